//! Data sources and the resumable batch loader.
mod base;
mod loader;
mod memory;
pub use base::*;
pub use loader::*;
pub use memory::*;
