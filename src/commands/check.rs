//! `reel check`: validate a config completely without training: the TOML, every plugin's
//! values, the files the roles name (architecture configs, weight headers; no tensor data is
//! read), and the data: its source opens (a parquet set's footers, a folder's listing) and
//! every role's model fits its latents (channels, text width, patch), as `reel train` would
//! find when building the roles.

use std::path::Path;

use reel_core::config::load_run_config;
use reel_core::config::LoadedConfig;

/// Validate `config` and print a one-line summary.
pub fn run(config: &Path, set: &[String]) -> anyhow::Result<()> {
    let loaded = load_run_config(config, set)?;
    loaded.check_files()?;
    let data = check_data(&loaded)?;
    println!(
        "ok: {}: {}; {data}",
        config.display(),
        super::describe(&loaded)
    );
    Ok(())
}

/// Open the data source and check every role's model against it ([`LoadedConfig::check_models`]);
/// returns a short description of the data.
fn check_data(loaded: &LoadedConfig) -> anyhow::Result<String> {
    let source = loaded.config.data.build(&loaded.base_dir)?;
    let spec = source.spec();
    loaded.check_models(&spec)?;
    Ok(format!(
        "data: {} samples of {}×{}×{}×{} latents, text {}×{}",
        source.len(),
        spec.channels,
        spec.frames,
        spec.height,
        spec.width,
        spec.text_len,
        spec.text_dim
    ))
}
