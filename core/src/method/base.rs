//! The training-method plugin interface.
//!
//! A method owns a training algorithm and its role models. The trainer calls
//! [`TrainingMethod::micro_step`] once per micro-batch of a step: the method runs forward and
//! backward and accumulates gradients into the roles that update at this step (its cadence).
//! The trainer then reads all losses and gradient norms in one host sync, applies the
//! non-finite policy and clipping, and steps each role's optimizer.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::path::{Path, PathBuf};

use burn::tensor::{backend::AutodiffBackend, backend::Backend, Bool, Tensor};

use crate::backend::BuildMethodAll;
use crate::config::{ConfigError, TrainingConfig};
use crate::data::{DataError, DataSpec, Prompt, TextCondition};
use crate::model::{DiffusionModel, DynModel, ModelError};
use crate::optim::{OptimizerConfig, OptimizerPatch};
use crate::rng::RunRng;
use crate::role::{
    RoleConfig, RoleFields, RoleHandle, RoleModule, RoleRequirement, RoleStateError, TrainableRole,
};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Errors raised while building or running a method.
#[derive(Debug, thiserror::Error)]
pub enum MethodError {
    /// A configuration problem found while building.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Loading or initialising a role model failed.
    #[error("role `{role}`: {message}")]
    Model {
        /// Role name.
        role: String,
        /// What went wrong (names the file/key).
        message: String,
    },
    /// Restoring role state failed.
    #[error(transparent)]
    RoleState(#[from] RoleStateError),
    /// Data problem.
    #[error(transparent)]
    Data(#[from] DataError),
    /// A collective operation of a data-parallel run failed.
    #[error(transparent)]
    Parallel(#[from] crate::parallel::ParallelError),
    /// The method cannot do what was asked (e.g. sampling).
    #[error("{0}")]
    Unsupported(String),
}

/// One micro-batch on the device.
#[derive(Debug, Clone)]
pub struct Batch<B: Backend> {
    /// Clean latents `x0` `[B, C, F, H, W]`.
    pub latents: Tensor<B, 5>,
    /// Text embeddings `[B, L, D]`.
    pub text: Tensor<B, 3>,
    /// Valid-token mask `[B, L]`.
    pub text_mask: Tensor<B, 2, Bool>,
    /// Unconditional (negative / empty) text embedding `[1, L, D]`.
    pub negative_text: Tensor<B, 3>,
    /// Each sample's draw key: its position in the run's data stream (the `n`-th sample the
    /// run reads), unique within the run even where a sample repeats in a step, and the same
    /// on resume and for any number of workers or micro-batches. Key per-sample random draws
    /// by it and the step (`ctx.rng.stream(ctx.step, key, name)`).
    pub keys: Vec<u64>,
    /// Captions, one per sample (may be empty strings).
    pub captions: Vec<String>,
}

/// Per-micro-batch context handed to [`TrainingMethod::micro_step`].
#[derive(Debug, Clone)]
pub struct StepContext {
    /// Global step being computed (0-based).
    pub step: u64,
    /// Micro-batch index within the step.
    pub micro: usize,
    /// Micro-batches per step (gradient accumulation).
    pub num_micro: usize,
    /// Total steps of the run.
    pub max_steps: u64,
    /// The run's generators: draw a sample's numbers with
    /// `rng.stream(step, batch.keys[i], "<purpose>")`, so that they do not depend on how the
    /// samples are split into micro-batches or over workers.
    pub rng: RunRng,
}

impl StepContext {
    /// The factor each micro-batch's gradients are scaled by so that accumulation averages.
    pub fn grad_scale(&self) -> f64 {
        1.0 / self.num_micro as f64
    }
}

/// Losses and metrics of one micro-batch, as device scalars (read once per step).
#[derive(Debug, Clone)]
pub struct StepOutput<B: AutodiffBackend> {
    /// Named scalar losses (`loss`, `generator_loss`, `critic_loss`...), 1-element tensors.
    pub losses: Vec<(String, Tensor<Inner<B>, 1>)>,
}

impl<B: AutodiffBackend> Default for StepOutput<B> {
    fn default() -> Self {
        Self { losses: Vec::new() }
    }
}

impl<B: AutodiffBackend> StepOutput<B> {
    /// Add a named scalar loss (detached from the graph).
    pub fn with_loss(mut self, name: &str, value: Tensor<B, 1>) -> Self {
        self.losses.push((name.to_string(), value.inner()));
        self
    }
}

/// A sampling request (validation, `reel sample`, `reel eval`).
#[derive(Debug, Clone)]
pub struct SampleRequest {
    /// Prompts to generate, one clip each.
    pub prompts: Vec<Prompt>,
    /// Unconditional text for classifier-free guidance (zeros when `None`).
    pub negative: Option<TextCondition>,
    /// Number of sampling steps (method default when `None`).
    pub steps: Option<usize>,
    /// Guidance scale (method default when `None`; 1 disables CFG).
    pub guidance: Option<f64>,
    /// Seed of the initial noise; prompt `i` uses a stream derived from
    /// `(seed, first_index + i)`.
    pub seed: u64,
    /// The index of the first prompt in a longer series split into several requests (`reel
    /// eval`'s batches), so that a clip's noise does not depend on how the series is split;
    /// 0 for a lone request.
    pub first_index: usize,
    /// Latent shape of the clips.
    pub spec: DataSpec,
    /// Told after each sampling step (`reel sample`'s progress bar); `None` when nobody
    /// watches.
    pub progress: Option<SampleProgress>,
}

/// A watcher of sampling steps: [`SampleProgress::step`] calls it with `(done, total)` once
/// the step's values are computed, not only queued (it waits for the device).
#[derive(Clone)]
pub struct SampleProgress(std::sync::Arc<dyn Fn(usize, usize) + Send + Sync>);

impl SampleProgress {
    /// A watcher calling `f(done, total)`.
    pub fn new(f: impl Fn(usize, usize) + Send + Sync + 'static) -> Self {
        Self(std::sync::Arc::new(f))
    }

    /// Step `done` of `total` is issued on `device`: wait for it, then tell the watcher. A
    /// device error is left to the sampler's next read of the values, which reports it.
    pub fn step<B: Backend>(&self, device: &B::Device, done: usize, total: usize) {
        let _ = B::sync(device);
        (self.0)(done, total);
    }
}

impl Debug for SampleProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SampleProgress")
    }
}

/// A runtime training method for backend `B`. Its roles come from `#[derive(Roles)]`
/// ([`RoleFields`]).
pub trait TrainingMethod<B: AutodiffBackend>: RoleFields<B> + Send {
    /// Forward and backward on one micro-batch; accumulate gradients (scaled by
    /// `ctx.grad_scale()`) into the roles that update at `ctx.step`.
    fn micro_step(
        &mut self,
        batch: &Batch<B>,
        ctx: &StepContext,
    ) -> Result<StepOutput<B>, MethodError>;

