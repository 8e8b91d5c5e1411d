//! The step-based trainer loop.
//!
//! For each step: draw `grad_accumulation` micro-batches, let the method run forward/backward
//! on each, read every loss and gradient norm in **one** host sync, apply the non-finite
//! policy, clip each role by its global L2 norm, step the optimizers, run callbacks, and
//! checkpoint when due. Ctrl-C (via [`TrainOptions::interrupt`]) writes a checkpoint and stops.
//!
//! [`Trainer`] holds the run and splits the loop into its pieces: [`Trainer::new`] builds,
//! `resume` restores, and each step is `forward_backward`, `reduce`, then `update` (or the
//! non-finite policy), the callbacks and `checkpoint_if_due`.

mod group;
mod lock;
mod publish;
mod run;
mod stamp;
mod state;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use burn::tensor::backend::AutodiffBackend;

pub use group::panic_message;
pub use run::Trainer;
pub use state::{ema_file, final_shapes, optim_file, weights_file, SHAPES_FILE};

use crate::backend::ReelBackend;
use crate::callback::CallbackError;
use crate::checkpoint::{CheckpointError, CheckpointStore, MANIFEST, STATE_FILE};
use crate::config::{ConfigError, LoadedConfig};
use crate::data::{DataError, DataSource, DataSpec};
use crate::method::{BuildContext, MethodError, TrainingMethod};
use crate::parallel::{ParallelError, ProcessHandle, Seat};
use crate::paths;

/// Errors that end a training run.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The method failed to build or run.
    #[error(transparent)]
    Method(#[from] MethodError),
    /// Bad data.
    #[error(transparent)]
    Data(#[from] DataError),
    /// Checkpoint write/read failure.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A callback failed.
    #[error(transparent)]
    Callback(#[from] CallbackError),
    /// NaN/inf with the `stop` policy; the last good state was checkpointed.
    #[error(
        "non-finite values at step {step}: {what}; the last good state was saved to {checkpoint}"
    )]
    NonFinite {
        /// Step that produced them, counted from 1 as in `metrics.jsonl` and the progress
        /// output (the saved state is that of the step before).
        step: u64,
        /// Which losses / gradient norms.
        what: String,
        /// Checkpoint holding the last good state.
        checkpoint: String,
    },
    /// A device call failed after the call that queued it returned
    /// ([`crate::device_fault`]): what was computed from it is wrong, so the run stops
    /// (found at a step's host sync: before that step's update; found before a checkpoint's
    /// commit: without committing it).
    #[error(
        "step {step}: {fault}; nothing computed from it was applied or saved: the last good \
         state is {checkpoint}"
    )]
    DeviceFault {
        /// The step (0-based) at whose host sync the failure was found, or the completed
        /// steps of the checkpoint it stopped.
        step: u64,
        /// What failed.
        fault: crate::device_fault::DeviceFault,
        /// The newest checkpoint (or that there is none yet).
        checkpoint: String,
    },
    /// A callback failed after a step's update, or a data record before one; the state after
    /// the last completed step was checkpointed first, so the steps since the last checkpoint
    /// are kept.
    #[error(
        "{cause}; the state after step {step} was saved first, to {checkpoint}: `--resume \
         latest` continues from there once the cause is fixed"
    )]
    SavedAfter {
        /// Completed steps.
        step: u64,
        /// The callback's or the data's error.
        cause: Box<TrainError>,
        /// The checkpoint folder.
        checkpoint: PathBuf,
    },
    /// A data record failed on one or more workers of a group. Every worker learned of it
    /// once the step's data was read, before any forward, and stopped there, so worker 0 can
    /// checkpoint the steps before it whichever worker read the record.
    #[error("{}", data_failed_text(workers, cause.as_deref()))]
    DataFailed {
        /// The global ranks of the workers whose record failed.
        workers: Vec<usize>,
        /// This worker's own data error, when it is one of them.
        cause: Option<Box<TrainError>>,
    },
    /// In a run of several processes, this process's own check failed before any worker
    /// started. Every process learned of it at the same point and stopped there (the others
    /// with [`ParallelError::Processes`]), so none is left waiting for it.
    #[error("process {rank} of {size}: {cause}")]
    StoppedTogether {
        /// This process's rank.
        rank: usize,
        /// How many processes the run has.
        size: usize,
        /// Its error.
        cause: Box<TrainError>,
    },
    /// Interrupted (Ctrl-C) after writing a checkpoint.
    #[error("interrupted at step {step}; checkpoint written to {checkpoint}")]
    Interrupted {
        /// Completed steps.
        step: u64,
        /// The checkpoint folder.
        checkpoint: PathBuf,
    },
    /// A collective operation failed (see [`crate::parallel`]).
    #[error(transparent)]
    Parallel(#[from] ParallelError),
    /// A data-parallel worker failed; the others were stopped.
    #[error("worker {rank} (device {device}) failed: {cause}")]
    Worker {
        /// The worker's rank.
        rank: usize,
        /// Its device index.
        device: usize,
        /// What failed (its error or panic message).
        cause: String,
    },
    /// Output folder problems.
    #[error("{path}: {message}")]
    Io {
        /// Path involved.
        path: PathBuf,
        /// What failed.
        message: String,
    },
}

