//! A data-parallel group: one [`Trainer`] per device on its own thread, supervised so that a
//! failed worker stops the others instead of leaving them waiting in an all-reduce.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

use burn::tensor::backend::AutodiffBackend;
use sha2::{Digest, Sha256};

use super::{TrainError, TrainOptions, TrainSummary, Trainer};
use crate::backend::ReelBackend;
use crate::config::LoadedConfig;
use crate::parallel::{ParallelError, Seat, Session};
use crate::role::RoleHandle;

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// How one worker ended: its result and, when it failed (not by agreement), the order in
/// which it failed.
struct Outcome {
    result: Result<(TrainSummary, String), TrainError>,
    failed_at: Option<usize>,
}

/// Train on every device of `runtime.devices` at once; returns worker 0's summary with the
/// digest of every worker's final state.
pub(super) fn train_group<B: ReelBackend>(
    loaded: &LoadedConfig,
    opts: &TrainOptions,
    devices: &[usize],
) -> Result<TrainSummary, TrainError> {
    let inner: Vec<_> = devices.iter().map(|&d| B::device_for(d)).collect();
    let session = Session::<Inner<B>>::open(&inner)?;
    let failures = AtomicUsize::new(0);
    let workers = devices.len();
    let outcomes: Vec<Outcome> = std::thread::scope(|s| {
        let handles: Vec<_> = devices
            .iter()
            .enumerate()
            .map(|(rank, &device)| {
                let (session, failures) = (&session, &failures);
                std::thread::Builder::new()
                    .name(format!("reel-worker-{rank}"))
                    .spawn_scoped(s, move || {
                        let seat = Seat::in_group(rank, workers, device, session.peer(rank));
                        let result =
                            catch_unwind(AssertUnwindSafe(|| run_worker::<B>(loaded, opts, seat)))
                                .unwrap_or_else(|panic| Err(panicked(rank, device, panic)));
                        let mut failed_at = None;
                        if result.as_ref().is_err_and(|e| !agreed(e)) {
                            failed_at = Some(failures.fetch_add(1, Ordering::SeqCst));
                            session.abort();
                        }
                        Outcome { result, failed_at }
                    })
                    .unwrap_or_else(|e| panic!("cannot start worker thread {rank}: {e}"))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| unreachable!("worker panics are caught"))
            })
            .collect()
    });
    conclude(outcomes, devices)
}

/// Build and run one worker; its summary and the digest of its final state.
fn run_worker<B: ReelBackend>(
    loaded: &LoadedConfig,
    opts: &TrainOptions,
    seat: Seat<Inner<B>>,
) -> Result<(TrainSummary, String), TrainError> {
    let mut trainer = Trainer::<B>::in_seat(loaded, opts, seat)?;
    let summary = trainer.run_to_end()?;
    Ok((summary, trainer.state_digest()))
}

/// Errors every worker reaches at the same step by agreement (interrupt, non-finite stop):
/// worker 0's, which carries the checkpoint, is the one to report.
fn agreed(e: &TrainError) -> bool {
    matches!(
        e,
        TrainError::Interrupted { .. } | TrainError::NonFinite { .. }
    )
}

/// The group's result: the first worker failure that is not a consequence of another (a
/// collective aborted because a worker failed), named with its worker; else worker 0's.
fn conclude(mut outcomes: Vec<Outcome>, devices: &[usize]) -> Result<TrainSummary, TrainError> {
    let consequence = |o: &Outcome| {
        matches!(
            o.result,
            Err(TrainError::Parallel(ParallelError::Collective { .. }))
        )
    };
    let first = (0..outcomes.len())
        .filter_map(|r| {
            outcomes[r]
                .failed_at
                .map(|at| (consequence(&outcomes[r]), at, r))
        })
        .min()
        .map(|(_, _, r)| r);
    if let Some(rank) = first {
        let error = outcomes
            .into_iter()
            .nth(rank)
            .and_then(|o| o.result.err())
            .unwrap_or_else(|| unreachable!("worker {rank} failed"));
        return Err(match error {
            named @ TrainError::Worker { .. } => named,
            e => TrainError::Worker {
                rank,
                device: devices[rank],
                cause: e.to_string(),
            },
        });
    }
    let digests: Vec<String> = outcomes
        .iter()
        .filter_map(|o| o.result.as_ref().ok().map(|(_, d)| d.clone()))
        .collect();
    let (mut summary, _) = outcomes.swap_remove(0).result?;
    summary.worker_digests = digests;
    Ok(summary)
}

/// A worker's panic as an error naming it.
fn panicked(rank: usize, device: usize, panic: Box<dyn std::any::Any + Send>) -> TrainError {
    let message = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into());
    TrainError::Worker {
        rank,
        device,
        cause: format!("panicked: {message}"),
    }
}

/// SHA-256 over every role's trainable weights, optimizer moments and EMA shadow (names,
/// shapes and bytes): equal digests mean bitwise-equal training state.
pub(super) fn digest_roles<B: AutodiffBackend>(roles: Vec<&dyn RoleHandle<B>>) -> String {
    let mut h = Sha256::new();
    for role in roles {
        h.update(role.name().as_bytes());
        let parts = [
            role.trainable_tensors(),
            role.optimizer_tensors(),
            role.ema_tensors(),
        ];
        for (name, data) in parts.into_iter().flatten() {
            h.update(name.as_bytes());
            h.update(format!("{:?}", data.shape).as_bytes());
            h.update(data.as_bytes());
        }
    }
    format!("{:x}", h.finalize())
}
