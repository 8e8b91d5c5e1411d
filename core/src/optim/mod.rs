//! Optimizers and learning-rate schedules.
mod adamw;
mod config;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub mod fused;
mod host;
pub use adamw::*;
pub use config::*;
