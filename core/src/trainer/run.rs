//! [`Trainer`]: one training run, its loop split into small steps.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use burn::tensor::{backend::AutodiffBackend, Tensor, TensorData};

use super::{build_method, io_err, publish_final, state, TrainError, TrainOptions, TrainSummary};
use crate::backend::ReelBackend;
use crate::callback::{Callback, CallbackContext, CallbackError, StepReport};
use crate::checkpoint::CheckpointStore;
use crate::config::{ConfigError, LoadedConfig, NonFinitePolicy, SaveErrorPolicy};
use crate::data::{negative_or_zeros, to_device, DataSource, Loader, TextCondition};
use crate::fault;
use crate::method::{StepContext, TrainingMethod};
use crate::parallel::{ParallelError, Seat};
use crate::profile;
use crate::rng::RunRng;

type Scalar<B> = Tensor<<B as AutodiffBackend>::InnerBackend, 1>;

/// Named losses of one step, each with its per-micro-batch values (device scalars).
type LossParts<B> = Vec<(String, Vec<Scalar<B>>)>;

/// What one host sync read: mean losses and each updating role's pre-clip gradient norm
/// (averaged over the workers of a group), and whether any worker was interrupted.
struct Reduced {
    losses: Vec<(String, f64)>,
    norms: Vec<(String, f64)>,
    interrupted: bool,
}

impl Reduced {
    /// `name=value` of every non-finite loss or norm.
    fn non_finite(&self) -> Vec<String> {
        self.losses
            .iter()
            .chain(&self.norms)
            .filter(|(_, v)| !v.is_finite())
            .map(|(n, v)| format!("{n}={v}"))
            .collect()
    }
}

/// One training run on backend `B`: the method, its data, callbacks and checkpoints.
pub struct Trainer<'a, B: ReelBackend> {
    loaded: &'a LoadedConfig,
    interrupt: Option<Arc<std::sync::atomic::AtomicBool>>,
    run_dir: PathBuf,
    device: B::Device,
    source: Arc<dyn DataSource>,
    negative: TextCondition,
    loader: Loader,
    method: Box<dyn TrainingMethod<B>>,
    callbacks: Vec<Box<dyn Callback<B>>>,
    store: CheckpointStore,
    rng: RunRng,
    seat: Seat<<B as AutodiffBackend>::InnerBackend>,
    /// A group's agreed interrupt (read with the losses of the last step).
    stop_agreed: bool,
    step: u64,
    skipped_steps: u64,
    last_losses: Vec<(String, f64)>,
    step_seconds: Vec<f64>,
    last_checkpoint: Option<PathBuf>,
}

impl<'a, B: ReelBackend> Trainer<'a, B> {
    /// Build the run on one device (`runtime.main_device()`): folder, data, method and
    /// callbacks; restore a checkpoint when `opts.resume` says so.
    pub fn new(loaded: &'a LoadedConfig, opts: &TrainOptions) -> Result<Self, TrainError> {
        Self::in_seat(
            loaded,
            opts,
            Seat::single(loaded.config.runtime.main_device()),
        )
    }

