//! [`Processes`]: the processes of a multi-process (multi-node) run, as a launcher such as
//! `mpirun` or `srun` started them.
//!
//! Reel's trainer runs one worker thread per local device and averages gradients between
//! them with `burn-collective`. Across processes it needs one more operation: an element-wise
//! sum of a host buffer over every process, with the same bits everywhere. The `reel` binary
//! implements it on MPI (the `mpi` feature); tests and other front ends may bring their own.
//! Burn 0.21's own multi-node level (`burn-collective`'s orchestrator) is not used: its
//! all-reduce hangs on the second call (docs/scaling.md, "Several machines").

use std::fmt::Debug;
use std::sync::Arc;

/// The processes of a run. Process `rank` of `size` runs the workers with global ranks
/// `rank·L .. (rank+1)·L`, where `L` is the number of devices each process lists.
pub trait Processes: Send + Sync + Debug {
    /// This process's index (0 writes checkpoints, logs and samples).
    fn rank(&self) -> usize;

    /// How many processes the run has.
    fn size(&self) -> usize;

    /// Replace `values` by their element-wise sum over every process. Every process calls it
    /// with the same length, in the same order, and gets bitwise the same result. Blocks until
    /// all processes have called; an error means the run cannot go on.
    fn sum(&self, values: &mut [f32]) -> Result<(), String>;

    /// Stop every process of the run at once (a worker failed here while the others may be
    /// waiting for it in [`Self::sum`]). Called after the failure has been reported.
    fn abort(&self, code: i32) -> !;
}

/// A shared handle on the run's processes.
pub type ProcessHandle = Arc<dyn Processes>;

/// Check that every process runs `local_workers` workers; returns the global worker count.
/// Every process gets the same answer: the counts' sum and the sum of their squares show
/// whether all are equal (`size · Σc² = (Σc)²` only then), not just this process's own.
pub fn global_workers(processes: &dyn Processes, local_workers: usize) -> Result<usize, String> {
    let c = local_workers as f32;
    let mut counts = [c, c * c, 1.0];
    processes.sum(&mut counts)?;
    let (total, squares, size) = (counts[0], counts[1], counts[2]);
    if size as usize != processes.size() || size * squares != total * total {
        return Err(format!(
            "every process must run the same number of workers (`runtime.devices`): process {} runs {local_workers}, the {size} processes run {total} in all",
            processes.rank()
        ));
    }
    Ok(total as usize)
}

/// `text`'s SHA-256 (hex) as numbers, then their squares: summed over processes (or averaged
/// over workers), both halves equal `n` times this one's (or exactly this one's) only when
/// every participant's text is the same, since their variance is then zero.
pub fn agreement_values(text: &str) -> Vec<f32> {
    let hex = crate::checkpoint::sha256_hex(text.as_bytes());
    let bytes = hex.bytes().map(f32::from);
    bytes.clone().chain(bytes.map(|b| b * b)).collect()
}

/// Whether every process passed the same `text` (each process calls it once, in the same
/// order: it is a collective call).
pub fn same_everywhere(processes: &dyn Processes, text: &str) -> Result<bool, String> {
    let own = agreement_values(text);
    let mut values = own.clone();
    processes.sum(&mut values)?;
    let n = processes.size() as f32;
    Ok(values.iter().zip(&own).all(|(sum, v)| *sum == n * v))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::{Barrier, Mutex};

    /// `size` in-process stand-ins for the processes of a run: threads that meet at a barrier
    /// and sum their buffers in process order (as a test double of the MPI group).
    #[derive(Debug)]
    pub struct ThreadProcesses {
        rank: usize,
        shared: Arc<Shared>,
    }

    #[derive(Debug)]
    struct Shared {
        size: usize,
        barrier: Barrier,
        slots: Mutex<Vec<Option<Vec<f32>>>>,
    }

    impl ThreadProcesses {
        /// One handle per simulated process.
        pub fn group(size: usize) -> Vec<Arc<ThreadProcesses>> {
            let shared = Arc::new(Shared {
                size,
                barrier: Barrier::new(size),
                slots: Mutex::new(vec![None; size]),
            });
            (0..size)
                .map(|rank| {
                    Arc::new(ThreadProcesses {
                        rank,
                        shared: shared.clone(),
                    })
                })
                .collect()
        }
    }

    impl Processes for ThreadProcesses {
        fn rank(&self) -> usize {
            self.rank
        }

        fn size(&self) -> usize {
            self.shared.size
        }

        fn sum(&self, values: &mut [f32]) -> Result<(), String> {
            self.shared.slots.lock().unwrap()[self.rank] = Some(values.to_vec());
            self.shared.barrier.wait();
            {
                let slots = self.shared.slots.lock().unwrap();
                values.fill(0.0);
                for slot in slots.iter() {
                    let slot = slot.as_ref().ok_or("a process sent nothing")?;
                    if slot.len() != values.len() {
                        return Err(format!("lengths {} and {}", slot.len(), values.len()));
                    }
                    values.iter_mut().zip(slot).for_each(|(v, s)| *v += s);
                }
            }
            self.shared.barrier.wait();
            Ok(())
        }

        fn abort(&self, code: i32) -> ! {
            panic!("process {} aborted the run with code {code}", self.rank)
        }
    }

    #[test]
    fn global_workers_counts_and_refuses_uneven_processes() {
        let group = ThreadProcesses::group(3);
        let even: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = group
                .iter()
                .map(|p| s.spawn(move || global_workers(&**p, 2)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(even.iter().all(|r| *r == Ok(6)), "{even:?}");
        let uneven: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = group
                .iter()
                .map(|p| s.spawn(move || global_workers(&**p, 1 + p.rank() / 2)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let err = uneven[0].clone().unwrap_err();
        assert!(
            err.contains("process 0 runs 1") && err.contains("run 4 in all"),
            "{err}"
        );
        // 1, 3 and 2 workers: the process of 2 runs the mean count, and is refused as well.
        let mean_count: Vec<_> =
            in_every_process(&group, |p| global_workers(p, [1, 3, 2][p.rank()]));
        assert!(mean_count.iter().all(Result::is_err), "{mean_count:?}");
    }

    /// `f` in every process of `group` at once; their results in rank order.
    fn in_every_process<T: Send>(
        group: &[Arc<ThreadProcesses>],
        f: impl Fn(&ThreadProcesses) -> T + Sync,
    ) -> Vec<T> {
        std::thread::scope(|s| {
            let hs: Vec<_> = group.iter().map(|p| s.spawn(|| f(p))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn same_everywhere_is_false_in_every_process_when_one_differs() {
        let group = ThreadProcesses::group(3);
        let same = in_every_process(&group, |p| same_everywhere(p, "run.toml v1"));
        assert_eq!(same, vec![Ok(true); 3]);
        // One text differs: every process learns it, the two that agree with each other too.
        let texts = ["a", "a", "b"];
        let one_off = in_every_process(&group, |p| same_everywhere(p, texts[p.rank()]));
        assert_eq!(one_off, vec![Ok(false); 3]);
    }
}
