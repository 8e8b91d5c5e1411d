//! [`Trainer`]: one training run, its loop split into small steps.

mod data;
mod step;

use crate::console::say;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorData};

use super::publish::publish_final;
use super::{build_method, io_err, state, TrainError, TrainOptions, TrainSummary};
use crate::backend::ReelBackend;
use crate::callback::{Callback, CallbackContext, CallbackError, StepReport};
use crate::checkpoint::{CheckpointError, CheckpointStore, Manifest, TrainerState};
use crate::config::{ConfigError, LoadedConfig, SaveErrorPolicy};
use crate::data::{negative_or_zeros, DataSource, Loader, TextCondition};
use crate::method::TrainingMethod;
use crate::parallel::{agreed, agreement_values, ParallelError, Seat};
use crate::rng::RunRng;

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
    /// Whether `final/` was published.
    published: bool,
    /// Stamps of the weight files the roles were built from ([`super::stamp`]), taken once
    /// at the start: what every checkpoint records and a resume compares.
    weight_stamps: BTreeMap<String, String>,
    /// The run folder's lock, held by the first worker while the trainer lives
    /// ([`super::lock`]).
    _lock: Option<std::fs::File>,
}

impl<'a, B: ReelBackend> Trainer<'a, B> {
    /// Build the run on one device (`runtime.main_device()`): folder, data, method and
    /// callbacks; restore a checkpoint when `opts.resume` says so.
    pub fn new(loaded: &'a LoadedConfig, opts: &TrainOptions) -> Result<Self, TrainError> {
        let seat = Seat::single(loaded.config.runtime.main_device());
        Self::in_seat(loaded, opts, seat, super::open_data(loaded)?)
    }

