//! One optimizer step of the [`Trainer`]: the micro-batches' forward and backward, the
//! gradient all-reduce, one host sync for losses and norms, then the update or the
//! non-finite policy.

use crate::console::say;
use std::time::Instant;

use burn::tensor::{backend::AutodiffBackend, Tensor, TensorData};

use super::super::{check_device, TrainError};
use super::Trainer;
use crate::backend::ReelBackend;
use crate::callback::StepReport;
use crate::config::NonFinitePolicy;
use crate::data::{to_device, HostBatch};
use crate::fault;
use crate::method::StepContext;
use crate::parallel::ParallelError;
use crate::profile;

type Scalar<B> = Tensor<<B as AutodiffBackend>::InnerBackend, 1>;

/// What the gradient counts compared across workers are taken modulo: exact in a float32 sum
/// over up to 4096 workers (the worker limit is 1024).
const COUNT_MODULUS: usize = 1 << 12;

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

impl<B: ReelBackend> Trainer<'_, B> {
    /// One optimizer step: micro-batches, one host sync, update (or the non-finite policy),
    /// callbacks, checkpoint. Each piece is a [`profile`] phase; time outside them counts as
    /// `other`.
    pub fn train_step(&mut self) -> Result<(), TrainError> {
        let device = self.device.clone();
        let _step = profile::enter::<B>("other", &device);
        let t0 = Instant::now();
        let cursor_before = self.loader.cursor();
        // Read (and, in a group, agreed on) before the autodiff turn: a worker waiting in
        // a collective must not hold it.
        let hosts = match profile::phase::<B, _>("data", &device, || self.read_step()) {
            Ok(hosts) => hosts,
            // A bad record mid-run (the data set is read as it trains): nothing of this step
            // was applied, so the state before it is checkpointed, at the data before it.
            Err(cause @ (TrainError::Data(_) | TrainError::DataFailed { .. })) => {
                return Err(self.save_after_failure(cause, cursor_before))
            }
            Err(e) => return Err(e),
        };
        let turn = self.seat.autodiff_turn();
        let parts = self.forward_backward(hosts)?;
        drop(turn);
        profile::phase::<B, _>("all-reduce", &device, || self.all_reduce_grads())?;
        let reduced =
            profile::phase::<B, _>("host sync (losses, norms)", &device, || self.reduce(parts))?;
        // Every call queued during the step has run by the host sync.
        check_device(&self.store, self.step)?;
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
        let ended = profile::phase::<B, _>("callbacks", &device, || self.end_step(&report));
        if let Err(cause) = ended {
            let cursor = self.loader.cursor();
            return Err(self.save_after_failure(cause, cursor));
        }
        profile::phase::<B, _>("checkpoint", &device, || self.checkpoint_if_due())
    }

    /// Forward and backward of every micro-batch of the step (`hosts`, one each); the losses
    /// stay on the device.
    fn forward_backward(&mut self, hosts: Vec<HostBatch>) -> Result<LossParts<B>, TrainError> {
        let accum = hosts.len();
        let spec = self.source.spec();
        let mut parts: LossParts<B> = vec![];
        for (micro, host) in hosts.into_iter().enumerate() {
            let data = profile::enter::<B>("data", &self.device);
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
        // Counts below 2^12, so that the sum over up to 4096 workers (2^24) is exact in
        // float32 and the mean of equal counts is the count itself.
        let counts: Vec<f32> = roles
            .iter()
            .flat_map(|r| {
                let (tensors, values) = r.grad_counts();
                [
                    (tensors % COUNT_MODULUS) as f32,
                    (values % COUNT_MODULUS) as f32,
                ]
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
                        "(tensors, values) mod 4096 per role here {counts:?}, mean over the workers {agreed:?}"
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
                // Every worker skips (they agree on the values); one says so.
                if self.seat.is_main() {
                    say(&format!(
                        "reel: step {}: non-finite {}: update skipped (non_finite = \"skip\")",
                        self.step + 1,
                        bad.join(", ")
                    ));
                }
                Ok(())
            }
            NonFinitePolicy::Stop => {
                let dir = self.save(cursor_before)?;
                Err(TrainError::NonFinite {
                    step: self.step + 1,
                    what: bad.join(", "),
                    checkpoint: dir.display().to_string(),
                })
            }
        }
    }
}
