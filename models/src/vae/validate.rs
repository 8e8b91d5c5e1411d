//! Validation of a [`WanVaeConfig`]: type errors and invalid values, each naming its key.

use reel_core::config::check;
use serde::de::DeserializeOwned;

use super::config::{WanVaeConfig, ENCODE_CHUNK};

/// Deserialize one field alone, so that a type error names its key.
fn field_error<T: DeserializeOwned>(
    obj: &serde_json::Map<String, serde_json::Value>,
    key: &str,
) -> Option<String> {
    let value = obj.get(key)?;
    serde_json::from_value::<T>(value.clone())
        .err()
        .map(|e| format!("`{key}`: {e} (found {value})"))
}

impl WanVaeConfig {
    /// The first field whose value has the wrong type, named.
    pub(super) fn diagnose(obj: &serde_json::Map<String, serde_json::Value>) -> Option<String> {
        type Us = usize;
        type OptUs = Option<usize>;
        field_error::<Us>(obj, "base_dim")
            .or_else(|| field_error::<OptUs>(obj, "decoder_base_dim"))
            .or_else(|| field_error::<Us>(obj, "z_dim"))
            .or_else(|| field_error::<Vec<Us>>(obj, "dim_mult"))
            .or_else(|| field_error::<Us>(obj, "num_res_blocks"))
            .or_else(|| field_error::<Vec<f64>>(obj, "attn_scales"))
            .or_else(|| field_error::<Vec<bool>>(obj, "temperal_downsample"))
            .or_else(|| field_error::<f64>(obj, "dropout"))
            .or_else(|| field_error::<Vec<f64>>(obj, "latents_mean"))
            .or_else(|| field_error::<Vec<f64>>(obj, "latents_std"))
            .or_else(|| field_error::<bool>(obj, "is_residual"))
            .or_else(|| field_error::<Us>(obj, "in_channels"))
            .or_else(|| field_error::<Us>(obj, "out_channels"))
            .or_else(|| field_error::<OptUs>(obj, "patch_size"))
            .or_else(|| field_error::<OptUs>(obj, "scale_factor_temporal"))
            .or_else(|| field_error::<OptUs>(obj, "scale_factor_spatial"))
            .or_else(|| field_error::<Option<String>>(obj, "_class_name"))
    }

