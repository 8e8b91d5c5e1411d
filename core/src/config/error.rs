//! The configuration error: always names the file, the key path and what was expected.

use std::fmt;
use std::path::{Path, PathBuf};

/// A configuration problem, reported as one line: `file: key: message`.
///
/// Plugins create errors with keys relative to their own section (`lr`, `rank`); the run-config
/// loader prefixes the section (`method.lr`) and the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The config file, when known.
    pub file: Option<PathBuf>,
    /// Dotted key path, e.g. `models.student.adapter.rank`.
    pub key: String,
    /// What was wrong and what was expected.
    pub message: String,
}

impl ConfigError {
    /// An error about `key` (relative to the current section).
    pub fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            file: None,
            key: key.into(),
            message: message.into(),
        }
    }

    /// Prefix the key with a section path (`section.key`).
    pub fn in_section(mut self, section: &str) -> Self {
        if section.is_empty() {
            return self;
        }
        self.key = if self.key.is_empty() {
            section.to_string()
        } else {
            format!("{section}.{}", self.key)
        };
        self
    }

    /// Attach the config file path (kept if one is already set).
    pub fn in_file(mut self, file: &Path) -> Self {
        if self.file.is_none() {
            self.file = Some(file.to_path_buf());
        }
        self
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}: ", file.display())?;
        }
        if self.key.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "`{}`: {}", self.key, self.message)
        }
    }
}

impl std::error::Error for ConfigError {}

/// Check helpers for `validate()` implementations.
pub mod check {
    use super::ConfigError;

    /// `value > 0`.
    pub fn positive_f64(key: &str, value: f64) -> Result<(), ConfigError> {
        if value.is_finite() && value > 0.0 {
            Ok(())
        } else {
            Err(ConfigError::new(
                key,
                format!("expected a positive number, got {value}"),
            ))
        }
    }

    /// `value >= 0` (and finite).
    pub fn non_negative_f64(key: &str, value: f64) -> Result<(), ConfigError> {
        if value.is_finite() && value >= 0.0 {
            Ok(())
        } else {
            Err(ConfigError::new(
                key,
                format!("expected a number >= 0, got {value}"),
            ))
        }
    }

    /// `value >= 1`.
    pub fn positive_usize(key: &str, value: usize) -> Result<(), ConfigError> {
        positive_u64(key, value as u64)
    }

    /// `value >= 1`.
    pub fn positive_u64(key: &str, value: u64) -> Result<(), ConfigError> {
        if value >= 1 {
            Ok(())
        } else {
            Err(ConfigError::new(
                key,
                format!("expected an integer >= 1, got {value}"),
            ))
        }
    }

    /// `1 <= value <= most`; `why` (` (...)`, or empty) says what the limit keeps from
    /// happening.
    pub fn count_in(key: &str, value: usize, most: usize, why: &str) -> Result<(), ConfigError> {
        if (1..=most).contains(&value) {
            return Ok(());
        }
        Err(ConfigError::new(
            key,
            format!("expected an integer in [1, {most}]{why}, got {value}"),
        ))
    }

    /// The most sampling steps a sampler takes: far above any schedule in use (Wan samples
    /// in 50), low enough that a mistyped count is an error, not an allocation of its
    /// σ schedule that aborts the process.
    pub const MAX_SAMPLING_STEPS: usize = 100_000;

    /// A count of sampling steps: `1 <= value <= MAX_SAMPLING_STEPS`.
    pub fn sampling_steps(key: &str, value: usize) -> Result<(), ConfigError> {
        positive_usize(key, value)?;
        if value > MAX_SAMPLING_STEPS {
            return Err(ConfigError::new(
                key,
                format!("expected at most {MAX_SAMPLING_STEPS} sampling steps, got {value}"),
            ));
        }
        Ok(())
    }

    /// The sizes of a model config (`(key, value, limit)`: a width, a channel, head or layer
    /// count, a vocabulary) that are above their limit, each a message naming its key. An
    /// architecture's limits lie far above every released model: a value past one is a typo,
    /// and staying below them keeps every count derived from the sizes (parameters, tensor
    /// elements, bytes) far from overflowing. A product of sizes is given saturated
    /// (`saturating_mul`): `usize::MAX` reads "too large to count".
    pub fn sizes_above(sizes: &[(&str, usize, usize)]) -> Vec<String> {
        sizes
            .iter()
            .filter(|(_, value, limit)| value > limit)
            .map(|(key, value, limit)| {
                // A product saturated at `usize::MAX` has no value worth printing.
                let is = match *value {
                    usize::MAX => "is too large to count, above".to_string(),
                    v => format!("= {v} is above"),
                };
                format!("`{key}` {is} the limit {limit} (far beyond released models)")
            })
            .collect()
    }

    /// `lo <= value <= hi`.
    pub fn in_range(key: &str, value: f64, lo: f64, hi: f64) -> Result<(), ConfigError> {
        if value.is_finite() && value >= lo && value <= hi {
            Ok(())
        } else {
            Err(ConfigError::new(
                key,
                format!("expected a number in [{lo}, {hi}], got {value}"),
            ))
        }
    }

    /// `lo <= value < hi`.
    pub fn in_half_open(key: &str, value: f64, lo: f64, hi: f64) -> Result<(), ConfigError> {
        if value.is_finite() && value >= lo && value < hi {
            Ok(())
        } else {
            Err(ConfigError::new(
                key,
                format!("expected a number in [{lo}, {hi}), got {value}"),
            ))
        }
    }
}
