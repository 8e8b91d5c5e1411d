//! Data sources shipped with Reel.
//!
//! - [`synthetic`]: moving coloured shapes in latent form, with a caption evaluator.

pub mod synthetic;

pub use synthetic::{clip_to_rgb, SyntheticConfig, SyntheticEvaluator, SyntheticSource};
