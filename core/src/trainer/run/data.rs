//! A step's data: every micro-batch read from the host before any forward and, in a group,
//! the workers' agreement that each read its own. A worker whose record fails must not skip
//! the step's forwards alone: a method may call a collective inside them (DMD2's
//! `mean_over_workers`), where the others would wait for it.

use burn::tensor::{Tensor, TensorData};

use super::super::TrainError;
use super::Trainer;
use crate::backend::ReelBackend;
use crate::console::say;
use crate::data::{DataError, HostBatch};

impl<B: ReelBackend> Trainer<'_, B> {
    /// The host batches of every micro-batch of the step. A bad record is
    /// [`TrainError::Data`] in a run of one worker; in a group, every worker learns here of
    /// any worker's bad record (one small all-reduce of a flag per worker) and all stop with
    /// [`TrainError::DataFailed`] before any forward.
    pub(super) fn read_step(&mut self) -> Result<Vec<HostBatch>, TrainError> {
        let accum = self.loaded.config.training.grad_accumulation;
        let read = self.loader.next_batches(accum);
        let Some(collective) = self.seat.collective() else {
            return Ok(read?);
        };
        let (rank, workers) = (self.seat.rank, self.seat.workers);
        let flags: Vec<f32> = (0..workers)
            .map(|r| (r == rank && read.is_err()) as u8 as f32)
            .collect();
        let local = Tensor::from_data(TensorData::new(flags, [workers]), &self.device);
        let agreed = collective.mean(local)?.into_data().to_vec::<f32>();
        let agreed = agreed.unwrap_or_else(|e| panic!("f32 flags do not read back: {e:?}"));
        let failed: Vec<usize> = (0..workers).filter(|&r| agreed[r] > 0.0).collect();
        match read {
            Ok(hosts) if failed.is_empty() => Ok(hosts),
            read => Err(data_failed(rank, self.seat.device, failed, read.err())),
        }
    }
}

/// The error every worker stops with when the data of the `failed` workers failed this step
/// (this worker among them when `own`, its error, is set: its flag was part of the
/// all-reduce); each of them prints its error, unless it is worker 0, whose error the run
/// reports.
fn data_failed(
    rank: usize,
    device: usize,
    failed: Vec<usize>,
    own: Option<DataError>,
) -> TrainError {
    let cause = own.map(|e| Box::new(TrainError::Data(e)));
    if let Some(e) = cause.as_ref().filter(|_| rank != 0) {
        say(&format!("reel: worker {rank} (device {device}): {e}"));
    }
    TrainError::DataFailed {
        workers: failed,
        cause,
    }
}
