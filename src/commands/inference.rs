//! Shared by `reel sample` and `reel eval`: rebuild a run's method from its config and load a
//! checkpoint into it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use reel_core::backend::ReelBackend;
use reel_core::checkpoint::{CheckpointStore, Manifest};
use reel_core::config::{load_run_config, LoadedConfig};
use reel_core::data::DataSource;
use reel_core::method::TrainingMethod;
use reel_core::trainer::{build_method, config_fingerprint, load_checkpoint_into};

/// Where the weights come from.
#[derive(Debug, Clone, clap::Args)]
pub struct Source {
    /// A checkpoint folder (`.../checkpoints/step-N`) or a run folder (its newest intact
    /// checkpoint is used).
    pub checkpoint: Option<PathBuf>,
    /// The run config; defaults to the checkpoint's own `config.toml`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Use the model as configured, without loading a checkpoint (e.g. the untrained model).
    #[arg(long)]
    pub untrained: bool,
    /// Do not swap in EMA weights even when the checkpoint has them.
    #[arg(long)]
    pub no_ema: bool,
    /// Override a config value (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// A method ready to sample, with its data source.
pub struct Loaded<B: ReelBackend> {
    /// The method with the checkpoint's weights (EMA swapped in unless `--no-ema`).
    pub method: Box<dyn TrainingMethod<B>>,
    /// The run's data source (prompts, evaluator).
    pub source: Arc<dyn DataSource>,
    /// The checkpoint loaded, if any.
    pub checkpoint: Option<PathBuf>,
    /// Whether EMA weights are in use.
    pub ema: bool,
}

/// Find the checkpoint folder for a checkpoint-or-run path.
fn checkpoint_dir(path: &Path, loaded: &LoadedConfig) -> anyhow::Result<PathBuf> {
    if path.join("manifest.json").is_file() {
        return Ok(path.to_path_buf());
    }
    let store = CheckpointStore::new(path, usize::MAX);
    // Sampling settings may be overridden with --set, which changes the config fingerprint:
    // accept the fingerprint the run's newest checkpoint was written with.
    let fingerprint = store
        .list()
        .first()
        .and_then(|(_, d)| Manifest::read(d).ok())
        .map(|m| m.config_fingerprint)
        .unwrap_or_else(|| config_fingerprint(loaded));
    let (dir, _, warnings) = store
        .resolve("latest", &fingerprint)
        .with_context(|| format!("no checkpoint under {}", path.display()))?;
    for w in warnings {
        eprintln!("reel: warning: {w}");
    }
    Ok(dir)
}

/// The config path: `--config`, else the checkpoint's `config.toml`.
fn config_path(src: &Source) -> anyhow::Result<PathBuf> {
    if let Some(c) = &src.config {
        return Ok(c.clone());
    }
    let Some(ck) = &src.checkpoint else {
        anyhow::bail!("give a checkpoint or run folder, or --config with --untrained");
    };
    let direct = ck.join("config.toml");
    if direct.is_file() {
        return Ok(direct);
    }
    let resolved = ck.join("config.resolved.toml");
    if resolved.is_file() {
        return Ok(resolved);
    }
    anyhow::bail!("{} holds no config.toml: pass --config", ck.display())
}

/// Build the method and load the weights.
pub fn load<B: ReelBackend>(src: &Source, loaded: &LoadedConfig) -> anyhow::Result<Loaded<B>> {
    let device = B::device_for(loaded.config.runtime.device);
    let source: Arc<dyn DataSource> = Arc::from(loaded.config.data.build(&loaded.base_dir)?);
    let mut method = build_method::<B>(loaded, &*source, &device)?;
    let mut checkpoint = None;
    let mut ema = false;
    if !src.untrained {
        let path = src
            .checkpoint
            .as_ref()
            .context("give a checkpoint or run folder (or --untrained)")?;
        let dir = checkpoint_dir(path, loaded)?;
        load_checkpoint_into(&dir, &mut *method)?;
        if !src.no_ema {
            let role = method.sampling_role().to_string();
            for r in method.roles_mut() {
                if r.name() == role && r.has_ema() {
                    r.swap_ema();
                    ema = true;
                }
            }
        }
        checkpoint = Some(dir);
    }
    Ok(Loaded {
        method,
        source,
        checkpoint,
        ema,
    })
}

/// Read the config for a source.
pub fn read_config(src: &Source) -> anyhow::Result<LoadedConfig> {
    Ok(load_run_config(&config_path(src)?, &src.set)?)
}