    /// Build worker `seat.rank` of a data-parallel group (see [`crate::parallel`]) on the
    /// config's data `source` ([`super::open_data`], shared by the group's workers): it reads
    /// its shard of each batch; only worker 0 writes files and runs the callbacks that are
    /// not [`Callback::on_every_worker`].
    pub fn in_seat(
        loaded: &'a LoadedConfig,
        opts: &TrainOptions,
        seat: Seat<<B as AutodiffBackend>::InnerBackend>,
        source: Arc<dyn DataSource>,
    ) -> Result<Self, TrainError> {
        let cfg = &loaded.config;
        let run_dir = super::run_dir_for(loaded, opts.output_dir.as_deref());
        if seat.is_main() {
            // A mistyped validation VAE path fails now, not at the first validation.
            loaded.check_callback_files()?;
        }
        // Weights and callbacks come before the run folder, as the data (opened by the
        // caller) does: a mistyped path leaves no empty run behind.
        let device = B::device_for(seat.device);
        if seat.is_main() {
            // A validation VAE whose latents are not the data's fails now too. (What the
            // run needs in memory was checked once, before any worker: `check_memory`.)
            loaded.check_callback_data(&source.spec())?;
        }
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
        // Callbacks that change training state (EMA) run first, whatever the config's order:
        // a callback that fails at a step (a validation that cannot write its samples) then
        // stops the run after the state is updated, so the checkpoint written on the way out
        // holds weights and EMA of the same step, as the other workers (which run only
        // these) have them.
        callbacks.sort_by_key(|c| !c.on_every_worker());
        // The checkpoint to resume from is found (and verified) before the run folder is
        // made too: `--resume latest` into an empty folder leaves nothing behind.
        let store = CheckpointStore::new(&run_dir, cfg.training.keep_last);
        let resume_from = (opts.resume.as_deref())
            .map(|spec| resolve(&store, spec, loaded))
            .transpose()
            .map_err(|e| explain_mismatch(loaded, e))?;
        let mut lock = None;
        if seat.is_main() {
            // A file where the run writes a folder (or the reverse) fails now, not at the
            // first write.
            (cfg.check_run_folder(&run_dir)).map_err(|e| e.in_file(&loaded.path))?;
            super::create_run_dir(loaded, opts.output_dir.as_deref(), &run_dir)?;
            lock = super::lock::lock_run_dir(loaded, opts.output_dir.as_deref(), &run_dir)?;
            let resolved = run_dir.join("config.resolved.toml");
            crate::io::replace_file(&resolved, loaded.resolved_toml.as_bytes())
                .map_err(|e| io_err(&resolved, e))?;
        } else {
            callbacks.retain(|c| c.on_every_worker());
        }
        let mut trainer = Self {
            loaded,
            interrupt: opts.interrupt.clone(),
            negative: negative_or_zeros(&*source),
            store,
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
            published: false,
            weight_stamps: super::stamp::role_weight_stamps(loaded),
            _lock: lock,
        };
        // The checkpoint's manifest (every file's SHA-256) names what a worker resumes.
        let (resumed, manifest) = match resume_from {
            Some(found) => {
                let manifest = serde_json::to_string(&found.1).unwrap_or_default();
                (Some(trainer.resume(found)?), manifest)
            }
            None => (None, String::new()),
        };
        // Every worker resolved `--resume` on its own (a file system may answer them apart).
        trainer.check_same_start(resumed.as_deref(), &manifest)?;
        // Only once every process agrees on the step: a process resuming an older checkpoint
        // than the others must not move their newer ones aside.
        if resumed.is_some() && trainer.seat.is_main() {
            trainer.set_aside_newer(trainer.step)?;
        }
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
        // Published (and ended) at the last step already, unless the run was resumed at its
        // end: then `final/` is published again and `on_train_end` runs (a loss plot that
        // failed the first time is drawn now).
        let ended = self.published;
        let checkpoint = self.publish()?;
        if !ended {
            self.each_callback(true, |cb, ctx| cb.on_train_end(ctx))?;
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

    /// Restore the checkpoint `found` by [`CheckpointStore::resolve`] (its folder, manifest
    /// and the warnings about checkpoints skipped); returns its folder.
    fn resume(&mut self, found: (PathBuf, Manifest, Vec<String>)) -> Result<PathBuf, TrainError> {
        let (dir, manifest, warnings) = found;
        let main = self.seat.is_main();
        for w in warnings.iter().filter(|_| main) {
            say(&format!("reel: warning: {w}"));
        }
        let ema_roles: Vec<String> = (self.loaded.config.callbacks.iter())
            .flat_map(|c| c.copies_of_roles())
            .collect();
        let (st, left_out) = state::restore(&dir, &mut *self.method, &ema_roles)?;
        for role in left_out.iter().filter(|_| main) {
            say(&format!(
                "reel: warning: the checkpoint keeps an EMA of role `{role}`, but no `ema` \
                 callback of the config does now: the run goes on without it (its checkpoints, \
                 validations and final weights have none)"
            ));
        }
        if st.step != manifest.step {
            let reason = format!(
                "its state.json is of step {}, its manifest of step {}",
                st.step, manifest.step
            );
            return Err(CheckpointError::Damaged { dir, reason }.into());
        }
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
        self.skipped_steps = st.skipped_steps;
        self.loader.set_cursor(st.data_cursor);
        if main {
            for role in super::stamp::changed_weights(&st.weights, &self.weight_stamps) {
                say(&format!(
                    "reel: warning: `models.{role}.weights` is not the file the checkpoint was \
                     trained with (its size or bytes changed since); the run goes on with the \
                     new one"
                ));
            }
            say(&format!(
                "reel: resumed from {} at step {}",
                dir.display(),
                self.step
            ));
            self.warn_if_data_changed(&st);
            self.warn_if_settings_changed(&dir);
            let (was, now) = (st.workers.max(1), self.seat.workers);
            if was != now {
                let batch = self.loaded.config.data.batch_size();
                say(&format!(
                    "reel: the checkpoint was trained on {was} worker(s), this run has {now}: the global batch stays {batch} samples ({} per worker, was {}); weights, optimizer state, EMA and the data order continue unchanged",
                    batch / now,
                    batch / was
                ));
            }
        }
        Ok(dir)
    }

    /// Say so when the data set is not the one the checkpoint trained on: another sample count
    /// (files added or removed: the data cursor now maps to other samples, so the rest of the
    /// epoch repeats some and skips others) or other shapes.
    fn warn_if_data_changed(&self, st: &TrainerState) {
        let len = self.source.len() as u64;
        if let Some(was) = st.data_len.filter(|&was| was != len) {
            say(&format!(
                "reel: warning: the data set has {len} samples, the checkpoint's had {was}: the \
                 data order from here on is not the uninterrupted run's"
            ));
        }
        let spec = self.source.spec();
        if let Some(was) = st.data_spec.filter(|&was| was != spec) {
            say(&format!(
                "reel: warning: the samples are {} now, the checkpoint trained on {}",
                shapes(&spec),
                shapes(&was)
            ));
        }
    }

    /// Say so for each setting the config changed since the checkpoint that makes the steps
    /// from here on differ from the uninterrupted run's (the learning rate, the precision,
    /// the batch, the EMA decay: [`crate::config::resume_differences`]), which a resume
    /// allows but a user may have changed by mistake.
    fn warn_if_settings_changed(&self, dir: &std::path::Path) {
        let Ok(saved) = std::fs::read_to_string(dir.join("config.toml")) else {
            return;
        };
        let resumable = self.loaded.resumable_keys();
        let differences =
            crate::config::resume_differences(&saved, &self.loaded.resolved_toml, &resumable);
        for (key, was, now) in differences {
            say(&format!(
                "reel: warning: `{key}` is {now} now, the checkpoint trained with {was}: the \
                 steps from here on differ from an uninterrupted run's"
            ));
        }
    }

    /// Move this run's checkpoints after the resumed `step` out of the way (the run goes on
    /// from `step` on a new timeline), saying where they went.
    fn set_aside_newer(&self, step: u64) -> Result<(), TrainError> {
        if let Some((aside, names)) = self.store.set_aside_newer(step)? {
            say(&format!(
                "reel: resuming from step {step}, before this run's newest checkpoint: moved {} \
                 to {} (kept, not pruned; delete it when no longer needed)",
                names.join(", "),
                aside.display()
            ));
        }
        Ok(())
    }

    /// Callbacks load their state (after a resume), then `on_train_start`.
    fn start(&mut self, resumed: Option<PathBuf>) -> Result<(), TrainError> {
        if let Some(dir) = resumed {
            self.each_callback(false, |cb, ctx| cb.load_state(ctx, &dir))?;
        }
        self.each_callback(false, |cb, ctx| cb.on_train_start(ctx))
    }

    /// In a run of several processes every worker must start from the same point: the same
    /// step of the same checkpoint (`manifest`: its files' SHA-256s), or a new run. Processes
    /// that see different run folders (no shared file system) or were given different
    /// `--resume` trained apart silently. Every worker decides from the same means, at the same
    /// point, and stops with the same error.
    fn check_same_start(
        &self,
        resumed: Option<&std::path::Path>,
        manifest: &str,
    ) -> Result<(), TrainError> {
        let Some(collective) = self.seat.collective() else {
            return Ok(());
        };
        let own = agreement_values(&format!("step {}: {manifest}", self.step));
        let x = Tensor::from_data(TensorData::new(own.clone(), [own.len()]), &self.device);
        let mean = collective.mean(x)?.into_data().convert::<f32>();
        let mean = (mean.to_vec::<f32>()).unwrap_or_else(|e| panic!("f32 values: {e:?}"));
        let workers = self.seat.workers;
        let sums: Vec<f32> = mean.iter().map(|m| m * workers as f32).collect();
        if agreed(&sums, workers) {
            return Ok(());
        }
        let from = match resumed {
            Some(dir) => format!("resumes `{}` at step {}", dir.display(), self.step),
            None => "starts a new run at step 0".to_string(),
        };
        Err(ParallelError::Processes(format!(
            "they start from different checkpoints: worker {} {from}; every worker must find the \
             same one (processes: the same run folder on a shared file system, and the same \
             --resume)",
            self.seat.rank
        ))
        .into())
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

    /// `on_step_end` for every callback, then `on_validation` for each validation they ran.
    fn end_step(&mut self, report: &StepReport) -> Result<(), TrainError> {
        let is_final = self.is_final();
        let mut validations = vec![];
        let ended = self.each_callback(is_final, |cb, ctx| {
            let result = cb.on_step_end(ctx, report);
            validations.append(&mut ctx.validations);
            result
        });
        let mut result = ended;
        for v in &validations {
            let forwarded = self.each_callback(is_final, |cb, ctx| cb.on_validation(ctx, v));
            result = result.and(forwarded);
        }
        result?;
        if crate::fault::fires("callback-error") {
            let why = format!("REEL_FAULT: callback-error at step {}", self.step);
            return Err(CallbackError::Other(why).into());
        }
        Ok(())
    }

    /// A callback failed after this step's update (a validation that cannot write its
    /// samples, say), or a record of the data failed before the step's update: checkpoint the
    /// state first (with the data cursor `cursor`), so that the steps since the last
    /// checkpoint are not lost with the run, then report both. A failed save leaves `cause` as
    /// it was.
    pub(super) fn save_after_failure(&mut self, cause: TrainError, cursor: u64) -> TrainError {
        // Before the first step there is nothing to keep (and a step-0 checkpoint would only
        // make the folder refuse a fresh run).
        if !self.seat.is_main() || self.step == 0 {
            return cause;
        }
        match self.save(cursor) {
            Ok(checkpoint) => TrainError::SavedAfter {
                step: self.step,
                cause: Box::new(cause),
                checkpoint,
            },
            Err(e) => {
                say(&format!(
                    "reel: warning: the checkpoint after that failure failed too: {e}"
                ));
                cause
            }
        }
    }

    /// Write a checkpoint every `checkpoint_every` steps and at the end (then
    /// `final/` is published and `on_train_end` runs); a failed save stops the run or, with
    /// `on_save_error = "continue"`, is reported and training goes on, except at the last step.
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
                // The last step's save is the run's result: it never just warns, or an older
                // checkpoint would be published as `final/` and the run reported done.
                Err(e)
                    if training.on_save_error == SaveErrorPolicy::Continue && !self.is_final() =>
                {
                    say(&format!(
                        "reel: warning: checkpoint at step {} failed, training continues \
                     (on_save_error = \"continue\"): {e}",
                        self.step
                    ))
                }
                Err(e) => return Err(e),
            }
        }
        if self.is_final() {
            // Published before `on_train_end`, whose failure (a loss plot that cannot be
            // written) must not cost the run its final weights.
            self.publish()?;
            self.each_callback(true, |cb, ctx| cb.on_train_end(ctx))?;
        }
        Ok(())
    }

