//! Data parallelism: one worker per device, gradients averaged with Burn's collective
//! operations (`burn-collective`).
//!
//! A run with `[runtime] devices = [0, 1, ...]` starts one [`Trainer`](crate::trainer::Trainer)
//! per device in one process ([`crate::trainer::train`] does it). Each worker builds every
//! role on its device and reads its shard of each global batch; after the backward, the
//! pending gradients of every updating role and the step's losses are averaged across
//! workers, so clipping, AdamW and EMA see the same numbers everywhere and the weights stay
//! identical on every worker. Worker 0 (its [`Seat::is_main`]) writes checkpoints, logs and
//! samples.
//!
//! A run can also span several processes, one per machine, started by a launcher such as
//! `mpirun` ([`Processes`], the `reel` binary's `mpi` feature): each process runs its own
//! devices' workers, and the means reach every worker of every process.

mod collective;
mod processes;

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::sync::{Condvar, Mutex};

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

pub use collective::{Collective, Session, BUCKET_VALUES};
#[cfg(test)]
pub(crate) use processes::tests::ThreadProcesses;
pub use processes::{
    agreed, agreement_values, global_workers, same_everywhere, sum_over, ProcessHandle, Processes,
};

/// Errors of collective operations.
#[derive(Debug, thiserror::Error)]
pub enum ParallelError {
    /// A collective call failed; after another worker's failure every worker sees this.
    #[error("worker {rank}: collective {op} failed: {detail}")]
    Collective {
        /// The worker that called.
        rank: usize,
        /// `register`, `all-reduce`...
        op: &'static str,
        /// What `burn-collective` said.
        detail: String,
    },
    /// The processes of a multi-process run disagree (see [`Processes`]).
    #[error("the processes of the run: {0}")]
    Processes(String),
    /// Workers reached a collective with different gradients to average (a method whose
    /// gradients depend on the worker, which breaks data parallelism).
    #[error(
        "worker {rank}: the workers disagree on which gradients to average at this step: {detail}"
    )]
    Mismatch {
        /// The worker that noticed.
        rank: usize,
        /// What differed.
        detail: String,
    },
}

impl ParallelError {
    pub(crate) fn collective(rank: usize, op: &'static str, e: impl std::fmt::Debug) -> Self {
        Self::Collective {
            rank,
            op,
            detail: format!("{e:?} (the group was stopped, usually because another worker failed)"),
        }
    }
}

/// Burn 0.21's autodiff graph cleanup is process-global: a `backward()` on one thread can
/// free graph steps another thread is still building (tracel-ai/burn#5573), silently losing
/// a gradient. Trainings in one process (a group's workers, or separate runs) therefore build
/// graphs and run backwards one at a time (they take turns), and give the turn away while they
/// wait in a collective call. Kernels run asynchronously on GPUs, so devices still compute
/// side by side.
struct Turn {
    taken: Mutex<bool>,
    free: Condvar,
}

static TURN: Turn = Turn {
    taken: Mutex::new(false),
    free: Condvar::new(),
};

