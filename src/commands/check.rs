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

/// Open the data source and check every role whose architecture tells its shape facts from
/// the config alone against it; returns a short description of the data.
fn check_data(loaded: &LoadedConfig) -> anyhow::Result<String> {
    let source = loaded.config.data.build(&loaded.base_dir)?;
    let spec = source.spec();
    for (name, role) in &loaded.config.models {
        let in_file = |e: reel_core::config::ConfigError| e.in_file(&loaded.path);
        let info = role
            .model
            .model_info(role, &|p| loaded.resolve(p))
            .map_err(|e| in_file(e.in_section(&format!("models.{name}"))))?;
        if let Some(info) = info {
            info.check_data(name, &spec).map_err(in_file)?;
        }
    }
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
