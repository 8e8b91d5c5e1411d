//! Shared by `reel sample` and `reel eval`: rebuild a run's method from its config and load a
//! checkpoint into it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use reel_core::backend::ReelBackend;
use reel_core::checkpoint::{CheckpointStore, Manifest, TrainerState, MANIFEST, STATE_FILE};
use reel_core::config::{load_run_config, LoadedConfig};
use reel_core::data::{DataConfig as _, DataSource, DataSpec};
use reel_core::method::TrainingMethod;
use reel_core::trainer::{
    build_method, final_shapes, holds_final_weights, load_final_into, SHAPES_FILE,
};
use reel_plugins::data::RandomDataConfig;

/// Where the weights come from.
#[derive(Debug, Clone, clap::Args)]
pub struct Source {
    /// A checkpoint folder (`.../checkpoints/step-N`), a run folder (its newest intact
    /// checkpoint is used) or a run's `final/` folder (its published weights).
    pub checkpoint: Option<PathBuf>,
    /// The run config; defaults to the checkpoint's own `config.toml` (the run's
    /// `config.resolved.toml` for its `final/` folder).
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
    /// Why `source` stands in for the run's data with shapes only, and whose shapes they are
    /// (`the run's data cannot be read (...); sampling with ...`); `None` for the data itself.
    pub stand_in: Option<String>,
}

/// `path`, if something is there: a missing run or checkpoint folder is named as one.
fn existing(path: &Path) -> anyhow::Result<&Path> {
    if !path.exists() {
        anyhow::bail!("{}: no such run or checkpoint folder", path.display());
    }
    Ok(path)
}

/// The checkpoint folder a path names, for reading (`sample`, `eval`, `export`): a checkpoint
/// folder (it has `manifest.json`; refused when a file fails its checksum), the `latest`
/// file of a run's `checkpoints/`, a run's `checkpoints/` folder, or a run folder. For the
/// last three the newest intact checkpoint is used (integrity checked by the manifest's
/// checksums, falling back past damaged ones, whatever config fingerprint each was stamped
/// with), so `--set` overrides of sampling settings do not make it unreadable, while the
/// weights are still checked key by key against the rebuilt model.
pub fn resolve_checkpoint(path: &Path) -> anyhow::Result<PathBuf> {
    if path.join(MANIFEST).is_file() {
        // Named directly, it is used or refused; never read with a damaged file.
        Manifest::read(path)?.verify(path)?;
        return Ok(path.to_path_buf());
    }
    existing(path)?;
    let latest = path.file_name().is_some_and(|n| n == "latest");
    anyhow::ensure!(
        !path.is_file() || latest,
        "{} is a file, where a run folder or a checkpoint folder (such as \
         runs/x/checkpoints/step-00000100) is expected",
        path.display()
    );
    let checkpoints = if path.is_file() {
        // `checkpoints/latest` names the newest step folder beside it.
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        parent.unwrap_or(Path::new(".")).to_path_buf()
    } else if path.join("checkpoints").is_dir() {
        path.join("checkpoints")
    } else {
        path.to_path_buf()
    };
    // The newest intact checkpoint, whatever fingerprint stamped it (an older binary's
    // style, or resumable keys changed on resume: a run's checkpoints hold one `[models]`
    // and `[method]`, as a resume refuses others); its error names the folder it searched.
    let store = CheckpointStore::at(&checkpoints);
    let (dir, _, warnings) = store.resolve_accepting("latest", &|_, _| true)?;
    for w in warnings {
        eprintln!("reel: warning: {w}");
    }
    Ok(dir)
}

/// The folder whose weights `sample`, `eval` and `export` read: a run's `final/` folder (or
/// a copy of it: the weights of every trainable role of `loaded`, nothing of a checkpoint,
/// see [`holds_final_weights`]) as it is, else the checkpoint [`resolve_checkpoint`] finds.
pub fn weights_folder(path: &Path, loaded: &LoadedConfig) -> anyhow::Result<PathBuf> {
    if holds_final_weights(path, &loaded.config.trainable_roles()) {
        return Ok(path.to_path_buf());
    }
    resolve_checkpoint(path)
}

