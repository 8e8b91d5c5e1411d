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
    /// Lines an architecture's loader adds on what the keys suggest (printed last).
    pub hints: Vec<String>,
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
            let n = self.missing.len();
            write!(f, "\n  {n} missing key(s): {}", key_list(&self.missing))?;
        }
        if !self.unexpected.is_empty() {
            let n = self.unexpected.len();
            write!(
                f,
                "\n  {n} unexpected key(s): {}",
                key_list(&self.unexpected)
            )?;
        }
        if !self.wrong_shape.is_empty() {
            write!(f, "\n  {} wrongly shaped key(s):", self.wrong_shape.len())?;
            for m in self.wrong_shape.iter().take(LISTED) {
                write!(
                    f,
                    "\n    {}: expected {:?}, found {:?}",
                    m.key, m.expected, m.found
                )?;
            }
            let more = self.wrong_shape.len().saturating_sub(LISTED);
            if more > 0 {
                write!(f, "\n    ... and {more} more")?;
            }
        }
        let prefix = prefix_hint(&self.missing, &self.unexpected);
        for hint in prefix.iter().chain(&self.hints) {
            write!(f, "\n  {hint}")?;
        }
        Ok(())
    }
}

/// How many keys (or wrongly shaped tensors) a mismatch report lists before it counts the
/// rest: a file of another model lists hundreds, which would bury the report.
pub const LISTED: usize = 8;

/// The first [`LISTED`] of `keys`, comma-separated, then how many more there are.
pub fn key_list<S: AsRef<str>>(keys: &[S]) -> String {
    let shown: Vec<&str> = keys.iter().take(LISTED).map(AsRef::as_ref).collect();
    match keys.len().saturating_sub(LISTED) {
        0 => shown.join(", "),
        more => format!("{}, ... and {more} more", shown.join(", ")),
    }
}

/// A line saying that unexpected keys are missing keys under a prefix (`model.`,
/// `exp_avg.`: a file saved from a wrapper, or an optimizer state file), with the prefixes
/// and how many keys each covers; `None` when no unexpected key is one.
pub fn prefix_hint<S: AsRef<str>>(missing: &[S], unexpected: &[S]) -> Option<String> {
    let missing: std::collections::HashSet<&str> = missing.iter().map(AsRef::as_ref).collect();
    let mut prefixes = std::collections::BTreeMap::<&str, usize>::new();
    for key in unexpected.iter().map(AsRef::as_ref) {
        let split = key
            .match_indices('.')
            .map(|(i, _)| i + 1)
            .find(|&i| missing.contains(&key[i..]));
        if let Some(i) = split {
            *prefixes.entry(&key[..i]).or_default() += 1;
        }
    }
    if prefixes.is_empty() {
        return None;
    }
    let count: usize = prefixes.values().sum();
    let listed: Vec<String> = prefixes
        .iter()
        .map(|(prefix, n)| format!("`{prefix}` {n}"))
        .collect();
    Some(format!(
        "hint: {count} unexpected key(s) are the model's own keys under a prefix ({}): a file \
         saved from a wrapper module, or not the weights (an optimizer state?)",
        key_list(&listed)
    ))
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