    /// The trainable roles (for optimizer steps, checkpoints and callbacks).
    fn roles_mut(&mut self) -> Vec<&mut dyn RoleHandle<B>> {
        self.role_fields_mut()
    }

    /// The trainable roles, read-only.
    fn roles(&self) -> Vec<&dyn RoleHandle<B>> {
        self.role_fields()
    }

    /// The role validation and sampling use (usually `student`).
    fn sampling_role(&self) -> &str {
        "student"
    }

    /// Generate one latent clip `[C, F, H, W]` (row-major) per prompt with the current weights.
    fn sample(&mut self, request: &SampleRequest) -> Result<Vec<Vec<f32>>, MethodError> {
        let _ = request;
        Err(MethodError::Unsupported("this method cannot sample".into()))
    }

    /// Extra method state for checkpoints (counters etc.); `Null` when stateless.
    fn state(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// Restore [`TrainingMethod::state`].
    fn load_state(&mut self, state: &serde_json::Value) -> Result<(), MethodError> {
        let _ = state;
        Ok(())
    }
}

/// Builds a role's model for backend `B` (the backend's [`ReelBackend::build_model`]).
///
/// [`ReelBackend::build_model`]: crate::backend::ReelBackend::build_model
pub type ModelBuilder<B> = fn(
    &dyn crate::model::ModelConfig,
    &RoleConfig,
    &BuildContext<B>,
) -> Result<DynModel<B>, ModelError>;

/// Everything a method needs to build itself.
#[derive(Debug)]
pub struct BuildContext<'a, B: AutodiffBackend> {
    /// Device to build on.
    pub device: B::Device,
    /// Role tables from the config.
    pub roles: &'a BTreeMap<String, RoleConfig>,
    /// The global `[optimizer]` settings.
    pub optimizer: &'a OptimizerConfig,
    /// The `[training]` settings.
    pub training: &'a TrainingConfig,
    /// Shapes of the data.
    pub data_spec: DataSpec,
    /// Folder relative paths in the config are resolved against.
    pub base_dir: &'a Path,
    /// Run seed.
    pub seed: u64,
    /// Compute precision (`runtime.dtype`) the role models run in.
    pub precision: crate::config::Precision,
    /// How role models are built on this backend.
    pub build_model: ModelBuilder<B>,
}

impl<B: AutodiffBackend> BuildContext<'_, B> {
    /// The table of role `name` (presence was checked during validation).
    pub fn role(&self, name: &str) -> Result<&RoleConfig, MethodError> {
        self.roles.get(name).ok_or_else(|| {
            MethodError::Config(ConfigError::new(
                format!("models.{name}"),
                "missing role table",
            ))
        })
    }