thread_local! {
    /// Whether this thread holds the [`TURN`].
    static HOLDS_TURN: Cell<bool> = const { Cell::new(false) };
    /// This worker thread's collective (a `Collective<B>` of the group's inner backend).
    static CURRENT: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

impl Turn {
    fn take(&self) {
        let mut taken = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        while *taken {
            taken = self.free.wait(taken).unwrap_or_else(|p| p.into_inner());
        }
        *taken = true;
        HOLDS_TURN.with(|h| h.set(true));
    }

    fn give(&self) {
        HOLDS_TURN.with(|h| h.set(false));
        *self.taken.lock().unwrap_or_else(|p| p.into_inner()) = false;
        self.free.notify_one();
    }
}

/// This thread's turn to build graphs and run backwards; given back when dropped (by the
/// guard that took it: a guard taken while the thread already held the turn leaves it held).
/// Not `Send`: the turn belongs to the thread that took it, and a guard dropped on another
/// thread would clear that thread's record of holding it instead of the taker's.
#[derive(Debug)]
pub struct TurnGuard {
    outermost: bool,
    /// Keeps the guard on its thread (a raw pointer is neither `Send` nor `Sync`).
    _thread_bound: PhantomData<*const ()>,
}

impl Drop for TurnGuard {
    fn drop(&mut self) {
        if self.outermost {
            TURN.give();
        }
    }
}

/// This thread's turn to build autodiff graphs and run backwards, held until the guard drops.
///
/// Burn 0.21's autodiff graph cleanup is process-wide (tracel-ai/burn#5573): a `backward()`
/// on one thread can free the graph steps another thread is still building, which silently
/// loses a gradient. The trainer takes this turn around every step's graphs and backwards;
/// code that drives methods or models directly on several threads of one process (a test
/// binary's tests, a library's caller) takes it around each forward-and-backward too. A
/// thread that already holds the turn gets it again at once (the inner guard leaves it held).
/// Do not hold it while waiting for another thread that takes it (a training's workers).
pub fn autodiff_turn() -> TurnGuard {
    if HOLDS_TURN.with(|h| h.get()) {
        return TurnGuard {
            outermost: false,
            _thread_bound: PhantomData,
        };
    }
    TURN.take();
    TurnGuard {
        outermost: true,
        _thread_bound: PhantomData,
    }
}

/// Run `wait` (a blocking collective call) without holding the turn, so the other workers
/// can reach the same call.
fn outside_turn<T>(wait: impl FnOnce() -> T) -> T {
    if !HOLDS_TURN.with(|h| h.get()) {
        return wait();
    }
    TURN.give();
    let out = wait();
    TURN.take();
    out
}

/// The mean of `x` over the workers of this thread's data-parallel group (`x` itself in a
/// one-device run). A method calls it for a **batch statistic** its loss depends on (DMD2's
/// gradient normalizer `mean|x0 − real|`), so that the statistic covers the whole global
/// micro-batch and the run stays equal to one device with the whole batch. `x` must be a
/// tensor of the inner (non-autodiff) backend, without gradients.
pub fn mean_over_workers<B: Backend, const D: usize>(
    x: Tensor<B, D>,
) -> Result<Tensor<B, D>, ParallelError> {
    CURRENT.with(|c| {
        let current = c.borrow();
        let Some(any) = current.as_ref() else {
            return Ok(x);
        };
        let Some(collective) = any.downcast_ref::<Collective<B>>() else {
            return Err(ParallelError::Mismatch {
                rank: usize::MAX,
                detail: "mean_over_workers was called with a tensor of another backend than the group's (use the inner, non-autodiff backend)".into(),
            });
        };
        let shape = x.shape();
        Ok(collective.mean(x.flatten(0, D - 1))?.reshape(shape))
    })
}

/// Where a trainer sits in its data-parallel group.
#[derive(Debug)]
pub struct Seat<B: Backend> {
    /// This worker's index; worker 0 writes checkpoints, logs and samples.
    pub rank: usize,
    /// Workers in the group.
    pub workers: usize,
    /// The worker's device index.
    pub device: usize,
    collective: Option<Collective<B>>,
}

impl<B: Backend> Seat<B> {
    /// The only worker of a one-device run.
    pub fn single(device: usize) -> Self {
        Self {
            rank: 0,
            workers: 1,
            device,
            collective: None,
        }
    }

    /// Worker `rank` of `workers` on device index `device`, with its collective handle.
    /// Call it on the worker's own thread: it also makes [`mean_over_workers`] reach the
    /// group there.
    pub fn in_group(rank: usize, workers: usize, device: usize, collective: Collective<B>) -> Self {
        CURRENT.with(|c| *c.borrow_mut() = Some(Box::new(collective.clone())));
        Self {
            rank,
            workers,
            device,
            collective: Some(collective),
        }
    }

    /// Whether this worker writes the run's files (worker 0).
    pub fn is_main(&self) -> bool {
        self.rank == 0
    }

    /// The collective handle (`None` in a one-device run).
    pub fn collective(&self) -> Option<&Collective<B>> {
        self.collective.as_ref()
    }

    /// This worker's turn to build graphs and run backwards: the workers of a group take
    /// turns because of tracel-ai/burn#5573 (collective calls give the turn away while they
    /// wait), and so does a one-device run, which otherwise races with any other training in
    /// the process (a test binary's runs side by side, a library's caller): such a race lost a
    /// DMD2 discriminator's gradient about one full test run in six (2026-12-01).
    pub fn autodiff_turn(&self) -> TurnGuard {
        autodiff_turn()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::autodiff_turn;

    #[test]
    fn a_nested_turn_leaves_the_turn_held_until_the_outer_guard_drops() {
        let outer = autodiff_turn();
        drop(autodiff_turn());
        let (tx, rx) = mpsc::channel();
        let other = std::thread::spawn(move || {
            let _turn = autodiff_turn();
            tx.send(()).expect("the test waits for this");
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "another thread took the turn while this one held it"
        );
        drop(outer);
        rx.recv_timeout(Duration::from_secs(30))
            .expect("the turn given back reaches the waiting thread");
        other.join().expect("the other thread");
    }
}
