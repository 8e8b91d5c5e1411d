//! [`Collective`]: one worker's handle on Burn's collective operations (`burn-collective`),
//! and the bucketed mean all-reduce the trainer uses for gradients and losses.
//!
//! `burn-collective` keeps one local server per backend type in the process. A data-parallel
//! session registers every worker up front ([`Session::open`]); a failed worker's supervisor
//! resets the server ([`Session::abort`]), which makes every pending and later collective call
//! return an error instead of waiting for the missing peer.
//!
//! In a run of several processes ([`Processes`]), a mean is three steps: the process's workers
//! sum their tensors with `burn-collective`, worker 0 of the process sums that over the
//! processes on the host, and broadcasts the result back to its local workers.

use std::marker::PhantomData;
use std::sync::{Mutex, MutexGuard};

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use burn_collective::{CollectiveConfig, PeerId, ReduceOperation};

use super::{ParallelError, ProcessHandle};

/// Gradients are all-reduced in buckets of at most this many values (64 MiB of f32): one
/// collective call per bucket instead of one per parameter, without a second copy of a whole
/// 1.3B-parameter model at once.
pub const BUCKET_VALUES: usize = 16 << 20;

/// One data-parallel session per process at a time (the collective server is per backend
/// type and process-wide).
static SESSION: Mutex<()> = Mutex::new(());

/// A registered group of `workers` peers on backend `B`; dropping it resets the server.
pub struct Session<B: Backend> {
    workers: usize,
    processes: Option<ProcessHandle>,
    _lock: MutexGuard<'static, ()>,
    _backend: PhantomData<fn() -> B>,
}

impl<B: Backend> Session<B> {
    /// Register one peer per device (all at once, from helper threads, so that no worker can
    /// fail while others wait in registration). With `processes`, these are this process's
    /// workers of a run of several processes, each with as many devices.
    pub fn open(
        devices: &[B::Device],
        processes: Option<ProcessHandle>,
    ) -> Result<Self, ParallelError> {
        let lock = SESSION.lock().unwrap_or_else(|p| p.into_inner());
        burn_collective::reset_collective::<B>();
        let config = CollectiveConfig::default().with_num_devices(devices.len());
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(rank, device)| {
                    let config = config.clone();
                    s.spawn(move || {
                        burn_collective::register::<B>(PeerId::from(rank), device.clone(), config)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join()).collect()
        });
        let session = Self {
            workers: devices.len(),
            processes,
            _lock: lock,
            _backend: PhantomData,
        };
        for (rank, r) in results.into_iter().enumerate() {
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(ParallelError::collective(rank, "register", e)),
                Err(_) => return Err(ParallelError::collective(rank, "register", "panicked")),
            }
        }
        Ok(session)
    }

    /// The global rank of local worker `local` (its process's workers come before the next
    /// process's).
    pub fn global_rank(&self, local: usize) -> usize {
        self.processes.as_ref().map_or(0, |p| p.rank()) * self.workers + local
    }

    /// Workers of the whole run, over every process.
    pub fn world(&self) -> usize {
        self.processes.as_ref().map_or(1, |p| p.size()) * self.workers
    }

    /// Local worker `local`'s handle.
    pub fn peer(&self, local: usize) -> Collective<B> {
        assert!(local < self.workers, "peer {local} of {}", self.workers);
        Collective {
            local,
            local_workers: self.workers,
            rank: self.global_rank(local),
            world: self.world(),
            processes: self.processes.clone(),
            _backend: PhantomData,
        }
    }

    /// Make every pending and later collective call of this session fail (a worker failed).
    pub fn abort(&self) {
        burn_collective::reset_collective::<B>();
    }
}

impl<B: Backend> Drop for Session<B> {
    fn drop(&mut self) {
        burn_collective::reset_collective::<B>();
    }
}

/// One worker's access to the session's collective operations.
#[derive(Debug, Clone)]
pub struct Collective<B: Backend> {
    /// Peer index in this process's session.
    local: usize,
    local_workers: usize,
    /// Global rank (errors name it).
    rank: usize,
    world: usize,
    processes: Option<ProcessHandle>,
    _backend: PhantomData<fn() -> B>,
}