impl TrainError {
    /// An error every worker of the run, in every process, reaches at the same point by
    /// agreement: an interrupt, a non-finite stop, processes that disagree on the run. Nothing
    /// waits for a worker that stops with it, so no other worker or process needs stopping.
    pub fn is_agreed(&self) -> bool {
        match self {
            TrainError::SavedAfter { cause, .. } => cause.is_agreed(),
            e => matches!(
                e,
                TrainError::Interrupted { .. }
                    | TrainError::NonFinite { .. }
                    | TrainError::DataFailed { .. }
                    | TrainError::StoppedTogether { .. }
                    | TrainError::Parallel(ParallelError::Processes(_))
            ),
        }
    }
}

/// [`TrainError::DataFailed`] in words: this worker's own error, or which workers' records
/// failed (each of those printed its own error, naming the file and record).
fn data_failed_text(workers: &[usize], cause: Option<&TrainError>) -> String {
    if let Some(cause) = cause {
        return cause.to_string();
    }
    let list: Vec<String> = workers.iter().map(|r| r.to_string()).collect();
    format!(
        "a data record failed on worker {} (its error, naming the file and record, is printed \
         above); every worker stopped before the step",
        list.join(", ")
    )
}

/// Options of one `reel train` invocation.
#[derive(Debug, Clone, Default)]
pub struct TrainOptions {
    /// `latest` or a checkpoint folder.
    pub resume: Option<String>,
    /// Overrides `[runtime] output_dir`.
    pub output_dir: Option<PathBuf>,
    /// Set to `true` (e.g. by a SIGINT handler) to checkpoint and stop at the next step.
    pub interrupt: Option<Arc<AtomicBool>>,
    /// The other processes of a multi-process run (`runtime.launcher`); `None` for a run in
    /// one process.
    pub processes: Option<ProcessHandle>,
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct TrainSummary {
    /// The run folder.
    pub run_dir: PathBuf,
    /// Completed steps.
    pub steps: u64,
    /// Mean losses of the last step.
    pub last_losses: Vec<(String, f64)>,
    /// The final checkpoint.
    pub checkpoint: PathBuf,
    /// Steps whose update was skipped (non-finite).
    pub skipped_steps: u64,
    /// Data-parallel runs: each worker's SHA-256 of its final weights, optimizer state and
    /// EMA, in worker order (all equal unless something broke the workers' agreement).
    /// Empty for a one-device run.
    pub worker_digests: Vec<String>,
    /// Wall time of every step this invocation ran, in seconds (worker 0's).
    pub step_seconds: Vec<f64>,
}

/// The run folder: `--output`, else `[runtime] output_dir`, else `runs/<config stem>`.
pub fn run_dir_for(loaded: &LoadedConfig, output: Option<&Path>) -> PathBuf {
    if let Some(o) = output {
        return o.to_path_buf();
    }
    if let Some(o) = &loaded.config.runtime.output_dir {
        return if o.is_absolute() {
            o.clone()
        } else {
            loaded.base_dir.join(o)
        };
    }
    let stem = loaded
        .path
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_else(|| "run".into());
    loaded.base_dir.join("runs").join(stem)
}

/// Build the method for a loaded config (used by `train`, `sample` and `eval`).
pub fn build_method<B: ReelBackend>(
    loaded: &LoadedConfig,
    source: &dyn DataSource,
    device: &B::Device,
) -> Result<Box<dyn TrainingMethod<B>>, TrainError> {
    let cfg = &loaded.config;
    let ctx = BuildContext::<B> {
        device: device.clone(),
        roles: &cfg.models,
        optimizer: &cfg.optimizer,
        training: &cfg.training,
        data_spec: source.spec(),
        base_dir: &loaded.base_dir,
        seed: cfg.runtime.seed,
        precision: cfg.runtime.dtype,
        build_model: B::build_model,
    };
    B::build_method(&*cfg.method, &ctx).map_err(|e| match e {
        // Building checks the config against the data and the files it names: say which file.
        MethodError::Config(c) => TrainError::Config(c.in_file(&loaded.path)),
        e => e.into(),
    })
}

/// Load the weights of a run's `final/` folder or of a checkpoint (each trainable role's,
/// and its EMA shadow where the run kept one) into a freshly built method, for `sample` /
/// `eval`. No optimizer or method state is read: a full fine-tune's AdamW moments are twice
/// its weights, and sampling needs none of them.
pub fn load_final_into<B: AutodiffBackend>(
    dir: &Path,
    method: &mut dyn TrainingMethod<B>,
) -> Result<(), TrainError> {
    state::load_final(dir, method)
}

/// Whether `dir` holds a run's published weights for the trainable `roles`, as its `final/`
/// folder (or a copy of it) does: each role's weights file, and nothing of a checkpoint: no
/// manifest, state or optimizer file, and not a step folder (`step-*`) or one a save left
/// unfinished (`.tmp-*`), which are read only verified, or refused.
pub fn holds_final_weights(dir: &Path, roles: &[&str]) -> bool {
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
    let step_folder = name.is_some_and(|n| n.starts_with("step-") || n.starts_with(".tmp-"));
    let checkpoint_file =
        |f: &str| f == MANIFEST || f == STATE_FILE || f.ends_with(".optim.safetensors");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let mut files = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned());
    !roles.is_empty()
        && !step_folder
        && roles.iter().all(|r| dir.join(weights_file(r)).is_file())
        && !files.any(|f| checkpoint_file(&f))
}

