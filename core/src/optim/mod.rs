//! Optimizers and learning-rate schedules.
mod adamw;
mod config;
pub use adamw::*;
pub use config::*;
