//! Shared helpers for the Wan tests: the backends, and fixture access, comparisons and gradient
//! collection from `reel_models::golden` (shared with the library's parity unit tests).
#![allow(dead_code)]

/// Inference backend.
pub type Cpu = burn::backend::NdArray;
/// Training backend.
pub type TestBackend = burn::backend::Autodiff<burn::backend::NdArray>;

pub use reel_models::golden::*;
