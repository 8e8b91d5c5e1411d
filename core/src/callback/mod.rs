//! Callbacks: runtime trait, config trait, reports.
mod base;
pub use base::*;