    /// Build worker `seat.rank` of a data-parallel group (see [`crate::parallel`]): it reads
    /// its shard of each batch; only worker 0 writes files and runs the callbacks that are
    /// not [`Callback::on_every_worker`].
    pub fn in_seat(
        loaded: &'a LoadedConfig,
        opts: &TrainOptions,
        seat: Seat<<B as AutodiffBackend>::InnerBackend>,
    ) -> Result<Self, TrainError> {
        let cfg = &loaded.config;
        let run_dir = super::run_dir_for(loaded, opts.output_dir.as_deref());
        if seat.is_main() {
            std::fs::create_dir_all(&run_dir).map_err(|e| io_err(&run_dir, e))?;
            let resolved = run_dir.join("config.resolved.toml");
            std::fs::write(&resolved, &loaded.resolved_toml).map_err(|e| io_err(&resolved, e))?;
        }
        let device = B::device_for(seat.device);
        let source: Arc<dyn DataSource> = Arc::from(cfg.data.build(&loaded.base_dir)?);
        let loader = Loader::new(
            source.clone(),
            cfg.data.batch_size(),
            cfg.data.shuffle(),
            cfg.runtime.seed,
        )?
        .sharded(seat.rank, seat.workers);
        let method = build_method::<B>(loaded, &*source, &device)?;
        let mut callbacks: Vec<Box<dyn Callback<B>>> = cfg
            .callbacks
            .iter()
            .map(|c| B::build_callback(&**c))
            .collect::<Result<_, _>>()?;
        if !seat.is_main() {
            callbacks.retain(|c| c.on_every_worker());
        }
        let mut trainer = Self {
            loaded,
            interrupt: opts.interrupt.clone(),
            negative: negative_or_zeros(&*source),
            store: CheckpointStore::new(&run_dir, cfg.training.keep_last),
            rng: RunRng::new(cfg.runtime.seed),
            seat,
            stop_agreed: false,
            run_dir,
            device,
            source,
            loader,
            method,
            callbacks,
            step: 0,
            skipped_steps: 0,
            last_losses: vec![],
            step_seconds: vec![],
            last_checkpoint: None,
        };
        let resumed = match &opts.resume {
            Some(spec) => Some(trainer.resume(spec)?),
            None => None,
        };
        trainer.start(resumed)?;
        Ok(trainer)
    }

    /// Train to `max_steps`, or until interrupted; publish the final weights.
    pub fn run(mut self) -> Result<TrainSummary, TrainError> {
        self.run_to_end()
    }

    /// SHA-256 of every role's weights, optimizer state and EMA (see [`super::group`]).
    pub(super) fn state_digest(&self) -> String {
        super::group::digest_roles(self.method.roles())
    }

    /// [`Self::run`] without consuming the trainer.
    pub(super) fn run_to_end(&mut self) -> Result<TrainSummary, TrainError> {
        while self.step < self.loaded.config.training.max_steps {
            if self.stop_requested() {
                let checkpoint = self.save(self.loader.cursor())?;
                return Err(TrainError::Interrupted {
                    step: self.step,
                    checkpoint,
                });
            }
            self.train_step()?;
        }
        let checkpoint = match self.last_checkpoint.take() {
            Some(c) => c,
            None => self.store.resolve("latest", &self.loaded.fingerprint)?.0,
        };
        if self.seat.is_main() {
            publish_final(&checkpoint, &self.run_dir)?;
        }
        Ok(TrainSummary {
            run_dir: self.run_dir.clone(),
            steps: self.step,
            last_losses: self.last_losses.clone(),
            checkpoint,
            skipped_steps: self.skipped_steps,
            worker_digests: vec![],
            step_seconds: std::mem::take(&mut self.step_seconds),
        })
    }

    /// Restore the checkpoint `spec` (`latest` or a folder); returns its folder.
    fn resume(&mut self, spec: &str) -> Result<PathBuf, TrainError> {
        let (dir, _manifest, warnings) = self.store.resolve(spec, &self.loaded.fingerprint)?;
        let main = self.seat.is_main();
        for w in warnings.iter().filter(|_| main) {
            eprintln!("reel: warning: {w}");
        }
        let st = state::restore(&dir, &mut *self.method)?;
        let seed = self.loaded.config.runtime.seed;
        if st.seed != seed {
            return Err(ConfigError::new(
                "runtime.seed",
                format!(
                    "the checkpoint was trained with seed {}, the config says {seed}",
                    st.seed
                ),
            )
            .in_file(&self.loaded.path)
            .into());
        }
        self.step = st.step;
        self.loader.set_cursor(st.data_cursor);
        if main {
            eprintln!("reel: resumed from {} at step {}", dir.display(), self.step);
            let (was, now) = (st.workers.max(1), self.seat.workers);
            if was != now {
                let batch = self.loaded.config.data.batch_size();
                eprintln!(
                    "reel: the checkpoint was trained on {was} worker(s), this run has {now}: the global batch stays {batch} samples ({} per worker, was {}); weights, optimizer state, EMA and the data order continue unchanged",
                    batch / now,
                    batch / was
                );
            }
        }
        Ok(dir)
    }

