//! `[data] kind = "toy"`: random latents `[1, 1, 2, 2]` with a text embedding of width 2.

use serde::{Deserialize, Serialize};

use reel_core::config::{check, ConfigError};
use reel_core::data::{DataConfig, DataError, DataSource, DataSpec, Sample, TextCondition};
use reel_core::rng::StreamRng;

/// `[data] kind = "toy"`: `num_samples` random samples of shape `[1, 1, 2, 2]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToyDataConfig {
    /// Samples per micro-batch.
    pub batch_size: usize,
    /// Number of samples.
    #[serde(default = "default_samples")]
    pub num_samples: usize,
}
fn default_samples() -> usize {
    16
}

#[derive(Debug)]
struct ToyData(usize);

impl DataSource for ToyData {
    fn spec(&self) -> DataSpec {
        DataSpec {
            channels: 1,
            frames: 1,
            height: 2,
            width: 2,
            text_len: 1,
            text_dim: 2,
        }
    }
    fn len(&self) -> usize {
        self.0
    }
    fn get(&self, index: usize) -> Result<Sample, DataError> {
        let mut r = StreamRng::from_seed(1000 + index as u64);
        Ok(Sample {
            latents: r.normal_vec(4),
            text: TextCondition {
                embedding: r.normal_vec(2),
                mask: vec![true],
            },
            caption: format!("toy {index}"),
        })
    }
}

#[reel_core::plugin(name = "toy", summary = "Random toy samples (example crate)")]
impl DataConfig for ToyDataConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        check::positive_usize("batch_size", self.batch_size)?;
        check::positive_usize("num_samples", self.num_samples)
    }
    fn batch_size(&self) -> usize {
        self.batch_size
    }
    fn build(&self, _base: &std::path::Path) -> Result<Box<dyn DataSource>, DataError> {
        Ok(Box::new(ToyData(self.num_samples)))
    }
}
