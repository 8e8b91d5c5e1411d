//! [`WanVae`]: the Wan2.1 video VAE (diffusers `AutoencoderKLWan`), its causal chunked
//! encode / decode and the latent normalisation.
//!
//! Upstream: diffusers `autoencoder_kl_wan.py`, `AutoencoderKLWan._encode` (frame 0 alone,
//! then chunks of 4 frames through the encoder with one feature cache, then `quant_conv`),
//! `_decode` (`post_quant_conv`, then one latent frame at a time, clamped to [-1, 1]) and
//! `vae.py`, `DiagonalGaussianDistribution` (mean / log-variance halves, log-variance
//! clamped to [-30, 20]).

use std::path::Path;

use burn::module::Module;
use burn::tensor::{backend::Backend, Tensor};
use reel_core::io::WeightError;

use super::cache::{FeatCache, Intermediates};
use super::config::{VaeConfigError, WanVaeConfig, ENCODE_CHUNK};
use super::conv::CausalConv3d;
use super::decoder::Decoder3d;
use super::encoder::Encoder3d;
use crate::checkpoint;
use crate::wan::init::ParamInit;

/// Weight file names tried, in order, in a VAE folder.
pub const WEIGHT_FILES: [&str; 4] = [
    "diffusion_pytorch_model.safetensors.index.json",
    "diffusion_pytorch_model.safetensors",
    "model.safetensors.index.json",
    "model.safetensors",
];