    /// Callbacks load their state (after a resume), then `on_train_start`.
    fn start(&mut self, resumed: Option<PathBuf>) -> Result<(), TrainError> {
        if let Some(dir) = resumed {
            self.each_callback(false, |cb, ctx| cb.load_state(ctx, &dir))?;
        }
        self.each_callback(false, |cb, ctx| cb.on_train_start(ctx))
    }

    fn interrupted(&self) -> bool {
        self.interrupt
            .as_ref()
            .is_some_and(|f| f.load(Ordering::SeqCst))
    }

    /// Whether to checkpoint and stop before the next step: the interrupt flag alone, or in
    /// a group what the workers agreed on at the last step's reduction (so that all stop at
    /// the same step).
    fn stop_requested(&self) -> bool {
        match self.seat.collective() {
            None => self.interrupted(),
            Some(_) => self.stop_agreed,
        }
    }

    /// One optimizer step: micro-batches, one host sync, update (or the non-finite policy),
    /// callbacks, checkpoint. Each piece is a [`profile`] phase; time outside them counts as
    /// `other`.
    pub fn train_step(&mut self) -> Result<(), TrainError> {
        let device = self.device.clone();
        let _step = profile::enter::<B>("other", &device);
        let t0 = Instant::now();
        let cursor_before = self.loader.cursor();
        let turn = self.seat.autodiff_turn();
        let parts = self.forward_backward()?;
        drop(turn);
        profile::phase::<B, _>("all-reduce", &device, || self.all_reduce_grads())?;
        let reduced =
            profile::phase::<B, _>("host sync (losses, norms)", &device, || self.reduce(parts))?;
        self.stop_agreed = reduced.interrupted;
        let _turn = self.seat.autodiff_turn();
        let bad = reduced.non_finite();
        let lrs = if bad.is_empty() {
            profile::phase::<B, _>("clip + optimizer", &device, || self.update(&reduced.norms))
        } else {
            self.on_non_finite(&bad, cursor_before)?;
            vec![]
        };
        self.step += 1;
        fault::point("step-end");
        if fault::fires("worker-panic") {
            panic!(
                "REEL_FAULT: worker-panic in worker {} at step {}",
                self.seat.rank, self.step
            );
        }
        if fault::fires("device-out-of-memory") {
            // The form of CubeCL's failed device allocation.
            panic!(
                "can't allocate buffer of size: 1 (REEL_FAULT: device-out-of-memory in worker \
                 {} at step {})",
                self.seat.rank, self.step
            );
        }
        let report = StepReport {
            step: self.step,
            max_steps: self.loaded.config.training.max_steps,
            losses: reduced.losses.clone(),
            grad_norms: reduced.norms,
            lrs,
            step_seconds: t0.elapsed().as_secs_f64(),
            samples_seen: self.loader.cursor(),
            skipped: !bad.is_empty(),
        };
        self.last_losses = reduced.losses;
        self.step_seconds.push(report.step_seconds);
        profile::phase::<B, _>("callbacks", &device, || self.end_step(&report))?;
        profile::phase::<B, _>("checkpoint", &device, || self.checkpoint_if_due())
    }

