//! Role configuration: `[models.<role>]` tables.
//!
//! A role table holds the keys every role shares (`weights`, `trainable`, `adapter`,
//! `optimizer`, ...) and the keys of its architecture (`arch = "wan"` with `preset`,
//! `attention`, ...), which the architecture's [`ModelConfig`] parses with its own unknown-key
//! check.

use std::fmt::Debug;
use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::config::{check, ConfigError};
use crate::model::ModelConfig;
use crate::optim::OptimizerPatch;

/// Serializable configuration of a model adapter (`[models.<role>.adapter] kind = "lora"`).
/// The architecture that builds the role applies it (downcasting with [`Self::as_any`]), or
/// rejects an adapter it does not support.
#[typetag::serde(tag = "kind")]
pub trait AdapterConfig: Debug + Send + Sync {
    /// Check values; keys relative to the adapter table.
    fn validate(&self) -> Result<(), ConfigError>;
    /// Downcast support for the model crates that apply adapters.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// The keys every role table has, whatever its architecture.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleKeys {
    /// Weights to load: a diffusers `transformer/` folder or a `.safetensors` file. Without it,
    /// the model is initialised from `init_seed`.
    #[serde(default)]
    pub weights: Option<PathBuf>,
    /// Seed for random initialisation when no `weights` are given (default: the run seed).
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
    /// activations (block-level activation checkpointing; every built-in method supports it).
    #[serde(default)]
    pub gradient_checkpointing: bool,
}

/// Names of the [`RoleKeys`] fields: every other key of a role table is the architecture's.
const ROLE_KEYS: [&str; 7] = [
    "weights",
    "init_seed",
    "trainable",
    "adapter",
    "optimizer",
    "max_grad_norm",
    "gradient_checkpointing",
];

/// One role model (`[models.student]`, `[models.teacher]`, ...).
#[derive(Debug)]
pub struct RoleConfig {
    /// The architecture and its keys (`arch = "wan"`, `preset`, `attention`, ...).
    pub model: Box<dyn ModelConfig>,
    /// The keys every role has.
    pub keys: RoleKeys,
}

impl std::ops::Deref for RoleConfig {
    type Target = RoleKeys;
    fn deref(&self) -> &RoleKeys {
        &self.keys
    }
}

impl RoleConfig {
    /// The architecture name (`arch`).
    pub fn arch(&self) -> &'static str {
        self.model.typetag_name()
    }

    /// Check values; keys relative to the role table.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.model.validate()?;
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
        if let Some(p) = &self.optimizer {
            p.validate().map_err(|e| e.in_section("optimizer"))?;
        }
        if let Some(n) = self.max_grad_norm {
            check::positive_f64("max_grad_norm", n)?;
        }
        Ok(())
    }
}

impl<'de> Deserialize<'de> for RoleConfig {
    /// Split the table: the shared keys into [`RoleKeys`], the rest (with `arch`) into the
    /// architecture's config.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut arch = toml::Table::deserialize(d)?;
        let mut shared = toml::Table::new();
        for key in ROLE_KEYS {
            if let Some(v) = arch.remove(key) {
                shared.insert(key.to_string(), v);
            }
        }
        let keys = RoleKeys::deserialize(toml::Value::Table(shared)).map_err(D::Error::custom)?;
        let top: Vec<String> = arch.keys().cloned().collect();
        let model = Box::<dyn ModelConfig>::deserialize(toml::Value::Table(arch))
            .map_err(|e| D::Error::custom(with_role_keys(e.to_string(), &top)))?;
        Ok(RoleConfig { model, keys })
    }
}

/// An architecture's "unknown field `x`, expected one of `a`, `b`" with the keys it does not
/// know but every role table takes (`arch` and [`ROLE_KEYS`]) added to the list: a mistyped
/// `trainable` is shown its spelling. Other messages are returned as they are, and so is one
/// about a field that is not among the role table's own keys `top` (a table nested in the
/// architecture's config, whose keys are its own).
fn with_role_keys(message: String, top: &[String]) -> String {
    let Some(rest) = message.strip_prefix("unknown field `") else {
        return message;
    };
    let Some((field, _)) = rest
        .split_once('`')
        .filter(|(f, _)| top.iter().any(|k| k == f))
    else {
        return message;
    };
    // Backquoted names alternate with the text between them: the field, then the list.
    let listed = message.split('`').skip(3).step_by(2);
    let keys: Vec<String> = (std::iter::once("arch").chain(listed).chain(ROLE_KEYS))
        .map(|k| format!("`{k}`"))
        .collect();
    format!(
        "unknown field `{field}`, expected one of {}",
        keys.join(", ")
    )
}

impl Serialize for RoleConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error;
        let mut table = match toml::Value::try_from(&self.model).map_err(S::Error::custom)? {
            toml::Value::Table(t) => t,
            other => return Err(S::Error::custom(format!("model config as {other}"))),
        };
        if let toml::Value::Table(keys) =
            toml::Value::try_from(&self.keys).map_err(S::Error::custom)?
        {
            table.extend(keys);
        }
        table.serialize(s)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_keys_are_added_only_for_a_field_of_the_role_table() {
        let msg = "unknown field `trainabel`, expected one of `preset`, `config`".to_string();
        let top = ["preset".to_string(), "trainabel".to_string()];
        let listed = with_role_keys(msg.clone(), &top);
        let head = "unknown field `trainabel`, expected one of `arch`, `preset`, `config`, `";
        assert!(listed.starts_with(head), "{listed}");
        assert!(
            ROLE_KEYS.iter().all(|k| listed.contains(&format!("`{k}`"))),
            "{listed}"
        );
        // The same message from a table nested in the architecture's config: its own keys.
        assert_eq!(with_role_keys(msg.clone(), &top[..1]), msg);
        let other = "invalid type: integer `3`, expected a string".to_string();
        assert_eq!(with_role_keys(other.clone(), &top), other);
    }
}