/// An error of the VAE: config, weights or an input it cannot take.
#[derive(Debug, thiserror::Error)]
pub enum VaeError {
    /// The config is unreadable or invalid.
    #[error(transparent)]
    Config(#[from] VaeConfigError),
    /// The weights are unreadable or do not match the config.
    #[error(transparent)]
    Weights(#[from] WeightError),
    /// A tensor handed to the VAE has the wrong shape.
    #[error("Wan VAE input: {0}")]
    Input(String),
}

impl WanVaeConfig {
    /// The config of a diffusers `vae/` folder, or of a weights file with `config.json`
    /// beside it (the config [`WanVae::load`] builds from); no weights are read.
    pub fn of_pretrained(path: impl AsRef<Path>) -> Result<Self, VaeError> {
        let dir = checkpoint::config_dir(path.as_ref())?;
        Ok(Self::from_json_file(dir.join("config.json"))?)
    }
}

/// The posterior `q(z | video)`: a diagonal Gaussian per latent voxel.
#[derive(Debug, Clone)]
pub struct Posterior<B: Backend> {
    /// Mean `[B, z_dim, f, h, w]` (the latents Wan trains on, before normalisation).
    pub mean: Tensor<B, 5>,
    /// Log-variance `[B, z_dim, f, h, w]`, clamped to [-30, 20].
    pub logvar: Tensor<B, 5>,
}

impl<B: Backend> Posterior<B> {
    /// Split encoder moments `[B, 2 z_dim, f, h, w]` into mean and clamped log-variance.
    pub fn from_moments(moments: Tensor<B, 5>) -> Self {
        let z = moments.dims()[1] / 2;
        Self {
            mean: moments.clone().narrow(1, 0, z),
            logvar: moments.narrow(1, z, z).clamp(-30.0, 20.0),
        }
    }

    /// A sample `mean + exp(logvar / 2) * noise` with `noise ~ N(0, 1)` of the same shape.
    pub fn sample(&self, noise: Tensor<B, 5>) -> Tensor<B, 5> {
        self.mean.clone() + self.logvar.clone().mul_scalar(0.5).exp() * noise
    }
}

/// The Wan2.1 VAE; field names are the diffusers keys (`encoder.*`, `quant_conv.*`,
/// `post_quant_conv.*`, `decoder.*`).
#[derive(Module, Debug)]
pub struct WanVae<B: Backend> {
    /// Video -> moments.
    pub encoder: Encoder3d<B>,
    /// 1x1x1 convolution on the moments `2 z_dim -> 2 z_dim`.
    pub quant_conv: CausalConv3d<B>,
    /// 1x1x1 convolution on the latents `z_dim -> z_dim`.
    pub post_quant_conv: CausalConv3d<B>,
    /// Latents -> video.
    pub decoder: Decoder3d<B>,
    /// The configuration the model was built from.
    pub config: WanVaeConfig,
}

impl<B: Backend> WanVae<B> {
    /// A model of `config` whose parameters are a function of `seed` and their keys
    /// (created lazily, so loading weights afterwards never generates them).
    pub fn init(config: &WanVaeConfig, device: &B::Device, seed: u64) -> Result<Self, VaeError> {
        config.validate()?;
        let init = ParamInit::new(seed, device);
        let z = config.z_dim;
        Ok(Self {
            encoder: Encoder3d::init(&init, "encoder", config),
            quant_conv: CausalConv3d::pointwise(&init, "quant_conv", 2 * z, 2 * z),
            post_quant_conv: CausalConv3d::pointwise(&init, "post_quant_conv", z, z),
            decoder: Decoder3d::init(&init, "decoder", config),
            config: config.clone(),
        })
    }

    /// Load a diffusers `vae/` folder (`config.json` and the weights, see [`WEIGHT_FILES`]),
    /// or a weights file with `config.json` beside it. Keys are diffusers' as they are.
    pub fn load(path: impl AsRef<Path>, device: &B::Device) -> Result<Self, VaeError> {
        let path = path.as_ref();
        let config = WanVaeConfig::of_pretrained(path)?;
        Self::init(&config, device, 0)?.load_weights(path)
    }

    /// Load weights (a folder, a `.safetensors` file or a shard index) into this model,
    /// strictly: every missing, unexpected or mis-shaped key is named with the file.
    pub fn load_weights(self, path: impl AsRef<Path>) -> Result<Self, VaeError> {
        let source = checkpoint::resolve(path.as_ref(), &WEIGHT_FILES)?;
        Ok(checkpoint::load(self, &source, |k| Some(k.to_string()))?)
    }

    /// Check a VAE [`Self::load`] would load, from `config.json` and the weight headers only
    /// (no tensor is read or allocated): the config is valid and the weights hold exactly
    /// its keys and shapes, every difference named with the file. Returns the config.
    pub fn check_pretrained(path: impl AsRef<Path>) -> Result<WanVaeConfig, VaeError> {
        let path = path.as_ref();
        let config = WanVaeConfig::of_pretrained(path)?;
        let model = Self::init(&config, &Default::default(), 0)?;
        let source = checkpoint::resolve(path, &WEIGHT_FILES)?;
        checkpoint::check(&model, &source, |k| Some(k.to_string()))?;
        Ok(config)
    }

    /// Encode `video [B, in_channels, F, H, W]` in [-1, 1] to the posterior
    /// `[B, z_dim, 1 + (F - 1) / 4 * (4 / temporal_factor), H / s, W / s]` (integer
    /// division: as in diffusers, trailing frames that do not fill a 4-frame chunk are not
    /// encoded, so use `F = 1 + 4k`).
    pub fn encode(&self, video: Tensor<B, 5>) -> Result<Posterior<B>, VaeError> {
        self.check_video(&video)?;
        let moments = self.encode_moments(video, &mut FeatCache::new());
        Ok(Posterior::from_moments(moments))
    }

    /// [`Self::encode`], also returning the encoder's module outputs on the first chunk
    /// (`first_chunk.encoder.conv_in`, `first_chunk.encoder.down_blocks.<i>`, ...).
    pub fn encode_with_intermediates(
        &self,
        video: Tensor<B, 5>,
    ) -> Result<(Posterior<B>, Intermediates<B>), VaeError> {
        self.check_video(&video)?;
        let mut cache = FeatCache::capturing();
        let moments = self.encode_moments(video, &mut cache);
        Ok((Posterior::from_moments(moments), cache.take_intermediates()))
    }

    /// Decode `z [B, z_dim, f, h, w]` to a video `[B, out_channels, F, h s, w s]` clamped
    /// to [-1, 1] (`F = 1 + (f - 1) * temporal_factor`).
    pub fn decode(&self, z: Tensor<B, 5>) -> Result<Tensor<B, 5>, VaeError> {
        self.check_latents(&z)?;
        Ok(self.decode_raw(z, &mut FeatCache::new()).clamp(-1.0, 1.0))
    }

    /// [`Self::decode`], also returning the decoder's module outputs on the first latent
    /// frame (`first_chunk.decoder.mid_block`, `first_chunk.decoder.up_blocks.<i>`, ...).
    pub fn decode_with_intermediates(
        &self,
        z: Tensor<B, 5>,
    ) -> Result<(Tensor<B, 5>, Intermediates<B>), VaeError> {
        self.check_latents(&z)?;
        let mut cache = FeatCache::capturing();
        let video = self.decode_raw(z, &mut cache).clamp(-1.0, 1.0);
        Ok((video, cache.take_intermediates()))
    }

    /// `(mean - latents_mean) / latents_std` per channel of `[B, z_dim, f, h, w]`: the
    /// form the DiT is trained on.
    pub fn normalize_latents(&self, mean: Tensor<B, 5>) -> Result<Tensor<B, 5>, VaeError> {
        self.check_latents(&mean)?;
        let (m, s) = self.latent_stats(&mean.device());
        Ok((mean - m) / s)
    }

    /// `z * latents_std + latents_mean`, the inverse of [`Self::normalize_latents`].
    pub fn denormalize_latents(&self, z: Tensor<B, 5>) -> Result<Tensor<B, 5>, VaeError> {
        self.check_latents(&z)?;
        let (m, s) = self.latent_stats(&z.device());
        Ok(z * s + m)
    }

    fn latent_stats(&self, device: &B::Device) -> (Tensor<B, 5>, Tensor<B, 5>) {
        let to = |v: &[f64]| {
            let v: Vec<f32> = v.iter().map(|x| *x as f32).collect();
            let n = v.len();
            Tensor::<B, 1>::from_floats(v.as_slice(), device).reshape([1, n, 1, 1, 1])
        };
        (to(&self.config.latents_mean), to(&self.config.latents_std))
    }

    /// Encoder moments `[B, 2 z_dim, f, h, w]` of a checked video, chunk by chunk with
    /// `cache` (fresh), then `quant_conv`.
    pub(crate) fn encode_moments(
        &self,
        video: Tensor<B, 5>,
        cache: &mut FeatCache<B>,
    ) -> Tensor<B, 5> {
        let frames = video.dims()[2];
        let chunks = 1 + (frames - 1) / ENCODE_CHUNK;
        let outs = (0..chunks)
            .map(|i| {
                cache.start_chunk(i);
                let (start, len) = match i {
                    0 => (0, 1),
                    _ => (1 + ENCODE_CHUNK * (i - 1), ENCODE_CHUNK),
                };
                self.encoder
                    .forward(video.clone().narrow(2, start, len), cache)
            })
            .collect();
        self.quant_conv
            .forward(Tensor::cat(outs, 2), None, cache.conv())
    }

    /// Unclamped decoder output of checked latents, one latent frame at a time.
    pub(crate) fn decode_raw(&self, z: Tensor<B, 5>, cache: &mut FeatCache<B>) -> Tensor<B, 5> {
        let x = self.post_quant_conv.forward(z, None, cache.conv());
        let outs = (0..x.dims()[2])
            .map(|i| {
                cache.start_chunk(i);
                self.decoder.forward(x.clone().narrow(2, i, 1), cache)
            })
            .collect();
        Tensor::cat(outs, 2)
    }

    pub(crate) fn check_video(&self, video: &Tensor<B, 5>) -> Result<(), VaeError> {
        let [b, c, f, h, w] = video.dims();
        let s = self.config.spatial_factor();
        let mut errs = Vec::new();
        if c != self.config.in_channels {
            errs.push(format!(
                "{c} channels, in_channels = {}",
                self.config.in_channels
            ));
        }
        if b == 0 || f == 0 {
            errs.push("an empty batch or no frame".into());
        }
        if h < s || w < s {
            errs.push(format!("{h}x{w} pixels, smaller than the compression {s}"));
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(VaeError::Input(format!(
                "video {:?}: {}",
                video.dims(),
                errs.join("; ")
            )))
        }
    }

    pub(crate) fn check_latents(&self, z: &Tensor<B, 5>) -> Result<(), VaeError> {
        let [b, c, f, h, w] = z.dims();
        if c != self.config.z_dim || b * f * h * w == 0 {
            return Err(VaeError::Input(format!(
                "latents {:?}: expected [B, z_dim = {}, f, h, w] with no empty axis",
                z.dims(),
                self.config.z_dim
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Distribution;
    use reel_core::io::{module_to_safetensors, read_safetensors, write_safetensors};
    use reel_core::params::named_param_shapes;

    type TestBackend = burn::backend::NdArray;

    /// Two levels, time halved once, attention at full scale: another layout than the
    /// fixture's, so the key list and frame schedule are exercised from the config.
    fn small_config() -> WanVaeConfig {
        WanVaeConfig::from_json_str(
            r#"{"base_dim": 4, "z_dim": 2, "dim_mult": [1, 2], "num_res_blocks": 1,
                "attn_scales": [1.0], "temperal_downsample": [true],
                "latents_mean": [0.5, -1.0], "latents_std": [2.0, 0.25]}"#,
        )
        .unwrap()
    }

    #[test]
    fn keys_and_frame_schedule_follow_the_config() {
        let dev = Default::default();
        let config = small_config();
        let vae = WanVae::<TestBackend>::init(&config, &dev, 5).unwrap();
        let keys: Vec<String> = named_param_shapes::<TestBackend, _>(&vae)
            .into_iter()
            .map(|p| p.path)
            .collect();
        for key in [
            "encoder.down_blocks.0.conv1.weight",
            "encoder.down_blocks.1.to_qkv.weight",
            "encoder.down_blocks.2.resample.1.weight",
            "encoder.down_blocks.2.time_conv.weight",
            "decoder.up_blocks.0.upsamplers.0.time_conv.weight",
            "decoder.up_blocks.1.resnets.1.conv2.weight",
        ] {
            assert!(keys.iter().any(|k| k == key), "missing {key}");
        }
        let video = Tensor::<TestBackend, 5>::random([1, 3, 9, 8, 6], Distribution::Default, &dev);
        let post = vae.encode(video).unwrap();
        assert_eq!(post.mean.dims(), [1, 2, config.latent_frames(9), 4, 3]);
        assert_eq!(config.latent_frames(9), 5);
        let video = vae.decode(post.mean.clone()).unwrap();
        assert_eq!(video.dims(), [1, 3, 9, 8, 6]);
        let z = vae.normalize_latents(post.mean.clone()).unwrap();
        let back = vae.denormalize_latents(z).unwrap();
        let err: f32 = (back - post.mean).abs().max().into_scalar();
        assert!(err < 1e-5, "{err}");
    }

    /// The whole encode and decode give the same result with either convolution
    /// implementation (`conv_gemm` checks each convolution alone).
    #[test]
    fn gemm_convolutions_encode_and_decode_as_burns() {
        use super::super::conv_gemm::ConvImpl;
        let dev = Default::default();
        let vae = WanVae::<TestBackend>::init(&small_config(), &dev, 7).unwrap();
        let video = Tensor::<TestBackend, 5>::random([2, 3, 5, 8, 6], Distribution::Default, &dev);
        let cache = |how| FeatCache::new().with_conv(how);
        let close = |a: Tensor<TestBackend, 5>, b: Tensor<TestBackend, 5>| {
            let scale: f32 = b.clone().abs().max().into_scalar();
            let err: f32 = (a - b).abs().max().into_scalar();
            assert!(err <= 1e-5 * scale, "{err} (largest value {scale})");
        };
        let moments = vae.encode_moments(video.clone(), &mut cache(ConvImpl::Burn));
        close(
            vae.encode_moments(video, &mut cache(ConvImpl::Gemm)),
            moments.clone(),
        );
        let z = Posterior::from_moments(moments).mean;
        let want = vae.decode_raw(z.clone(), &mut cache(ConvImpl::Burn));
        close(vae.decode_raw(z, &mut cache(ConvImpl::Gemm)), want);
    }

    /// Counts the parameters whose lazy random value has not been made.
    struct Uninitialized(usize);

    impl<B: burn::tensor::backend::Backend> burn::module::ModuleVisitor<B> for Uninitialized {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<B, D>>) {
            self.0 += usize::from(!param.is_initialized());
        }
    }

    /// Random weights are lazy (made on first use, so a checkpoint's never are): a pass must
    /// use the model's own parameters, not clones of them, or every chunk would make (and on
    /// a GPU upload) the weights it uses again, and the model would keep none of them.
    #[test]
    fn an_encode_and_a_decode_make_every_random_weight_once_in_the_model() {
        let dev = Default::default();
        let vae = WanVae::<TestBackend>::init(&small_config(), &dev, 3).unwrap();
        let count = |vae: &WanVae<TestBackend>| {
            let mut v = Uninitialized(0);
            vae.visit(&mut v);
            v.0
        };
        let total = named_param_shapes::<TestBackend, _>(&vae).len();
        assert_eq!(count(&vae), total, "nothing is made before a pass");
        let video = Tensor::<TestBackend, 5>::random([1, 3, 5, 8, 8], Distribution::Default, &dev);
        let z = vae.encode(video).unwrap().mean;
        vae.decode(z).unwrap();
        assert_eq!(
            count(&vae),
            0,
            "of {total} parameters, after a 5-frame encode and decode"
        );
    }

    #[test]
    fn bad_inputs_are_errors() {
        let dev = Default::default();
        let vae = WanVae::<TestBackend>::init(&small_config(), &dev, 5).unwrap();
        let msg = vae
            .encode(Tensor::zeros([1, 4, 1, 8, 8], &dev))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("in_channels = 3"), "{msg}");
        let msg = vae
            .encode(Tensor::zeros([1, 3, 1, 1, 8], &dev))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("smaller than the compression"), "{msg}");
        let msg = vae
            .decode(Tensor::zeros([1, 3, 1, 2, 2], &dev))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("z_dim = 2"), "{msg}");
    }

    #[test]
    fn missing_and_misshaped_weights_name_the_file_and_the_keys() {
        let dev = Default::default();
        let config = small_config();
        let vae = WanVae::<TestBackend>::init(&config, &dev, 5).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), config.to_json_string()).unwrap();
        let file = dir.path().join("diffusion_pytorch_model.safetensors");
        module_to_safetensors(&vae, &file, None).unwrap();
        let loaded = WanVae::<TestBackend>::load(dir.path(), &dev).unwrap();
        let w = |m: &WanVae<TestBackend>| m.quant_conv.weight.val().into_data();
        assert_eq!(w(&loaded), w(&vae));

        let (mut tensors, _) = read_safetensors(&file).unwrap();
        tensors.remove("decoder.conv_in.bias");
        let bad = tensors.get("encoder.conv_out.weight").unwrap().clone();
        let n = bad.num_elements();
        let reshaped = burn::tensor::TensorData::new(bad.to_vec::<f32>().unwrap(), [n]);
        tensors.insert("encoder.conv_out.weight".into(), reshaped);
        let list: Vec<_> = tensors.into_iter().collect();
        write_safetensors(&file, &list, None).unwrap();
        let msg = WanVae::<TestBackend>::load(dir.path(), &dev)
            .unwrap_err()
            .to_string();
        for needle in [
            file.display().to_string(),
            "decoder.conv_in.bias".into(),
            "encoder.conv_out.weight".into(),
        ] {
            assert!(msg.contains(&needle), "`{needle}` not in: {msg}");
        }
    }
}
