//! Reel models: the Wan video diffusion transformer in the diffusers layout (module paths
//! equal checkpoint keys), its presets and its weight I/O, registered as `arch = "wan"`;
//! its LoRA adapter (`kind = "lora"`).
#![warn(missing_docs)]

pub mod lora;
pub mod wan;

pub use lora::{apply_lora, load_lora, merge_and_unload, save_lora, LoraError, LoraSpec};
pub use wan::{build_wan_role, AttentionMode, WanArch, WanConfig, WanModel};

/// Architecture name under which the Wan model is registered (`arch = "wan"` in run configs).
pub const ARCH_NAME: &str = "wan";
