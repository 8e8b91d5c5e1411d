//! [`WeightError`] and the key/shape mismatch report every weight loader shares.

use std::fmt;
use std::path::{Path, PathBuf};

/// An error while reading, writing or applying weights. Every message names the file (or the source
/// given in [`LoadOptions::source`](super::LoadOptions::source)) and, where one is involved, the
/// tensor key.
#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    /// The file could not be read or written.
    #[error("cannot access `{path}`: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error (printed in the message, so not returned as the source).
        error: std::io::Error,
    },
    /// The file is not valid safetensors (or a related JSON file is malformed).
    #[error("invalid file `{path}`: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A tensor in the file has a dtype that cannot be converted to f32.
    #[error(
        "`{path}`: tensor `{key}` has dtype {dtype}; only F32, BF16, F16 and F64 are supported"
    )]
    UnsupportedDtype {
        /// The file.
        path: PathBuf,
        /// The tensor key.
        key: String,
        /// The dtype found.
        dtype: String,
    },
    /// A tensor handed to a writer is malformed (wrong byte count or dtype) or a key repeats.
    #[error("`{path}`: tensor `{key}`: {message}")]
    InvalidTensor {
        /// The file being written.
        path: PathBuf,
        /// The tensor key.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// The tensors do not match the module's parameters.
    #[error("{0}")]
    Mismatch(Box<KeyMismatch>),
}

/// A parameter whose stored tensor has the wrong shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeMismatch {
    /// The key (dotted parameter path).
    pub key: String,
    /// The shape the module expects.
    pub expected: Vec<usize>,
    /// The shape found in the tensors.
    pub found: Vec<usize>,
}

/// Every difference between a set of tensors and a module's parameters, found in one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyMismatch {
    /// Where the tensors came from (usually a file path).
    pub source: String,
    /// Module parameters with no tensor (sorted).
    pub missing: Vec<String>,
    /// Tensors with no module parameter (sorted; only reported when strict).
    pub unexpected: Vec<String>,
    /// Tensors whose shape differs from the parameter's (sorted by key).
    pub wrong_shape: Vec<ShapeMismatch>,
}

impl KeyMismatch {
    /// True when nothing is wrong.
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty() && self.wrong_shape.is_empty()
    }
}

impl fmt::Display for KeyMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "weights from `{}` do not match the model:", self.source)?;
        if !self.missing.is_empty() {
            write!(
                f,
                "\n  {} missing key(s): {}",
                self.missing.len(),
                self.missing.join(", ")
            )?;
        }
        if !self.unexpected.is_empty() {
            write!(
                f,
                "\n  {} unexpected key(s): {}",
                self.unexpected.len(),
                self.unexpected.join(", ")
            )?;
        }
        if !self.wrong_shape.is_empty() {
            write!(f, "\n  {} wrongly shaped key(s):", self.wrong_shape.len())?;
            for m in &self.wrong_shape {
                write!(
                    f,
                    "\n    {}: expected {:?}, found {:?}",
                    m.key, m.expected, m.found
                )?;
            }
        }
        Ok(())
    }
}

pub(super) fn io_err(path: &Path, error: std::io::Error) -> WeightError {
    WeightError::Io {
        path: path.to_path_buf(),
        error,
    }
}

pub(super) fn format_err(path: &Path, message: impl fmt::Display) -> WeightError {
    WeightError::Format {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}
