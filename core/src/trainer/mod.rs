//! The step-based trainer loop.
//!
//! For each step: draw `grad_accumulation` micro-batches, let the method run forward/backward
//! on each, read every loss and gradient norm in **one** host sync, apply the non-finite
//! policy, clip each role by its global L2 norm, step the optimizers, run callbacks, and
//! checkpoint when due. Ctrl-C (via [`TrainOptions::interrupt`]) writes a checkpoint and stops.

mod state;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use burn::tensor::{backend::AutodiffBackend, Tensor};

pub use state::{ema_file, optim_file, weights_file};

use crate::backend::ReelBackend;
use crate::callback::{Callback, CallbackContext, CallbackError, StepReport};
use crate::checkpoint::{sha256_hex, CheckpointError, CheckpointStore, TrainerState};
use crate::config::{ConfigError, LoadedConfig, NonFinitePolicy, SaveErrorPolicy};
use crate::data::{negative_or_zeros, to_device, DataError, DataSource, Loader};
use crate::fault;
use crate::method::{BuildContext, MethodError, StepContext, TrainingMethod};
use crate::rng::RunRng;

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
        /// Step (0-based) that produced them.
        step: u64,
        /// Which losses / gradient norms.
        what: String,
        /// Checkpoint holding the last good state.
        checkpoint: String,
    },
    /// Interrupted (Ctrl-C) after writing a checkpoint.
    #[error("interrupted at step {step}; checkpoint written to {checkpoint}")]
    Interrupted {
        /// Completed steps.
        step: u64,
        /// The checkpoint folder.
        checkpoint: PathBuf,
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

/// Options of one `reel train` invocation.
#[derive(Debug, Clone, Default)]
pub struct TrainOptions {
    /// `latest` or a checkpoint folder.
    pub resume: Option<String>,
    /// Overrides `[runtime] output_dir`.
    pub output_dir: Option<PathBuf>,
    /// Set to `true` (e.g. by a SIGINT handler) to checkpoint and stop at the next step.
    pub interrupt: Option<Arc<AtomicBool>>,
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

/// Fingerprint of the config parts a checkpoint depends on (`[models]` and `[method]`).
/// Changing `max_steps`, callbacks or logging keeps checkpoints resumable.
pub fn config_fingerprint(loaded: &LoadedConfig) -> String {
    let root: toml::Table = toml::from_str(&loaded.resolved_toml).unwrap_or_default();
    let pick = |k: &str| {
        root.get(k)
            .map(|v| serde_json::to_string(v).unwrap_or_default())
            .unwrap_or_default()
    };
    sha256_hex(format!("models={}\nmethod={}", pick("models"), pick("method")).as_bytes())
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
    };
    Ok(B::build_method(&*cfg.method, &ctx)?)
}

/// Load a checkpoint folder into a freshly built method (for `sample` / `eval`).
pub fn load_checkpoint_into<B: AutodiffBackend>(
    dir: &Path,
    method: &mut dyn TrainingMethod<B>,
) -> Result<TrainerState, TrainError> {
    state::restore(dir, method)
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> TrainError {
    TrainError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Train a run to `max_steps` (or until interrupted) on backend `B`.
pub fn train<B: ReelBackend>(
    loaded: &LoadedConfig,
    opts: &TrainOptions,
) -> Result<TrainSummary, TrainError> {
    let cfg = &loaded.config;
    let device = B::device_for(cfg.runtime.device);
    let run_dir = run_dir_for(loaded, opts.output_dir.as_deref());
    std::fs::create_dir_all(&run_dir).map_err(|e| io_err(&run_dir, e))?;
    let resolved_path = run_dir.join("config.resolved.toml");
    std::fs::write(&resolved_path, &loaded.resolved_toml).map_err(|e| io_err(&resolved_path, e))?;

    let source: Arc<dyn DataSource> = Arc::from(cfg.data.build(&loaded.base_dir)?);
    let spec = source.spec();
    let negative = negative_or_zeros(&*source);
    let mut loader = Loader::new(
        source.clone(),
        cfg.data.batch_size(),
        cfg.data.shuffle(),
        cfg.runtime.seed,
    )?;
    let mut method = build_method::<B>(loaded, &*source, &device)?;
    let mut callbacks: Vec<Box<dyn Callback<B>>> = cfg
        .callbacks
        .iter()
        .map(|c| B::build_callback(&**c))
        .collect::<Result<_, _>>()?;

    let store = CheckpointStore::new(&run_dir, cfg.training.keep_last);
    let fingerprint = config_fingerprint(loaded);
    let rng = RunRng::new(cfg.runtime.seed);
    let max_steps = cfg.training.max_steps;
    let mut step = 0u64;
    let mut resumed_from = None;
    if let Some(spec_str) = &opts.resume {
        let resume_spec = if spec_str == "latest" {
            "latest".to_string()
        } else {
            spec_str.clone()
        };
        let (dir, _manifest, warnings) = store.resolve(&resume_spec, &fingerprint)?;
        for w in warnings {
            eprintln!("reel: warning: {w}");
        }
        let st = state::restore(&dir, &mut *method)?;
        if st.seed != cfg.runtime.seed {
            return Err(ConfigError::new(
                "runtime.seed",
                format!(
                    "the checkpoint was trained with seed {}, the config says {}",
                    st.seed, cfg.runtime.seed
                ),
            )
            .in_file(&loaded.path)
            .into());
        }
        step = st.step;
        loader.set_cursor(st.data_cursor);
        resumed_from = Some(dir);
    }

    let mut cb_ctx = CallbackContext {
        step,
        max_steps,
        method: &mut *method,
        data: &*source,
        run_dir: &run_dir,
        seed: cfg.runtime.seed,
        validations: vec![],
        is_final: false,
    };
    if let Some(dir) = &resumed_from {
        eprintln!("reel: resumed from {} at step {step}", dir.display());
        for cb in callbacks.iter_mut() {
            cb.load_state(&mut cb_ctx, dir)?;
        }
    }
    for cb in callbacks.iter_mut() {
        cb.on_train_start(&mut cb_ctx)?;
    }
    drop(cb_ctx);

    let accum = cfg.training.grad_accumulation;
    let mut last_losses = vec![];
    let mut skipped_steps = 0u64;
    let mut last_checkpoint: Option<PathBuf> = None;
    let trainer_state = |step: u64, cursor: u64| TrainerState {
        step,
        data_cursor: cursor,
        seed: cfg.runtime.seed,
        optimizer_steps: Default::default(),
        method_state: serde_json::Value::Null,
    };

    while step < max_steps {
        if opts
            .interrupt
            .as_ref()
            .is_some_and(|f| f.load(Ordering::SeqCst))
        {
            let mut ctx = CallbackContext {
                step,
                max_steps,
                method: &mut *method,
                data: &*source,
                run_dir: &run_dir,
                seed: cfg.runtime.seed,
                validations: vec![],
                is_final: false,
            };
            let dir = state::save(
                &store,
                &trainer_state(step, loader.cursor()),
                &loaded.resolved_toml,
                &fingerprint,
                &mut callbacks,
                &mut ctx,
            )?;
            return Err(TrainError::Interrupted {
                step,
                checkpoint: dir,
            });
        }
        let t0 = Instant::now();
        let cursor_before = loader.cursor();
        let mut loss_names: Vec<String> = vec![];
        let mut loss_parts: Vec<Vec<Tensor<<B as AutodiffBackend>::InnerBackend, 1>>> = vec![];
        for micro in 0..accum {
            let host = loader.next_batch()?;
            let batch = to_device::<B>(&host, &spec, &negative, &device);
            let ctx = StepContext {
                step,
                micro,
                num_micro: accum,
                max_steps,
                rng,
            };
            let out = method.micro_step(&batch, &ctx)?;
            for (name, value) in out.losses {
                match loss_names.iter().position(|n| *n == name) {
                    Some(i) => loss_parts[i].push(value),
                    None => {
                        loss_names.push(name);
                        loss_parts.push(vec![value]);
                    }
                }
            }
        }
        // One host sync: every loss (mean over micro-batches) and every role's grad norm².
        let mut scalars = vec![];
        for parts in &loss_parts {
            let n = parts.len() as f64;
            scalars.push(Tensor::cat(parts.clone(), 0).sum().div_scalar(n));
        }
        let mut updating = vec![];
        for role in method.roles() {
            if let Some(n2) = role.grad_norm_sq() {
                updating.push(role.name().to_string());
                scalars.push(n2);
            }
        }
        let mut values: Vec<f64> = if scalars.is_empty() {
            vec![]
        } else {
            Tensor::cat(scalars, 0)
                .into_data()
                .convert::<f64>()
                .to_vec::<f64>()
                .expect("scalars convert to f64")
        };
        if fault::fires("non-finite-loss") && !values.is_empty() {
            values[0] = f64::NAN;
        }
        let losses: Vec<(String, f64)> = loss_names
            .iter()
            .cloned()
            .zip(values.iter().copied())
            .collect();
        let norms: Vec<(String, f64)> = updating
            .iter()
            .cloned()
            .zip(values[loss_names.len()..].iter().map(|v| v.sqrt()))
            .collect();
        let bad: Vec<String> = losses
            .iter()
            .chain(norms.iter())
            .filter(|(_, v)| !v.is_finite())
            .map(|(n, v)| format!("{n}={v}"))
            .collect();
        let skipped = !bad.is_empty();
        let mut lrs = vec![];
        if skipped {
            for role in method.roles_mut() {
                role.discard_grads();
            }
            match cfg.training.non_finite {
                NonFinitePolicy::Skip => {
                    skipped_steps += 1;
                    eprintln!(
                        "reel: step {step}: non-finite {}: update skipped (non_finite = \"skip\")",
                        bad.join(", ")
                    );
                }
                NonFinitePolicy::Stop => {
                    let mut ctx = CallbackContext {
                        step,
                        max_steps,
                        method: &mut *method,
                        data: &*source,
                        run_dir: &run_dir,
                        seed: cfg.runtime.seed,
                        validations: vec![],
                        is_final: false,
                    };
                    let dir = state::save(
                        &store,
                        &trainer_state(step, cursor_before),
                        &loaded.resolved_toml,
                        &fingerprint,
                        &mut callbacks,
                        &mut ctx,
                    )?;
                    return Err(TrainError::NonFinite {
                        step,
                        what: bad.join(", "),
                        checkpoint: dir.display().to_string(),
                    });
                }
            }
        } else {
            for role in method.roles_mut() {
                let Some((_, norm)) = norms.iter().find(|(n, _)| n == role.name()) else {
                    continue;
                };
                let scale = match role.max_grad_norm() {
                    Some(max) if *norm > max => max / (norm + 1e-6),
                    _ => 1.0,
                };
                lrs.push((role.name().to_string(), role.lr_at(step)));
                role.apply_update(step, scale);
            }
        }
        step += 1;
        fault::point("step-end");
        let report = StepReport {
            step,
            max_steps,
            losses: losses.clone(),
            grad_norms: norms,
            lrs,
            step_seconds: t0.elapsed().as_secs_f64(),
            samples_seen: loader.cursor(),
            skipped,
        };
        last_losses = losses;
        let is_final = step == max_steps;
        let mut ctx = CallbackContext {
            step,
            max_steps,
            method: &mut *method,
            data: &*source,
            run_dir: &run_dir,
            seed: cfg.runtime.seed,
            validations: vec![],
            is_final,
        };
        for cb in callbacks.iter_mut() {
            cb.on_step_end(&mut ctx, &report)?;
        }
        let validations = std::mem::take(&mut ctx.validations);
        for v in &validations {
            for cb in callbacks.iter_mut() {
                cb.on_validation(&mut ctx, v)?;
            }
        }
        let due = is_final
            || cfg
                .training
                .checkpoint_every
                .is_some_and(|n| step.is_multiple_of(n));
        if due {
            match state::save(
                &store,
                &trainer_state(step, loader.cursor()),
                &loaded.resolved_toml,
                &fingerprint,
                &mut callbacks,
                &mut ctx,
            ) {
                Ok(dir) => last_checkpoint = Some(dir),
                Err(e) => match cfg.training.on_save_error {
                    SaveErrorPolicy::Stop => return Err(e),
                    SaveErrorPolicy::Continue => {
                        eprintln!("reel: warning: checkpoint at step {step} failed, training continues (on_save_error = \"continue\"): {e}")
                    }
                },
            }
        }
        if is_final {
            for cb in callbacks.iter_mut() {
                cb.on_train_end(&mut ctx)?;
            }
        }
    }
    let checkpoint = match last_checkpoint {
        Some(c) => c,
        None => store.resolve("latest", &fingerprint)?.0,
    };
    publish_final(&checkpoint, &run_dir)?;
    Ok(TrainSummary {
        run_dir,
        steps: step,
        last_losses,
        checkpoint,
        skipped_steps,
    })
}

/// Copy the final weights (and EMA shadows) of every role to `<run>/final/`, a stable path
/// other configs can name (e.g. a DMD2 teacher: `weights = "runs/quickstart/final/student.ema.safetensors"`).
fn publish_final(checkpoint: &Path, run_dir: &Path) -> Result<(), TrainError> {
    let final_dir = run_dir.join("final");
    std::fs::create_dir_all(&final_dir).map_err(|e| io_err(&final_dir, e))?;
    let entries = std::fs::read_dir(checkpoint).map_err(|e| io_err(checkpoint, e))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.ends_with(".safetensors") && !name.contains(".optim.") {
            let tmp = final_dir.join(format!(".{name}.tmp"));
            std::fs::copy(e.path(), &tmp).map_err(|err| io_err(&tmp, err))?;
            std::fs::rename(&tmp, final_dir.join(&name)).map_err(|err| io_err(&final_dir, err))?;
        }
    }
    Ok(())
}