    /// Forward and backward of every micro-batch of the step; the losses stay on the device.
    fn forward_backward(&mut self) -> Result<LossParts<B>, TrainError> {
        let accum = self.loaded.config.training.grad_accumulation;
        let spec = self.source.spec();
        let mut parts: LossParts<B> = vec![];
        for micro in 0..accum {
            let data = profile::enter::<B>("data", &self.device);
            let host = self.loader.next_batch()?;
            let batch = to_device::<B>(&host, &spec, &self.negative, &self.device);
            drop(data);
            let ctx = StepContext {
                step: self.step,
                micro,
                num_micro: accum,
                max_steps: self.loaded.config.training.max_steps,
                rng: self.rng,
            };
            // A method's own phases nest inside; the rest of its step counts here.
            let out = profile::phase::<B, _>("method (other)", &self.device, || {
                self.method.micro_step(&batch, &ctx)
            })?;
            for (name, value) in out.losses {
                match parts.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, values)) => values.push(value),
                    None => parts.push((name, vec![value])),
                }
            }
        }
        Ok(parts)
    }

    /// In a group: average every updating role's pending gradients over the workers (after
    /// checking that all workers hold the same gradients to average).
    fn all_reduce_grads(&mut self) -> Result<(), TrainError> {
        let Some(collective) = self.seat.collective() else {
            return Ok(());
        };
        let mut roles = self.method.roles_mut();
        let counts: Vec<f32> = roles
            .iter()
            .flat_map(|r| {
                let (tensors, values) = r.grad_counts();
                [tensors as f32, (values % (1 << 20)) as f32]
            })
            .collect();
        if !counts.is_empty() {
            let local = Tensor::from_data(
                TensorData::new(counts.clone(), [counts.len()]),
                &self.device,
            );
            let agreed = collective
                .mean(local)?
                .into_data()
                .to_vec::<f32>()
                .unwrap_or_default();
            if agreed != counts {
                return Err(ParallelError::Mismatch {
                    rank: self.seat.rank,
                    detail: format!(
                        "(tensors, values mod 2^20) per role here {counts:?}, mean over the workers {agreed:?}"
                    ),
                }
                .into());
            }
        }
        for role in roles.iter_mut() {
            role.map_grads(&mut |grads| collective.mean_all(grads))?;
        }
        Ok(())
    }

    /// One host sync: every loss (mean over micro-batches, then over the workers of a group)
    /// and every updating role's gradient norm.
    fn reduce(&self, parts: LossParts<B>) -> Result<Reduced, TrainError> {
        let mut scalars: Vec<Scalar<B>> = parts
            .iter()
            .map(|(_, v)| Tensor::cat(v.clone(), 0).sum().div_scalar(v.len() as f64))
            .collect();
        if fault::fires("non-finite-loss") && !scalars.is_empty() {
            scalars[0] = scalars[0].clone().add_scalar(f64::NAN);
        }
        // In a group, the workers average the losses and agree on an interrupt (one more
        // value, read back with the rest).
        let group = self.seat.collective();
        if let Some(collective) = group {
            let flag = Tensor::from_floats([self.interrupted() as u8 as f32], &self.device);
            let local = Tensor::cat(scalars.into_iter().chain([flag]).collect(), 0);
            scalars = vec![collective.mean(local)?];
        }
        let mut updating = vec![];
        for role in self.method.roles() {
            if let Some(n2) = role.grad_norm_sq() {
                updating.push(role.name().to_string());
                scalars.push(n2);
            }
        }
        let mut values: Vec<f64> = if scalars.is_empty() {
            vec![]
        } else {
            let data = Tensor::cat(scalars, 0).into_data().convert::<f64>();
            data.to_vec::<f64>()
                .unwrap_or_else(|e| panic!("f64 scalars do not read back: {e:?}"))
        };
        let mut norms = values.split_off(parts.len());
        let interrupted = group.is_some() && norms.remove(0) > 0.0;
        Ok(Reduced {
            losses: parts.into_iter().map(|(n, _)| n).zip(values).collect(),
            norms: updating
                .into_iter()
                .zip(norms.into_iter().map(f64::sqrt))
                .collect(),
            interrupted,
        })
    }

    /// Clip each updating role by its global norm and step its optimizer; returns the
    /// learning rates used.
    fn update(&mut self, norms: &[(String, f64)]) -> Vec<(String, f64)> {
        let mut lrs = vec![];
        for role in self.method.roles_mut() {
            let Some((_, norm)) = norms.iter().find(|(n, _)| n == role.name()) else {
                continue;
            };
            let scale = match role.max_grad_norm() {
                Some(max) if *norm > max => max / (norm + 1e-6),
                _ => 1.0,
            };
            lrs.push((role.name().to_string(), role.lr_at(self.step)));
            role.apply_update(self.step, scale);
        }
        lrs
    }

    /// NaN/inf: drop the gradients, then skip the step or save the last good state and stop.
    fn on_non_finite(&mut self, bad: &[String], cursor_before: u64) -> Result<(), TrainError> {
        for role in self.method.roles_mut() {
            role.discard_grads();
        }
        match self.loaded.config.training.non_finite {
            NonFinitePolicy::Skip => {
                self.skipped_steps += 1;
                eprintln!(
                    "reel: step {}: non-finite {}: update skipped (non_finite = \"skip\")",
                    self.step,
                    bad.join(", ")
                );
                Ok(())
            }
            NonFinitePolicy::Stop => {
                let dir = self.save(cursor_before)?;
                Err(TrainError::NonFinite {
                    step: self.step,
                    what: bad.join(", "),
                    checkpoint: dir.display().to_string(),
                })
            }
        }
    }

    /// `on_step_end` for every callback, then `on_validation` for each validation they ran.
    fn end_step(&mut self, report: &StepReport) -> Result<(), TrainError> {
        let is_final = self.is_final();
        let mut validations = vec![];
        self.each_callback(is_final, |cb, ctx| {
            cb.on_step_end(ctx, report)?;
            validations.append(&mut ctx.validations);
            Ok(())
        })?;
        for v in &validations {
            self.each_callback(is_final, |cb, ctx| cb.on_validation(ctx, v))?;
        }
        Ok(())
    }

    /// Write a checkpoint every `checkpoint_every` steps and at the end (then
    /// `on_train_end`); a failed save stops the run or, with `on_save_error = "continue"`,
    /// is reported and training goes on.
    fn checkpoint_if_due(&mut self) -> Result<(), TrainError> {
        let loaded = self.loaded;
        let training = &loaded.config.training;
        let due = self.is_final()
            || training
                .checkpoint_every
                .is_some_and(|n| self.step.is_multiple_of(n));
        if due {
            match self.save(self.loader.cursor()) {
                Ok(dir) => self.last_checkpoint = Some(dir),
                Err(e) if training.on_save_error == SaveErrorPolicy::Continue => eprintln!(
                    "reel: warning: checkpoint at step {} failed, training continues \
                     (on_save_error = \"continue\"): {e}",
                    self.step
                ),
                Err(e) => return Err(e),
            }
        }
        if self.is_final() {
            self.each_callback(true, |cb, ctx| cb.on_train_end(ctx))?;
        }
        Ok(())
    }

    fn is_final(&self) -> bool {
        self.step == self.loaded.config.training.max_steps
    }

    /// A checkpoint of the current state with the data cursor `cursor`, written by worker 0
    /// (the other workers return an empty path).
    fn save(&mut self, cursor: u64) -> Result<PathBuf, TrainError> {
        if !self.seat.is_main() {
            return Ok(PathBuf::new());
        }
        let loaded = self.loaded;
        let at = state::SavePoint {
            step: self.step,
            data_cursor: cursor,
            workers: self.seat.workers,
            seed: loaded.config.runtime.seed,
            resolved_toml: &loaded.resolved_toml,
            fingerprint: &loaded.fingerprint,
        };
        let store = self.store.clone();
        let is_final = self.is_final();
        let (callbacks, mut ctx) = self.parts(is_final);
        state::save(&store, &at, callbacks, &mut ctx)
    }

    /// Run `f` on every callback in order, each with a fresh [`CallbackContext`].
    fn each_callback(
        &mut self,
        is_final: bool,
        mut f: impl FnMut(
            &mut Box<dyn Callback<B>>,
            &mut CallbackContext<B>,
        ) -> Result<(), CallbackError>,
    ) -> Result<(), TrainError> {
        let (callbacks, mut ctx) = self.parts(is_final);
        for cb in callbacks.iter_mut() {
            f(cb, &mut ctx)?;
        }
        Ok(())
    }

    /// The callbacks and the context they see (split borrows of the trainer).
    fn parts(&mut self, is_final: bool) -> (&mut [Box<dyn Callback<B>>], CallbackContext<'_, B>) {
        let ctx = CallbackContext {
            step: self.step,
            max_steps: self.loaded.config.training.max_steps,
            method: &mut *self.method,
            data: &*self.source,
            run_dir: &self.run_dir,
            device: &self.device,
            seed: self.loaded.config.runtime.seed,
            validations: vec![],
            is_final,
        };
        (&mut self.callbacks, ctx)
    }
}