/// The config of a checkpoint or run: `config` when given, else the folder's own
/// `config.toml` (a checkpoint) or `config.resolved.toml` (a run), the run's
/// `config.resolved.toml` for its `final/` folder, else the `config.toml` of
/// the checkpoint [`resolve_checkpoint`] finds.
pub fn config_for(checkpoint: Option<&Path>, config: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(c) = config {
        return Ok(c.to_path_buf());
    }
    let Some(ck) = checkpoint else {
        anyhow::bail!("give a checkpoint or run folder, or --config with --untrained");
    };
    for name in ["config.toml", "config.resolved.toml"] {
        if ck.join(name).is_file() {
            return Ok(ck.join(name));
        }
    }
    // A run's `final/` folder (also named as `.` from inside it): the run's config beside it.
    let run_config = run_of_final(ck).map(|run| run.join("config.resolved.toml"));
    if let Some(c) = run_config.filter(|c| c.is_file()) {
        return Ok(c);
    }
    // The cause names the folder.
    let dir = resolve_checkpoint(existing(ck)?)
        .context("cannot find the run's config.toml (pass --config)")?;
    Ok(dir.join("config.toml"))
}

/// The run folder of a run's `final/` folder: the folder above it as the path is written
/// where that is a run (it holds `config.resolved.toml` or `checkpoints/`: `runs/x/final`,
/// also where `final` is a link to weights kept elsewhere), else the folder above it as it
/// resolves (`.` from inside it, or a link to another run's `final/`); `None` for a folder
/// that is no `final/` either way.
fn run_of_final(dir: &Path) -> Option<PathBuf> {
    let above_final = |d: PathBuf| {
        d.parent()
            .filter(|_| d.ends_with("final"))
            .map(Path::to_path_buf)
    };
    let is_run =
        |r: &PathBuf| r.join("config.resolved.toml").is_file() || r.join("checkpoints").is_dir();
    let written = std::path::absolute(dir).ok().and_then(above_final);
    let real = dir.canonicalize().ok().and_then(above_final);
    match (written, real) {
        (Some(w), _) if is_run(&w) => Some(w),
        (w, r) => r.or(w),
    }
}

/// The shapes recorded for the weights in `dir`, and the file that recorded them: a
/// checkpoint's `state.json`, or the `shapes.json` a run publishes in `final/`. A `final/`
/// published before that file was written takes the `state.json` of the newest checkpoint
/// beside it that has one (only its shapes are read: nothing there is verified or loaded).
fn recorded_spec(dir: &Path) -> Option<(PathBuf, DataSpec)> {
    let state = |d: &Path| Some((d.join(STATE_FILE), TrainerState::read(d).ok()?.data_spec?));
    if dir.join(MANIFEST).is_file() {
        return state(dir);
    }
    if let Some(spec) = final_shapes(dir) {
        return Some((dir.join(SHAPES_FILE), spec));
    }
    let checkpoints = CheckpointStore::at(&run_of_final(dir)?.join("checkpoints")).list();
    checkpoints.iter().find_map(|(_, d)| state(d))
}

/// What may stand in for a run's data that cannot be read (e.g. on another machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StandIn {
    /// Nothing: the data itself is needed (its prompts, its evaluator).
    Nothing,
    /// The shapes the checkpoint recorded (the caller embeds its prompts itself, and could be
    /// given a size to stand in without them).
    Recorded,
    /// The shapes the checkpoint recorded, else these (an untrained model has none recorded);
    /// `None` where the models' configs do not tell their latent channels and text width.
    RecordedOr(Option<DataSpec>),
}

/// What chose the device `reel sample` and `reel eval` run on, for the error when it does
/// not exist here.
pub const RUN_DEVICE: &str =
    "the run's first device (`[runtime]` of its config, which `--set` changes)";

