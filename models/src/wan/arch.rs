//! `arch = "wan"`: the Wan model as a Reel model architecture. The role table's Wan keys
//! ([`WanArch`]), how a role's model is built from them, and the [`DiffusionModel`] /
//! [`TrainableModel`] seam methods call.
//!
//! ```toml
//! [models.student]
//! arch = "wan"
//! preset = "wan2.1-t2v-1.3b"        # or config = "path/to/config.json"
//! attention = "auto"                # naive | memory_efficient | fused
//! weights = "ckpt/Wan2.1-T2V-1.3B-Diffusers/transformer"
//! trainable = true
//! ```

use std::path::{Path, PathBuf};

use burn::module::{AutodiffModule, Module};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

use reel_core::backend::CpuBackend;
use reel_core::config::{ConfigError, Precision};
use reel_core::method::BuildContext;
use reel_core::model::{
    BuildModel, DiffusionModel, DynModel, LossFn, ModelConfig, ModelError, ModelInfo,
    TrainableModel,
};
use reel_core::role::RoleConfig;

use super::{AttentionMode, WanConfig, WanConfigError, WanModel};
use crate::lora::{apply_lora, check_block_targets, lora_param_count, LoraError, LoraSpec};

/// The Wan keys of a `[models.<role>]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WanArch {
    /// Named preset (`reel list` shows the architectures; [`WanConfig::preset_names`] the
    /// presets), e.g. `"wan2.1-t2v-1.3b"`.
    #[serde(default)]
    pub preset: Option<String>,
    /// A diffusers `config.json` instead of a preset (read when the role is built).
    #[serde(default)]
    pub config: Option<PathBuf>,
    /// Attention implementation: `"auto"` (default: memory-efficient from
    /// [`AUTO_MIN_TOKENS`](super::AUTO_MIN_TOKENS) query tokens), `"naive"`,
    /// `"memory_efficient"`, `"fused"` (the CubeCL kernels on `cuda`/`wgpu`) or `"flash"`
    /// (`"fused"`, with the tensor-core flash kernel for forwards without gradients).
    #[serde(default)]
    pub attention: AttentionMode,
}

impl WanArch {
    /// The architecture config the table selects (preset or `config.json`), with paths
    /// resolved by `resolve`; keys relative to the role table.
    pub fn wan_config(&self, resolve: impl Fn(&Path) -> PathBuf) -> Result<WanConfig, ConfigError> {
        let cfg = match (&self.preset, &self.config) {
            (Some(name), None) => WanConfig::preset(name).ok_or_else(|| {
                ConfigError::new(
                    "preset",
                    format!(
                        "unknown Wan preset `{name}`, expected one of {:?}",
                        WanConfig::preset_names()
                    ),
                )
            })?,
            (None, Some(path)) => {
                // The file's errors name it; its values' problems are prefixed with it.
                let p = resolve(path);
                let cfg = WanConfig::from_json_file(&p)
                    .map_err(|e| ConfigError::new("config", e.to_string()))?;
                cfg.validate()
                    .map_err(|e| ConfigError::new("config", format!("{}: {e}", p.display())))?;
                return Ok(cfg);
            }
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    "config",
                    "give either `preset` or `config`, not both",
                ))
            }
            (None, None) => {
                return Err(ConfigError::new(
                    "preset",
                    "missing: give `preset = \"<name>\"` or `config = \"path/to/config.json\"`",
                ))
            }
        };
        cfg.validate()
            .map_err(|e| ConfigError::new("preset", e.to_string()))?;
        Ok(cfg)
    }
}

/// The model of `cfg` with lazily initialised parameters, its error keyed `preset`.
fn lazy_model(cfg: &WanConfig) -> Result<WanModel<CpuBackend>, ConfigError> {
    cfg.lazy()
        .map_err(|e| ConfigError::new("preset", e.to_string()))
}

impl WanConfig {
    /// The model with lazily initialised parameters: their shapes, no memory.
    fn lazy(&self) -> Result<WanModel<CpuBackend>, WanConfigError> {
        self.try_init(&Default::default(), 0)
    }

    /// Values in the model's parameters, counted on a lazily initialised model
    /// ([`num_param_values`](reel_core::params::num_param_values)): nothing is allocated.
    /// Errors as [`Self::try_init`].
    pub fn num_params(&self) -> Result<u64, WanConfigError> {
        Ok(reel_core::params::num_param_values(&self.lazy()?))
    }

