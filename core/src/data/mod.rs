//! Data sources and the resumable batch loader.
mod base;
mod loader;
pub use base::*;
pub use loader::*;
