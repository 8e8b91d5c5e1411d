//! Role models: configuration and the runtime trainable-role state (weights, gradients,
//! optimizer state, EMA shadow).
//!
//! One concern per file: [`config`](self) (`[models.<role>]` tables), the [`RoleModule`]
//! view of a module by parameter path, [`TrainableRole`] (gradients, AdamW, EMA), the
//! object-safe [`RoleHandle`] with [`RoleFields`] (how a method lists its roles) and the
//! checkpoint conversions of role state.
mod config;
mod handle;
mod module;
mod state;
mod trainable;

pub use config::*;
pub use handle::*;
pub use module::*;
pub use trainable::*;
