//! `[models.<role>.adapter] kind = "lora"`: train a low-rank adapter instead of the whole
//! role model.
//!
//! ```toml
//! [models.student.adapter]
//! kind = "lora"
//! rank = 8
//! alpha = 8                                          # default: rank (scale 1)
//! target_modules = ["to_q", "to_k", "to_v", "to_out.0"]   # the default
//! init_seed = 0                                      # default: derived from the run seed
//! ```
//!
//! The role must be trainable. Its base weights are frozen (no gradients, no optimizer state,
//! not in checkpoints); the adapter's `lora_A` / `lora_B` weights are trained, checkpointed
//! under their PEFT names and exported with `reel export --format lora` as a diffusers
//! `pytorch_lora_weights.safetensors`.
//!
//! `target_modules` follow PEFT: an entry adapts every linear layer whose module path equals
//! it or ends with `.<entry>` (`"to_q"` adapts the self- and cross-attention queries of every
//! block; `"attn1.to_q"` only the self-attention ones; `"blocks.0.ffn.net.2"` one layer).
//! `A` starts like PEFT's default (`kaiming_uniform_(a=sqrt(5))`), `B` at zero, so training
//! starts from the base model's outputs.

use serde::{Deserialize, Serialize};

use reel_core::config::ConfigError;
use reel_core::role::{AdapterConfig, LoraSpec};
use reel_models::lora::{is_known_target, WAN_LINEAR_MODULES};

/// The `lora` adapter table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    /// Rank `r` of the update (>= 1).
    pub rank: usize,
    /// Scale numerator: the update is multiplied by `alpha / rank` (> 0; default `rank`).
    #[serde(default)]
    pub alpha: Option<f64>,
    /// Linear layers to adapt (PEFT suffix rule).
    #[serde(default = "default_targets")]
    pub target_modules: Vec<String>,
    /// Dropout on the adapter input during training. Only 0 is supported for now: masks
    /// would need per-step seeded randomness for resumed runs to stay exact.
    #[serde(default)]
    pub dropout: f64,
    /// Seed of the initial `A` matrices (default: derived from `[runtime] seed`).
    #[serde(default)]
    pub init_seed: Option<u64>,
}

/// The attention projections of every block, PEFT's usual choice for diffusion
/// transformers (and the targets of the golden fixture).
pub fn default_targets() -> Vec<String> {
    ["to_q", "to_k", "to_v", "to_out.0"]
        .map(String::from)
        .to_vec()
}

impl LoraConfig {
    /// A config with `rank` and every other value at its default.
    pub fn new(rank: usize) -> Self {
        Self {
            rank,
            alpha: None,
            target_modules: default_targets(),
            dropout: 0.0,
            init_seed: None,
        }
    }

    /// The architecture-neutral spec the model crate applies.
    pub fn spec(&self) -> LoraSpec {
        LoraSpec {
            rank: self.rank,
            alpha: self.alpha.unwrap_or(self.rank as f64),
            target_modules: self.target_modules.clone(),
            dropout: self.dropout,
            init_seed: self.init_seed,
        }
    }
}

#[typetag::serde(name = "lora")]
impl AdapterConfig for LoraConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        self.spec().validate()?;
        for (i, t) in self.target_modules.iter().enumerate() {
            if !is_known_target(t) {
                let names: Vec<String> = WAN_LINEAR_MODULES
                    .iter()
                    .map(|p| p.replace("blocks.{}.", ""))
                    .collect();
                return Err(ConfigError::new(
                    format!("target_modules[{i}]"),
                    format!(
                        "`{t}` is not a linear layer of the Wan model; a target must be a module \
                         path or a suffix of one, e.g. one of {names:?}"
                    ),
                ));
            }
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn lora(&self) -> Option<LoraSpec> {
        Some(self.spec())
    }
}

reel_core::register_plugin!(
    Adapter,
    "lora",
    "Low-rank adapters (PEFT layout) on the role's linear layers; base weights frozen"
);

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Box<dyn AdapterConfig>, String> {
        toml::from_str::<Box<dyn AdapterConfig>>(text).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_follow_peft() {
        let a = parse("kind = \"lora\"\nrank = 8").unwrap();
        let spec = a.lora().unwrap();
        assert_eq!(
            (spec.rank, spec.alpha, spec.dropout, spec.init_seed),
            (8, 8.0, 0.0, None)
        );
        assert_eq!(spec.target_modules, default_targets());
        assert!(a.validate().is_ok());
        let b = parse("kind = \"lora\"\nrank = 4\nalpha = 8\ntarget_modules = [\"attn1.to_q\", \"blocks.1.ffn.net.2\"]\ninit_seed = 3").unwrap();
        assert!(b.validate().is_ok());
        assert_eq!(b.lora().unwrap().scaling(), 2.0);
        assert_eq!(
            b.as_any().downcast_ref::<LoraConfig>().unwrap().init_seed,
            Some(3)
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        let key = |text: &str| parse(text).unwrap().validate().unwrap_err().key;
        assert_eq!(key("kind = \"lora\"\nrank = 0"), "rank");
        assert_eq!(key("kind = \"lora\"\nrank = 2\nalpha = -1.0"), "alpha");
        assert_eq!(
            key("kind = \"lora\"\nrank = 2\ntarget_modules = []"),
            "target_modules"
        );
        assert_eq!(
            key("kind = \"lora\"\nrank = 2\ntarget_modules = [\"to_q\", \"to_x\"]"),
            "target_modules[1]"
        );
        assert_eq!(key("kind = \"lora\"\nrank = 2\ndropout = 0.1"), "dropout");
        let err = parse("kind = \"lora\"\nrank = 2\nranks = 3").unwrap_err();
        assert!(err.contains("ranks"), "{err}");
    }
}
