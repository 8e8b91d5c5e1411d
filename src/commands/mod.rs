//! The subcommands of `reel`, one module each; [`crate::cli`] dispatches to them.
pub mod bench;
pub mod check;
pub mod data;
pub mod eval;
pub mod export;
pub mod inference;
pub mod list;
pub mod negative;
pub mod preprocess;
pub mod processes;
mod progress;
pub mod sample;
pub mod train;

use reel_core::config::LoadedConfig;

/// One-line description of a loaded config.
pub fn describe(loaded: &LoadedConfig) -> String {
    let c = &loaded.config;
    let roles: Vec<String> = c
        .models
        .iter()
        .map(|(n, r)| format!("{n}={}{}", r.arch(), if r.trainable { "*" } else { "" }))
        .collect();
    let backend = c.runtime.backend.as_str();
    let devices = c.runtime.worker_devices();
    let workers = match devices.len() {
        1 => String::new(),
        n => format!(
            ", {n} data-parallel workers on devices {devices:?} ({} samples each)",
            c.data.batch_size() / n
        ),
    };
    format!(
        "method `{}`, roles [{}] (* = trainable), backend {backend}{workers}, {} steps",
        c.method.typetag_name(),
        roles.join(", "),
        c.training.max_steps
    )
}
