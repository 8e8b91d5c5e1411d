//! Reel models: the Wan video diffusion transformer in the diffusers layout (module paths
//! equal checkpoint keys), its presets and its weight I/O, registered as `arch = "wan"`, and
//! its LoRA adapter (`kind = "lora"`); the Wan2.1 video VAE ([`vae`]) and the UMT5 text
//! encoder ([`umt5`]) that turn videos and prompts into the DiT's inputs. [`golden`] reads the
//! diffusers golden fixtures for the parity tests.
#![warn(missing_docs)]

pub mod checkpoint;
pub mod golden;
pub mod lora;
pub mod umt5;
pub mod vae;
pub mod wan;

pub use lora::{apply_lora, load_lora, merge_and_unload, save_lora, LoraError, LoraSpec};
pub use wan::{build_wan_role, AttentionMode, WanArch, WanConfig, WanModel};

/// Architecture name under which the Wan model is registered (`arch = "wan"` in run configs).
pub const ARCH_NAME: &str = "wan";