/// Build the method and load the weights. A run whose data cannot be read is sampled at the
/// shapes `stand_in` allows.
pub fn load<B: ReelBackend>(
    src: &Source,
    loaded: &LoadedConfig,
    stand_in: StandIn,
) -> anyhow::Result<Loaded<B>> {
    let device = super::device::<B>(loaded.config.runtime.main_device(), RUN_DEVICE)?;
    let checkpoint = match src.untrained {
        true => None,
        false => {
            let path = src.checkpoint.as_ref();
            let path = path.context("give a checkpoint or run folder (or --untrained)")?;
            Some(weights_folder(path, loaded)?)
        }
    };
    let (source, stand_in) = data_source(loaded, checkpoint.as_deref(), stand_in)?;
    let mut method = build_method::<B>(loaded, &*source, &device)?;
    let mut ema = false;
    if let Some(dir) = &checkpoint {
        // Weights and EMA only, from a checkpoint as from `final/`: never the optimizer's
        // moments (twice a full fine-tune's weights, on the device).
        load_final_into(dir, &mut *method)?;
        if !src.no_ema {
            let role = method.sampling_role().to_string();
            for r in method.roles_mut() {
                if r.name() == role && r.has_ema() {
                    r.swap_ema();
                    ema = true;
                }
            }
        }
    }
    Ok(Loaded {
        method,
        source,
        checkpoint,
        ema,
        stand_in,
    })
}

/// The run's data source, and why it is a stand-in (see [`Loaded::stand_in`]). The run's data
/// gives the clips' shape (and its prompts, where no text encoder is given): when it is gone
/// and only its shapes are needed, a source of the shapes `checkpoint` recorded (or
/// `stand_in`'s own) stands in; otherwise the error says how to point the config at the data.
fn data_source(
    loaded: &LoadedConfig,
    checkpoint: Option<&Path>,
    stand_in: StandIn,
) -> anyhow::Result<(Arc<dyn DataSource>, Option<String>)> {
    let err = match loaded.config.data.build(&loaded.base_dir) {
        Ok(source) => return Ok((Arc::from(source), None)),
        Err(e) => e,
    };
    let recorded = checkpoint
        .filter(|_| stand_in != StandIn::Nothing)
        .and_then(recorded_spec);
    let (spec, from) = match (recorded, stand_in) {
        (Some((file, spec)), _) => (spec, format!("the shapes {} recorded", file.display())),
        (None, StandIn::RecordedOr(Some(spec))) => {
            let from = "the models' latent channels and text width".to_string();
            (spec, from)
        }
        (None, _) => {
            let instead = match stand_in {
                StandIn::Nothing => "",
                StandIn::Recorded => ", or give the clips' size with --video-size or --latent-size",
                StandIn::RecordedOr(_) => {
                    "; the size given cannot stand in for it: the models' configs do not tell \
                     their latent channels and text width"
                }
            };
            return Err(anyhow::Error::new(err).context(format!(
                "the run's `[data]` (from {}) is read for the clips' shape and prompts; point \
                 it at the data with --set data.path=... (or --config another config){instead}",
                loaded.path.display()
            )));
        }
    };
    let source = shapes_only(spec).with_context(|| format!("sampling with {from}"))?;
    let why = format!("the run's data cannot be read ({err}); sampling with {from}");
    Ok((Arc::from(source), Some(why)))
}

/// A data source of `spec`'s shapes and nothing else (no prompts, no negative embedding).
/// Shapes read from a file are checked as a `random` data table's are (bounded, countable):
/// a hand-edited `shapes.json` gets an error, not an overflow. (`reel sample` checks the clip
/// it draws against the host's memory once a size given on its command line has replaced
/// these.)
fn shapes_only(spec: DataSpec) -> anyhow::Result<Box<dyn DataSource>> {
    let cfg = RandomDataConfig {
        batch_size: 1,
        num_samples: 1,
        seed: 0,
        channels: spec.channels,
        frames: spec.frames,
        height: spec.height,
        width: spec.width,
        text_len: spec.text_len,
        text_dim: spec.text_dim,
    };
    cfg.validate()?;
    Ok(cfg.build(Path::new("."))?)
}