    /// Copy the last checkpoint's weights to `final/` (worker 0), once; returns the checkpoint.
    fn publish(&mut self) -> Result<PathBuf, TrainError> {
        let checkpoint = match &self.last_checkpoint {
            Some(c) => c.clone(),
            None => resolve(&self.store, "latest", self.loaded)?.0,
        };
        if self.seat.is_main() && !self.published {
            publish_final(&checkpoint, &self.run_dir)?;
        }
        self.published = true;
        Ok(checkpoint)
    }

    fn is_final(&self) -> bool {
        self.step == self.loaded.config.training.max_steps
    }

    /// A checkpoint of the current state with the data cursor `cursor`, written by worker 0
    /// (the other workers return the folder it writes: in a run of several processes, theirs
    /// print it when interrupted).
    fn save(&mut self, cursor: u64) -> Result<PathBuf, TrainError> {
        let dir = self.store.step_dir(self.step);
        // Nothing changed since this process saved this step (an interrupt or a non-finite
        // stop right after a due checkpoint): saving again would only open a moment in which
        // the step's folder is moved aside.
        if !self.seat.is_main() || self.last_checkpoint.as_ref() == Some(&dir) {
            return Ok(dir);
        }
        let loaded = self.loaded;
        let at = state::SavePoint {
            step: self.step,
            data_cursor: cursor,
            workers: self.seat.workers,
            seed: loaded.config.runtime.seed,
            resolved_toml: &loaded.resolved_toml,
            fingerprint: &loaded.fingerprint,
            weights: self.weight_stamps.clone(),
            data_spec: self.source.spec(),
            data_len: self.source.len() as u64,
            skipped_steps: self.skipped_steps,
        };
        let store = self.store.clone();
        let is_final = self.is_final();
        let (callbacks, mut ctx) = self.parts(is_final);
        state::save(&store, &at, callbacks, &mut ctx)
    }