    /// Values the LoRA adapter of `spec` would add to the model ([`lora_param_count`]),
    /// counted on a lazily initialised model: nothing is allocated. A config that cannot
    /// build a model is a [`LoraError::Spec`] naming why.
    pub fn num_lora_params(&self, spec: &LoraSpec) -> Result<u64, LoraError> {
        let mut model = self.lazy().map_err(|e| LoraError::Spec(e.to_string()))?;
        lora_param_count(&mut model, spec)
    }
}

impl WanConfig {
    /// The architecture's shape facts as methods and data checks see them.
    pub fn model_info(&self) -> ModelInfo {
        ModelInfo {
            in_channels: self.in_channels,
            out_channels: self.out_channels,
            text_dim: self.text_dim,
            patch_size: self.patch_size,
            hidden_size: self.inner_dim(),
            num_layers: self.num_layers,
            max_grid: Some(self.rope_max_seq_len),
        }
    }
}

#[reel_core::plugin(
    name = crate::ARCH_NAME,
    summary = "Wan2.1 video DiT (diffusers WanTransformer3DModel layout, safetensors in/out)"
)]
impl ModelConfig for WanArch {
    /// Presets are checked here; a `config.json` path is read at build time (it may be
    /// relative to the working directory of `reel train`).
    fn validate(&self) -> Result<(), ConfigError> {
        if self.config.is_none() || self.preset.is_some() {
            self.wan_config(Path::to_path_buf)?;
        }
        Ok(())
    }

    /// The attention implementation: every one computes the same attention (within float
    /// rounding) from the same weights.
    fn resumable_keys(&self) -> &'static [&'static str] {
        &["attention"]
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    /// The `config.json` parses and validates; `weights` resolves to a diffusers folder,
    /// file or shard index whose headers hold exactly the model's keys and shapes (checked
    /// against a lazily initialised model: nothing is allocated).
    fn check_files(
        &self,
        role: &RoleConfig,
        resolve: &dyn Fn(&Path) -> PathBuf,
    ) -> Result<(), ConfigError> {
        let cfg = self.wan_config(resolve)?;
        check_adapter_blocks(role, &cfg)?;
        let Some(weights) = &role.weights else {
            return Ok(());
        };
        let model = lazy_model(&cfg)?;
        super::weights::check_weights(&model, resolve(weights))
            .map_err(|e| ConfigError::new("weights", e.to_string()))
    }

    /// From the preset or `config.json`; a LoRA adapter changes none of it.
    fn model_info(
        &self,
        _role: &RoleConfig,
        resolve: &dyn Fn(&Path) -> PathBuf,
    ) -> Result<Option<ModelInfo>, ConfigError> {
        Ok(Some(self.wan_config(resolve)?.model_info()))
    }

    /// Counted on a lazily initialised model (nothing is allocated); a LoRA adapter's
    /// parameters are counted by `num_adapter_params`.
    fn num_params(
        &self,
        _role: &RoleConfig,
        resolve: &dyn Fn(&Path) -> PathBuf,
    ) -> Result<Option<u64>, ConfigError> {
        let count = (self.wan_config(resolve)?.num_params())
            .map_err(|e| ConfigError::new("preset", e.to_string()))?;
        Ok(Some(count))
    }

    /// A LoRA's `A` and `B` of every targeted layer, counted from the layers' shapes on a
    /// lazily initialised model (nothing is allocated).
    fn num_adapter_params(
        &self,
        role: &RoleConfig,
        resolve: &dyn Fn(&Path) -> PathBuf,
    ) -> Result<Option<u64>, ConfigError> {
        let Some(adapter) = &role.adapter else {
            return Ok(None);
        };
        let Some(spec) = adapter.as_any().downcast_ref::<LoraSpec>() else {
            return Ok(None);
        };
        let count = (self.wan_config(resolve)?.num_lora_params(spec))
            .map_err(|e| ConfigError::new("adapter", e.to_string()))?;
        Ok(Some(count))
    }
}

impl<B: AutodiffBackend> BuildModel<B> for WanArch {
    fn build_model(
        &self,
        role: &RoleConfig,
        ctx: &BuildContext<B>,
    ) -> Result<DynModel<B>, ModelError> {
        let model = build_wan_role::<B>(role, |p| ctx.resolve(p), ctx.seed, &ctx.device)?
            .with_precision(ctx.precision);
        // A frozen role computing in bf16 keeps its weight matrices in bf16 (same products,
        // half the memory); trained roles keep float32 master weights.
        Ok(DynModel::new(match (role.trainable, ctx.precision) {
            (false, Precision::Bf16) => model.with_bf16_weights(),
            _ => model,
        }))
    }
}

