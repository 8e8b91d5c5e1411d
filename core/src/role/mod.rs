//! Role models: configuration and the runtime trainable-role state (weights, gradients,
//! optimizer state, EMA shadow).
mod adapter;
mod config;
mod trainable;
pub use adapter::{target_matches, LoraSpec};
pub use config::*;
pub use trainable::*;
