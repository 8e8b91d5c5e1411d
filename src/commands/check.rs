//! `reel check`: validate a config completely without training: the TOML, every plugin's
//! values, the files the roles name (architecture configs, weight headers; no tensor data is
//! read), and the data: its source opens (a parquet set's footers, a safetensors folder's
//! headers) and every role's model fits its latents (channels, text width, patch), as `reel
//! train` would find when building the roles; the run's GPUs exist; and no file stands where
//! the run folder must be made.
//!
//! The values are checked first and the first bad one stops the check (later keys may depend
//! on it); past them, every problem is listed: a backend this binary lacks, each role's and
//! callback's files, the data, the run folder — so the shipped real configs name every file
//! they miss at once.

use std::path::Path;

use reel_core::config::{load_run_config_any_backend, ConfigError, LoadedConfig};
use reel_core::memory;
use reel_core::trainer::{check_run_outside_data, run_dir_error, run_dir_for, EarlierRun};

/// Validate `config` and print a summary (the run, the data and on a second line the roles'
/// memory floor), or every problem found, one per line.
pub fn run(config: &Path, set: &[String], output: Option<&Path>) -> anyhow::Result<()> {
    let loaded = load_run_config_any_backend(config, set)?;
    let mut problems: Vec<String> = Vec::new();
    let mut note = |e: ConfigError| problems.push(e.to_string());
    match loaded.config.runtime.backend.check_compiled() {
        Err(e) => note(e.in_file(config)),
        Ok(()) => {
            if let Err(e) = loaded.check_devices() {
                note(e);
            }
        }
    }
    if let Some(e) = super::processes::launcher_unsupported(&loaded) {
        note(e.in_file(config));
    }
    loaded.file_problems().into_iter().for_each(&mut note);
    let data = check_data(&loaded, &mut note);
    if let Err(e) = check_run_dir(&loaded, output) {
        note(e);
    }
    // A role whose `config.json` is missing fails its file check and its model check alike.
    let mut seen = std::collections::HashSet::new();
    problems.retain(|p| seen.insert(p.clone()));
    match problems.len() {
        0 => {
            let data = data.unwrap_or_default();
            println!(
                "ok: {}: {}; {data}",
                config.display(),
                super::describe(&loaded)
            );
            note_existing_run(&loaded, output);
            Ok(())
        }
        1 => anyhow::bail!("{}", problems[0]),
        n => {
            for p in &problems {
                eprintln!("error: {p}");
            }
            anyhow::bail!("{}: {n} problems (each above)", config.display())
        }
    }
}

/// Open the data source and check every role's model against it
/// ([`LoadedConfig::model_problems`]) and the roles' memory floor against the devices'
/// ([`LoadedConfig::check_memory_floor`]), noting what is wrong; returns a short description
/// of the data when it opens, and on a second line the floor.
fn check_data(loaded: &LoadedConfig, note: &mut impl FnMut(ConfigError)) -> Option<String> {
    let source = match loaded.config.data.build(&loaded.base_dir) {
        Ok(source) => source,
        Err(e) => {
            note(ConfigError::new("data", e.to_string()).in_file(&loaded.path));
            return None;
        }
    };
    let spec = source.spec();
    loaded
        .model_problems(&spec)
        .into_iter()
        .for_each(&mut *note);
    // Sizes past a step's data's memory (noted above) make the floor meaningless. (As one
    // process: a run of several holds its share.)
    let floor = loaded
        .check_step_memory(&spec, 1)
        .ok()
        .map(|()| loaded.check_memory_floor(&spec));
    let memory = match floor {
        Some(Ok((floor, available))) => {
            format!("\nmemory: {}", memory::describe(&floor, available))
        }
        Some(Err(e)) => {
            note(e);
            String::new()
        }
        None => String::new(),
    };
    Some(format!("data: {} samples of {spec}{memory}", source.len()))
}

/// Refuse a run folder (`--output`, else `runtime.output_dir`, else `runs/<config name>`) that `reel train`
/// could not make because a file stands at its path or at a parent's, or that lies in the
/// data's folder. Nothing is created.
fn check_run_dir(loaded: &LoadedConfig, output: Option<&Path>) -> Result<(), ConfigError> {
    check_run_outside_data(loaded, output)?;
    let dir = run_dir_for(loaded, output);
    match dir.ancestors().find(|p| p.exists()) {
        Some(file) if !file.is_dir() => Err(run_dir_error(
            loaded,
            output,
            format!(
                "the run folder `{}` cannot be made: `{}` is a file",
                dir.display(),
                file.display()
            ),
        )),
        // Entries the run writes, there as the wrong kind.
        _ => (loaded.config.check_run_folder(&dir)).map_err(|e| e.in_file(&loaded.path)),
    }
}

/// Say when the run folder already holds a run, which `reel train` refuses without
/// `--resume latest` (and refuses outright when there is no checkpoint to resume from).
fn note_existing_run(loaded: &LoadedConfig, output: Option<&Path>) {
    let dir = run_dir_for(loaded, output);
    if let Some(earlier) = EarlierRun::in_folder(&dir) {
        eprintln!(
            "reel: note: `{}` already holds a run ({earlier}): {}",
            dir.display(),
            earlier.what_to_do()
        );
    }
}
