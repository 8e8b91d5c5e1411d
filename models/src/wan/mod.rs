//! The Wan video diffusion transformer (diffusers `WanTransformer3DModel`, text-to-video).
//!
//! One concern per file: [`config`] (diffusers `config.json`), [`presets`], [`init`] (seeded
//! lazy initialization), [`linear`], [`norm`], [`gelu`] (GELU with a lean backward),
//! [`embeddings`] (patch / timestep / text),
//! [`rope`], [`attention`] (with the memory-efficient kernel in [`mem_attention`] and the
//! mode in [`attention_mode`]),
//! [`block`], [`model`], [`checkpointed`] (block-level activation checkpointing) and
//! [`weights`] (safetensors I/O in the diffusers layout); [`arch`] registers it as `arch = "wan"`. Module field names equal the
//! diffusers state-dict keys.

pub mod arch;
pub mod attention;
pub mod attention_mode;
pub mod bias;
pub mod block;
mod block_kernels;
pub use block_kernels::matmul;
pub mod checkpointed;
pub mod config;
mod custom_op;
pub mod embeddings;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub mod fused_attention;
pub mod gelu;
pub mod gelu_linear;
pub mod init;
pub mod linear;
pub mod mem_attention;
pub mod model;
pub mod norm;
pub mod norm_ops;
pub mod presets;
pub mod product;
pub mod rope;
pub mod weights;

pub use arch::{build_wan_role, WanArch};
pub use attention_mode::{AttentionMode, AUTO_MIN_TOKENS};
pub use config::{RopeSplit, WanConfig, WanConfigError};
pub use linear::Linear;
pub use model::{Captured, Intermediates, WanModel};
pub use weights::{load_weights, resolve_weights, WanLoadError, WeightSource};
