//! [`Collective`]: one worker's handle on Burn's collective operations (`burn-collective`),
//! and the bucketed mean all-reduce the trainer uses for gradients and losses.
//!
//! `burn-collective` keeps one local server per backend type in the process. A data-parallel
//! session registers every worker up front ([`Session::open`]); a failed worker's supervisor
//! resets the server ([`Session::abort`]), which makes every pending and later collective call
//! return an error instead of waiting for the missing peer.

use std::marker::PhantomData;
use std::sync::{Mutex, MutexGuard};

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_collective::{CollectiveConfig, PeerId, ReduceOperation};

use super::ParallelError;

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
    _lock: MutexGuard<'static, ()>,
    _backend: PhantomData<fn() -> B>,
}

impl<B: Backend> Session<B> {
    /// Register one peer per device (all at once, from helper threads, so that no worker can
    /// fail while others wait in registration).
    pub fn open(devices: &[B::Device]) -> Result<Self, ParallelError> {
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

    /// Worker `rank`'s handle.
    pub fn peer(&self, rank: usize) -> Collective<B> {
        assert!(rank < self.workers, "peer {rank} of {}", self.workers);
        Collective {
            rank,
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

/// Worker `rank`'s access to the session's collective operations.
#[derive(Debug, Clone)]
pub struct Collective<B: Backend> {
    rank: usize,
    _backend: PhantomData<fn() -> B>,
}

impl<B: Backend> Collective<B> {
    /// The element-wise mean of `x [N]` over all workers (every worker gets the same values).
    pub fn mean(&self, x: Tensor<B, 1>) -> Result<Tensor<B, 1>, ParallelError> {
        let primitive = x.into_primitive().tensor();
        let out = super::outside_turn(|| {
            burn_collective::all_reduce::<B>(
                PeerId::from(self.rank),
                primitive,
                ReduceOperation::Mean,
            )
        })
        .map_err(|e| ParallelError::collective(self.rank, "all-reduce", e))?;
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
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
        let session = Session::<TestBackend>::open(&[device, device, device]).unwrap();
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
    fn abort_releases_a_peer_waiting_for_a_missing_one() {
        let device = Default::default();
        let session = Session::<TestBackend>::open(&[device, device]).unwrap();
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
