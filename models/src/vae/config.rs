//! [`WanVaeConfig`]: the diffusers `AutoencoderKLWan` `config.json`, read as is.
//!
//! Upstream: diffusers `src/diffusers/models/autoencoders/autoencoder_kl_wan.py`,
//! `AutoencoderKLWan.__init__` (field names and defaults, including the upstream spelling
//! `temperal_downsample`).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Frames per causal encoder chunk after the first frame (diffusers encodes frame 0 alone,
/// then chunks of 4 frames).
pub const ENCODE_CHUNK: usize = 4;

/// Why a [`WanVaeConfig`] cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum VaeConfigError {
    /// The file could not be read.
    #[error("cannot read VAE config `{path}`: {error}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error (printed in the message, so not returned as the source).
        error: std::io::Error,
    },
    /// The file is not a valid `AutoencoderKLWan` `config.json`.
    #[error("invalid VAE config `{path}`: {message}")]
    Parse {
        /// The file.
        path: String,
        /// What is wrong, naming the key when one is to blame.
        message: String,
    },
    /// The values are inconsistent or unsupported (every problem is listed, each naming its
    /// key).
    #[error("invalid VAE config `{path}`:\n  {}", .problems.join("\n  "))]
    Invalid {
        /// The file (`<string>` when parsed from a string).
        path: String,
        /// One line per problem.
        problems: Vec<String>,
    },
}

/// Configuration of the Wan2.1 video VAE with the field names (and defaults) of diffusers'
/// `AutoencoderKLWan`, so that a diffusers `vae/config.json` deserializes as is. Fields the
/// file has and this struct does not name are kept in [`WanVaeConfig::extra`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WanVaeConfig {
    /// diffusers class name (`"AutoencoderKLWan"`).
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
    /// Channels of the first encoder level (`dim` of `WanEncoder3d`).
    #[serde(default = "default_base_dim")]
    pub base_dim: usize,
    /// Channels of the decoder's base level; `null` means `base_dim`.
    #[serde(default)]
    pub decoder_base_dim: Option<usize>,
    /// Latent channels (the encoder outputs `2 * z_dim`: mean and log-variance).
    #[serde(default = "default_z_dim")]
    pub z_dim: usize,
    /// Channel multiplier of each resolution level (one level per entry).
    #[serde(default = "default_dim_mult")]
    pub dim_mult: Vec<usize>,
    /// Residual blocks per encoder level (the decoder uses one more).
    #[serde(default = "default_num_res_blocks")]
    pub num_res_blocks: usize,
    /// Spatial scales (1.0, 0.5, ...) at which the encoder adds an attention block after
    /// each residual block.
    #[serde(default)]
    pub attn_scales: Vec<f64>,
    /// Whether each downsampling level also halves time (upstream spelling); the decoder
    /// upsamples time in the reverse order.
    #[serde(default = "default_temperal_downsample")]
    pub temperal_downsample: Vec<bool>,
    /// Dropout rate (inference only here, so it has no effect).
    #[serde(default)]
    pub dropout: f64,
    /// Per-channel mean of the latents, used by [`crate::vae::WanVae::normalize_latents`].
    #[serde(default = "default_latents_mean")]
    pub latents_mean: Vec<f64>,
    /// Per-channel standard deviation of the latents.
    #[serde(default = "default_latents_std")]
    pub latents_std: Vec<f64>,
    /// Residual down/up blocks of the Wan2.2 VAE (not supported: must be false).
    #[serde(default)]
    pub is_residual: bool,
    /// Video channels in.
    #[serde(default = "default_channels")]
    pub in_channels: usize,
    /// Video channels out.
    #[serde(default = "default_channels")]
    pub out_channels: usize,
    /// Pixel patchification of the Wan2.2 VAE (not supported: must be null).
    #[serde(default)]
    pub patch_size: Option<usize>,
    /// Temporal compression factor as diffusers records it.
    #[serde(default = "default_temporal")]
    pub scale_factor_temporal: Option<usize>,
    /// Spatial compression factor as diffusers records it.
    #[serde(default = "default_spatial")]
    pub scale_factor_spatial: Option<usize>,
    /// Any other field found in the file, kept verbatim.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

fn default_base_dim() -> usize {
    96
}
fn default_z_dim() -> usize {
    16
}
fn default_dim_mult() -> Vec<usize> {
    vec![1, 2, 4, 4]
}
fn default_num_res_blocks() -> usize {
    2
}
fn default_temperal_downsample() -> Vec<bool> {
    vec![false, true, true]
}
fn default_channels() -> usize {
    3
}
fn default_temporal() -> Option<usize> {
    Some(4)
}
fn default_spatial() -> Option<usize> {
    Some(8)
}
fn default_latents_mean() -> Vec<f64> {
    vec![
        -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715,
        0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
    ]
}
fn default_latents_std() -> Vec<f64> {
    vec![
        2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652,
        1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
    ]
}

impl WanVaeConfig {
    /// Parse a diffusers `config.json` string and validate it.
    pub fn from_json_str(json: &str) -> Result<Self, VaeConfigError> {
        Self::parse(json, "<string>")
    }