    pub(super) fn problems(&self) -> Vec<String> {
        let mut errs = Vec::new();
        for (name, v) in [
            ("base_dim", self.base_dim),
            ("z_dim", self.z_dim),
            ("num_res_blocks", self.num_res_blocks),
            ("in_channels", self.in_channels),
            ("out_channels", self.out_channels),
        ] {
            if v == 0 {
                errs.push(format!("`{name}` must be positive"));
            }
        }
        for (name, v) in [
            ("decoder_base_dim", self.decoder_base_dim),
            ("scale_factor_temporal", self.scale_factor_temporal),
            ("scale_factor_spatial", self.scale_factor_spatial),
        ] {
            if v == Some(0) {
                errs.push(format!("`{name}` must be positive or null"));
            }
        }
        if self.dim_mult.is_empty() || self.dim_mult.contains(&0) {
            errs.push(format!(
                "`dim_mult` must be a non-empty list of positive multipliers, got {:?}",
                self.dim_mult
            ));
        }
        self.check_temporal(&mut errs);
        errs.extend(self.sizes_above_limits());
        if self
            .attn_scales
            .iter()
            .any(|s| !(s.is_finite() && *s > 0.0))
        {
            errs.push(format!(
                "`attn_scales` entries must be positive, got {:?}",
                self.attn_scales
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            errs.push(format!("`dropout` must be in [0, 1), got {}", self.dropout));
        }
        self.check_latent_stats(&mut errs);
        if self.is_residual {
            errs.push("`is_residual` = true (the Wan2.2 VAE) is not supported".into());
        }
        if let Some(p) = self.patch_size {
            errs.push(format!(
                "`patch_size` = {p} (the Wan2.2 VAE) is not supported; it must be null"
            ));
        }
        if let Some(name) = &self.class_name {
            if name != "AutoencoderKLWan" {
                errs.push(format!(
                    "`_class_name` is `{name}`, expected `AutoencoderKLWan`"
                ));
            }
        }
        if let Some(kind) = self.extra.get("model_type") {
            errs.push(format!(
                "`model_type` is {kind}: a transformers model's config, not a diffusers \
                 `AutoencoderKLWan`'s"
            ));
        }
        errs
    }

    /// The sizes above their limit ([`check::sizes_above`]): 4096 channels at the base
    /// widths, in the latents and in the images, multipliers of 16 over at most 8 levels, and
    /// 64 residual blocks a level (the Wan2.1 VAE: base 96, multipliers [1, 2, 4, 4], z 16).
    fn sizes_above_limits(&self) -> Vec<String> {
        let most = |v: &[usize]| v.iter().copied().max().unwrap_or(0);
        check::sizes_above(&[
            ("base_dim", self.base_dim, 4096),
            ("decoder_base_dim", self.decoder_base_dim.unwrap_or(0), 4096),
            ("max(dim_mult)", most(&self.dim_mult), 16),
            ("len(dim_mult)", self.dim_mult.len(), 8),
            ("z_dim", self.z_dim, 4096),
            ("num_res_blocks", self.num_res_blocks, 64),
            ("in_channels", self.in_channels, 4096),
            ("out_channels", self.out_channels, 4096),
        ])
    }

    fn check_temporal(&self, errs: &mut Vec<String>) {
        let levels = self.dim_mult.len().saturating_sub(1);
        if self.temperal_downsample.len() != levels {
            errs.push(format!(
                "`temperal_downsample` needs one entry per downsampling level \
                 (len(dim_mult) - 1 = {levels}), got {}",
                self.temperal_downsample.len()
            ));
        }
        let halvings = self.temporal_halvings();
        if halvings > ENCODE_CHUNK.ilog2() as usize {
            errs.push(format!(
                "`temperal_downsample` halves time {halvings} times, but the causal encoder \
                 runs chunks of {ENCODE_CHUNK} frames (at most {} halvings)",
                ENCODE_CHUNK.ilog2()
            ));
        }
    }

    fn check_latent_stats(&self, errs: &mut Vec<String>) {
        for (name, v) in [
            ("latents_mean", &self.latents_mean),
            ("latents_std", &self.latents_std),
        ] {
            if v.len() != self.z_dim {
                errs.push(format!(
                    "`{name}` needs z_dim = {} entries, got {}",
                    self.z_dim,
                    v.len()
                ));
            }
            if v.iter().any(|x| !x.is_finite()) {
                errs.push(format!("`{name}` entries must be finite"));
            }
        }
        if self.latents_std.iter().any(|s| *s <= 0.0) {
            errs.push(format!(
                "`latents_std` entries must be positive, got {:?}",
                self.latents_std
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vae::config::tests::JSON;

    #[test]
    fn every_problem_names_its_key() {
        let json = JSON
            .replace("\"z_dim\": 4", "\"z_dim\": 5")
            .replace("[false, true, true]", "[true, true]")
            .replace("\"is_residual\": false", "\"is_residual\": true")
            .replace("[1.5, 0.5, 2.0, 1.1]", "[1.5, 0.0, 2.0, 1.1]");
        let msg = WanVaeConfig::from_json_str(&json).unwrap_err().to_string();
        for key in [
            "latents_mean",
            "latents_std",
            "temperal_downsample",
            "is_residual",
        ] {
            assert!(msg.contains(&format!("`{key}`")), "{key} not in: {msg}");
        }
        assert!(msg.contains("Wan2.2"), "{msg}");
    }

    #[test]
    fn sizes_far_beyond_released_models_are_refused_by_key() {
        let json = JSON
            .replace("\"base_dim\": 8", "\"base_dim\": 1099511627776")
            .replace("[1, 2, 2, 2]", "[1, 2, 2, 2, 1, 1, 1, 1, 64]")
            .replace(
                "[false, true, true]",
                "[false, true, true, false, false, false, false, false]",
            );
        let msg = WanVaeConfig::from_json_str(&json).unwrap_err().to_string();
        for key in [
            "`base_dim` = 1099511627776",
            "`max(dim_mult)` = 64",
            "`len(dim_mult)` = 9",
        ] {
            assert!(msg.contains(key), "{key} not in: {msg}");
        }
        let at_limits = JSON
            .replace("\"base_dim\": 8", "\"base_dim\": 4096")
            .replace("[1, 2, 2, 2]", "[1, 2, 2, 2, 1, 1, 1, 16]")
            .replace(
                "[false, true, true]",
                "[false, true, true, false, false, false, false]",
            );
        WanVaeConfig::from_json_str(&at_limits).unwrap();
    }

    #[test]
    fn too_many_temporal_halvings_are_rejected() {
        let json = JSON.replace("[false, true, true]", "[true, true, true]");
        let msg = WanVaeConfig::from_json_str(&json).unwrap_err().to_string();
        assert!(msg.contains("halves time 3 times"), "{msg}");
    }

    #[test]
    fn a_type_error_names_the_key() {
        let json = JSON.replace("\"base_dim\": 8", "\"base_dim\": -8");
        let msg = WanVaeConfig::from_json_str(&json).unwrap_err().to_string();
        assert!(msg.contains("`base_dim`"), "{msg}");
        let json = JSON.replace("\"patch_size\": null", "\"patch_size\": 2");
        let msg = WanVaeConfig::from_json_str(&json).unwrap_err().to_string();
        assert!(
            msg.contains("`patch_size`") && msg.contains("Wan2.2"),
            "{msg}"
        );
    }
}
