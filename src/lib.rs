//! Reel: a typed, reproducible training framework for video diffusion transformers.
//!
//! The `reel` binary is [`cli::run`]; a crate with plugins of its own builds its binary from
//! it (see [`cli`]). This crate links every built-in plugin crate (methods, models, data
//! sources, callbacks), so their registrations are part of any binary built on it.
#![warn(missing_docs)]

pub mod cli;
pub mod commands;
pub mod panic_hint;

// Plugin crates register themselves at link time; reference each so the linker keeps them.
use reel_methods as _;
use reel_models as _;
use reel_plugins as _;
