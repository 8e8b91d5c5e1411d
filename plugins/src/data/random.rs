//! The `random` data source: seeded standard-normal latents and text embeddings of any
//! shape, with no files.
//!
//! For benchmarks and shape smoke tests at a real model's sizes when no preprocessed data
//! is at hand (`reel bench --breakdown` uses it), not for learning anything: sample `i` is a
//! pure function of `seed` and `i`, every text token is real, and there is no caption.
//!
//! ```toml
//! [data]
//! kind = "random"
//! channels = 16          # Wan2.1's VAE latents
//! frames = 20            # 77 video frames
//! height = 56            # 448 px
//! width = 104            # 832 px
//! text_len = 512
//! text_dim = 4096        # UMT5-XXL
//! ```

use std::path::Path;

use reel_core::config::{check, ConfigError};
use reel_core::data::{DataConfig, DataError, DataSource, DataSpec, Sample, TextCondition};
use reel_core::rng::StreamRng;
use serde::{Deserialize, Serialize};

fn default_batch_size() -> usize {
    1
}
fn default_num_samples() -> usize {
    64
}

/// Configuration of the `random` source; the latent and text shapes are required.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RandomDataConfig {
    /// Samples per micro-batch (default 1).
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Number of samples in the data set (default 64).
    #[serde(default = "default_num_samples")]
    pub num_samples: usize,
    /// Seed of the values (default 0).
    #[serde(default)]
    pub seed: u64,
    /// Latent channels `C`.
    pub channels: usize,
    /// Latent frames `F`.
    pub frames: usize,
    /// Latent height `H`.
    pub height: usize,
    /// Latent width `W`.
    pub width: usize,
    /// Text tokens `L`.
    pub text_len: usize,
    /// Text embedding width `D`.
    pub text_dim: usize,
}

impl RandomDataConfig {
    /// The shapes of the samples this config produces.
    pub fn spec(&self) -> DataSpec {
        DataSpec {
            channels: self.channels,
            frames: self.frames,
            height: self.height,
            width: self.width,
            text_len: self.text_len,
            text_dim: self.text_dim,
        }
    }
}

#[reel_core::plugin(
    name = "random",
    summary = "Seeded random latents and text embeddings of any shape (benchmarks, smoke tests)"
)]
impl DataConfig for RandomDataConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        check::positive_usize("batch_size", self.batch_size)?;
        super::tensors::check_generated_samples(self.num_samples)?;
        // Each size bounded far beyond any model's latents (Wan 14B at 720p: 16 × 21 × 90 ×
        // 160), so that a typo is an error here, not an allocation that aborts the process or
        // a product that wraps around.
        let why = " (latent sizes; Wan2.1 at 480p: 16, 21, 60, 104)";
        check::count_in("channels", self.channels, 4096, why)?;
        check::count_in("frames", self.frames, 1 << 16, why)?;
        check::count_in("height", self.height, 1 << 16, why)?;
        check::count_in("width", self.width, 1 << 16, why)?;
        super::tensors::check_text_len(self.text_len)?;
        check::count_in("text_dim", self.text_dim, 1 << 16, " (Wan: 4096)")?;
        let dims = [self.channels, self.frames, self.height, self.width];
        let values = dims.iter().try_fold(1usize, |a, &n| a.checked_mul(n));
        let most = 1usize << 34;
        match values {
            Some(v) if v <= most => Ok(()),
            _ => Err(ConfigError::new(
                "height",
                format!(
                    "a latent of {dims:?} is more than the {most} values (64 GiB) one sample \
                     may hold"
                ),
            )),
        }
    }

    fn batch_size(&self) -> usize {
        self.batch_size
    }

    fn build(&self, _base_dir: &Path) -> Result<Box<dyn DataSource>, DataError> {
        Ok(Box::new(RandomSource {
            config: self.clone(),
        }))
    }
}

/// Stream tag of the sample values.
const SAMPLE_STREAM: u64 = 0x7a4d_0000;

/// The `random` data source (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct RandomSource {
    config: RandomDataConfig,
}

impl DataSource for RandomSource {
    fn spec(&self) -> DataSpec {
        self.config.spec()
    }

    fn len(&self) -> usize {
        self.config.num_samples
    }

    fn get(&self, index: usize) -> Result<Sample, DataError> {
        if index >= self.len() {
            return Err(DataError::OutOfRange {
                index,
                len: self.len(),
            });
        }
        let spec = self.spec();
        let seed = (self.config.seed ^ SAMPLE_STREAM).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut rng = StreamRng::from_seed(seed ^ index as u64);
        Ok(Sample {
            latents: rng.normal_vec(spec.latent_numel()),
            text: TextCondition {
                embedding: rng.normal_vec(spec.text_numel()),
                mask: vec![true; spec.text_len],
            },
            caption: String::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> RandomDataConfig {
        toml::from_str(
            "channels = 3\nframes = 2\nheight = 4\nwidth = 5\ntext_len = 6\ntext_dim = 7\n",
        )
        .unwrap()
    }

    #[test]
    fn samples_have_the_configured_shapes_and_depend_on_seed_and_index() {
        let cfg = config();
        cfg.validate().unwrap();
        let src = cfg.build(Path::new(".")).unwrap();
        assert_eq!((src.len(), cfg.batch_size()), (64, 1));
        let a = src.get(3).unwrap();
        assert_eq!(a.latents.len(), 3 * 2 * 4 * 5);
        assert_eq!(a.text.embedding.len(), 6 * 7);
        assert_eq!(a.text.mask, vec![true; 6]);
        assert_eq!(src.get(3).unwrap(), a, "a pure function of the index");
        assert_ne!(src.get(4).unwrap().latents, a.latents);
        let other = RandomDataConfig { seed: 1, ..cfg };
        assert_ne!(other.build(Path::new(".")).unwrap().get(3).unwrap(), a);
        let mean = a.latents.iter().sum::<f32>() / a.latents.len() as f32;
        assert!(mean.abs() < 0.5, "standard normal values: mean {mean}");
        assert!(matches!(
            src.get(64),
            Err(DataError::OutOfRange { index: 64, len: 64 })
        ));
    }

    #[test]
    fn shapes_are_required_and_positive() {
        let err = toml::from_str::<RandomDataConfig>("channels = 3").unwrap_err();
        assert!(err.to_string().contains("missing field"), "{err}");
        let zero = RandomDataConfig {
            width: 0,
            ..config()
        };
        assert!(zero.validate().unwrap_err().to_string().contains("width"));
        // Sizes no model has are refused by key, and so is a product past what a sample may
        // hold (each size below its own limit, 2^16 each: 2^48 values).
        let huge = RandomDataConfig {
            height: 1_000_000,
            ..config()
        };
        let e = huge.validate().unwrap_err();
        assert_eq!(e.key, "height");
        assert!(e.to_string().contains("[1, 65536]"), "{e}");
        let wide = RandomDataConfig {
            frames: 1 << 16,
            height: 1 << 16,
            width: 1 << 16,
            ..config()
        };
        let e = wide.validate().unwrap_err().to_string();
        assert!(e.contains("more than the 17179869184 values"), "{e}");
    }
}
