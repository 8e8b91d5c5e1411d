//! Reel core: the training-method plugin interface, role models, callbacks, the plugin
//! registry, run configs, the step-based trainer loop, optimizers and checkpoints.
//!
//! Dependencies flow one way: `reel-core` ← `reel-models` ← `reel-methods`, `reel-plugins`
//! ← the `reel` binary.
#![warn(missing_docs)]

pub mod backend;
pub mod callback;
pub mod checkpoint;
pub mod config;
pub mod console;
pub mod data;
pub mod device_fault;
mod device_setup;
pub mod devices;
pub mod fault;
pub mod fixtures;
pub mod flow;
pub mod host;
pub mod io;
pub mod kernel_cache;
pub mod memory;
pub mod method;
pub mod model;
pub mod optim;
pub mod parallel;
pub mod params;
pub mod paths;
pub mod profile;
pub mod registry;
pub mod rng;
pub mod role;
pub mod trainer;

pub use inventory;
pub use reel_macros::{plugin, Roles};

/// What `#[plugin]` expands to needs; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use typetag;
}
