//! [`Umt5Config`]: the transformers `UMT5Config` `config.json`, read as is.
//!
//! Upstream: transformers `src/transformers/models/umt5/configuration_umt5.py` (field
//! names, defaults, and `feed_forward_proj` deciding the FFN: `"gated-gelu"` is a gated
//! FFN with `gelu_new`, `"relu"` a plain one with ReLU).

use std::collections::BTreeMap;
use std::path::Path;

use reel_core::config::check;
use serde::{Deserialize, Serialize};

/// Why a [`Umt5Config`] cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Umt5ConfigError {
    /// The file could not be read.
    #[error("cannot read UMT5 config `{path}`: {error}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error (printed in the message, so not returned as the source).
        error: std::io::Error,
    },
    /// The file is not a valid `config.json`.
    #[error("invalid UMT5 config `{path}`: {message}")]
    Parse {
        /// The file.
        path: String,
        /// What serde reported.
        message: String,
    },
    /// The values are inconsistent or unsupported (every problem listed, naming its key).
    #[error("invalid UMT5 config `{path}`:\n  {}", .problems.join("\n  "))]
    Invalid {
        /// The file (`<string>` when parsed from a string).
        path: String,
        /// One line per problem.
        problems: Vec<String>,
    },
}

/// The feed-forward activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `max(x, 0)`.
    Relu,
    /// Exact GELU `x * Φ(x)` (erf form).
    Gelu,
    /// The tanh approximation `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`
    /// (transformers `gelu_new`, also `gelu_pytorch_tanh`).
    GeluNew,
    /// `x * sigmoid(x)`.
    Silu,
}

impl Activation {
    /// The activation transformers' `ACT2FN[name]` gives.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "relu" => Some(Self::Relu),
            "gelu" => Some(Self::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" => Some(Self::GeluNew),
            "silu" | "swish" => Some(Self::Silu),
            _ => None,
        }
    }
}

/// Configuration of a UMT5 encoder with transformers' field names and defaults, so that a
/// `text_encoder/config.json` deserializes as is. Fields this struct does not name are kept
/// in [`Umt5Config::extra`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Umt5Config {
    /// Token vocabulary size (rows of `shared.weight`).
    #[serde(default = "default_vocab")]
    pub vocab_size: usize,
    /// Model width.
    #[serde(default = "default_d_model")]
    pub d_model: usize,
    /// Width of one attention head.
    #[serde(default = "default_d_kv")]
    pub d_kv: usize,
    /// Hidden width of the feed-forward network.
    #[serde(default = "default_d_ff")]
    pub d_ff: usize,
    /// Number of encoder blocks.
    #[serde(default = "default_num_layers")]
    pub num_layers: usize,
    /// Attention heads.
    #[serde(default = "default_num_heads")]
    pub num_heads: usize,
    /// Relative-position buckets of every layer's `relative_attention_bias`.
    #[serde(default = "default_buckets")]
    pub relative_attention_num_buckets: usize,
    /// Distance from which all relative positions share the last bucket.
    #[serde(default = "default_max_distance")]
    pub relative_attention_max_distance: usize,
    /// Epsilon of the T5 layer norms.
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f64,
    /// `"[gated-]<activation>"`; decides the FFN.
    #[serde(default = "default_ff_proj")]
    pub feed_forward_proj: String,
    /// Dropout rate (inference only here, so it has no effect).
    #[serde(default)]
    pub dropout_rate: f64,
    /// `"umt5"` (T5 and mT5 share one relative bias across layers and are not this model).
    #[serde(default)]
    pub model_type: Option<String>,
    /// Any other field found in the file, kept verbatim.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

