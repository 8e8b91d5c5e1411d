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

use reel_core::backend::ReelBackend;
use reel_core::config::LoadedConfig;

/// `B`'s device `index` once it is known to exist on this machine
/// ([`reel_core::devices::check_indices`]); otherwise an error led by `what`, the flag or key
/// that chose it (`--device`).
pub fn device<B: ReelBackend>(index: usize, what: &str) -> anyhow::Result<B::Device> {
    reel_core::devices::check_indices(B::NAME, &[index])
        .map_err(|message| anyhow::anyhow!("{what}: {message}"))?;
    Ok(B::device_for(index))
}

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
