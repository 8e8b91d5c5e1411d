//! Callbacks shipped with Reel: `ema`, `validation` and `logging`.
//!
//! Each callback is a serde config (`[[callbacks]] kind = "<name>"`, unknown keys rejected,
//! every optional key defaulted) plus the runtime [`Callback`](reel_core::callback::Callback)
//! it builds, generic over the autodiff backend.
//!
//! ```toml
//! [[callbacks]]
//! kind = "ema"            # shadow weights e ← d·e + (1−d)·w after every step
//! decay = 0.999
//!
//! [[callbacks]]
//! kind = "validation"     # sample prompts, write GIFs + a contact sheet, score them
//! every_steps = 100
//! sampling_steps = 8
//!
//! [[callbacks]]
//! kind = "logging"        # progress line, metrics.jsonl, TensorBoard events, loss.png
//! ```
//!
//! - [`ema`]: the EMA shadow lives in the role ([`RoleHandle::ema_update`]); the trainer saves
//!   it as `<role>.ema.safetensors` with every checkpoint and restores it on resume.
//! - [`validation`]: `<run>/samples/step-<N>/` with one GIF per prompt, `sheet.png` and
//!   `scores.json`; reports `val/overall` and `val/<criterion>` to the other callbacks.
//! - [`logging`]: everything a person or a dashboard reads while a run trains.
//!
//! [`RoleHandle::ema_update`]: reel_core::role::RoleHandle::ema_update

pub mod ema;
pub mod logging;
pub mod validation;

use std::path::Path;

use reel_core::callback::CallbackError;

pub use ema::{EmaCallback, EmaConfig};
pub use logging::{LoggingCallback, LoggingConfig};
pub use validation::{ValidationCallback, ValidationConfig};

/// A [`CallbackError::Io`] naming `path`.
pub(crate) fn io_error(path: &Path, e: impl std::fmt::Display) -> CallbackError {
    CallbackError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Print one message line on stderr, above the progress bar when one is drawn.
pub(crate) fn print_line(line: &str) {
    logging::progress::print_above(line);
}
