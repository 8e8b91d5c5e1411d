//! [`LoraSpec`]: the `[models.<role>.adapter] kind = "lora"` table and what
//! [`apply_lora`](super::apply_lora) applies.
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

use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use reel_core::config::{check, ConfigError};
use reel_core::role::AdapterConfig;

use super::apply::{is_known_target, WAN_LINEAR_MODULES};

/// A low-rank adaptation (LoRA, Hu et al. 2021) of a model's linear layers, as PEFT's
/// `LoraConfig` describes it.
///
/// Each targeted linear layer `y = W x + b` becomes `y = W x + b + (alpha / rank) · B (A x)`
/// with `A [rank, in]` and `B [out, rank]`; only `A` and `B` are trained, the base weights
/// are frozen.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
    /// The attention projections of every block, PEFT's usual choice for diffusion
    /// transformers (and the targets of the golden fixture): the default `target_modules`.
    pub fn default_targets() -> Vec<String> {
        ["to_q", "to_k", "to_v", "to_out.0"]
            .map(String::from)
            .to_vec()
    }

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
        // The scale multiplies float32 activations: far outside this range it becomes 0
        // (nothing trains) or infinity (NaN from the first forward).
        let scale = self.alpha / self.rank as f64;
        if !(1e-6..=1e6).contains(&scale) {
            return Err(ConfigError::new(
                "alpha",
                format!(
                    "expected alpha / rank (the LoRA scale) in [1e-6, 1e6], got {} / {} = {scale:e}",
                    self.alpha, self.rank
                ),
            ));
        }
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

#[reel_core::plugin(
    name = "lora",
    summary = "Low-rank adapters (PEFT layout) on the role's linear layers; base weights frozen"
)]
impl AdapterConfig for LoraSpec {
    /// [`LoraSpec::validate`], and every target names a linear layer of the Wan model.
    fn validate(&self) -> Result<(), ConfigError> {
        LoraSpec::validate(self)?;
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
}

/// The keys of the `lora` table.
const FIELDS: &[&str] = &["rank", "alpha", "target_modules", "dropout", "init_seed"];

impl<'de> Deserialize<'de> for LoraSpec {
    /// The TOML table: `rank` required; `alpha` defaults to `rank`, `target_modules` to
    /// [`LoraSpec::default_targets`], `dropout` to 0, `init_seed` to none; unknown keys are
    /// rejected.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(SpecVisitor)
    }
}

struct SpecVisitor;

impl<'de> Visitor<'de> for SpecVisitor {
    type Value = LoraSpec;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a LoRA table")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LoraSpec, A::Error> {
        let mut rank = None;
        let mut spec = LoraSpec::new(0, LoraSpec::default_targets());
        let mut alpha = None;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "rank" => rank = Some(map.next_value()?),
                "alpha" => alpha = Some(map.next_value()?),
                "target_modules" => spec.target_modules = map.next_value()?,
                "dropout" => spec.dropout = map.next_value()?,
                "init_seed" => spec.init_seed = map.next_value()?,
                other => return Err(de::Error::unknown_field(other, FIELDS)),
            }
        }
        spec.rank = rank.ok_or_else(|| de::Error::missing_field("rank"))?;
        spec.alpha = alpha.unwrap_or(spec.rank as f64);
        Ok(spec)
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

    fn parse(text: &str) -> Result<Box<dyn AdapterConfig>, String> {
        toml::from_str::<Box<dyn AdapterConfig>>(text).map_err(|e| e.to_string())
    }

    fn spec_of(a: &dyn AdapterConfig) -> &LoraSpec {
        a.as_any().downcast_ref::<LoraSpec>().unwrap()
    }

    #[test]
    fn defaults_follow_peft() {
        let a = parse("kind = \"lora\"\nrank = 8").unwrap();
        let spec = spec_of(&*a);
        assert_eq!(
            (spec.rank, spec.alpha, spec.dropout, spec.init_seed),
            (8, 8.0, 0.0, None)
        );
        assert_eq!(spec.target_modules, LoraSpec::default_targets());
        assert!(a.validate().is_ok());
        let b = parse("kind = \"lora\"\nrank = 4\nalpha = 8\ntarget_modules = [\"attn1.to_q\", \"blocks.1.ffn.net.2\"]\ninit_seed = 3").unwrap();
        assert!(b.validate().is_ok());
        assert_eq!(spec_of(&*b).scaling(), 2.0);
        assert_eq!(spec_of(&*b).init_seed, Some(3));
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
        // A scale float32 would make infinite, or 0.
        for alpha in [1e40, 1e-9] {
            let e = LoraSpec {
                alpha,
                ..ok.clone()
            }
            .validate()
            .unwrap_err();
            assert_eq!(e.key, "alpha");
            assert!(e.to_string().contains("alpha / rank"), "{e}");
        }
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
