//! The Wan video diffusion transformer (diffusers `WanTransformer3DModel`, text-to-video).
//!
//! One concern per file: [`config`] (diffusers `config.json`), [`presets`], [`init`] (seeded lazy
//! initialization), [`linear`], [`norm`], [`gelu`] (GELU with a lean backward), [`embeddings`]
//! (patch / timestep / text), [`rope`], [`attention`] (with the memory-efficient kernel in
//! [`mem_attention`] and the mode in [`attention_mode`]), [`block`], [`model`], [`checkpointed`]
//! (block-level activation checkpointing) and [`weights`] (safetensors I/O in the diffusers
//! layout); [`arch`] registers it as `arch = "wan"`. Module field names equal the diffusers
//! state-dict keys. [`product`] and [`matmul`] run the linear layers' products on a pinned cubek
//! kernel (`REEL_MATMUL`).

pub mod arch;
pub mod attention;
pub mod attention_mode;
pub mod bias;
pub mod block;
mod block_kernels;
pub use block_kernels::matmul;
pub(crate) use block_kernels::rows;
pub mod checkpointed;
pub mod config;
mod custom_op;
pub mod embeddings;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub mod fused_attention;
pub mod gate;
pub mod gelu;
pub mod gelu_linear;
pub mod init;
pub mod linear;
pub mod mem_attention;
pub mod model;
pub mod norm;
pub mod norm_ops;
pub mod param_graph;
#[cfg(test)]
mod parity;
pub mod presets;
pub mod product;
mod reshape;
pub mod rope;
pub mod weights;

pub use arch::{build_wan_role, WanArch};
pub use attention_mode::{AttentionMode, AUTO_MIN_TOKENS};
pub use config::{RopeSplit, WanConfig, WanConfigError};
pub use linear::Linear;
pub use model::{Captured, Intermediates, WanModel};
pub use weights::{load_weights, resolve_weights, WanLoadError, WeightSource};

/// The environment variables that choose GPU kernels in this build (`REEL_MATMUL` and
/// `REEL_VAE_CONV`; with `cuda` or `wgpu`, `REEL_TILED_TILES` and `REEL_BLOCK_KERNELS` too;
/// with `cuda`, `REEL_FLASH`) that are set, as `NAME=value`, for a run's log: they change
/// which kernels run, and a run config does not record them.
pub fn kernel_settings() -> Vec<String> {
    kernel_settings_from(|name| std::env::var(name).ok())
}

/// [`kernel_settings`] with the variables read by `get`.
fn kernel_settings_from(get: impl Fn(&str) -> Option<String>) -> Vec<String> {
    #[allow(unused_mut)]
    let mut names = vec![matmul::MATMUL_ENV, crate::vae::conv_gemm::VAE_CONV_ENV];
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    names.extend([
        fused_attention::tiles::TILES_ENV,
        block_kernels::BLOCK_KERNELS_ENV,
    ]);
    #[cfg(feature = "cuda")]
    names.push(fused_attention::cudnn::FLASH_ENV);
    names
        .into_iter()
        .filter_map(|name| get(name).map(|v| format!("{name}={v}")))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn kernel_settings_list_the_variables_that_are_set() {
        let get = |name: &str| (name == "REEL_MATMUL").then(|| "double-mma".to_string());
        assert_eq!(super::kernel_settings_from(get), ["REEL_MATMUL=double-mma"]);
        assert!(super::kernel_settings_from(|_| None).is_empty());
    }
}
