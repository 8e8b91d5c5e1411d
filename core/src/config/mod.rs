//! Run configuration: TOML parsing, validation, overrides.
mod error;
mod load;
mod memory;
mod run;
pub use error::*;
pub use load::*;
pub use run::*;
