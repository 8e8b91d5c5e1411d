//! Data sources: the traits every dataset plugin implements.
//!
//! A source yields host-side [`Sample`]s by index; the [`loader`](super::loader) shuffles,
//! batches and keeps a resumable cursor; the trainer moves batches to the device.

use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::Arc;

use crate::config::ConfigError;

/// Errors raised by data sources. Every variant names the file (or source) and, where one
/// exists, the record index.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file could not be read or parsed.
    #[error("{file}: {reason}")]
    File {
        /// Offending file.
        file: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// One record of a file is malformed (wrong shape, dtype, truncated bytes...).
    #[error("{file}: record {record}: {reason}")]
    Record {
        /// Offending file.
        file: PathBuf,
        /// Zero-based record index inside the file.
        record: usize,
        /// What went wrong.
        reason: String,
    },
    /// The source has no samples.
    #[error("data source `{source_name}` is empty: {reason}")]
    Empty {
        /// Source kind or path.
        source_name: String,
        /// Why it is empty (e.g. which folder was scanned).
        reason: String,
    },
    /// Index out of range (a loader bug or a changed dataset on resume).
    #[error("sample index {index} out of range for a source of {len} samples")]
    OutOfRange {
        /// Requested index.
        index: usize,
        /// Number of samples.
        len: usize,
    },
}

/// Static shape information of a source: every sample has these shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DataSpec {
    /// Latent channels `C`.
    pub channels: usize,
    /// Latent frames `F`.
    pub frames: usize,
    /// Latent height `H`.
    pub height: usize,
    /// Latent width `W`.
    pub width: usize,
    /// Text tokens `L` (after padding/cropping).
    pub text_len: usize,
    /// Text embedding width `D`.
    pub text_dim: usize,
}

impl DataSpec {
    /// Number of latent values per sample (`C·F·H·W`).
    pub fn latent_numel(&self) -> usize {
        self.channels * self.frames * self.height * self.width
    }
    /// Number of text-embedding values per sample (`L·D`).
    pub fn text_numel(&self) -> usize {
        self.text_len * self.text_dim
    }

    /// A spec of 4 latent channels, 8 text tokens 32 wide and the given latent sizes, for
    /// unit tests.
    #[cfg(test)]
    pub(crate) fn for_tests(frames: usize, height: usize, width: usize) -> Self {
        Self {
            channels: 4,
            frames,
            height,
            width,
            text_len: 8,
            text_dim: 32,
        }
    }
}

impl std::fmt::Display for DataSpec {
    /// `C×F×H×W latents, text L×D`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}×{}×{}×{} latents, text {}×{}",
            self.channels, self.frames, self.height, self.width, self.text_len, self.text_dim
        )
    }
}

/// A text condition: embedding `[L, D]` (row-major) plus a mask of valid tokens `[L]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TextCondition {
    /// Embedding values, `L·D` floats, row-major.
    pub embedding: Vec<f32>,
    /// `true` for real tokens, `false` for padding. Length `L`.
    pub mask: Vec<bool>,
}

/// One training sample on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Latent clip `[C, F, H, W]`, row-major, already normalised for the model.
    pub latents: Vec<f32>,
    /// Text condition.
    pub text: TextCondition,
    /// Human-readable caption (may be empty for sources without captions).
    pub caption: String,
}

/// A prompt used for validation and sampling: caption plus its embedding.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    /// Caption text.
    pub caption: String,
    /// Its text condition.
    pub text: TextCondition,
}

/// Scores of one generated clip against its caption, each in `[0, 1]`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClipScore {
    /// Named criteria (e.g. `colour`, `shape`, `direction`), 1.0 = correct.
    pub criteria: Vec<(String, f32)>,
    /// 1.0 when every criterion is correct.
    pub overall: f32,
}

/// Scores generated clips against their captions (the synthetic data's quality metric).
pub trait ClipEvaluator: Send + Sync + Debug {
    /// Score a generated latent clip `[C, F, H, W]` (row-major) against `caption`.
    fn score(&self, clip: &[f32], spec: &DataSpec, caption: &str) -> ClipScore;
}

/// A dataset: samples addressable by index.
pub trait DataSource: Send + Sync + Debug {
    /// Shapes every sample has.
    fn spec(&self) -> DataSpec;
    /// Number of samples.
    fn len(&self) -> usize;
    /// `true` when the source has no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Load sample `index` (`0..len()`).
    fn get(&self, index: usize) -> Result<Sample, DataError>;
    /// The unconditional (negative / empty prompt) text condition, if the source defines one.
    /// Methods fall back to zeros.
    fn negative_text(&self) -> Option<TextCondition> {
        None
    }
    /// A fixed, small set of prompts for validation and `reel sample`.
    fn prompts(&self) -> Vec<Prompt> {
        Vec::new()
    }
    /// Look up a prompt by caption (for `reel sample --prompt`).
    fn prompt_for(&self, caption: &str) -> Option<Prompt> {
        self.prompts().into_iter().find(|p| p.caption == caption)
    }
    /// An evaluator for generated clips, if this source has one.
    fn evaluator(&self) -> Option<Arc<dyn ClipEvaluator>> {
        None
    }
}

/// Serializable configuration of a data source (`[data] kind = "..."`).
#[typetag::serde(tag = "kind")]
pub trait DataConfig: Debug + Send + Sync {
    /// Check values (ranges, paths) without loading data. Errors name the key under `data.`.
    fn validate(&self) -> Result<(), ConfigError>;
    /// Samples per micro-batch.
    fn batch_size(&self) -> usize;
    /// Whether the loader shuffles (seeded) each epoch. Default: true.
    fn shuffle(&self) -> bool {
        true
    }
    /// The folder this source searches for sample files of a kind a run writes too (a
    /// folder of `.safetensors` samples, where a run writes `.safetensors` checkpoints and
    /// weights), relative to the current directory as [`build`](Self::build)'s `base_dir`
    /// is. A run folder inside it would have its files read as samples, so `reel train` and
    /// `reel check` refuse one. Default: none (the source reads nothing a run writes).
    fn read_from(&self) -> Option<&std::path::Path> {
        None
    }
    /// Open the source. `base_dir` resolves relative paths (the current directory, see
    /// [`crate::config::base_dir_for`]).
    fn build(&self, base_dir: &std::path::Path) -> Result<Box<dyn DataSource>, DataError>;
}
