//! The models validation uses to show real clips: the Wan VAE turns sampled latents into
//! videos, the UMT5 encoder turns configured prompts (and the negative prompt) into text
//! conditions. Without them, latents are shown as they are (the synthetic data's preview)
//! and the data's own prompts are sampled.

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use reel_core::backend::CpuBackend;
use reel_core::config::ConfigError;
use reel_core::data::{negative_or_zeros, DataSource, DataSpec, Prompt, TextCondition};
use reel_models::umt5::{load_tokenizer, tokenizer_for, Umt5Config, Umt5Encoder, Umt5TextEncoder};
use reel_models::vae::{Tiling, WanVae, WanVaeConfig};

use super::output::ClipStyle;
use super::ValidationConfig;
use crate::data::clip_to_rgb;
use crate::data::prompts::{encode_prompts, encode_text};
use crate::media::video::{Frames, VideoDecoder};

/// The configured VAE and text encoder of a validation callback.
pub struct MediaModels<B: Backend> {
    /// Decodes latents to videos (`vae`).
    pub decoder: Option<VideoDecoder<B>>,
    /// Encodes `prompts` and `negative_prompt` (`text_encoder`, `tokenizer`).
    pub text: Option<Umt5TextEncoder<B>>,
}

/// An error of the model or text a setting (`key`, one of the callback table's) names:
/// the callback shows it under its table key, `reel sample` under its flag.
fn failed(key: &str, path: &Path, e: impl std::fmt::Display) -> ConfigError {
    ConfigError::new(key, format!("loading {}: {e}", path.display()))
}