fn default_vocab() -> usize {
    250112
}
fn default_d_model() -> usize {
    512
}
fn default_d_kv() -> usize {
    64
}
fn default_d_ff() -> usize {
    1024
}
fn default_num_layers() -> usize {
    8
}
fn default_num_heads() -> usize {
    6
}
fn default_buckets() -> usize {
    32
}
fn default_max_distance() -> usize {
    128
}
fn default_eps() -> f64 {
    1e-6
}
fn default_ff_proj() -> String {
    "gated-gelu".into()
}

impl Umt5Config {
    /// Parse and validate a `config.json` string.
    pub fn from_json_str(json: &str) -> Result<Self, Umt5ConfigError> {
        Self::parse(json, "<string>")
    }

    /// Read and validate a `config.json` file.
    pub fn from_json_file(path: impl AsRef<Path>) -> Result<Self, Umt5ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|error| Umt5ConfigError::Io {
            path: path.display().to_string(),
            error,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    fn parse(json: &str, path: &str) -> Result<Self, Umt5ConfigError> {
        let config: Self = serde_json::from_str(json).map_err(|e| Umt5ConfigError::Parse {
            path: path.to_string(),
            message: e.to_string(),
        })?;
        let problems = config.problems();
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(Umt5ConfigError::Invalid {
                path: path.to_string(),
                problems,
            })
        }
    }

