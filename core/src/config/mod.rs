//! Run configuration: TOML parsing, validation, overrides.
mod diff;
mod error;
mod load;
mod memory;
mod run;
pub use diff::*;
pub use error::*;
pub use load::*;
pub use run::*;
