//! The typed run configuration: one TOML file, every table `deny_unknown_fields`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::backend::BackendName;
use crate::callback::CallbackConfig;
use crate::config::{check, ConfigError};
use crate::data::DataConfig;
use crate::method::MethodConfig;
use crate::optim::OptimizerConfig;
use crate::role::RoleConfig;

/// Compute precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// float32 everywhere.
    #[default]
    F32,
    /// bfloat16 matrix products (linear layers, attention) and bfloat16 activations between
    /// them, with float32 master weights, gradients, optimizer state and checkpoints; norms,
    /// modulation, softmax statistics and losses compute in float32. Needs a backend with
    /// bfloat16 kernels (`cuda`, or `flex` on CPU).
    Bf16,
}

impl Precision {
    /// The dtype of the products and activations: `BF16` for `Bf16`, else `F32`.
    pub fn dtype(self) -> burn::tensor::DType {
        match self {
            Precision::F32 => burn::tensor::DType::F32,
            Precision::Bf16 => burn::tensor::DType::BF16,
        }
    }
}

/// `[runtime] launcher`: how the processes of a multi-process run were started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Launcher {
    /// An MPI launcher (`mpirun`, `srun`): the process joins the MPI job it was started in.
    Mpi,
}

/// The most data-parallel workers one process runs (`runtime.num_devices`): far above the
/// GPUs of one machine, low enough that a typo is an error, not a list of a trillion workers.
pub const MAX_WORKERS: usize = 1024;

/// `[runtime]`: where and how the run executes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Backend name: `cpu` or `cuda`.
    #[serde(default)]
    pub backend: BackendName,
    /// Device index (CUDA) of a single-device run.
    #[serde(default)]
    pub device: usize,
    /// Data parallelism: one worker per listed device, in one process (`[0, 1, 2, 3]`). Each
    /// worker reads `data.batch_size / workers` samples of every global batch; gradients are
    /// averaged across workers before clipping and AdamW, so the run equals a one-device run
    /// with the whole batch. On CPU backends the indices only count workers.
    #[serde(default)]
    pub devices: Option<Vec<usize>>,
    /// Shorthand for `devices = [0, 1, ..., N-1]`.
    #[serde(default)]
    pub num_devices: Option<usize>,
    /// Several processes (one per machine): `"mpi"` joins the MPI job this process was
    /// started in (`mpirun -np 2 reel train ...`); every process runs the workers of its own
    /// `devices` (the same count everywhere) and `data.batch_size` splits over all of them.
    /// Needs a `reel` built with `--features mpi`. Unset: the run is this process alone.
    #[serde(default)]
    pub launcher: Option<Launcher>,
    /// Compute precision.
    #[serde(default)]
    pub dtype: Precision,
    /// Run seed: every random draw derives from it.
    #[serde(default)]
    pub seed: u64,
    /// Output folder (checkpoints, logs, samples). Default `runs/<config file stem>`.
    #[serde(default)]
    pub output_dir: Option<PathBuf>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            backend: BackendName::Cpu,
            device: 0,
            devices: None,
            num_devices: None,
            launcher: None,
            dtype: Precision::F32,
            seed: 0,
            output_dir: None,
        }
    }
}

impl RuntimeConfig {
    /// The device index of every worker: `devices`, else `0..num_devices`, else `[device]`.
    pub fn worker_devices(&self) -> Vec<usize> {
        match (&self.devices, self.num_devices) {
            (Some(d), _) => d.clone(),
            (None, Some(n)) => (0..n).collect(),
            (None, None) => vec![self.device],
        }
    }

    /// Worker 0's device: the device of a one-device run, and where `reel sample` and
    /// `reel eval` run.
    pub fn main_device(&self) -> usize {
        self.worker_devices()[0]
    }

    /// Check that the worker devices exist on this machine's `backend`
    /// ([`crate::devices::check_indices`]), keyed by the key that names them; keys relative
    /// to `[runtime]`. Not part of [`Self::validate`]: a config stays valid on a smaller
    /// machine, where `reel sample` of its run uses the first device only.
    pub fn check_devices_exist(&self) -> Result<(), ConfigError> {
        match crate::devices::device_count(self.backend) {
            Some(count) => self.check_devices_against(count),
            None => Ok(()),
        }
    }

    /// [`Self::check_devices_exist`] against `count` devices.
    fn check_devices_against(&self, count: usize) -> Result<(), ConfigError> {
        let devices = self.worker_devices();
        crate::devices::check_against(self.backend, &devices, count).map_err(|message| {
            let key = match (&self.devices, self.num_devices) {
                (Some(_), _) => "devices",
                (None, Some(_)) => "num_devices",
                (None, None) => "device",
            };
            ConfigError::new(key, message)
        })
    }

