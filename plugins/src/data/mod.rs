//! Data sources shipped with Reel.
//!
//! - [`synthetic`]: moving coloured shapes in latent form, with a caption evaluator.
//! - [`fastvideo`]: FastVideo's preprocessed parquet datasets (`fastvideo_parquet`).
//! - [`safetensors_dir`]: a folder of per-sample safetensors files (`safetensors`).
//! - [`random`]: seeded random latents and text of any shape, for benchmarks (`random`).
//!
//! [`negative`] reads and writes the negative-prompt embedding file of the file sources.

pub mod fastvideo;
pub mod files;
pub mod negative;
pub mod prompts;
pub mod random;
pub mod safetensors_dir;
pub mod synthetic;
pub mod tensors;

pub use fastvideo::{FastVideoParquetConfig, FastVideoParquetSource};
pub use random::{RandomDataConfig, RandomSource};
pub use safetensors_dir::{SafetensorsDirConfig, SafetensorsDirSource};
pub use synthetic::{clip_to_rgb, SyntheticConfig, SyntheticEvaluator, SyntheticSource};
