//! Training methods: the runtime trait, its config trait and build context.
mod base;
pub use base::*;
