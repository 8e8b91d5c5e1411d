//! `arch = "toy"`: a second model architecture, registered from outside the built-in crates.
//! The built-in methods train it through the model seam exactly as they train Wan.
//!
//! A tiny diffusion transformer without attention: every latent pixel is a token (patch
//! `[1, 1, 1]`), embedded linearly; the timestep (sinusoid) and the mean text embedding are
//! added to every token; `num_layers` residual MLP blocks; a linear head back to the latent
//! channels. Channels and text width follow the data.
//!
//! ```toml
//! [models.student]
//! arch = "toy"
//! hidden_size = 32     # default
//! num_layers = 2       # default
//! trainable = true
//! ```

use burn::module::{AutodiffModule, Module, Param};
use burn::tensor::activation::gelu;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};

use reel_core::config::{check, ConfigError};
use reel_core::method::BuildContext;
use reel_core::model::{
    BuildModel, DiffusionModel, DynModel, ModelConfig, ModelError, ModelInfo, TrainableModel,
};
use reel_core::rng::StreamRng;
use reel_core::role::RoleConfig;

/// Frequencies of the timestep sinusoid.
const FREQS: usize = 8;

/// The toy keys of a `[models.<role>]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToyArch {
    /// Only `"tiny"` (the defaults), accepted for symmetry with other architectures.
    #[serde(default)]
    pub preset: Option<String>,
    /// Token width.
    #[serde(default = "default_hidden")]
    pub hidden_size: usize,
    /// Residual MLP blocks.
    #[serde(default = "default_layers")]
    pub num_layers: usize,
}
fn default_hidden() -> usize {
    32
}
fn default_layers() -> usize {
    2
}