/// Train a run to `max_steps` (or until interrupted) on backend `B`: on `runtime.device`,
/// or with one worker per device of `runtime.devices`, and with the other processes of
/// `opts.processes` (see [`crate::parallel`]).
pub fn train<B: ReelBackend>(
    loaded: &LoadedConfig,
    opts: &TrainOptions,
) -> Result<TrainSummary, TrainError> {
    let output = opts.output_dir.as_deref();
    // The data is opened once: its spec sizes the memory check, and every worker reads it.
    let checked = (loaded.check_devices())
        .and_then(|()| check_run_outside_data(loaded, output))
        .map_err(TrainError::from)
        .and_then(|()| check_not_a_run(loaded, opts))
        .and_then(|()| open_data(loaded))
        .and_then(|source| check_memory(loaded, opts, &source.spec()).map(|()| source));
    let source = match opts.processes.as_deref() {
        Some(p) => group::checked_everywhere(p, checked)?,
        None => checked?,
    };
    match (
        &opts.processes,
        loaded.config.runtime.worker_devices().as_slice(),
    ) {
        (None, [device]) => {
            Trainer::<B>::in_seat(loaded, opts, Seat::single(*device), source)?.run()
        }
        (_, devices) => group::train_group::<B>(loaded, opts, devices, source),
    }
}

/// The config's data source, opened (every file's header read) for the run's workers to
/// share. An error names the config file and its `data` table, as `reel check` does (the
/// data's own message names the file and record).
pub fn open_data(loaded: &LoadedConfig) -> Result<Arc<dyn DataSource>, TrainError> {
    match loaded.config.data.build(&loaded.base_dir) {
        Ok(source) => Ok(Arc::from(source)),
        Err(e) => Err(ConfigError::new("data", e.to_string())
            .in_file(&loaded.path)
            .into()),
    }
}

