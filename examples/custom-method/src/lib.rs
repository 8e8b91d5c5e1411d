//! A complete third-party Reel plugin crate, selected from TOML by name and built into its own
//! `reel` binary (`src/main.rs`, three lines through `reel::cli::run`):
//!
//! - [`toy_dit`]: a second model architecture, `arch = "toy"`, a tiny diffusion transformer
//!   that the built-in methods (`finetune`, `dmd2`, ...) train through the model seam;
//! - [`toy_data`]: `[data] kind = "toy"`, random samples;
//! - [`toy_method`]: `[method] kind = "toy"`, a two-role regression that exercises the trainer
//!   loop (cadence, two optimizers, accumulation, clipping, resume) without a video model;
//! - [`minimal`]: the minimal method of `docs/extending.md`, `kind = "fixed_sigma"`.
//!
//! Every plugin registers with `#[reel_core::plugin(name, summary)]` on its config impl.

pub mod minimal;
pub mod toy_data;
pub mod toy_dit;
pub mod toy_method;

pub use toy_data::ToyDataConfig;
pub use toy_dit::{ToyArch, ToyDit};
pub use toy_method::{ToyMethod, ToyMethodConfig, ToyModel};
