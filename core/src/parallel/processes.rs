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

use super::ParallelError;

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
/// Every process decides from the same sums (the counts', their squares' and the
/// processes'), so all get the same answer: `size · Σc² = (Σc)²` only when every count is equal.
pub fn global_workers(
    processes: &dyn Processes,
    local_workers: usize,
) -> Result<usize, ParallelError> {
    let c = local_workers as f32;
    let mut counts = [c, c * c, 1.0];
    sum_over(processes, &mut counts)?;
    let [total, squares, size] = counts.map(|v| v.round() as u64);
    if size as usize != processes.size() || size * squares != total * total {
        return Err(ParallelError::Processes(format!(
            "every process must run the same number of workers (`runtime.devices`): not every \
             process runs {local_workers} as process {} does ({total} in all over {size} processes)",
            processes.rank()
        )));
    }
    Ok(total as usize)
}

/// `text`'s SHA-256 as its 64 hex digits (0 to 15), then their squares. Summed over
/// participants, the values stay small integers (exact in `f32`), and [`agreed`] tells from
/// the sums alone whether every participant's text was the same.
pub fn agreement_values(text: &str) -> Vec<f32> {
    let hex = crate::checkpoint::sha256_hex(text.as_bytes());
    let digits: Vec<f32> = hex
        .chars()
        .map(|c| c.to_digit(16).unwrap_or_else(|| panic!("hex digit: {c:?}")) as f32)
        .collect();
    let squares: Vec<f32> = digits.iter().map(|d| d * d).collect();
    [digits, squares].concat()
}

/// Whether the sums over `n` participants of their [`agreement_values`] come from one text:
/// for each digit `n · Σx² = (Σx)²` exactly when the variance is zero. It reads only the
/// sums, which every participant has bit for bit, so every participant decides alike.
pub fn agreed(sums: &[f32], n: usize) -> bool {
    let (digits, squares) = sums.split_at(sums.len() / 2);
    digits.iter().zip(squares).all(|(s, q)| {
        let (s, q) = (s.round() as u64, q.round() as u64);
        n as u64 * q == s * s
    })
}

/// Whether every process passed the same `text` (each process calls it once, in the same
/// order: it is a collective call).
pub fn same_everywhere(processes: &dyn Processes, text: &str) -> Result<bool, ParallelError> {
    let mut values = agreement_values(text);
    sum_over(processes, &mut values)?;
    Ok(agreed(&values, processes.size()))
}

/// [`Processes::sum`], its failure a collective error (the run cannot go on).
pub fn sum_over(processes: &dyn Processes, values: &mut [f32]) -> Result<(), ParallelError> {
    processes
        .sum(values)
        .map_err(|e| ParallelError::collective(processes.rank(), "sum over processes", e))
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
        assert!(even.iter().all(|r| matches!(r, Ok(6))), "{even:?}");
        let uneven: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = group
                .iter()
                .map(|p| s.spawn(move || global_workers(&**p, 1 + p.rank() / 2)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let err = uneven[0].as_ref().unwrap_err().to_string();
        assert!(
            err.contains("not every process runs 1 as process 0 does (4 in all over 3 processes)"),
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
        assert!(same.iter().all(|r| matches!(r, Ok(true))), "{same:?}");
        // One text differs: every process learns it, the two that agree with each other too.
        let texts = ["a", "a", "b"];
        let one_off = in_every_process(&group, |p| same_everywhere(p, texts[p.rank()]));
        assert!(
            one_off.iter().all(|r| matches!(r, Ok(false))),
            "{one_off:?}"
        );
    }

    #[test]
    fn agreement_is_read_from_the_sums_alone() {
        let (a, b) = (agreement_values("run a"), agreement_values("run b"));
        assert_eq!(a.len(), 128);
        assert!(a
            .iter()
            .all(|v| v.fract() == 0.0 && (0.0..=225.0).contains(v)));
        let sum = |texts: &[&Vec<f32>]| -> Vec<f32> {
            (0..texts[0].len())
                .map(|i| texts.iter().map(|t| t[i]).sum())
                .collect()
        };
        assert!(agreed(&sum(&[&a; 1000]), 1000));
        assert!(!agreed(&sum(&[&a, &a, &b]), 3));
        // The same sums as two equal texts, from two that differ: the squares tell them apart.
        let (x, y) = (vec![4.0, 16.0], vec![2.0, 4.0]);
        let z = vec![6.0, 36.0];
        assert!(agreed(&sum(&[&x, &x]), 2) && !agreed(&sum(&[&y, &z]), 2));
    }
}