/// Check the files `cfg` names as [`MediaModels::load`] will open them, from the configs and
/// the weight headers (every key and shape; no tensor is read); errors are keyed by the
/// callback table's `vae`, `text_encoder` or `tokenizer`.
pub fn check_files(
    cfg: &ValidationConfig,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<(), ConfigError> {
    if let Some(p) = &cfg.vae {
        let vae = WanVae::<CpuBackend>::check_pretrained(resolve(p))
            .map_err(|e| ConfigError::new("vae", e.to_string()))?;
        if let Some(t) = cfg.vae_tile {
            Tiling::overlapping(t, vae.spatial_factor())
                .map_err(|e| ConfigError::new("vae_tile", format!("{}: {e}", p.display())))?;
        }
    }
    if let Some(p) = &cfg.text_encoder {
        Umt5Encoder::<CpuBackend>::check_pretrained(resolve(p))
            .map_err(|e| ConfigError::new("text_encoder", e.to_string()))?;
    }
    if let Some(p) = tokenizer_path(cfg, resolve)? {
        load_tokenizer(p).map_err(|e| ConfigError::new("tokenizer", e.to_string()))?;
    }
    Ok(())
}

/// The tokenizer of `cfg`'s text encoder: `tokenizer`, else the one beside `text_encoder`
/// ([`tokenizer_for`]); `None` without a text encoder.
fn tokenizer_path(
    cfg: &ValidationConfig,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<Option<PathBuf>, ConfigError> {
    let Some(enc) = &cfg.text_encoder else {
        return Ok(None);
    };
    let given = cfg.tokenizer.as_deref().map(resolve);
    tokenizer_for(given.as_deref(), resolve(enc))
        .map(Some)
        .map_err(|e| ConfigError::new("tokenizer", e.to_string()))
}

/// The configured VAE's latent channels and text encoder's width against the data's (`spec`),
/// from their `config.json` files (no weights are read; `resolve` maps a config path to a
/// file): a mismatch is an error keyed by `vae` or `text_encoder`, before anything is encoded
/// or decoded.
pub fn check_data(
    cfg: &ValidationConfig,
    spec: &DataSpec,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<(), ConfigError> {
    if let Some(p) = &cfg.vae {
        let z = WanVaeConfig::of_pretrained(resolve(p))
            .map_err(|e| ConfigError::new("vae", e.to_string()))?
            .z_dim;
        if z != spec.channels {
            let why = format!(
                "{}: the data's latents have {} channels, this VAE's have z_dim = {z}: use the \
                 VAE the data was encoded with",
                p.display(),
                spec.channels
            );
            return Err(ConfigError::new("vae", why));
        }
    }
    if let Some(p) = &cfg.text_encoder {
        let d = Umt5Config::of_pretrained(resolve(p))
            .map_err(|e| ConfigError::new("text_encoder", e.to_string()))?
            .d_model;
        if d != spec.text_dim {
            let why = format!(
                "{}: it encodes text {d} wide (d_model), the data's text is {} wide: use the \
                 text encoder the data was encoded with",
                p.display(),
                spec.text_dim
            );
            return Err(ConfigError::new("text_encoder", why));
        }
    }
    Ok(())
}

impl<B: Backend> MediaModels<B> {
    /// Load what `cfg` names onto `device` (the text encoder only where `prompts` or
    /// `negative_prompt` are set: nothing else needs it). Errors here and below are keyed by
    /// the setting (`vae`, `text_encoder`, `tokenizer`, `prompts`, `negative_prompt`).
    pub fn load(cfg: &ValidationConfig, device: &B::Device) -> Result<Self, ConfigError> {
        let decoder = match &cfg.vae {
            Some(p) => {
                let mut d = VideoDecoder::load(p, device, cfg.denormalize)
                    .map_err(|e| failed("vae", p, e))?;
                let s = d.vae.config.spatial_factor();
                d.tiling = (cfg.vae_tile.map(|t| Tiling::overlapping(t, s)).transpose())
                    .map_err(|e| ConfigError::new("vae_tile", format!("{}: {e}", p.display())))?;
                Some(d)
            }
            None => None,
        };
        let tokenizer = tokenizer_path(cfg, &Path::to_path_buf)?;
        // Nothing to encode (the data's prompts and negative): not loaded.
        let needed = !cfg.prompts.is_empty() || cfg.negative_prompt.is_some();
        let text = match (&cfg.text_encoder, tokenizer) {
            (Some(enc), Some(tok)) if needed => Some(
                Umt5TextEncoder::load(tok, enc, device)
                    .map_err(|e| failed("text_encoder", enc, e))?,
            ),
            _ => None,
        };
        Ok(Self { decoder, text })
    }

    /// The prompts to sample: `cfg.prompts` encoded with the text encoder (the first
    /// `num_prompts`, all by default), else the data's first `num_prompts`
    /// ([`DATA_PROMPTS`](super::DATA_PROMPTS) by default).
    pub fn prompts(
        &self,
        cfg: &ValidationConfig,
        data: &dyn DataSource,
        spec: &DataSpec,
    ) -> Result<Vec<Prompt>, ConfigError> {
        match &self.text {
            Some(enc) if !cfg.prompts.is_empty() => {
                let n = cfg.num_prompts.unwrap_or(usize::MAX);
                let captions: Vec<String> = cfg.prompts.iter().take(n).cloned().collect();
                encode_prompts(enc, &captions, spec.text_len)
                    .map_err(|e| ConfigError::new("prompts", format!("encoding: {e}")))
            }
            _ => {
                let n = cfg.num_prompts.unwrap_or(super::DATA_PROMPTS);
                Ok(data.prompts().into_iter().take(n).collect())
            }
        }
    }

    /// The negative text: `cfg.negative_prompt` encoded, else the data's (or zeros).
    pub fn negative(
        &self,
        cfg: &ValidationConfig,
        data: &dyn DataSource,
        spec: &DataSpec,
    ) -> Result<TextCondition, ConfigError> {
        match (&self.text, &cfg.negative_prompt) {
            (Some(enc), Some(neg)) => encode_text(enc, neg, spec.text_len)
                .map_err(|e| ConfigError::new("negative_prompt", format!("encoding: {e}"))),
            _ => Ok(negative_or_zeros(data)),
        }
    }

    /// How `cfg`'s clips are written: decoded videos at `cfg.fps` with a VAE, else latent
    /// previews.
    pub fn style(&self, spec: &DataSpec, cfg: &ValidationConfig) -> ClipStyle {
        match self.decoder {
            Some(_) => ClipStyle::video(cfg.fps),
            None => ClipStyle::preview(spec),
        }
    }

    /// The RGB frames of each of `clips` (latents of `spec`'s shape), decoded one at a time
    /// as the iterator is read: with a VAE, one clip's video is held at once, not all of
    /// them (81×480×832 is about 100 MB each).
    pub fn frames<'a>(
        &'a self,
        clips: &'a [Vec<f32>],
        spec: &'a DataSpec,
    ) -> impl Iterator<Item = Result<Frames, ConfigError>> + 'a {
        clips
            .iter()
            .enumerate()
            .map(move |(i, c)| match &self.decoder {
                Some(decoder) => (decoder.decode(c, spec))
                    .map_err(|e| ConfigError::new("vae", format!("decoding clip {i}: {e}"))),
                None => Ok(Frames {
                    frames: clip_to_rgb(c, spec),
                    width: spec.width,
                    height: spec.height,
                }),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reel_core::fixtures::{UMT5, WAN_VAE};

    /// A VAE whose `z_dim` or a text encoder whose `d_model` differs from the data's is
    /// refused from its `config.json`, keyed by its table key; fitting ones pass.
    #[test]
    fn models_that_do_not_fit_the_data_are_refused_by_key() {
        let vae = WAN_VAE.require(&["config.json"]);
        let t5 = UMT5.require(&["config.json"]);
        let z = WanVaeConfig::from_json_file(vae.join("config.json"))
            .unwrap()
            .z_dim;
        let d = Umt5Config::from_json_file(t5.join("config.json"))
            .unwrap()
            .d_model;
        let mut cfg: ValidationConfig = toml::from_str("every_steps = 1").unwrap();
        cfg.vae = Some(vae);
        cfg.text_encoder = Some(t5);
        let spec = DataSpec {
            channels: z,
            frames: 2,
            height: 4,
            width: 4,
            text_len: 8,
            text_dim: d,
        };
        let same = |p: &Path| p.to_path_buf();
        check_data(&cfg, &spec, &same).unwrap();
        let wider = DataSpec {
            channels: z + 1,
            ..spec
        };
        let err = check_data(&cfg, &wider, &same).unwrap_err();
        assert_eq!(err.key, "vae", "{err}");
        assert!(err.message.contains(&format!("z_dim = {z}")), "{err}");
        let err = check_data(
            &cfg,
            &DataSpec {
                text_dim: d + 1,
                ..spec
            },
            &same,
        )
        .unwrap_err();
        assert_eq!(err.key, "text_encoder", "{err}");
        let want = format!("{} wide (d_model), the data's text is {}", d, d + 1);
        assert!(err.message.contains(&want), "{err}");
        cfg.text_encoder = Some("no/such/encoder".into());
        let err = check_data(&cfg, &spec, &same).unwrap_err();
        assert!(
            err.key == "text_encoder" && err.message.contains("no/such/encoder"),
            "{err}"
        );
        // Paths resolve as the config's do (against its base folder).
        let vae = cfg.vae.take().unwrap();
        let (parent, name) = (vae.parent().unwrap(), vae.file_name().unwrap());
        cfg.text_encoder = None;
        cfg.vae = Some(name.into());
        check_data(&cfg, &spec, &|p| parent.join(p)).unwrap();
        let err = check_data(&cfg, &wider, &|p| parent.join(p)).unwrap_err();
        assert_eq!(err.key, "vae", "{err}");
    }

    /// A VAE whose weights fail to load, and a text encoder whose tokenizer is missing, are
    /// errors keyed by their setting and naming the file (`reel sample` shows the key as its
    /// flag, the callback as its table key).
    #[test]
    fn models_that_fail_to_load_are_keyed_by_their_setting() {
        let vae = WAN_VAE.require(&["config.json", "model.safetensors"]);
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(vae.join("config.json"), dir.path().join("config.json")).unwrap();
        let bytes = std::fs::read(vae.join("model.safetensors")).unwrap();
        let cut = &bytes[..bytes.len() - 4];
        std::fs::write(dir.path().join("model.safetensors"), cut).unwrap();
        let mut cfg: ValidationConfig = toml::from_str("every_steps = 1").unwrap();
        cfg.vae = Some(dir.path().to_path_buf());
        let device = Default::default();
        let err = MediaModels::<CpuBackend>::load(&cfg, &device)
            .err()
            .unwrap();
        assert_eq!(err.key, "vae", "{err}");
        let named = dir.path().display().to_string();
        assert!(err.message.contains(&named), "{err}");

        let t5 = dir.path().join("text_encoder");
        std::fs::create_dir(&t5).unwrap();
        let mut cfg: ValidationConfig = toml::from_str("every_steps = 1").unwrap();
        cfg.text_encoder = Some(t5);
        cfg.prompts = vec!["a red square".into()];
        let err = MediaModels::<CpuBackend>::load(&cfg, &device)
            .err()
            .unwrap();
        assert_eq!(err.key, "tokenizer", "{err}");
    }
}
