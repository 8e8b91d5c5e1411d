//! The model seam: what methods know of a role's network.
//!
//! A method never names a model class. It asks the [`BuildContext`](crate::method::BuildContext)
//! for the model of a role and gets a [`DynModel`] (trainable, on the autodiff backend) or a
//! `Box<dyn DiffusionModel<_>>` (frozen, on the inner backend), and talks to it through
//! [`DiffusionModel`]: a forward with timesteps and text, a hidden-state hook, and the
//! [`ModelInfo`] (channels, text width, patch, width and depth).
//!
//! A model architecture is a plugin like the others: a serializable [`ModelConfig`] (the
//! architecture's keys of a `[models.<role>]` table, selected by `arch = "<name>"`) that
//! builds the runtime model for every compiled backend ([`BuildModel`]).

mod base;
mod config;
mod info;

pub use base::*;
pub use config::*;
pub use info::*;
