//! Role models: configuration and the runtime trainable-role state (weights, gradients,
//! optimizer state, EMA shadow).
mod config;
mod trainable;
pub use config::*;
pub use trainable::*;