/// A LoRA adapter's targets against the model's block count: a block the model lacks is
/// refused by key (`adapter.target_modules[i]`).
fn check_adapter_blocks(role: &RoleConfig, cfg: &WanConfig) -> Result<(), ConfigError> {
    let spec = role
        .adapter
        .as_ref()
        .and_then(|a| a.as_any().downcast_ref::<LoraSpec>());
    match spec {
        Some(spec) => {
            check_block_targets(spec, cfg.num_layers).map_err(|e| e.in_section("adapter"))
        }
        None => Ok(()),
    }
}

/// Build the Wan model of one role (its `arch` must be `wan`): architecture from the preset /
/// `config.json`, weights from `weights` (diffusers folder or file) or a seeded init
/// (`init_seed`, else `default_seed`). Frozen roles get `require_grad = false` parameters. A
/// role with a LoRA adapter gets fresh adapters on the targeted layers and frozen base
/// weights (see [`apply_lora`]; without an adapter `init_seed` the adapter seed derives from
/// `default_seed`), so only the adapter is trained and checkpointed. Every attention uses the
/// role's `attention` mode. Errors name the file or key.
pub fn build_wan_role<B: Backend>(
    role: &RoleConfig,
    resolve: impl Fn(&Path) -> PathBuf,
    default_seed: u64,
    device: &B::Device,
) -> Result<WanModel<B>, ModelError> {
    let arch = role
        .model
        .as_any()
        .downcast_ref::<WanArch>()
        .ok_or_else(|| {
            ModelError::Build(format!(
                "arch `{}` is not `{}`",
                role.arch(),
                crate::ARCH_NAME
            ))
        })?;
    let cfg = arch.wan_config(&resolve)?;
    // Before the weights are read (minutes for a large model).
    check_adapter_blocks(role, &cfg)?;
    let model = cfg
        .try_init::<B>(device, role.init_seed.unwrap_or(default_seed))
        .map_err(|e| ModelError::Build(e.to_string()))?
        .with_attention(arch.attention);
    let model = match &role.weights {
        Some(w) => model
            .load_weights(resolve(w))
            .map_err(|e| ConfigError::new("weights", e.to_string()))?,
        None => model,
    };
    let model = match &role.adapter {
        None => model,
        Some(adapter) => {
            let spec = adapter.as_any().downcast_ref::<LoraSpec>().ok_or_else(|| {
                ModelError::Build(format!(
                    "adapter {adapter:?} is not supported by the Wan model (only `kind = \"lora\"`)"
                ))
            })?;
            apply_lora(model, spec, default_seed)
                .map_err(|e| ModelError::Build(format!("adapter: {e}")))?
        }
    };
    Ok(if role.trainable {
        model
    } else {
        model.no_grad()
    })
}

impl<B: Backend> DiffusionModel<B> for WanModel<B> {
    fn info(&self) -> ModelInfo {
        self.config.model_info()
    }

    fn forward(
        &self,
        latents: Tensor<B, 5>,
        timesteps: Tensor<B, 1>,
        text: Tensor<B, 3>,
    ) -> Tensor<B, 5> {
        WanModel::forward(self, latents, timesteps, text)
    }

    fn forward_hidden_states(
        &self,
        latents: Tensor<B, 5>,
        timesteps: Tensor<B, 1>,
        text: Tensor<B, 3>,
        blocks: &[usize],
    ) -> (Tensor<B, 5>, Vec<Tensor<B, 3>>) {
        WanModel::forward_hidden_states(self, latents, timesteps, text, blocks)
    }
}

impl<B: AutodiffBackend> TrainableModel<B> for WanModel<B> {
    fn valid(&self) -> Box<dyn DiffusionModel<B::InnerBackend>> {
        Box::new(AutodiffModule::valid(self))
    }

    /// Block-level activation checkpointing ([`WanModel::backward_checkpointed`]).
    fn backward_checkpointed(
        &self,
        latents: Tensor<B, 5>,
        timesteps: Tensor<B, 1>,
        text: Tensor<B, 3>,
        loss: LossFn<'_, B>,
        sink: &mut dyn FnMut(&B::Gradients),
    ) -> Tensor<B, 1> {
        WanModel::backward_checkpointed(self, latents, timesteps, text, loss, sink)
    }
}
