//! Callbacks observe the training loop (EMA, validation, logging...).
//!
//! Every hook is a no-op by default; callbacks run in the order they are declared. Stateful
//! callbacks write their state in [`Callback::on_checkpoint`] and read it back in
//! [`Callback::load_state`].

use std::fmt::Debug;
use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;

use crate::backend::BuildCallbackAll;
use crate::config::ConfigError;
use crate::data::{DataSource, DataSpec};
use crate::method::TrainingMethod;

/// Errors raised by callbacks.
#[derive(Debug, thiserror::Error)]
pub enum CallbackError {
    /// File I/O failed.
    #[error("{path}: {message}")]
    Io {
        /// File involved.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// Anything else (the message says which callback and why).
    #[error("{0}")]
    Other(String),
}

/// Summary of one completed optimizer step, passed to [`Callback::on_step_end`].
#[derive(Debug, Clone, Default)]
pub struct StepReport {
    /// Number of completed steps (the step just finished is `step - 1`).
    pub step: u64,
    /// Total steps of the run.
    pub max_steps: u64,
    /// Mean losses over the micro-batches.
    pub losses: Vec<(String, f64)>,
    /// Pre-clip global gradient norm per updated role.
    pub grad_norms: Vec<(String, f64)>,
    /// Learning rate per updated role.
    pub lrs: Vec<(String, f64)>,
    /// Wall time of the step in seconds.
    pub step_seconds: f64,
    /// Samples consumed so far.
    pub samples_seen: u64,
    /// Whether the update was skipped (non-finite values).
    pub skipped: bool,
}

/// Result of one validation pass, passed to [`Callback::on_validation`].
#[derive(Debug, Clone, Default)]
pub struct ValidationReport {
    /// Completed steps when validation ran.
    pub step: u64,
    /// Named metrics (e.g. `caption_accuracy`).
    pub metrics: Vec<(String, f64)>,
    /// Files written (GIFs, sheets).
    pub files: Vec<PathBuf>,
}

/// What callbacks can see and touch.
pub struct CallbackContext<'a, B: AutodiffBackend> {
    /// Completed steps.
    pub step: u64,
    /// Total steps of the run.
    pub max_steps: u64,
    /// The method (roles, sampling).
    pub method: &'a mut dyn TrainingMethod<B>,
    /// The training data source (prompts, evaluator).
    pub data: &'a dyn DataSource,
    /// The run's output folder.
    pub run_dir: &'a Path,
    /// The run's device (where the method's models live).
    pub device: &'a B::Device,
    /// Run seed.
    pub seed: u64,
    /// Validation results produced during this hook round (the trainer forwards them to
    /// every callback's `on_validation`).
    pub validations: Vec<ValidationReport>,
    /// `true` during the last step's hooks.
    pub is_final: bool,
}

/// A runtime callback.
pub trait Callback<B: AutodiffBackend>: Send {
    /// Name for messages and state files.
    fn name(&self) -> &str;
    /// Whether this callback runs on every worker of a data-parallel run: `true` for one
    /// that changes training state (EMA), which must stay identical on every worker. The
    /// default, `false`, runs it on worker 0 only, which writes the run's files (logs,
    /// samples, its checkpoint state).
    fn on_every_worker(&self) -> bool {
        false
    }
    /// Before the first step (after a resume, after state is loaded).
    fn on_train_start(&mut self, ctx: &mut CallbackContext<B>) -> Result<(), CallbackError> {
        let _ = ctx;
        Ok(())
    }
    /// After every optimizer step.
    fn on_step_end(
        &mut self,
        ctx: &mut CallbackContext<B>,
        report: &StepReport,
    ) -> Result<(), CallbackError> {
        let _ = (ctx, report);
        Ok(())
    }
    /// After a validation pass (produced by any callback).
    fn on_validation(
        &mut self,
        ctx: &mut CallbackContext<B>,
        report: &ValidationReport,
    ) -> Result<(), CallbackError> {
        let _ = (ctx, report);
        Ok(())
    }
    /// While a checkpoint is written: write state files into `dir` (a temporary folder that is
    /// renamed into place when complete). Return the file names written.
    fn on_checkpoint(
        &mut self,
        ctx: &mut CallbackContext<B>,
        dir: &Path,
    ) -> Result<Vec<String>, CallbackError> {
        let _ = (ctx, dir);
        Ok(Vec::new())
    }
    /// Restore state from a checkpoint folder (resume).
    fn load_state(
        &mut self,
        ctx: &mut CallbackContext<B>,
        dir: &Path,
    ) -> Result<(), CallbackError> {
        let _ = (ctx, dir);
        Ok(())
    }
    /// After the last step.
    fn on_train_end(&mut self, ctx: &mut CallbackContext<B>) -> Result<(), CallbackError> {
        let _ = ctx;
        Ok(())
    }
}

/// Build a runtime callback for backend `B` (implement generically).
pub trait BuildCallback<B: AutodiffBackend> {
    /// Build the callback.
    fn build_callback(&self) -> Result<Box<dyn Callback<B>>, ConfigError>;
}

/// Serializable callback configuration (`[[callbacks]] kind = "..."`).
#[typetag::serde(tag = "kind")]
pub trait CallbackConfig: BuildCallbackAll + Debug + Send + Sync {
    /// Check values; keys relative to the callback table.
    fn validate(&self) -> Result<(), ConfigError>;
    /// Check the files the callback will open (a VAE, a text encoder...) from their configs
    /// and headers, without loading tensors, so that `reel check` and the start of
    /// `reel train` report a wrong path rather than the first validation, steps later.
    /// `resolve` maps a config path to a file. Errors name the key relative to the callback
    /// table. The default has nothing to check.
    fn check_files(&self, resolve: &dyn Fn(&Path) -> PathBuf) -> Result<(), ConfigError> {
        let _ = resolve;
        Ok(())
    }
    /// Check the models the callback will use against the data's shapes (`spec`: a VAE's
    /// latent channels, a text encoder's width), from their configs, so that `reel check` and
    /// the start of `reel train` report a mismatch before the run folder is made. Keys and
    /// `resolve` as in [`check_files`](Self::check_files); the default has nothing to check.
    fn check_data(
        &self,
        spec: &DataSpec,
        resolve: &dyn Fn(&Path) -> PathBuf,
    ) -> Result<(), ConfigError> {
        let _ = (spec, resolve);
        Ok(())
    }
    /// The roles whose trained weights the callback keeps a float32 copy of on each device
    /// (an EMA's shadow), counted in the memory floor of `reel check` and `reel train`
    /// ([`crate::memory::MemoryFloor`]). The default: none.
    fn copies_of_roles(&self) -> Vec<String> {
        Vec::new()
    }
    /// The entries of the run folder the callback writes: files (`metrics.jsonl`) and
    /// folders (a name ending in `/`: `samples/`). Two callbacks may not write the same entry
    /// (a config error: the second would replace the first's), and `reel check` and
    /// `reel train` refuse a run folder holding one of the wrong kind before the first step.
    /// The default: none.
    fn run_outputs(&self) -> Vec<String> {
        Vec::new()
    }
    /// The sampling steps the callback asks the method for (a validation's
    /// `sampling_steps`), checked against the method's
    /// [`max_sampling_steps`](crate::method::MethodConfig::max_sampling_steps). The
    /// default: none (the method's own default).
    fn sampling_steps(&self) -> Option<usize> {
        None
    }
}
