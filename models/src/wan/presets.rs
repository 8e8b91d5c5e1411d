//! Named [`WanConfig`] presets.

use std::collections::BTreeMap;

use super::config::WanConfig;

/// Names accepted by [`WanConfig::preset`].
pub const PRESET_NAMES: &[&str] = &[
    "wan-tiny",
    "wan-quickstart",
    "wan-bench-small",
    "wan-bench-medium",
    "wan2.1-t2v-1.3b",
    "wan2.1-t2v-14b",
];

/// The common shape of the Wan2.1 text-to-video models.
fn wan21_t2v(num_layers: usize, heads: usize, ffn_dim: usize) -> WanConfig {
    WanConfig {
        class_name: Some("WanTransformer3DModel".into()),
        diffusers_version: Some("0.33.0.dev0".into()),
        patch_size: [1, 2, 2],
        num_attention_heads: heads,
        attention_head_dim: 128,
        in_channels: 16,
        out_channels: 16,
        text_dim: 4096,
        freq_dim: 256,
        ffn_dim,
        num_layers,
        cross_attn_norm: true,
        qk_norm: Some("rms_norm_across_heads".into()),
        eps: 1e-6,
        image_dim: None,
        added_kv_proj_dim: None,
        rope_max_seq_len: 1024,
        pos_embed_seq_len: None,
        extra: BTreeMap::new(),
    }
}

/// A small made-up Wan for CPU work on the synthetic data (4 latent channels, text_dim 32).
fn small(
    patch_size: [usize; 3],
    num_layers: usize,
    heads: usize,
    head_dim: usize,
    ffn_dim: usize,
) -> WanConfig {
    WanConfig {
        class_name: Some("WanTransformer3DModel".into()),
        diffusers_version: Some("0.42.1".into()),
        patch_size,
        num_attention_heads: heads,
        attention_head_dim: head_dim,
        in_channels: 4,
        out_channels: 4,
        text_dim: 32,
        freq_dim: 64,
        ffn_dim,
        num_layers,
        cross_attn_norm: true,
        qk_norm: Some("rms_norm_across_heads".into()),
        eps: 1e-6,
        image_dim: None,
        added_kv_proj_dim: None,
        rope_max_seq_len: 64,
        pos_embed_seq_len: None,
        extra: BTreeMap::new(),
    }
}

impl WanConfig {
    /// A named preset, or `None` for an unknown name (see [`Self::preset_names`]).
    ///
    /// - `wan-tiny`: the golden-fixture model of `tests/fixtures/wan_tiny/config.json`
    ///   (2 layers, 2 heads x 16, ffn 64, text_dim 32, freq_dim 32, 4 channels, patch
    ///   `[1, 2, 2]`, rope_max_seq_len 32).
    /// - `wan-quickstart`: made up for the CPU quickstart on the synthetic data (4 layers,
    ///   4 heads x 48, ffn 768, text_dim 32, freq_dim 64, 4 channels, patch `[4, 2, 2]`: one
    ///   token holds a 2x2 pixel patch through 4 frames, so clips need a multiple of 4 frames).
    ///   The temporal patch is what lets this small model learn motion on a CPU budget: the
    ///   patch embedding sees the object's motion inside each token, where with patch
    ///   `[1, 2, 2]` (the earlier quickstart model, 2 heads) motion had to be learned as
    ///   cross-frame attention at a caption-dependent offset, which it never did (direction
    ///   accuracy 8-16 %, measured up to 4000 steps; docs/quickstart.md). Heads of 48
    ///   dims give each RoPE axis 8 frequencies.
    /// - `wan-bench-small` / `wan-bench-medium`: made up for benchmarks (4 layers, 4 x 32,
    ///   ffn 512 / 8 layers, 8 x 64, ffn 2048), 4 channels, text_dim 32, patch `[1, 2, 2]`.
    /// - `wan2.1-t2v-1.3b`: `transformer/config.json` of the Hugging Face repository
    ///   `Wan-AI/Wan2.1-T2V-1.3B-Diffusers` (30 layers, 12 heads x 128, ffn 8960).
    /// - `wan2.1-t2v-14b`: `transformer/config.json` of `Wan-AI/Wan2.1-T2V-14B-Diffusers`
    ///   (40 layers, 40 heads x 128, ffn 13824).
    ///
    /// Both Wan2.1 presets: text_dim 4096 (UMT5-XXL), freq_dim 256, patch `[1, 2, 2]`,
    /// 16 latent channels in and out, eps 1e-6, rope_max_seq_len 1024, cross_attn_norm true,
    /// qk_norm `rms_norm_across_heads`, no image conditioning.
    pub fn preset(name: &str) -> Option<WanConfig> {
        match name {
            "wan-tiny" => Some(WanConfig {
                class_name: Some("WanTransformer3DModel".into()),
                diffusers_version: Some("0.42.1".into()),
                patch_size: [1, 2, 2],
                num_attention_heads: 2,
                attention_head_dim: 16,
                in_channels: 4,
                out_channels: 4,
                text_dim: 32,
                freq_dim: 32,
                ffn_dim: 64,
                num_layers: 2,
                cross_attn_norm: true,
                qk_norm: Some("rms_norm_across_heads".into()),
                eps: 1e-6,
                image_dim: None,
                added_kv_proj_dim: None,
                rope_max_seq_len: 32,
                pos_embed_seq_len: None,
                extra: BTreeMap::new(),
            }),
            "wan-quickstart" => Some(small([4, 2, 2], 4, 4, 48, 768)),
            "wan-bench-small" => Some(small([1, 2, 2], 4, 4, 32, 512)),
            "wan-bench-medium" => Some(small([1, 2, 2], 8, 8, 64, 2048)),
            "wan2.1-t2v-1.3b" => Some(wan21_t2v(30, 12, 8960)),
            "wan2.1-t2v-14b" => Some(wan21_t2v(40, 40, 13824)),
            _ => None,
        }
    }

    /// Names of the presets, for listings and error messages.
    pub fn preset_names() -> &'static [&'static str] {
        PRESET_NAMES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_is_valid() {
        for name in WanConfig::preset_names() {
            let c = WanConfig::preset(name).unwrap();
            c.validate().unwrap();
        }
        assert!(WanConfig::preset("nope").is_none());
    }

    #[test]
    fn wan21_sizes() {
        let small = WanConfig::preset("wan2.1-t2v-1.3b").unwrap();
        assert_eq!(small.inner_dim(), 1536);
        let big = WanConfig::preset("wan2.1-t2v-14b").unwrap();
        assert_eq!(big.inner_dim(), 5120);
        assert_eq!(big.num_layers, 40);
        assert_eq!(big.ffn_dim, 13824);
    }
}