/// `--steps` against the method's most sampling steps (DMD2 samples with its
/// `denoising_steps`), before any weights are loaded.
pub fn check_steps(steps: Option<usize>, loaded: &LoadedConfig) -> anyhow::Result<()> {
    if let (Some(steps), Some((max, key))) = (steps, loaded.config.method.max_sampling_steps()) {
        anyhow::ensure!(
            steps <= max,
            "--steps {steps}: the method samples with at most `method.{key}` ({max}) steps"
        );
    }
    Ok(())
}

/// Read the config for a source.
pub fn read_config(src: &Source) -> anyhow::Result<LoadedConfig> {
    let path = config_for(src.checkpoint.as_deref(), src.config.as_deref())?;
    Ok(load_run_config(&path, &src.set)?)
}

#[cfg(test)]
mod tests {
    use super::{check_steps, resolve_checkpoint, run_of_final};
    use reel_core::checkpoint::{CheckpointStore, MANIFEST};

    /// `--steps` past a DMD2 run's denoising steps is refused by `reel sample` and `reel
    /// eval` alike, naming the key; a method without such a limit takes any count.
    #[test]
    fn steps_beyond_the_methods_schedule_are_refused() {
        let configs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
        let dmd2 =
            reel_core::config::load_run_config(&configs.join("dmd2_quickstart.toml"), &[]).unwrap();
        let max = dmd2.config.method.max_sampling_steps().unwrap().0;
        check_steps(Some(max), &dmd2).unwrap();
        check_steps(None, &dmd2).unwrap();
        let err = check_steps(Some(max + 1), &dmd2).unwrap_err().to_string();
        assert!(err.contains("method.denoising_steps"), "{err}");
        let finetune =
            reel_core::config::load_run_config(&configs.join("quickstart.toml"), &[]).unwrap();
        check_steps(Some(max + 1), &finetune).unwrap();
    }

    /// A run whose newest checkpoint lost its manifest (a copy cut short) resolves to the
    /// newest intact one, not to an error that calls it another config's.
    #[test]
    fn a_damaged_newest_checkpoint_falls_back_to_an_intact_one() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(tmp.path(), 5);
        let dirs: Vec<_> = (1..=2)
            .map(|step| {
                let p = store.begin(step).unwrap();
                p.write_bytes("state.json", b"{}").unwrap();
                store.commit(p, "fp").unwrap()
            })
            .collect();
        std::fs::remove_file(dirs[1].join(MANIFEST)).unwrap();
        assert_eq!(resolve_checkpoint(tmp.path()).unwrap(), dirs[0]);
    }

    /// A `final/` folder's run is the folder above it as the path is written, also where
    /// `final` is a link to a folder of another name; any other folder has none.
    #[test]
    fn the_run_of_a_final_folder_is_the_folder_above_it_as_written() {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        std::fs::create_dir_all(root.join("run/final")).unwrap();
        std::fs::create_dir_all(root.join("store/model-v3")).unwrap();
        assert_eq!(
            run_of_final(&root.join("run/final")),
            Some(root.join("run"))
        );
        assert_eq!(run_of_final(&root.join("store/model-v3")), None);
        #[cfg(unix)]
        {
            std::fs::create_dir(root.join("linked")).unwrap();
            let link = root.join("linked/final");
            std::os::unix::fs::symlink(root.join("store/model-v3"), &link).unwrap();
            assert_eq!(run_of_final(&link), Some(root.join("linked")));
            // A link named otherwise to a `final/` folder: the run the folder lies in.
            std::os::unix::fs::symlink(root.join("run/final"), root.join("weights")).unwrap();
            assert_eq!(run_of_final(&root.join("weights")), Some(root.join("run")));
            // A `final` link to another run's `final/`: the run it leads to, unless the
            // folder it is written in is a run itself.
            for (name, is_run) in [("best", false), ("mine", true)] {
                std::fs::create_dir(root.join(name)).unwrap();
                if is_run {
                    std::fs::write(root.join(name).join("config.resolved.toml"), "").unwrap();
                }
                let link = root.join(name).join("final");
                std::os::unix::fs::symlink(root.join("run/final"), &link).unwrap();
                let run = if is_run {
                    root.join(name)
                } else {
                    root.join("run")
                };
                assert_eq!(run_of_final(&link), Some(run), "{name}");
            }
        }
    }
}