/// The run folder must not lie in the data's folder ([`DataConfig::read_from`]): the run's
/// checkpoints and final weights would be read as samples by the next run or resume. An error
/// keyed where the run folder came from (`--output` or `runtime.output_dir`).
///
/// [`DataConfig::read_from`]: crate::data::DataConfig::read_from
pub fn check_run_outside_data(
    loaded: &LoadedConfig,
    output: Option<&Path>,
) -> Result<(), ConfigError> {
    let Some(data) = loaded.config.data.read_from() else {
        return Ok(());
    };
    let data = loaded.base_dir.join(data);
    let run_dir = run_dir_for(loaded, output);
    // As the data's file search reaches it: through links too (`data/runs -> /scratch`),
    // named through the link or by its own path.
    let through = match paths::lies_in(&run_dir, &data) {
        true => String::new(),
        false => match paths::link_reaching(&data, &run_dir) {
            Some(link) => format!(" through the link `{}`", link.display()),
            None => return Ok(()),
        },
    };
    let data = paths::resolved(&data);
    let message = format!(
        "the run folder `{}` lies in the data's folder `{}` (`data.path`){through}: the run's \
         checkpoints and weights would be read as data; train into a folder outside it",
        run_dir.display(),
        data.display()
    );
    Err(run_dir_error(loaded, output, message))
}

/// A run must not write into a folder that holds another run's checkpoints: its step numbers
/// would overwrite theirs and its `final/` replace theirs. That is any run started without
/// `--resume`, and one resumed from a checkpoint outside the folder (a branch of another
/// run): the run there would lose its newer checkpoints (set aside), its `final/` and its
/// metrics to the branch. An error keyed where the folder came from says what to do.
fn check_not_a_run(loaded: &LoadedConfig, opts: &TrainOptions) -> Result<(), TrainError> {
    let run_dir = run_dir_for(loaded, opts.output_dir.as_deref());
    let branch = match opts.resume.as_deref() {
        None => None,
        Some("latest") => return Ok(()),
        Some(p) if paths::resolved(Path::new(p)).starts_with(paths::resolved(&run_dir)) => {
            return Ok(())
        }
        Some(p) => Some(p),
    };
    let Some(earlier) = EarlierRun::in_folder(&run_dir) else {
        return Ok(());
    };
    let held = format!("`{}` already holds a run ({earlier})", run_dir.display());
    let message = match branch {
        None => format!("{held}: {}", earlier.what_to_do()),
        Some(p) => format!(
            "{held}, and `--resume {p}` is not one of its checkpoints: resuming another run's \
             checkpoint here would mix the two runs (this one's checkpoints set aside, its \
             `final/` and metrics replaced); give the branch a folder of its own (`--output`)"
        ),
    };
    Err(run_dir_error(loaded, opts.output_dir.as_deref(), message).into())
}

/// What an earlier run left in a run folder that a new run there would overwrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EarlierRun {
    /// Checkpoints, the newest at this step: `--resume latest` continues the run.
    Checkpoints(u64),
    /// No checkpoint, but weights in `final/` (other configs may name them, e.g. as a
    /// teacher), which a new run would replace.
    FinalWeights,
}

impl EarlierRun {
    /// What an earlier run left in `run_dir`; `None` when it holds neither checkpoints nor
    /// final weights (a missing or fresh folder).
    pub fn in_folder(run_dir: &Path) -> Option<Self> {
        if let Some((step, _)) = CheckpointStore::new(run_dir, 1).list().into_iter().next() {
            return Some(Self::Checkpoints(step));
        }
        // Any weights there count: the run that wrote them may have had other roles.
        let entries = std::fs::read_dir(run_dir.join("final")).ok()?;
        let weights = |name: &str| name.ends_with(".safetensors");
        (entries.flatten())
            .any(|e| weights(&e.file_name().to_string_lossy()))
            .then_some(Self::FinalWeights)
    }

    /// How to go on: continue the run if it can be, else train elsewhere or delete it.
    pub fn what_to_do(&self) -> &'static str {
        match self {
            Self::Checkpoints(_) => {
                "`--resume latest` continues it; to start a new run, train into another folder \
                 (`--output`) or delete this one"
            }
            Self::FinalWeights => {
                "it has no checkpoint to resume from, and a new run would replace its `final/` \
                 weights: train into another folder (`--output`) or delete this one"
            }
        }
    }
}

impl std::fmt::Display for EarlierRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Checkpoints(step) => write!(f, "checkpoints up to step {step}"),
            Self::FinalWeights => f.write_str("final weights in `final/`, no checkpoint"),
        }
    }
}