    /// Check the device keys; keys relative to `[runtime]`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.devices.is_some() && self.num_devices.is_some() {
            return Err(ConfigError::new(
                "num_devices",
                "set either `devices = [..]` or `num_devices = N`, not both",
            ));
        }
        if (self.devices.is_some() || self.num_devices.is_some()) && self.device != 0 {
            return Err(ConfigError::new(
                "device",
                "`device` selects the device of a one-device run; with `devices`/`num_devices` list the devices there instead",
            ));
        }
        if let Some(n) = self.num_devices {
            let why = " (workers of one process; each holds its own copy of the roles)";
            check::count_in("num_devices", n, MAX_WORKERS, why)?;
        }
        if let Some(d) = &self.devices {
            if d.is_empty() {
                return Err(ConfigError::new(
                    "devices",
                    "expected at least one device index",
                ));
            }
            if d.len() > MAX_WORKERS {
                return Err(ConfigError::new(
                    "devices",
                    format!("expected at most {MAX_WORKERS} devices, got {}", d.len()),
                ));
            }
            let mut seen = d.clone();
            seen.sort_unstable();
            seen.dedup();
            if seen.len() != d.len() {
                return Err(ConfigError::new(
                    "devices",
                    format!("expected distinct device indices, got {d:?}"),
                ));
            }
        }
        // An empty path would scatter the run's folders into the working directory.
        if self
            .output_dir
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Err(ConfigError::new(
                "output_dir",
                "expected a folder path, got an empty string (leave the key out for runs/<config name>)",
            ));
        }
        Ok(())
    }
}

/// What to do when a loss or gradient is NaN/inf.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum NonFinitePolicy {
    /// Drop that step's update, log it, continue.
    Skip,
    /// Write a checkpoint of the last good state and exit with an error.
    #[default]
    Stop,
}

/// What to do when writing a checkpoint fails (disk full, unwritable folder).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SaveErrorPolicy {
    /// Stop training with the error (the previous checkpoint stays intact).
    #[default]
    Stop,
    /// Log the error and keep training; the last step's save still stops with the error
    /// (it is what `final/` publishes).
    Continue,
}

/// `[training]`: the loop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingConfig {
    /// Optimizer steps to run.
    pub max_steps: u64,
    /// Micro-batches per optimizer step; gradients are averaged.
    #[serde(default = "one")]
    pub grad_accumulation: usize,
    /// Clip each role's gradients by their global L2 norm.
    #[serde(default)]
    pub max_grad_norm: Option<f64>,
    /// Write a checkpoint every N steps (and always at the end).
    #[serde(default)]
    pub checkpoint_every: Option<u64>,
    /// Keep the newest N checkpoints.
    #[serde(default = "three")]
    pub keep_last: usize,
    /// NaN/inf policy.
    #[serde(default)]
    pub non_finite: NonFinitePolicy,
    /// Checkpoint-write failure policy.
    #[serde(default)]
    pub on_save_error: SaveErrorPolicy,
}

fn one() -> usize {
    1
}
fn three() -> usize {
    3
}

impl TrainingConfig {
    /// Check ranges; keys relative to `[training]`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check::positive_u64("max_steps", self.max_steps)?;
        check::positive_usize("grad_accumulation", self.grad_accumulation)?;
        if let Some(n) = self.max_grad_norm {
            check::positive_f64("max_grad_norm", n)?;
        }
        if let Some(n) = self.checkpoint_every {
            check::positive_u64("checkpoint_every", n)?;
        }
        check::positive_usize("keep_last", self.keep_last)?;
        Ok(())
    }
}

/// A whole run: `reel train <file.toml>`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// `[runtime]`.
    #[serde(default)]
    pub runtime: RuntimeConfig,
    /// `[models.<role>]` tables.
    #[serde(default)]
    pub models: BTreeMap<String, RoleConfig>,
    /// `[method]`.
    pub method: Box<dyn MethodConfig>,
    /// `[data]`.
    pub data: Box<dyn DataConfig>,
    /// `[optimizer]`: defaults for every trainable role.
    #[serde(default)]
    pub optimizer: OptimizerConfig,
    /// `[training]`.
    pub training: TrainingConfig,
    /// `[[callbacks]]`, run in order.
    #[serde(default)]
    pub callbacks: Vec<Box<dyn CallbackConfig>>,
}

impl RunConfig {
    /// Names of the trainable roles of `[models]`, in table order.
    pub fn trainable_roles(&self) -> Vec<&str> {
        (self.models.iter())
            .filter(|(_, r)| r.trainable)
            .map(|(n, _)| n.as_str())
            .collect()
    }

