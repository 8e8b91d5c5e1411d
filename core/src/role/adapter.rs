//! Adapter specifications shared by the adapter plugins (which parse them from
//! `[models.<role>.adapter]`) and the model crates (which apply them).
//!
//! The adapter plugin turns its TOML table into a backend- and architecture-neutral spec
//! ([`LoraSpec`]) through [`AdapterConfig::lora`](crate::role::AdapterConfig::lora); the
//! model crate that builds the role applies the spec to its modules. Keeping the spec here
//! lets both sides agree on one type without the plugin crate depending on model internals.

use serde::{Deserialize, Serialize};

use crate::config::{check, ConfigError};

/// A low-rank adaptation (LoRA, Hu et al. 2021) of a model's linear layers, as PEFT's
/// `LoraConfig` describes it.
///
/// Each targeted linear layer `y = W x + b` becomes `y = W x + b + (alpha / rank) · B (A x)`
/// with `A [rank, in]` and `B [out, rank]`; only `A` and `B` are trained, the base weights
/// are frozen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraSpec {
    /// Rank `r` of the update (rows of `A`, columns of `B`), at least 1.
    pub rank: usize,
    /// Scale numerator: the update is multiplied by `alpha / rank` (PEFT `lora_alpha`).
    pub alpha: f64,
    /// Module names to adapt, with PEFT's list semantics: a module whose dotted path equals
    /// an entry or ends with `"." + entry` is adapted (`"to_q"` adapts every `…attn1.to_q`
    /// and `…attn2.to_q`; `"attn1.to_q"` only the self-attention ones).
    pub target_modules: Vec<String>,
    /// Dropout probability on the LoRA input during training (PEFT `lora_dropout`).
    pub dropout: f64,
    /// Seed of the initial `A` matrices; `None` derives one from the run seed.
    pub init_seed: Option<u64>,
}

impl LoraSpec {
    /// A spec with PEFT's defaults for everything but `rank` and the targets: `alpha =
    /// rank` (scale 1), no dropout, seed from the run.
    pub fn new(rank: usize, target_modules: Vec<String>) -> Self {
        Self {
            rank,
            alpha: rank as f64,
            target_modules,
            dropout: 0.0,
            init_seed: None,
        }
    }

    /// The factor `alpha / rank` the low-rank update is multiplied by.
    pub fn scaling(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// Whether the module at dotted path `module_path` is targeted (PEFT list semantics:
    /// equal to an entry, or ending with `"." + entry`).
    pub fn targets(&self, module_path: &str) -> bool {
        self.target_modules
            .iter()
            .any(|t| target_matches(module_path, t))
    }

    /// Check the architecture-independent values; keys relative to the adapter table
    /// (`rank`, `alpha`, `target_modules`, `dropout`).
    ///
    /// Dropout is rejected when positive: a dropout mask must come from the run's seeded
    /// generators (so that resumed runs repeat exactly), which the layers do not receive yet.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check::positive_usize("rank", self.rank)?;
        check::positive_f64("alpha", self.alpha)?;
        if self.target_modules.is_empty() {
            return Err(ConfigError::new(
                "target_modules",
                "expected at least one module name, e.g. [\"to_q\", \"to_k\", \"to_v\", \"to_out.0\"]",
            ));
        }
        if let Some(t) = self.target_modules.iter().find(|t| t.trim().is_empty()) {
            return Err(ConfigError::new(
                "target_modules",
                format!("empty module name {t:?}"),
            ));
        }
        check::in_half_open("dropout", self.dropout, 0.0, 1.0)?;
        if self.dropout > 0.0 {
            return Err(ConfigError::new(
                "dropout",
                format!(
                    "LoRA dropout is not supported yet (got {}): masks would need per-step seeded \
                     randomness to keep resumed runs exact; set `dropout = 0`",
                    self.dropout
                ),
            ));
        }
        Ok(())
    }
}

/// PEFT's rule for one `target_modules` entry: the module at `module_path` is targeted when
/// its path equals `target` or ends with `"." + target`.
pub fn target_matches(module_path: &str, target: &str) -> bool {
    module_path == target
        || (module_path.len() > target.len()
            && module_path.ends_with(target)
            && module_path.as_bytes()[module_path.len() - target.len() - 1] == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peft_suffix_semantics_and_scaling() {
        let s = LoraSpec {
            alpha: 8.0,
            ..LoraSpec::new(4, vec!["to_q".into(), "attn2.to_out.0".into()])
        };
        assert_eq!(s.scaling(), 2.0);
        assert!(s.targets("blocks.0.attn1.to_q"));
        assert!(s.targets("to_q"));
        assert!(!s.targets("blocks.0.attn1.xto_q"));
        assert!(s.targets("blocks.1.attn2.to_out.0"));
        assert!(!s.targets("blocks.1.attn1.to_out.0"));
        assert_eq!(LoraSpec::new(3, vec![]).scaling(), 1.0);
        assert!(target_matches("a.b.c", "b.c") && !target_matches("a.bb.c", "b.c"));
    }

    #[test]
    fn validate_names_the_key() {
        let ok = LoraSpec::new(4, vec!["to_q".into()]);
        assert!(ok.validate().is_ok());
        let key = |s: LoraSpec| s.validate().unwrap_err().key;
        assert_eq!(
            key(LoraSpec {
                rank: 0,
                ..ok.clone()
            }),
            "rank"
        );
        assert_eq!(
            key(LoraSpec {
                alpha: 0.0,
                ..ok.clone()
            }),
            "alpha"
        );
        assert_eq!(
            key(LoraSpec {
                alpha: f64::NAN,
                ..ok.clone()
            }),
            "alpha"
        );
        assert_eq!(
            key(LoraSpec {
                target_modules: vec![],
                ..ok.clone()
            }),
            "target_modules"
        );
        assert_eq!(
            key(LoraSpec {
                target_modules: vec![" ".into()],
                ..ok.clone()
            }),
            "target_modules"
        );
        assert_eq!(
            key(LoraSpec {
                dropout: 1.5,
                ..ok.clone()
            }),
            "dropout"
        );
        let msg = LoraSpec { dropout: 0.1, ..ok }
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("not supported") && !msg.contains('\n'),
            "{msg}"
        );
    }
}
