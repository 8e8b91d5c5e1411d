//! [`WanConfig`]: the diffusers `WanTransformer3DModel` `config.json`, read as is.

use std::collections::BTreeMap;
use std::path::Path;

use reel_core::config::check;
use serde::{Deserialize, Serialize};

/// Why a [`WanConfig`] cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum WanConfigError {
    /// The file could not be read.
    #[error("cannot read config `{path}`: {error}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error (printed in the message, so not returned as the source).
        error: std::io::Error,
    },
    /// The file is not a valid Wan `config.json`.
    #[error("invalid Wan config `{path}`: {message}")]
    Parse {
        /// The file.
        path: String,
        /// What serde reported.
        message: String,
    },
    /// The values are inconsistent or unsupported (every problem is listed).
    #[error("invalid Wan config:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
}

/// Configuration of a Wan video DiT, with the field names of diffusers'
/// `WanTransformer3DModel` so that a diffusers `transformer/config.json` deserializes as is.
///
/// `_class_name` and `_diffusers_version` are kept, and any other field diffusers writes that
/// this struct does not name is kept in [`WanConfig::extra`] and written back on save.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WanConfig {
    /// diffusers class name (`"WanTransformer3DModel"`).
    #[serde(
        rename = "_class_name",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub class_name: Option<String>,
    /// diffusers version that wrote the file.
    #[serde(
        rename = "_diffusers_version",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub diffusers_version: Option<String>,
    /// Patch size `(pt, ph, pw)` of the patch-embedding Conv3d.
    pub patch_size: [usize; 3],
    /// Number of attention heads.
    pub num_attention_heads: usize,
    /// Width of one attention head.
    pub attention_head_dim: usize,
    /// Latent channels in.
    pub in_channels: usize,
    /// Latent channels out.
    pub out_channels: usize,
    /// Width of the text-encoder embeddings (`encoder_hidden_states`).
    pub text_dim: usize,
    /// Width of the sinusoidal timestep embedding.
    pub freq_dim: usize,
    /// Hidden width of the feed-forward network.
    pub ffn_dim: usize,
    /// Number of transformer blocks.
    pub num_layers: usize,
    /// Affine LayerNorm before cross-attention (`norm2`) when true, identity otherwise.
    #[serde(default = "default_true")]
    pub cross_attn_norm: bool,
    /// Query/key norm name. diffusers accepts it but never reads it: the q/k RMSNorm across
    /// all heads is always on. Kept for round-tripping.
    #[serde(default)]
    pub qk_norm: Option<String>,
    /// Epsilon of every LayerNorm and RMSNorm.
    #[serde(default = "default_eps")]
    pub eps: f64,
    /// Image-embedding width of the I2V variant (not supported: must be `null`).
    #[serde(default)]
    pub image_dim: Option<usize>,
    /// Extra key/value projection width of the I2V variant (not supported: must be `null`).
    #[serde(default)]
    pub added_kv_proj_dim: Option<usize>,
    /// Length of the RoPE tables: every post-patch grid position must be below it.
    #[serde(default = "default_rope_len")]
    pub rope_max_seq_len: usize,
    /// Learned image position embedding of the FLF2V variant (not supported: must be `null`).
    #[serde(default)]
    pub pos_embed_seq_len: Option<usize>,
    /// Any other field found in the file, kept verbatim.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

fn default_true() -> bool {
    true
}
fn default_eps() -> f64 {
    1e-6
}
fn default_rope_len() -> usize {
    1024
}

/// How a head's channels are split between the three RoPE axes (time, height, width).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopeSplit {
    /// Channels rotated by the frame index.
    pub t: usize,
    /// Channels rotated by the row index.
    pub h: usize,
    /// Channels rotated by the column index.
    pub w: usize,
}

impl WanConfig {
    /// Model width `num_attention_heads * attention_head_dim`.
    pub fn inner_dim(&self) -> usize {
        self.num_attention_heads * self.attention_head_dim
    }

    /// Features per token produced by `proj_out`: `pt * ph * pw * out_channels`.
    pub fn out_features(&self) -> usize {
        self.patch_volume() * self.out_channels
    }

    /// `pt * ph * pw`.
    pub fn patch_volume(&self) -> usize {
        self.patch_size.iter().product()
    }