    /// Check everything that can be checked without loading weights or data: ranges, backend,
    /// registered architectures, the method's roles, adapters, callbacks.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.runtime.backend.check_compiled()?;
        self.validate_settings()
    }

    /// [`Self::validate`] but for whether the backend is compiled into this binary (`reel
    /// check` reports that with the file problems, so a CUDA config is checked on a CPU build).
    pub fn validate_settings(&self) -> Result<(), ConfigError> {
        let backend = self.runtime.backend;
        if self.runtime.dtype == Precision::Bf16
            && matches!(backend, BackendName::Cpu | BackendName::Wgpu)
        {
            let why = match backend {
                BackendName::Cpu => "the ndarray `cpu` backend computes in f32 only",
                _ => "WGSL, the shading language of Burn's `wgpu` backend, has no bfloat16",
            };
            return Err(ConfigError::new(
                "runtime.dtype",
                format!("bf16 needs a backend with bfloat16 kernels: set `runtime.backend = \"cuda\"` (or \"flex\" on CPU); {why}"),
            ));
        }
        self.runtime
            .validate()
            .map_err(|e| e.in_section("runtime"))?;
        self.training
            .validate()
            .map_err(|e| e.in_section("training"))?;
        self.optimizer
            .validate()
            .map_err(|e| e.in_section("optimizer"))?;
        self.method.validate().map_err(|e| e.in_section("method"))?;
        self.data.validate().map_err(|e| e.in_section("data"))?;
        let workers = self.runtime.worker_devices().len();
        if !self.data.batch_size().is_multiple_of(workers) {
            return Err(ConfigError::new(
                "data.batch_size",
                format!(
                    "the global batch ({}) must split evenly over the {workers} workers of `runtime.devices`; expected a multiple of {workers}",
                    self.data.batch_size()
                ),
            ));
        }
        for (i, cb) in self.callbacks.iter().enumerate() {
            cb.validate()
                .map_err(|e| e.in_section(&format!("callbacks[{i}]")))?;
        }
        let required = self.method.roles();
        for req in &required {
            match self.models.get(req.name) {
                None if !req.optional => {
                    let names: Vec<_> = required.iter().map(|r| r.name).collect();
                    return Err(ConfigError::new(
                        format!("models.{}", req.name),
                        format!("missing role: this method needs the roles {names:?}"),
                    ));
                }
                Some(role) => match req.trainable {
                    Some(true) if !role.trainable => {
                        return Err(ConfigError::new(
                            format!("models.{}.trainable", req.name),
                            "this method trains this role: expected `trainable = true`",
                        ))
                    }
                    Some(false) if role.trainable => {
                        return Err(ConfigError::new(
                            format!("models.{}.trainable", req.name),
                            "this method keeps this role frozen: expected `trainable = false`",
                        ))
                    }
                    _ => {}
                },
                None => {}
            }
        }
        for (name, role) in &self.models {
            let section = format!("models.{name}");
            if !required.iter().any(|r| r.name == name) {
                let names: Vec<_> = required.iter().map(|r| r.name).collect();
                return Err(ConfigError::new(
                    section,
                    format!("unexpected role: this method uses only {names:?}"),
                ));
            }
            role.validate().map_err(|e| e.in_section(&section))?;
            if role.gradient_checkpointing && !self.method.supports_gradient_checkpointing() {
                return Err(ConfigError::new(
                    format!("{section}.gradient_checkpointing"),
                    "this method does not support block-level activation checkpointing (the built-in finetune, dmd2, adversarial and consistency do); set it to false",
                ));
            }
        }
        self.check_callback_roles()?;
        self.check_callback_outputs()?;
        self.check_sampling_steps()
    }

    /// No callback asks the method for more sampling steps than its sampler takes
    /// ([`MethodConfig::max_sampling_steps`]): the first validation would fail, steps in.
    fn check_sampling_steps(&self) -> Result<(), ConfigError> {
        let Some((max, key)) = self.method.max_sampling_steps() else {
            return Ok(());
        };
        for (i, cb) in self.callbacks.iter().enumerate() {
            match cb.sampling_steps() {
                Some(steps) if steps > max => {
                    return Err(ConfigError::new(
                        format!("callbacks[{i}].sampling_steps"),
                        format!(
                            "expected at most {max}: the method samples with at most \
                             `method.{key}` ({max}) steps, got {steps}"
                        ),
                    ))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// No two callbacks write the same entry of the run folder
    /// ([`CallbackConfig::run_outputs`]): the second would replace what the first wrote
    /// (two `logging` callbacks: the first keeps writing to a `metrics.jsonl` the second
    /// replaced, and its lines are lost).
    fn check_callback_outputs(&self) -> Result<(), ConfigError> {
        let mut owner: BTreeMap<String, usize> = BTreeMap::new();
        for (i, cb) in self.callbacks.iter().enumerate() {
            for output in cb.run_outputs() {
                if let Some(k) = owner.insert(output.clone(), i) {
                    return Err(ConfigError::new(
                        format!("callbacks[{i}]"),
                        format!(
                            "writes `{output}` in the run folder, as callbacks[{k}] does; one \
                             would replace what the other wrote: keep one of them (or turn that \
                             output off in one)"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The entries the run will write in `run_dir` (its `checkpoints/` and each callback's
    /// [`CallbackConfig::run_outputs`]) are not there as the wrong kind (a file named
    /// `samples`, a folder named `metrics.jsonl`), which would fail the run at the first
    /// write, steps or hours in.
    pub fn check_run_folder(&self, run_dir: &std::path::Path) -> Result<(), ConfigError> {
        let callbacks = self.callbacks.iter().enumerate();
        let outputs = callbacks.flat_map(|(i, cb)| {
            let key = format!("callbacks[{i}]");
            cb.run_outputs().into_iter().map(move |o| (key.clone(), o))
        });
        let checkpoints = ("runtime.output_dir".to_string(), "checkpoints/".to_string());
        for (key, output) in std::iter::once(checkpoints).chain(outputs) {
            let folder = output.ends_with('/');
            let path = run_dir.join(output.trim_end_matches('/'));
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if meta.is_dir() != folder {
                let (is, wants) = match folder {
                    true => ("a file", "a folder"),
                    false => ("a folder", "a file"),
                };
                return Err(ConfigError::new(
                    key,
                    format!(
                        "`{}` is {is}, where the run writes {wants}: move it, or train into \
                         another folder",
                        path.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Each role a callback keeps a weight copy of (an EMA shadow) is a trainable role of
    /// `[models]`, and no two callbacks keep one of the same role: a role has one shadow,
    /// which both would update.
    fn check_callback_roles(&self) -> Result<(), ConfigError> {
        let trainable = self.trainable_roles();
        let mut owner: BTreeMap<String, usize> = BTreeMap::new();
        for (i, cb) in self.callbacks.iter().enumerate() {
            for role in cb.copies_of_roles() {
                let key = format!("callbacks[{i}]");
                if !trainable.contains(&role.as_str()) {
                    return Err(ConfigError::new(
                        key,
                        format!(
                            "keeps a copy of role `{role}`'s trained weights, but `{role}` is \
                             not a trainable role of [models]; expected one of {trainable:?}"
                        ),
                    ));
                }
                if let Some(k) = owner.insert(role.clone(), i) {
                    return Err(ConfigError::new(
                        key,
                        format!(
                            "role `{role}` is already averaged by callbacks[{k}]; a role has \
                             one shadow, which both callbacks would update"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Worker counts past one process's limit are refused by key before any list is made.
    #[test]
    fn a_worker_count_past_the_limit_is_refused() {
        let runtime = |devices: Option<Vec<usize>>, num_devices: Option<usize>| RuntimeConfig {
            devices,
            num_devices,
            ..RuntimeConfig::default()
        };
        runtime(None, Some(MAX_WORKERS)).validate().unwrap();
        let e = runtime(None, Some(1_000_000_000_000))
            .validate()
            .unwrap_err();
        assert_eq!(e.key, "num_devices");
        assert!(e.message.contains("[1, 1024]"), "{e}");
        assert_eq!(
            runtime(None, Some(0)).validate().unwrap_err().key,
            "num_devices"
        );
        let many: Vec<usize> = (0..=MAX_WORKERS).collect();
        let e = runtime(Some(many), None).validate().unwrap_err();
        assert_eq!(
            (e.key.as_str(), e.message.contains("at most 1024")),
            ("devices", true)
        );
    }

    /// A device past the machine's count is named under the key that chose it.
    #[test]
    fn a_missing_device_is_named_under_the_key_that_chose_it() {
        let cuda = |devices: Option<Vec<usize>>, num_devices: Option<usize>, device: usize| {
            RuntimeConfig {
                backend: BackendName::Cuda,
                device,
                devices,
                num_devices,
                ..RuntimeConfig::default()
            }
        };
        let key = |c: RuntimeConfig| c.check_devices_against(2).map_err(|e| e.key);
        assert_eq!(key(cuda(None, None, 1)), Ok(()));
        assert_eq!(key(cuda(None, None, 2)), Err("device".into()));
        assert_eq!(key(cuda(None, Some(2), 0)), Ok(()));
        assert_eq!(key(cuda(None, Some(4), 0)), Err("num_devices".into()));
        assert_eq!(key(cuda(Some(vec![1, 0]), None, 0)), Ok(()));
        assert_eq!(key(cuda(Some(vec![0, 3]), None, 0)), Err("devices".into()));
        let e = cuda(None, Some(4), 0).check_devices_against(2).unwrap_err();
        assert!(e.message.starts_with("device 2 does not exist"), "{e}");
    }
}