    /// Check the values; every problem is listed, naming its key.
    pub fn validate(&self) -> Result<(), Umt5ConfigError> {
        let problems = self.problems();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Umt5ConfigError::Invalid {
                path: "<config>".into(),
                problems,
            })
        }
    }

    fn problems(&self) -> Vec<String> {
        let mut errs = Vec::new();
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("d_model", self.d_model),
            ("d_kv", self.d_kv),
            ("d_ff", self.d_ff),
            ("num_heads", self.num_heads),
            ("num_layers", self.num_layers),
        ] {
            if v == 0 {
                errs.push(format!("`{name}` must be positive"));
            }
        }
        errs.extend(self.sizes_above_limits());
        // Bidirectional buckets: half per direction, half of those exact.
        let max_exact = self.relative_attention_num_buckets / 4;
        if max_exact == 0 {
            errs.push(format!(
                "`relative_attention_num_buckets` must be at least 4, got {}",
                self.relative_attention_num_buckets
            ));
        } else if self.relative_attention_max_distance <= max_exact {
            errs.push(format!(
                "`relative_attention_max_distance` = {} must exceed the exact range \
                 relative_attention_num_buckets / 4 = {max_exact}",
                self.relative_attention_max_distance
            ));
        }
        if !(self.layer_norm_epsilon.is_finite() && self.layer_norm_epsilon > 0.0) {
            errs.push(format!(
                "`layer_norm_epsilon` must be positive, got {}",
                self.layer_norm_epsilon
            ));
        }
        if let Err(e) = self.ffn() {
            errs.push(e);
        }
        match self.model_type.as_deref() {
            None | Some("umt5") => {}
            Some(other) => errs.push(format!(
                "`model_type` is `{other}`; only `umt5` (a relative attention bias in every \
                 layer) is supported"
            )),
        }
        if let Some(name) = self.extra.get("_class_name") {
            errs.push(format!(
                "`_class_name` is {name}: a diffusers model's config, not a transformers \
                 UMT5 encoder's (`model_type` \"umt5\")"
            ));
        }
        errs
    }

    /// The sizes above their limit ([`check::sizes_above`]): a vocabulary of 2^22, a width
    /// of 2^16, attention of 2^17 channels (`num_heads × d_kv`, however split), an FFN of
    /// 2^20, 1024 layers and 2^16 position buckets (UMT5-XXL: a vocabulary of 256384, width
    /// 4096, 24 layers, FFN 10240).
    fn sizes_above_limits(&self) -> Vec<String> {
        check::sizes_above(&[
            ("vocab_size", self.vocab_size, 1 << 22),
            ("d_model", self.d_model, 1 << 16),
            (
                "num_heads × d_kv",
                self.num_heads.saturating_mul(self.d_kv),
                1 << 17,
            ),
            ("d_ff", self.d_ff, 1 << 20),
            ("num_layers", self.num_layers, 1024),
            (
                "relative_attention_num_buckets",
                self.relative_attention_num_buckets,
                1 << 16,
            ),
        ])
    }

    /// `(gated, activation)` from `feed_forward_proj`, as transformers derives
    /// `is_gated_act` and `dense_act_fn` (`"gated-gelu"` means `gelu_new`).
    pub fn ffn(&self) -> Result<(bool, Activation), String> {
        let proj = self.feed_forward_proj.as_str();
        let parts: Vec<&str> = proj.split('-').collect();
        let (gated, name) = match parts.as_slice() {
            ["gated", "gelu"] => (true, "gelu_new"),
            ["gated", act] => (true, *act),
            [act] => (false, *act),
            _ => {
                return Err(format!(
                    "`feed_forward_proj` = `{proj}` is not `[gated-]<act>`"
                ))
            }
        };
        Activation::from_name(name)
            .map(|a| (gated, a))
            .ok_or_else(|| format!("`feed_forward_proj` = `{proj}`: unknown activation `{name}`"))
    }

    /// `num_heads * d_kv`, the width of the attention projections.
    pub fn inner_dim(&self) -> usize {
        self.num_heads * self.d_kv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_transformers_config() {
        let c = Umt5Config::from_json_str(
            r#"{"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4,
                "vocab_size": 300, "model_type": "umt5", "feed_forward_proj": "gated-gelu",
                "tie_word_embeddings": true}"#,
        )
        .unwrap();
        assert_eq!(c.ffn(), Ok((true, Activation::GeluNew)));
        assert_eq!(c.inner_dim(), 32);
        assert_eq!(c.relative_attention_num_buckets, 32);
        assert_eq!(c.extra["tie_word_embeddings"], serde_json::json!(true));
    }

    #[test]
    fn every_problem_names_its_key() {
        let msg = Umt5Config::from_json_str(
            r#"{"d_model": 0, "num_layers": 0, "relative_attention_num_buckets": 2,
                "feed_forward_proj": "gated-tanh", "model_type": "t5"}"#,
        )
        .unwrap_err()
        .to_string();
        for key in [
            "d_model",
            "num_layers",
            "relative_attention_num_buckets",
            "feed_forward_proj",
            "model_type",
        ] {
            assert!(msg.contains(&format!("`{key}`")), "{key} not in: {msg}");
        }
    }

    #[test]
    fn sizes_far_beyond_released_models_are_refused_by_key() {
        let msg = Umt5Config::from_json_str(
            r#"{"d_model": 32, "d_kv": 1099511627776, "d_ff": 64, "num_layers": 100000000,
                "num_heads": 1099511627776, "vocab_size": 300}"#,
        )
        .unwrap_err()
        .to_string();
        for key in [
            "`num_heads × d_kv` is too large to count, above the limit 131072",
            "`num_layers` = 100000000",
        ] {
            assert!(msg.contains(key), "{key} not in: {msg}");
        }
        assert!(!msg.contains("`vocab_size`"), "{msg}");
        let at_limits = r#"{"d_model": 65536, "d_kv": 128, "d_ff": 1048576, "num_layers": 1024,
            "num_heads": 1024, "vocab_size": 4194304, "relative_attention_num_buckets": 65536,
            "relative_attention_max_distance": 100000}"#;
        Umt5Config::from_json_str(at_limits).unwrap();
    }

    /// A diffusers model's config (a VAE folder given as the text encoder) is called that,
    /// not read as a UMT5 of default sizes.
    #[test]
    fn a_diffusers_config_is_not_a_text_encoder() {
        let msg = Umt5Config::from_json_str(r#"{"_class_name": "AutoencoderKLWan", "z_dim": 4}"#)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("`_class_name`") && msg.contains("not a transformers UMT5"),
            "{msg}"
        );
    }
}