    /// diffusers' RoPE split of the head: `h = w = 2 * (head_dim / 6)`, `t = head_dim - h - w`.
    pub fn rope_split(&self) -> RopeSplit {
        let hw = 2 * (self.attention_head_dim / 6);
        RopeSplit {
            t: self.attention_head_dim.saturating_sub(2 * hw),
            h: hw,
            w: hw,
        }
    }

    /// Parse a diffusers `config.json` string.
    pub fn from_json_str(json: &str) -> Result<Self, WanConfigError> {
        serde_json::from_str(json).map_err(|e| WanConfigError::Parse {
            path: "<string>".into(),
            message: e.to_string(),
        })
    }

    /// Read a diffusers `config.json` file (values are not validated; see [`Self::validate`]).
    pub fn from_json_file(path: impl AsRef<Path>) -> Result<Self, WanConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|error| WanConfigError::Io {
            path: path.display().to_string(),
            error,
        })?;
        serde_json::from_str(&text).map_err(|e| WanConfigError::Parse {
            path: path.display().to_string(),
            message: e.to_string(),
        })
    }

    /// The config as pretty JSON in the diffusers layout.
    pub fn to_json_string(&self) -> String {
        serde_json::to_string_pretty(self).expect("WanConfig serializes")
    }

    /// The sizes above their limit ([`check::sizes_above`]): 1024 layers, a width
    /// (`num_attention_heads × attention_head_dim`, however split) of 2^17, an FFN of 2^20,
    /// text embeddings of 2^17, 4096 latent channels, patches of 64, and 2^16 for the timestep
    /// embedding and the RoPE tables (Wan2.1-14B: 40 layers of width 5120, FFN 13824).
    fn sizes_above_limits(&self) -> Vec<String> {
        let width = (self.num_attention_heads).saturating_mul(self.attention_head_dim);
        let patch = self.patch_size.iter().copied().max().unwrap_or(0);
        check::sizes_above(&[
            ("num_layers", self.num_layers, 1024),
            ("num_attention_heads × attention_head_dim", width, 1 << 17),
            ("ffn_dim", self.ffn_dim, 1 << 20),
            ("text_dim", self.text_dim, 1 << 17),
            ("in_channels", self.in_channels, 4096),
            ("out_channels", self.out_channels, 4096),
            ("max(patch_size)", patch, 64),
            ("freq_dim", self.freq_dim, 1 << 16),
            ("rope_max_seq_len", self.rope_max_seq_len, 1 << 16),
        ])
    }

    /// Check that the values describe a model this implementation can build; every problem
    /// is listed in the error.
    pub fn validate(&self) -> Result<(), WanConfigError> {
        let mut errs = Vec::new();
        let positive = [
            ("num_layers", self.num_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("attention_head_dim", self.attention_head_dim),
            ("in_channels", self.in_channels),
            ("out_channels", self.out_channels),
            ("text_dim", self.text_dim),
            ("ffn_dim", self.ffn_dim),
            ("rope_max_seq_len", self.rope_max_seq_len),
        ];
        for (name, v) in positive {
            if v == 0 {
                errs.push(format!("`{name}` must be positive"));
            }
        }
        errs.extend(self.sizes_above_limits());
        if self.patch_size.contains(&0) {
            errs.push(format!(
                "`patch_size` entries must be positive, got {:?}",
                self.patch_size
            ));
        }
        if self.freq_dim < 2 {
            errs.push(format!(
                "`freq_dim` must be at least 2, got {}",
                self.freq_dim
            ));
        }
        let hd = self.attention_head_dim;
        if !hd.is_multiple_of(2) || hd < 6 {
            errs.push(format!(
                "`attention_head_dim` = {hd} is too small or odd for the 3-axis RoPE split \
                 (needs an even head_dim >= 6 so that h = w = 2*(head_dim/6) >= 2 and t >= 2)"
            ));
        }
        if !(self.eps > 0.0 && self.eps.is_finite()) {
            errs.push(format!("`eps` must be positive, got {}", self.eps));
        }
        for (name, v) in [
            ("image_dim", self.image_dim),
            ("added_kv_proj_dim", self.added_kv_proj_dim),
            ("pos_embed_seq_len", self.pos_embed_seq_len),
        ] {
            if let Some(v) = v {
                errs.push(format!(
                    "`{name}` = {v} (image-conditioned Wan variants) is not supported yet; \
                     it must be null"
                ));
            }
        }
        if let Some(name) = &self.class_name {
            if name != "WanTransformer3DModel" {
                errs.push(format!(
                    "`_class_name` is `{name}`, expected `WanTransformer3DModel`"
                ));
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(WanConfigError::Invalid(errs))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE_JSON: &str = r#"{
      "_class_name": "WanTransformer3DModel",
      "_diffusers_version": "0.42.1",
      "added_kv_proj_dim": null,
      "attention_head_dim": 16,
      "cross_attn_norm": true,
      "eps": 1e-06,
      "ffn_dim": 64,
      "freq_dim": 32,
      "image_dim": null,
      "in_channels": 4,
      "num_attention_heads": 2,
      "num_layers": 2,
      "out_channels": 4,
      "patch_size": [1, 2, 2],
      "pos_embed_seq_len": null,
      "qk_norm": "rms_norm_across_heads",
      "rope_max_seq_len": 32,
      "text_dim": 32
    }"#;

    #[test]
    fn parses_diffusers_json_and_round_trips() {
        let c = WanConfig::from_json_str(FIXTURE_JSON).unwrap();
        c.validate().unwrap();
        assert_eq!(c.inner_dim(), 32);
        assert_eq!(c.rope_split(), RopeSplit { t: 8, h: 4, w: 4 });
        assert_eq!(c.out_features(), 16);
        assert!(c.extra.is_empty());
        let back = WanConfig::from_json_str(&c.to_json_string()).unwrap();
        assert_eq!(back, c);
        let v: serde_json::Value = serde_json::from_str(&c.to_json_string()).unwrap();
        assert_eq!(v["_class_name"], "WanTransformer3DModel");
        assert_eq!(v["patch_size"], serde_json::json!([1, 2, 2]));
    }

    #[test]
    fn unknown_fields_are_kept() {
        let json = FIXTURE_JSON.replace("\"text_dim\": 32", "\"text_dim\": 32, \"future\": 3");
        let c = WanConfig::from_json_str(&json).unwrap();
        assert_eq!(c.extra["future"], serde_json::json!(3));
        assert!(c.to_json_string().contains("\"future\": 3"));
    }

    #[test]
    fn sizes_far_beyond_released_models_are_refused_by_key() {
        let mut c = WanConfig::from_json_str(FIXTURE_JSON).unwrap();
        c.validate().unwrap();
        // 2^40 × 2^30 wraps a usize product to 0: the width must be checked, not computed.
        c.num_attention_heads = 1 << 40;
        c.attention_head_dim = 1 << 30;
        c.num_layers = 1_000_000_000_000;
        c.patch_size = [1, 2, 1 << 20];
        let msg = c.validate().unwrap_err().to_string();
        for key in [
            "`num_layers` = 1000000000000",
            "`num_attention_heads × attention_head_dim` is too large to count, above the limit 131072",
            "`max(patch_size)` = 1048576",
        ] {
            assert!(msg.contains(key), "{key} not in: {msg}");
        }
        // A model without blocks (the prompt would never reach the output) is refused.
        let mut none = WanConfig::from_json_str(FIXTURE_JSON).unwrap();
        none.num_layers = 0;
        let msg = none.validate().unwrap_err().to_string();
        assert!(msg.contains("`num_layers` must be positive"), "{msg}");
        // At the limits a config is valid, however its width is split into heads.
        c.num_layers = 1024;
        c.patch_size = [64, 64, 64];
        for (heads, head_dim) in [(1 << 14, 8), (32, 4096), (1, 1 << 17)] {
            c.num_attention_heads = heads;
            c.attention_head_dim = head_dim;
            c.validate().unwrap();
        }
        c.attention_head_dim += 2;
        let msg = c.validate().unwrap_err().to_string();
        assert!(
            msg.contains(
                "`num_attention_heads × attention_head_dim` = 131074 is above the limit 131072"
            ),
            "{msg}"
        );
    }

    #[test]
    fn validate_lists_every_problem() {
        let mut c = WanConfig::from_json_str(FIXTURE_JSON).unwrap();
        c.attention_head_dim = 4;
        c.patch_size = [0, 2, 2];
        c.image_dim = Some(1280);
        let msg = c.validate().unwrap_err().to_string();
        assert!(msg.contains("RoPE"), "{msg}");
        assert!(msg.contains("patch_size"), "{msg}");
        assert!(msg.contains("image_dim"), "{msg}");
    }
}
