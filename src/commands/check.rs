//! `reel check`: validate a config completely without training: the TOML, every plugin's
//! values, the files the roles name (architecture configs, weight headers; no tensor data is
//! read), and the data: its source opens (a parquet set's footers, a folder's listing) and
//! every role's model fits its latents (channels, text width, patch), as `reel train` would
//! find when building the roles; and no file stands where the run folder must be made.

use std::path::Path;

use reel_core::config::{load_run_config, ConfigError, LoadedConfig};
use reel_core::trainer::{run_dir_error, run_dir_for};

/// Validate `config` and print a one-line summary.
pub fn run(config: &Path, set: &[String]) -> anyhow::Result<()> {
    let loaded = load_run_config(config, set)?;
    loaded.check_files()?;
    let data = check_data(&loaded)?;
    check_run_dir(&loaded)?;
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

/// Refuse a run folder (`runtime.output_dir`, else `runs/<config name>`) that `reel train`
/// could not make because a file stands at its path or at a parent's. Nothing is created.
fn check_run_dir(loaded: &LoadedConfig) -> Result<(), ConfigError> {
    let dir = run_dir_for(loaded, None);
    match dir.ancestors().find(|p| p.exists()) {
        Some(file) if !file.is_dir() => Err(run_dir_error(
            loaded,
            None,
            format!(
                "the run folder `{}` cannot be made: `{}` is a file",
                dir.display(),
                file.display()
            ),
        )),
        _ => Ok(()),
    }
}