#[reel_core::plugin(
    name = "toy",
    summary = "Toy diffusion MLP (example crate's second architecture)"
)]
impl ModelConfig for ToyArch {
    fn validate(&self) -> Result<(), ConfigError> {
        if let Some(p) = self.preset.as_deref().filter(|p| *p != "tiny") {
            return Err(ConfigError::new(
                "preset",
                format!("unknown toy preset `{p}`, expected one of [\"tiny\"]"),
            ));
        }
        check::positive_usize("hidden_size", self.hidden_size)?;
        check::positive_usize("num_layers", self.num_layers)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl<B: AutodiffBackend> BuildModel<B> for ToyArch {
    fn build_model(
        &self,
        role: &RoleConfig,
        ctx: &BuildContext<B>,
    ) -> Result<DynModel<B>, ModelError> {
        if role.adapter.is_some() {
            return Err(ModelError::Build("the toy model takes no adapter".into()));
        }
        let spec = ctx.data_spec;
        let seed = role.init_seed.unwrap_or(ctx.seed);
        let mut model = ToyDit::<B>::new(self, spec.channels, spec.text_dim, seed, &ctx.device);
        if let Some(w) = &role.weights {
            model = reel_core::io::load_module_safetensors(model, ctx.resolve(w))
                .map_err(|e| ModelError::Build(e.to_string()))?;
        }
        let model = if role.trainable {
            model
        } else {
            model.no_grad()
        };
        Ok(DynModel::new(model))
    }
}

/// A linear layer `y = x·Wᵀ + b` on `[.., in]` rows, seeded.
#[derive(Module, Debug)]
pub struct ToyLinear<B: Backend> {
    /// `[out, in]`.
    pub weight: Param<Tensor<B, 2>>,
    /// `[out]`.
    pub bias: Param<Tensor<B, 1>>,
}

impl<B: Backend> ToyLinear<B> {
    fn new(inputs: usize, outputs: usize, rng: &mut StreamRng, device: &B::Device) -> Self {
        let scale = 1.0 / (inputs as f32).sqrt();
        let w: Vec<f32> = rng
            .normal_vec(inputs * outputs)
            .iter()
            .map(|v| v * scale)
            .collect();
        Self {
            weight: Param::from_data(TensorData::new(w, [outputs, inputs]), device),
            bias: Param::from_tensor(Tensor::zeros([outputs], device)),
        }
    }

    /// `x [B, N, in]` → `[B, N, out]`.
    fn forward3(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [b, n, d] = x.dims();
        let out = self.bias.dims()[0];
        self.forward2(x.reshape([b * n, d])).reshape([b, n, out])
    }

    /// `x [B, in]` → `[B, out]`.
    fn forward2(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let out = self.bias.dims()[0];
        x.matmul(self.weight.val().transpose())
            .add(self.bias.val().reshape([1, out]))
    }
}

/// A residual MLP block `x + fc2(gelu(fc1(x)))`.
#[derive(Module, Debug)]
pub struct ToyBlock<B: Backend> {
    /// `hidden → 2·hidden`.
    pub fc1: ToyLinear<B>,
    /// `2·hidden → hidden`.
    pub fc2: ToyLinear<B>,
}

/// The toy diffusion model.
#[derive(Module, Debug)]
pub struct ToyDit<B: Backend> {
    /// Token embedding `channels → hidden`.
    pub embed: ToyLinear<B>,
    /// Timestep embedding `2·FREQS → hidden`.
    pub time: ToyLinear<B>,
    /// Text embedding `text_dim → hidden` (of the mean over tokens).
    pub text: ToyLinear<B>,
    /// Residual blocks.
    pub blocks: Vec<ToyBlock<B>>,
    /// Output head `hidden → channels`.
    pub head: ToyLinear<B>,
}

impl<B: Backend> ToyDit<B> {
    /// A model for `channels` latent channels and text `text_dim` wide, weights from `seed`.
    pub fn new(
        cfg: &ToyArch,
        channels: usize,
        text_dim: usize,
        seed: u64,
        device: &B::Device,
    ) -> Self {
        let mut rng = StreamRng::from_seed(seed);
        let h = cfg.hidden_size;
        let mut lin = |i, o| ToyLinear::new(i, o, &mut rng, device);
        Self {
            embed: lin(channels, h),
            time: lin(2 * FREQS, h),
            text: lin(text_dim, h),
            blocks: (0..cfg.num_layers)
                .map(|_| ToyBlock {
                    fc1: lin(h, 2 * h),
                    fc2: lin(2 * h, h),
                })
                .collect(),
            head: lin(h, channels),
        }
    }

    /// `[sin | cos]` of `t / 1000` at `FREQS` geometric frequencies: `[B]` → `[B, 2·FREQS]`.
    fn sinusoid(t: Tensor<B, 1>) -> Tensor<B, 2> {
        let [b] = t.dims();
        let freqs: Vec<f32> = (0..FREQS).map(|k| 2f32.powi(k as i32)).collect();
        let freqs = Tensor::<B, 1>::from_data(TensorData::new(freqs, [FREQS]), &t.device());
        let angles = t.div_scalar(1000.0).reshape([b, 1]) * freqs.reshape([1, FREQS]);
        Tensor::cat(vec![angles.clone().sin(), angles.cos()], 1)
    }
}

impl<B: Backend> DiffusionModel<B> for ToyDit<B> {
    fn info(&self) -> ModelInfo {
        let [hidden, channels] = self.embed.weight.dims();
        ModelInfo {
            in_channels: channels,
            out_channels: self.head.bias.dims()[0],
            text_dim: self.text.weight.dims()[1],
            patch_size: [1, 1, 1],
            hidden_size: hidden,
            num_layers: self.blocks.len(),
            max_grid: None,
        }
    }

    fn forward(
        &self,
        latents: Tensor<B, 5>,
        timesteps: Tensor<B, 1>,
        text: Tensor<B, 3>,
    ) -> Tensor<B, 5> {
        self.forward_hidden_states(latents, timesteps, text, &[]).0
    }

    fn forward_hidden_states(
        &self,
        latents: Tensor<B, 5>,
        timesteps: Tensor<B, 1>,
        text: Tensor<B, 3>,
        blocks: &[usize],
    ) -> (Tensor<B, 5>, Vec<Tensor<B, 3>>) {
        let [b, c, f, h, w] = latents.dims();
        let n = f * h * w;
        // [B, C, F, H, W] -> tokens [B, N, C].
        let tokens = latents.reshape([b, c, n]).swap_dims(1, 2);
        let cond = self.time.forward2(Self::sinusoid(timesteps))
            + self.text.forward2(text.mean_dim(1).squeeze_dim(1));
        let hidden = self.embed.weight.dims()[0];
        let mut x = self.embed.forward3(tokens) + cond.reshape([b, 1, hidden]);
        let mut kept = vec![None; self.blocks.len()];
        for (i, block) in self.blocks.iter().enumerate() {
            x = x.clone() + block.fc2.forward3(gelu(block.fc1.forward3(x)));
            if blocks.contains(&i) {
                kept[i] = Some(x.clone());
            }
        }
        let out = self
            .head
            .forward3(x)
            .swap_dims(1, 2)
            .reshape([b, c, f, h, w]);
        let states = blocks
            .iter()
            .map(|&i| {
                kept.get(i).cloned().flatten().unwrap_or_else(|| {
                    panic!(
                        "block index {i} out of range: the model has {} blocks",
                        self.blocks.len()
                    )
                })
            })
            .collect();
        (out, states)
    }
}

impl<B: AutodiffBackend> TrainableModel<B> for ToyDit<B> {
    fn valid(&self) -> Box<dyn DiffusionModel<B::InnerBackend>> {
        Box::new(AutodiffModule::valid(self))
    }
}