    /// Read and validate a diffusers `config.json` file.
    pub fn from_json_file(path: impl AsRef<Path>) -> Result<Self, VaeConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|error| VaeConfigError::Io {
            path: path.display().to_string(),
            error,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    fn parse(json: &str, path: &str) -> Result<Self, VaeConfigError> {
        let bad = |message: String| VaeConfigError::Parse {
            path: path.to_string(),
            message,
        };
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
        let obj = value
            .as_object()
            .ok_or_else(|| bad("the file is not a JSON object".into()))?;
        let config: Self = serde_json::from_value(value.clone())
            .map_err(|e| bad(Self::diagnose(obj).unwrap_or_else(|| e.to_string())))?;
        config.validate_at(path)?;
        Ok(config)
    }

    /// The config as pretty JSON in the diffusers layout.
    pub fn to_json_string(&self) -> String {
        serde_json::to_string_pretty(self).expect("WanVaeConfig serializes")
    }

    /// Check that the values describe a Wan2.1 VAE this implementation can run; every
    /// problem is listed, each naming its key.
    pub fn validate(&self) -> Result<(), VaeConfigError> {
        self.validate_at("<config>")
    }

    fn validate_at(&self, path: &str) -> Result<(), VaeConfigError> {
        let problems = self.problems();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(VaeConfigError::Invalid {
                path: path.to_string(),
                problems,
            })
        }
    }

    /// How many levels halve time (the `true` entries of `temperal_downsample`).
    pub fn temporal_halvings(&self) -> usize {
        self.temperal_downsample.iter().filter(|t| **t).count()
    }

    /// Spatial compression of the architecture, `2^(len(dim_mult) - 1)`. Tiling uses this
    /// (diffusers reads `scale_factor_spatial`, which equals it in every released config).
    pub fn spatial_factor(&self) -> usize {
        1 << self.dim_mult.len().saturating_sub(1)
    }

    /// Temporal compression of the architecture, `2^temporal_halvings`.
    pub fn temporal_factor(&self) -> usize {
        1 << self.temporal_halvings()
    }

    /// Latent frames for `frames` video frames: frame 0 alone, then each complete chunk of
    /// [`ENCODE_CHUNK`] frames gives `ENCODE_CHUNK / temporal_factor` latent frames (as in
    /// diffusers, trailing frames that do not fill a chunk are not encoded).
    pub fn latent_frames(&self, frames: usize) -> usize {
        if frames == 0 {
            return 0;
        }
        1 + (frames - 1) / ENCODE_CHUNK * (ENCODE_CHUNK / self.temporal_factor())
    }

    /// Channel widths of the encoder levels: `base_dim * [1, dim_mult...]`.
    pub fn encoder_dims(&self) -> Vec<usize> {
        std::iter::once(1)
            .chain(self.dim_mult.iter().copied())
            .map(|m| m * self.base_dim)
            .collect()
    }

    /// Channel widths of the decoder levels: `d * [dim_mult[-1], reversed(dim_mult)...]`
    /// with `d = decoder_base_dim.unwrap_or(base_dim)`.
    pub fn decoder_dims(&self) -> Vec<usize> {
        let d = self.decoder_base_dim.unwrap_or(self.base_dim);
        let last = self.dim_mult.last().copied().unwrap_or(1);
        std::iter::once(last)
            .chain(self.dim_mult.iter().rev().copied())
            .map(|m| m * d)
            .collect()
    }

    /// Whether the encoder level at spatial `scale` (1.0, 0.5, ...) has attention blocks.
    pub fn has_attention_at(&self, scale: f64) -> bool {
        self.attn_scales.contains(&scale)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) const JSON: &str = r#"{
      "_class_name": "AutoencoderKLWan", "_diffusers_version": "0.42.1",
      "attn_scales": [], "base_dim": 8, "decoder_base_dim": null, "dim_mult": [1, 2, 2, 2],
      "dropout": 0.0, "in_channels": 3, "is_residual": false,
      "latents_mean": [0.1, -0.2, 0.3, -0.4], "latents_std": [1.5, 0.5, 2.0, 1.1],
      "num_res_blocks": 1, "out_channels": 3, "patch_size": null,
      "scale_factor_spatial": 8, "scale_factor_temporal": 4,
      "temperal_downsample": [false, true, true], "z_dim": 4
    }"#;

    #[test]
    fn parses_and_derives_the_architecture() {
        let c = WanVaeConfig::from_json_str(JSON).unwrap();
        assert_eq!(c.encoder_dims(), vec![8, 8, 16, 16, 16]);
        assert_eq!(c.decoder_dims(), vec![16, 16, 16, 16, 8]);
        assert_eq!((c.spatial_factor(), c.temporal_factor()), (8, 4));
        assert_eq!(c.latent_frames(9), 3);
        assert_eq!(c.latent_frames(1), 1);
        assert_eq!(c.latent_frames(8), 2);
        let back = WanVaeConfig::from_json_str(&c.to_json_string()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn released_config_uses_diffusers_defaults() {
        let c = WanVaeConfig::from_json_str(r#"{"base_dim": 96, "z_dim": 16}"#).unwrap();
        assert_eq!(c.dim_mult, vec![1, 2, 4, 4]);
        assert_eq!(c.latents_std.len(), 16);
        assert_eq!(c.spatial_factor(), 8);
    }

    /// A transformers config (a text encoder folder given as the VAE) is called that, not
    /// read as a VAE of default sizes.
    #[test]
    fn a_transformers_config_is_not_a_vae() {
        let msg = WanVaeConfig::from_json_str(r#"{"model_type": "umt5", "d_model": 32}"#)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("`model_type`") && msg.contains("not a diffusers"),
            "{msg}"
        );
    }
}