impl<B: Backend> Collective<B> {
    /// The handle of the only worker of a process in a run of several processes (no
    /// `burn-collective` session is needed: the mean goes straight to the processes).
    pub fn sole_worker_of(processes: ProcessHandle) -> Self {
        Self {
            local: 0,
            local_workers: 1,
            rank: processes.rank(),
            world: processes.size(),
            processes: Some(processes),
            _backend: PhantomData,
        }
    }

    /// The element-wise mean of `x [N]` over all workers of the run, in every process (every
    /// worker gets the same values).
    pub fn mean(&self, x: Tensor<B, 1>) -> Result<Tensor<B, 1>, ParallelError> {
        let Some(processes) = &self.processes else {
            return self.local_all_reduce(x, ReduceOperation::Mean);
        };
        let summed = match self.local_workers {
            1 => x,
            _ => self.local_all_reduce(x, ReduceOperation::Sum)?,
        };
        let global = if self.local == 0 {
            let total = self.sum_over_processes(&**processes, summed)?;
            match self.local_workers {
                1 => total,
                _ => self.local_broadcast(Some(total))?,
            }
        } else {
            self.local_broadcast(None)?
        };
        Ok(global.div_scalar(self.world as f64))
    }

    /// `burn-collective`'s all-reduce over this process's workers.
    fn local_all_reduce(
        &self,
        x: Tensor<B, 1>,
        op: ReduceOperation,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        let primitive = x.into_primitive().tensor();
        let out = super::outside_turn(|| {
            burn_collective::all_reduce::<B>(PeerId::from(self.local), primitive, op)
        })
        .map_err(|e| ParallelError::collective(self.rank, "all-reduce", e))?;
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    /// Send `x` from local worker 0 to this process's other workers (which pass `None`).
    fn local_broadcast(&self, x: Option<Tensor<B, 1>>) -> Result<Tensor<B, 1>, ParallelError> {
        let primitive = x.map(|x| x.into_primitive().tensor());
        let out = super::outside_turn(|| {
            burn_collective::broadcast::<B>(PeerId::from(self.local), primitive)
        })
        .map_err(|e| ParallelError::collective(self.rank, "broadcast", e))?;
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    /// The element-wise sum of `x` over the processes, through the host.
    fn sum_over_processes(
        &self,
        processes: &dyn super::Processes,
        x: Tensor<B, 1>,
    ) -> Result<Tensor<B, 1>, ParallelError> {
        let device = x.device();
        let mut values = x
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .unwrap_or_else(|e| panic!("f32 values do not read back: {e:?}"));
        super::outside_turn(|| processes.sum(&mut values))
            .map_err(|e| ParallelError::collective(self.rank, "all-reduce over processes", e))?;
        let n = values.len();
        Ok(Tensor::from_data(TensorData::new(values, [n]), &device))
    }

    /// [`Self::mean`] of each tensor of `xs` (flat), in buckets of at most [`BUCKET_VALUES`]
    /// values: consecutive tensors are concatenated, reduced together and split again. Every
    /// worker must pass the same shapes in the same order.
    pub fn mean_all(&self, xs: Vec<Tensor<B, 1>>) -> Result<Vec<Tensor<B, 1>>, ParallelError> {
        let mut out = Vec::with_capacity(xs.len());
        for bucket in buckets(&xs.iter().map(|x| x.dims()[0]).collect::<Vec<_>>()) {
            if bucket.len() == 1 {
                out.push(self.mean(xs[bucket.start].clone())?);
                continue;
            }
            let parts: Vec<Tensor<B, 1>> = xs[bucket].to_vec();
            let sizes: Vec<usize> = parts.iter().map(|p| p.dims()[0]).collect();
            let reduced = self.mean(Tensor::cat(parts, 0))?;
            let mut at = 0;
            for n in sizes {
                out.push(reduced.clone().slice(at..at + n));
                at += n;
            }
        }
        Ok(out)
    }
}

/// Index ranges of consecutive tensors whose total length stays within [`BUCKET_VALUES`]
/// (a larger tensor is a bucket of its own).
fn buckets(sizes: &[usize]) -> Vec<std::ops::Range<usize>> {
    let mut out = vec![];
    let (mut start, mut total) = (0, 0);
    for (i, &n) in sizes.iter().enumerate() {
        if i > start && total + n > BUCKET_VALUES {
            out.push(start..i);
            (start, total) = (i, 0);
        }
        total += n;
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parallel::processes::tests::ThreadProcesses;
    use crate::parallel::Processes;

    type TestBackend = burn::backend::NdArray;

    #[test]
    fn buckets_are_consecutive_and_bounded() {
        let big = BUCKET_VALUES;
        assert_eq!(buckets(&[1, 2, 3]), vec![0..3]);
        assert_eq!(buckets(&[big, 1, big - 1, 2]), vec![0..1, 1..3, 3..4]);
        assert_eq!(buckets(&[2 * big, 1]), vec![0..1, 1..2]);
        assert!(buckets(&[]).is_empty());
    }

    #[test]
    fn three_peers_average_in_threads_and_agree_bitwise() {
        let device = Default::default();
        let session = Session::<TestBackend>::open(&[device, device, device], None).unwrap();
        let results: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|rank| {
                    let peer = session.peer(rank);
                    s.spawn(move || {
                        let r = rank as f32;
                        let xs = vec![
                            Tensor::<TestBackend, 1>::from_floats([r, 1.0, 2.0 * r], &device),
                            Tensor::from_floats([10.0 + r], &device),
                        ];
                        peer.mean_all(xs)
                            .unwrap()
                            .into_iter()
                            .map(|t| t.into_data().to_vec::<f32>().unwrap())
                            .collect()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(results[0], vec![vec![1.0, 1.0, 2.0], vec![11.0]]);
        assert!(results.iter().all(|r| *r == results[0]));
    }

    #[test]
    fn processes_of_one_worker_average_through_the_host() {
        let device = Default::default();
        let group = ThreadProcesses::group(3);
        let results: Vec<Vec<f32>> = std::thread::scope(|s| {
            let handles: Vec<_> = group
                .iter()
                .map(|p| {
                    let c = Collective::<TestBackend>::sole_worker_of(p.clone());
                    s.spawn(move || {
                        let r = p.rank() as f32;
                        let xs = vec![Tensor::from_floats([r, 3.0], &device)];
                        let out = c.mean_all(xs).unwrap();
                        out[0].clone().into_data().to_vec::<f32>().unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(results, vec![vec![1.0, 3.0]; 3]);
    }

    #[test]
    fn local_workers_of_a_process_sum_then_share_the_processes_mean() {
        // One process of two workers: the local sum goes through the process group and is
        // broadcast back; the mean divides by every worker of the run.
        let device = Default::default();
        let group = ThreadProcesses::group(1);
        let session =
            Session::<TestBackend>::open(&[device, device], Some(group[0].clone())).unwrap();
        assert_eq!((session.world(), session.global_rank(1)), (2, 1));
        let results: Vec<Vec<f32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|local| {
                    let peer = session.peer(local);
                    s.spawn(move || {
                        let x = Tensor::<TestBackend, 1>::from_floats(
                            [local as f32 * 4.0, 1.0],
                            &device,
                        );
                        let out = peer.mean(x).unwrap();
                        out.into_data().to_vec::<f32>().unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(results, vec![vec![2.0, 1.0]; 2]);
    }

    #[test]
    fn abort_releases_a_peer_waiting_for_a_missing_one() {
        let device = Default::default();
        let session = Session::<TestBackend>::open(&[device, device], None).unwrap();
        let peer = session.peer(0);
        std::thread::scope(|s| {
            let waiting =
                s.spawn(move || peer.mean(Tensor::<TestBackend, 1>::from_floats([1.0], &device)));
            std::thread::sleep(std::time::Duration::from_millis(100));
            session.abort();
            let err = waiting.join().unwrap().unwrap_err().to_string();
            assert!(
                err.contains("worker 0") && err.contains("all-reduce"),
                "{err}"
            );
        });
        // Later calls fail at once instead of waiting.
        let late = session.peer(1).mean(Tensor::from_floats([1.0], &device));
        assert!(late.is_err());
    }
}
