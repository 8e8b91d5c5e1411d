//! `reel check`: validate a config completely without training: the TOML, every plugin's
//! values, and the files the roles name (architecture configs, weight headers; no tensor
//! data is read).

use std::path::Path;

use reel_core::config::load_run_config;

/// Validate `config` and print a one-line summary.
pub fn run(config: &Path, set: &[String]) -> anyhow::Result<()> {
    let loaded = load_run_config(config, set)?;
    loaded.check_files()?;
    println!("ok: {}: {}", config.display(), super::describe(&loaded));
    Ok(())
}