    /// The model of role `name`, built by its architecture (`arch`) on the autodiff backend,
    /// checked against the data ([`ModelInfo::check_data`]). Frozen roles come back with
    /// every parameter frozen.
    ///
    /// [`ModelInfo::check_data`]: crate::model::ModelInfo::check_data
    pub fn model(&self, name: &str) -> Result<DynModel<B>, MethodError> {
        let role = self.role(name)?;
        let model = (self.build_model)(&*role.model, role, self).map_err(|e| match e {
            ModelError::Config(c) => MethodError::Config(c.in_section(&format!("models.{name}"))),
            ModelError::Build(message) => MethodError::Model {
                role: name.to_string(),
                message,
            },
        })?;
        model.info().check_data(name, &self.data_spec)?;
        Ok(model)
    }

    /// The model of a frozen role `name` on the inner backend: no graph, no gradients.
    pub fn frozen_model(
        &self,
        name: &str,
    ) -> Result<Box<dyn DiffusionModel<B::InnerBackend>>, MethodError> {
        Ok(self.model(name)?.valid())
    }

    /// The optimizer of role `name`: `[optimizer]`, then the method's patch, then the role's.
    pub fn role_optimizer(
        &self,
        name: &str,
        method_patch: Option<&OptimizerPatch>,
    ) -> OptimizerConfig {
        let mut cfg = self.optimizer.clone();
        if let Some(p) = method_patch {
            cfg = p.apply(&cfg);
        }
        if let Some(p) = self.roles.get(name).and_then(|r| r.optimizer.as_ref()) {
            cfg = p.apply(&cfg);
        }
        cfg
    }

    /// Clipping threshold of role `name` (role override, else `training.max_grad_norm`).
    pub fn role_max_grad_norm(&self, name: &str) -> Option<f64> {
        self.roles
            .get(name)
            .and_then(|r| r.max_grad_norm)
            .or(self.training.max_grad_norm)
    }

    /// Resolve a path from the config against the config's folder.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base_dir.join(p)
        }
    }

    /// The trainable role `name` around `model`, with the role's optimizer (`[optimizer]`,
    /// then `method_patch`, then the role's own table), its clipping threshold and the run's
    /// length for the LR schedule.
    pub fn trainable_role<M: RoleModule<B>>(
        &self,
        name: &str,
        model: M,
        method_patch: Option<&OptimizerPatch>,
    ) -> TrainableRole<B, M> {
        TrainableRole::new(
            name,
            model,
            self.role_optimizer(name, method_patch),
            self.role_max_grad_norm(name),
            self.training.max_steps,
        )
    }
}

/// Build a runtime method for backend `B`. Implement it generically
/// (`impl<B: AutodiffBackend> BuildMethod<B> for MyConfig`) and every compiled backend is
/// covered.
pub trait BuildMethod<B: AutodiffBackend> {
    /// Build the method (loads its role models).
    fn build_method(
        &self,
        ctx: &BuildContext<B>,
    ) -> Result<Box<dyn TrainingMethod<B>>, MethodError>;
}

/// Serializable method configuration (`[method] kind = "..."`).
#[typetag::serde(tag = "kind")]
pub trait MethodConfig: BuildMethodAll + Debug + Send + Sync {
    /// Check values; keys are relative to `[method]`.
    fn validate(&self) -> Result<(), ConfigError>;
    /// The roles this method needs.
    fn roles(&self) -> Vec<RoleRequirement>;
    /// Whether the method can train a role with `gradient_checkpointing = true` (block-level
    /// activation checkpointing needs the method to run its backward in stages).
    fn supports_gradient_checkpointing(&self) -> bool {
        false
    }
    /// Check settings that depend on the roles' models (e.g. block indices against a
    /// model's `num_layers`), before any weight is read: `info(role)` is the role's
    /// [`ModelInfo`](crate::model::ModelInfo), `None` when its architecture cannot tell
    /// without building it. Keys are relative to `[method]`; the default has nothing to check.
    fn check_models(
        &self,
        info: &dyn Fn(&str) -> Option<crate::model::ModelInfo>,
    ) -> Result<(), ConfigError> {
        let _ = info;
        Ok(())
    }
    /// The most steps the method's sampler takes, where it has a limit, with the `[method]`
    /// key that sets it (a few-step generator samples with at most its `denoising_steps`):
    /// a validation's `sampling_steps` over it is a config error, not a failure at the first
    /// validation. The default: no limit.
    fn max_sampling_steps(&self) -> Option<(usize, &'static str)> {
        None
    }
}