    /// Run `f` on every callback in order, each with a fresh [`CallbackContext`]. Every
    /// callback runs even after one fails (a validation that cannot write its samples must
    /// not cost the step its metrics line); the first error is returned, later ones are said
    /// as warnings.
    fn each_callback(
        &mut self,
        is_final: bool,
        mut f: impl FnMut(
            &mut Box<dyn Callback<B>>,
            &mut CallbackContext<B>,
        ) -> Result<(), CallbackError>,
    ) -> Result<(), TrainError> {
        let (callbacks, mut ctx) = self.parts(is_final);
        let mut first: Option<CallbackError> = None;
        for cb in callbacks.iter_mut() {
            if let Err(e) = f(cb, &mut ctx) {
                match first {
                    None => first = Some(e),
                    Some(_) => say(&format!(
                        "reel: warning: callback `{}` failed too: {e}",
                        cb.name()
                    )),
                }
            }
        }
        first.map_or(Ok(()), |e| Err(e.into()))
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

/// `spec`'s shapes in words: `latents CxFxHxW, text LxD`.
fn shapes(spec: &crate::data::DataSpec) -> String {
    let s = spec;
    format!(
        "latents {}x{}x{}x{}, text {}x{}",
        s.channels, s.frames, s.height, s.width, s.text_len, s.text_dim
    )
}

/// [`CheckpointStore::resolve`] for this config: a checkpoint stamped with its fingerprint,
/// or one written before resumable keys were left out of fingerprints
/// ([`LoadedConfig::fits_checkpoint`]).
fn resolve(
    store: &CheckpointStore,
    spec: &str,
    loaded: &LoadedConfig,
) -> Result<(PathBuf, Manifest, Vec<String>), CheckpointError> {
    store.resolve_accepting(spec, &|dir, m| {
        let saved = || std::fs::read_to_string(dir.join("config.toml")).unwrap_or_default();
        loaded.fits_checkpoint(&m.config_fingerprint, saved)
    })
}

/// A checkpoint refused for another config names the first differing key of `[models]` or
/// `[method]`, from the resolved config every checkpoint holds (`config.toml`).
fn explain_mismatch(loaded: &LoadedConfig, e: CheckpointError) -> TrainError {
    let CheckpointError::ConfigMismatch { dir } = &e else {
        return e.into();
    };
    let saved = std::fs::read_to_string(dir.join("config.toml")).unwrap_or_default();
    let resumable = loaded.resumable_keys();
    match crate::config::fingerprint_difference(&saved, &loaded.resolved_toml, &resumable) {
        Some((key, was, now)) => ConfigError::new(
            key,
            format!(
                "the checkpoint {} was trained with {was}, the config says {now}; resuming \
                 needs the same [models] and [method]: change it back, or start a new run \
                 in another folder (--output) without --resume",
                dir.display()
            ),
        )
        .in_file(&loaded.path)
        .into(),
        None => e.into(),
    }
}
