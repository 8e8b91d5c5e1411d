//! Role configuration: `[models.<role>]` tables.

use std::fmt::Debug;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::{check, ConfigError};
use crate::optim::OptimizerPatch;

/// Serializable configuration of a model adapter (`[models.<role>.adapter] kind = "lora"`).
#[typetag::serde(tag = "kind")]
pub trait AdapterConfig: Debug + Send + Sync {
    /// Check values; keys relative to the adapter table.
    fn validate(&self) -> Result<(), ConfigError>;
    /// Downcast support for the model crates that apply adapters.
    fn as_any(&self) -> &dyn std::any::Any;
    /// The LoRA this adapter describes, if it is one (the model crates apply it when they
    /// build the role). Adapters of other kinds keep the default `None`.
    fn lora(&self) -> Option<super::LoraSpec> {
        None
    }
}

/// Query length from which [`AttentionMode::Auto`] switches to the memory-efficient kernel.
pub const AUTO_MIN_TOKENS: usize = 1024;

/// Which attention implementation the model uses (`[models.<role>] attention = "..."`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionMode {
    /// Memory-efficient when the query has at least [`AUTO_MIN_TOKENS`] tokens, plain below.
    #[default]
    Auto,
    /// Always the plain `softmax(QKᵀ/√d)·V` (materialises the score matrix).
    Naive,
    /// Always the blocked kernel with its own backward.
    MemoryEfficient,
    /// Reel's fused CubeCL attention kernels (forward and backward) on the `cuda` and `wgpu`
    /// backends, with or without Burn's fusion layer (cargo feature `fusion`); the
    /// memory-efficient blocked version on every other backend.
    Fused,
}

impl AttentionMode {
    /// Whether this mode uses the memory-efficient kernel for `seq_q` query tokens.
    pub fn use_memory_efficient(self, seq_q: usize) -> bool {
        match self {
            AttentionMode::Auto => seq_q >= AUTO_MIN_TOKENS,
            AttentionMode::Naive => false,
            AttentionMode::MemoryEfficient | AttentionMode::Fused => true,
        }
    }
}

/// One role model (`[models.student]`, `[models.teacher]`, ...).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleConfig {
    /// Registered model architecture (`reel list` shows them), e.g. `"wan"`.
    pub arch: String,
    /// Named preset of the architecture (e.g. `"wan2.1-t2v-1.3b"`).
    #[serde(default)]
    pub preset: Option<String>,
    /// Path to an architecture config file (diffusers `config.json`) instead of a preset.
    #[serde(default)]
    pub config: Option<PathBuf>,
    /// Weights to load: a diffusers `transformer/` folder or a `.safetensors` file. Without it,
    /// the model is initialised from `init_seed`.
    #[serde(default)]
    pub weights: Option<PathBuf>,
    /// Seed for random initialisation when no `weights` are given.
    #[serde(default)]
    pub init_seed: Option<u64>,
    /// Whether the role is trained.
    #[serde(default)]
    pub trainable: bool,
    /// Optional adapter (e.g. LoRA); only the adapter weights are then trained.
    #[serde(default)]
    pub adapter: Option<Box<dyn AdapterConfig>>,
    /// Optimizer settings overriding `[optimizer]` for this role.
    #[serde(default)]
    pub optimizer: Option<OptimizerPatch>,
    /// Gradient clipping by global L2 norm for this role (overrides `training.max_grad_norm`).
    #[serde(default)]
    pub max_grad_norm: Option<f64>,
    /// Recompute each transformer block in the backward pass instead of keeping its
    /// activations (block-level activation checkpointing; methods that support it: `finetune`).
    #[serde(default)]
    pub gradient_checkpointing: bool,
    /// Attention implementation: `"auto"` (default: memory-efficient from
    /// [`AUTO_MIN_TOKENS`] query tokens), `"naive"`, `"memory_efficient"` or `"fused"` (the CubeCL
    /// kernels on `cuda`/`wgpu`).
    #[serde(default)]
    pub attention: AttentionMode,
}

impl RoleConfig {
    /// Check values that do not depend on the architecture; keys relative to the role table.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.preset.is_some() && self.config.is_some() {
            return Err(ConfigError::new(
                "config",
                "give either `preset` or `config`, not both",
            ));
        }
        if self.preset.is_none() && self.config.is_none() {
            return Err(ConfigError::new(
                "preset",
                "missing: give `preset = \"<name>\"` or `config = \"path/to/config.json\"`",
            ));
        }
        if let Some(a) = &self.adapter {
            if !self.trainable {
                return Err(ConfigError::new(
                    "adapter",
                    "an adapter is only allowed on a trainable role (set `trainable = true`)",
                ));
            }
            a.validate().map_err(|e| e.in_section("adapter"))?;
        }
        if !self.trainable {
            if self.optimizer.is_some() {
                return Err(ConfigError::new(
                    "optimizer",
                    "an optimizer is only allowed on a trainable role",
                ));
            }
            if self.gradient_checkpointing {
                return Err(ConfigError::new(
                    "gradient_checkpointing",
                    "only meaningful on a trainable role",
                ));
            }
        }
        if let Some(n) = self.max_grad_norm {
            check::positive_f64("max_grad_norm", n)?;
        }
        Ok(())
    }
}

/// What a method requires of its roles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleRequirement {
    /// Role name (`student`, `teacher`, ...).
    pub name: &'static str,
    /// `Some(true)`: must be trainable; `Some(false)`: must be frozen; `None`: either.
    pub trainable: Option<bool>,
    /// Whether the role may be omitted.
    pub optional: bool,
}

impl RoleRequirement {
    /// A required trainable role.
    pub const fn trainable(name: &'static str) -> Self {
        Self {
            name,
            trainable: Some(true),
            optional: false,
        }
    }
    /// A required frozen role.
    pub const fn frozen(name: &'static str) -> Self {
        Self {
            name,
            trainable: Some(false),
            optional: false,
        }
    }
}
