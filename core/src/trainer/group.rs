//! A data-parallel group: one [`Trainer`] per device on its own thread, supervised so that a
//! failed worker stops the others instead of leaving them waiting in an all-reduce.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use burn::tensor::backend::{AutodiffBackend, Backend};
use sha2::{Digest, Sha256};

use super::{TrainError, TrainOptions, TrainSummary, Trainer};
use crate::backend::ReelBackend;
use crate::config::ConfigError;
use crate::config::LoadedConfig;
use crate::data::DataSource;
use crate::parallel::{
    global_workers, same_everywhere, sum_over, Collective, ParallelError, Processes, Seat, Session,
};
use crate::role::RoleHandle;

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// How one worker ended: its result and, when it failed (not by agreement), the order in
/// which it failed.
struct Outcome {
    result: Result<(TrainSummary, String), TrainError>,
    failed_at: Option<usize>,
}

/// Train on every device of `runtime.devices` at once (and, with `opts.processes`, together
/// with the other processes of the run); returns worker 0's summary with the digest of every
/// local worker's final state.
pub(super) fn train_group<B: ReelBackend>(
    loaded: &LoadedConfig,
    opts: &TrainOptions,
    devices: &[usize],
    source: Arc<dyn DataSource>,
) -> Result<TrainSummary, TrainError> {
    let processes = opts.processes.as_deref();
    let (session, seats) = open_seats::<B>(loaded, opts, devices, &*source)?;
    let first_rank = seats[0].0;
    let failures = AtomicUsize::new(0);
    let supervisor = Supervisor {
        session: session.as_ref(),
        processes,
        failures: &failures,
    };
    let outcomes: Vec<Outcome> = std::thread::scope(|s| {
        let handles: Vec<_> = seats
            .into_iter()
            .zip(devices)
            .map(|((rank, workers, collective), &device)| {
                let supervisor = &supervisor;
                let source = source.clone();
                std::thread::Builder::new()
                    .name(format!("reel-worker-{rank}"))
                    .spawn_scoped(s, move || {
                        let seat = Seat::in_group(rank, workers, device, collective);
                        supervisor.run::<B>(loaded, opts, seat, source)
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
    conclude(outcomes, devices, first_rank)
}

/// The local session (none for the only worker of a process) and each local worker's
/// `(global rank, global workers, collective handle)`.
#[allow(clippy::type_complexity)]
fn open_seats<B: ReelBackend>(
    loaded: &LoadedConfig,
    opts: &TrainOptions,
    devices: &[usize],
    source: &dyn DataSource,
) -> Result<
    (
        Option<Session<Inner<B>>>,
        Vec<(usize, usize, Collective<Inner<B>>)>,
    ),
    TrainError,
> {
    let inner: Vec<_> = devices.iter().map(|&d| B::device_for(d)).collect();
    let Some(processes) = &opts.processes else {
        let session = Session::open(&inner, None)?;
        let seats = (0..devices.len())
            .map(|l| (l, devices.len(), session.peer(l)))
            .collect();
        return Ok((Some(session), seats));
    };
    let world = global_workers(&**processes, devices.len())?;
    check_same_config(loaded, &**processes)?;
    check_same_data(source, &**processes)?;
    check_global_batch(loaded, world, &**processes)?;
    if devices.len() == 1 {
        let only = Collective::sole_worker_of(processes.clone());
        return Ok((None, vec![(processes.rank(), world, only)]));
    }
    let session = Session::open(&inner, Some(processes.clone()))?;
    let seats = (0..devices.len())
        .map(|l| (session.global_rank(l), world, session.peer(l)))
        .collect();
    Ok((Some(session), seats))
}

/// What every worker thread shares: how to stop the others when it fails (`B`: the inner
/// backend of the group's collectives).
struct Supervisor<'a, B: Backend> {
    session: Option<&'a Session<B>>,
    processes: Option<&'a dyn Processes>,
    failures: &'a AtomicUsize,
}

impl<B: Backend> Supervisor<'_, B> {
    /// Run one worker; when it fails (not by agreement), stop the local workers' collective
    /// calls and, for the first failure of a multi-process run, every process.
    fn run<R: ReelBackend<InnerBackend = B>>(
        &self,
        loaded: &LoadedConfig,
        opts: &TrainOptions,
        seat: Seat<B>,
        source: Arc<dyn DataSource>,
    ) -> Outcome {
        let (rank, device) = (seat.rank, seat.device);
        let result = catch_unwind(AssertUnwindSafe(|| {
            run_worker::<R>(loaded, opts, seat, source)
        }))
        .unwrap_or_else(|panic| Err(panicked(rank, device, panic)));
        let mut failed_at = None;
        if let Some(e) = result.as_ref().err().filter(|e| !e.is_agreed()) {
            let first = self.failures.fetch_add(1, Ordering::SeqCst);
            failed_at = Some(first);
            if let Some(s) = self.session {
                s.abort();
            }
            if let (Some(p), 0) = (self.processes, first) {
                stop_processes(p, rank, device, e);
            }
        }
        Outcome { result, failed_at }
    }
}

/// Every process must train the same run: the same config after `--set`, but for the keys
/// that name its own devices and folder ([`LoadedConfig::run_digest`]). Processes started
/// with different flags used to train apart silently, each with its own steps or rate.
fn check_same_config(loaded: &LoadedConfig, processes: &dyn Processes) -> Result<(), TrainError> {
    let digest = loaded.run_digest();
    if same_everywhere(processes, &digest)? {
        return Ok(());
    }
    Err(ParallelError::Processes(format!(
        "they were started with different configs: `{}` after --set (sha256 {} in process {} of \
         {}) is not the same in every process; only `runtime.device`, `devices`, `num_devices` \
         and `output_dir` may differ, so start every process with the same file and flags",
        loaded.path.display(),
        &digest[..12],
        processes.rank(),
        processes.size()
    ))
    .into())
}

/// Every process must read the same data: each shuffles its own copy's sample list and
/// takes its workers' slices by position, so copies of other lengths (a file missing on one
/// machine) would read some samples twice an epoch and others never, and copies of other
/// shapes could not train together. Compared by sample count and shapes.
fn check_same_data(source: &dyn DataSource, processes: &dyn Processes) -> Result<(), TrainError> {
    let here = format!("{} samples of {}", source.len(), source.spec());
    if same_everywhere(processes, &here)? {
        return Ok(());
    }
    Err(ParallelError::Processes(format!(
        "they read different data: process {} of {} has {here}, another process not; every \
         process must see the same data set (the same files in each machine's copy)",
        processes.rank(),
        processes.size()
    ))
    .into())
}

/// The global batch must split evenly over every worker of every process. Every process
/// decides alike (the config and the worker count are agreed by now), so all stop together.
fn check_global_batch(
    loaded: &LoadedConfig,
    world: usize,
    processes: &dyn Processes,
) -> Result<(), TrainError> {
    let batch = loaded.config.data.batch_size();
    if batch.is_multiple_of(world) {
        return Ok(());
    }
    let cause = ConfigError::new(
        "data.batch_size",
        format!("the global batch ({batch}) must split evenly over the {world} workers of all processes; expected a multiple of {world}"),
    )
    .in_file(&loaded.path);
    Err(TrainError::StoppedTogether {
        rank: processes.rank(),
        size: processes.size(),
        cause: Box::new(cause.into()),
    })
}

/// Every process learns which processes' own checks (`own`: this one's, run before any worker
/// starts) failed, in one sum over processes, and all stop together when any did: a process
/// that failed alone used to end while the others waited for it in their first sum.
pub(super) fn checked_everywhere<T>(
    processes: &dyn Processes,
    own: Result<T, TrainError>,
) -> Result<T, TrainError> {
    let (rank, size) = (processes.rank(), processes.size());
    let mut failed = vec![0.0_f32; size];
    failed[rank] = if own.is_err() { 1.0 } else { 0.0 };
    sum_over(processes, &mut failed)?;
    let failed: Vec<String> = (0..size)
        .filter(|&r| failed[r] > 0.0)
        .map(|r| r.to_string())
        .collect();
    match own {
        Err(cause) => Err(TrainError::StoppedTogether {
            rank,
            size,
            cause: Box::new(cause),
        }),
        Ok(checked) if failed.is_empty() => Ok(checked),
        Ok(_) => Err(ParallelError::Processes(format!(
            "process(es) {} of {size} failed their checks before training (see their error \
             lines); process {rank} stopped with them",
            failed.join(", ")
        ))
        .into()),
    }
}

/// A worker of a multi-process run failed first here: report it, then stop every process
/// (the others may be waiting for this one in an all-reduce, which nothing else would end).
fn stop_processes(processes: &dyn Processes, rank: usize, device: usize, e: &TrainError) -> ! {
    let line = match e {
        named @ TrainError::Worker { .. } => named.to_string(),
        e => format!("worker {rank} (device {device}) failed: {e}"),
    };
    crate::console::say(&format!(
        "reel: process {} of {}: {line}; stopping every process of the run",
        processes.rank(),
        processes.size()
    ));
    processes.abort(1)
}

/// Build and run one worker; its summary and the digest of its final state.
fn run_worker<B: ReelBackend>(
    loaded: &LoadedConfig,
    opts: &TrainOptions,
    seat: Seat<Inner<B>>,
    source: Arc<dyn DataSource>,
) -> Result<(TrainSummary, String), TrainError> {
    let mut trainer = Trainer::<B>::in_seat(loaded, opts, seat, source)?;
    let summary = trainer.run_to_end()?;
    Ok((summary, trainer.state_digest()))
}

/// The group's result: the first worker failure that is not a consequence of another (a
/// collective aborted because a worker failed), named with its worker; else worker 0's.
/// `first_rank` is the global rank of this process's first worker.
fn conclude(
    mut outcomes: Vec<Outcome>,
    devices: &[usize],
    first_rank: usize,
) -> Result<TrainSummary, TrainError> {
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
                rank: first_rank + rank,
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
    let message = panic_message(panic.as_ref()).unwrap_or("unknown panic");
    TrainError::Worker {
        rank,
        device,
        cause: format!("panicked: {message}"),
    }
}

/// A panic payload's message: `panic!` with a format string (`String`) or a literal
/// (`&str`); `None` for any other payload.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> Option<&str> {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
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

#[cfg(test)]
mod tests {
    use super::{check_same_data, checked_everywhere, panic_message, TrainError};
    use crate::parallel::{Processes, ThreadProcesses};
    use std::any::Any;

    #[test]
    fn a_check_failed_in_one_process_stops_every_process_with_a_reason() {
        let group = ThreadProcesses::group(3);
        let checks = |failing: &[usize]| -> Vec<Result<(), TrainError>> {
            std::thread::scope(|s| {
                let hs: Vec<_> = group
                    .iter()
                    .map(|p| {
                        let own = match failing.contains(&p.rank()) {
                            true => Err(TrainError::Io {
                                path: "run".into(),
                                message: "holds a run".into(),
                            }),
                            false => Ok(()),
                        };
                        s.spawn(move || checked_everywhere(&**p, own))
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            })
        };
        assert!(checks(&[]).iter().all(Result::is_ok));
        let one = checks(&[1]);
        assert!(one
            .iter()
            .all(|r| r.as_ref().is_err_and(TrainError::is_agreed)));
        let errors: Vec<String> = one
            .iter()
            .map(|r| r.as_ref().unwrap_err().to_string())
            .collect();
        assert_eq!(errors[1], "process 1 of 3: run: holds a run");
        for e in [&errors[0], &errors[2]] {
            assert!(e.contains("process(es) 1 of 3 failed their checks"), "{e}");
        }
        let two = checks(&[0, 2]);
        let e = two[1].as_ref().unwrap_err().to_string();
        assert!(e.contains("process(es) 0, 2 of 3 failed"), "{e}");
    }

    /// A data source of `len` samples of one value each, `side`×`side` latents.
    #[derive(Debug)]
    struct Shaped(usize, usize);
    impl crate::data::DataSource for Shaped {
        fn spec(&self) -> crate::data::DataSpec {
            crate::data::DataSpec {
                channels: 1,
                frames: 1,
                height: self.1,
                width: self.1,
                text_len: 1,
                text_dim: 1,
            }
        }
        fn len(&self) -> usize {
            self.0
        }
        fn get(&self, _: usize) -> Result<crate::data::Sample, crate::data::DataError> {
            unreachable!("only the sizes are compared")
        }
    }

    /// Processes whose copies of the data differ in length or shapes are all refused, each
    /// naming what it has; equal copies pass.
    #[test]
    fn processes_reading_different_data_are_refused() {
        let group = ThreadProcesses::group(2);
        let compare = |sources: [Shaped; 2]| -> Vec<Result<(), TrainError>> {
            std::thread::scope(|s| {
                let hs: Vec<_> = group
                    .iter()
                    .zip(&sources)
                    .map(|(p, src)| s.spawn(move || check_same_data(src, &**p)))
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            })
        };
        assert!(compare([Shaped(10, 2), Shaped(10, 2)])
            .iter()
            .all(Result::is_ok));
        for other in [Shaped(9, 2), Shaped(10, 4)] {
            let results = compare([Shaped(10, 2), other]);
            let errors: Vec<String> = results
                .iter()
                .map(|r| r.as_ref().unwrap_err().to_string())
                .collect();
            assert!(
                errors[0].contains("process 0 of 2 has 10 samples of"),
                "{errors:?}"
            );
            assert!(errors[1].contains("they read different data"), "{errors:?}");
        }
    }

    #[test]
    fn reads_both_kinds_of_panic_payload() {
        let owned: Box<dyn Any + Send> = Box::new(String::from("out of memory"));
        let literal: Box<dyn Any + Send> = Box::new("BufferTooBig");
        let other: Box<dyn Any + Send> = Box::new(7u32);
        assert_eq!(panic_message(owned.as_ref()), Some("out of memory"));
        assert_eq!(panic_message(literal.as_ref()), Some("BufferTooBig"));
        assert_eq!(panic_message(other.as_ref()), None);
    }
}