/// What the run needs in memory, checked once in each process before any of its workers
/// builds a role or reads a weight: a step's data against the host's memory, and the
/// roles' floor against each device's ([`crate::memory`]), printed by the first process.
/// A config that cannot fit is an error naming the file, and no run folder is made.
fn check_memory(
    loaded: &LoadedConfig,
    opts: &TrainOptions,
    spec: &DataSpec,
) -> Result<(), TrainError> {
    let processes = opts.processes.as_ref().map_or(1, |p| p.size());
    loaded.check_step_memory(spec, processes)?;
    let (floor, available) = loaded.check_memory_floor(spec)?;
    if opts.processes.as_ref().is_none_or(|p| p.rank() == 0) {
        let line = crate::memory::describe(&floor, available);
        crate::console::say(&format!("reel: memory: {line}"));
    }
    Ok(())
}

/// Create the run folder. When it cannot be made (a file of that name, no permission), the
/// error names where its path came from ([`run_dir_error`]).
fn create_run_dir(
    loaded: &LoadedConfig,
    output: Option<&Path>,
    run_dir: &Path,
) -> Result<(), TrainError> {
    std::fs::create_dir_all(run_dir).map_err(|e| {
        let message = format!("cannot make `{}` the run folder: {e}", run_dir.display());
        run_dir_error(loaded, output, message).into()
    })
}

/// An error about the run folder of [`run_dir_for`], keyed where its path came from:
/// `--output`, else the config's `runtime.output_dir` (also for the default
/// `runs/<config name>`, which that key replaces).
pub fn run_dir_error(
    loaded: &LoadedConfig,
    output: Option<&Path>,
    message: impl Into<String>,
) -> ConfigError {
    match output {
        Some(_) => ConfigError::new("--output", message),
        None => ConfigError::new("runtime.output_dir", message).in_file(&loaded.path),
    }
}

/// [`crate::device_fault::check`] as the trainer's error: a failure at `step` names the newest
/// checkpoint in `store`, the last good state.
fn check_device(store: &CheckpointStore, step: u64) -> Result<(), TrainError> {
    crate::device_fault::check().map_err(|fault| TrainError::DeviceFault {
        step,
        fault,
        checkpoint: match store.list().first() {
            Some((_, dir)) => dir.display().to_string(),
            None => "the run's start (no checkpoint was written yet)".into(),
        },
    })
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> TrainError {
    TrainError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::holds_final_weights;

    /// A `final/` folder (or a copy) is told by its roles' weights; a run folder holding
    /// sampled clips, a step folder without its manifest, an unfinished save and a folder
    /// of another config's roles are not.
    #[test]
    fn final_weights_are_told_from_checkpoints_and_run_folders() {
        let tmp = tempfile::tempdir().unwrap();
        let folder = |name: &str, files: &[&str]| {
            let dir = tmp.path().join(name);
            std::fs::create_dir_all(&dir).unwrap();
            for f in files {
                std::fs::write(dir.join(f), b"").unwrap();
            }
            dir
        };
        let weights = ["student.safetensors", "student.ema.safetensors"];
        let student = ["student"];
        let published = [&weights[..], &["shapes.json"]].concat();
        assert!(holds_final_weights(&folder("final", &published), &student));
        assert!(holds_final_weights(
            &folder("copy", &weights[..1]),
            &student
        ));
        let run = folder("run", &["0-a_clip.safetensors", "config.resolved.toml"]);
        std::fs::create_dir(run.join("checkpoints")).unwrap();
        assert!(!holds_final_weights(&run, &student));
        for (name, extra) in [
            ("step-00000004", None),
            (".tmp-step-00000004-7", None),
            ("with_state", Some("state.json")),
            ("with_optimizer", Some("student.optim.safetensors")),
            ("with_manifest", Some("manifest.json")),
        ] {
            let files: Vec<&str> = weights.iter().copied().chain(extra).collect();
            assert!(
                !holds_final_weights(&folder(name, &files), &student),
                "{name}"
            );
        }
        let two = folder("two", &weights);
        assert!(!holds_final_weights(&two, &["student", "critic"]));
        assert!(!holds_final_weights(&two, &[]));
        assert!(!holds_final_weights(&tmp.path().join("absent"), &student));
    }
}
