//! The batch loader: seeded per-epoch shuffling, batching across epoch boundaries, and a
//! cursor that makes the data order resumable.
//!
//! The cursor counts samples consumed since the start of the run. Position `p` maps to sample
//! `perm(epoch = p / len)[p % len]`, where each epoch's permutation depends only on the run
//! seed and the epoch index, so restoring the cursor restores the exact data order.
//!
//! With data parallelism every worker owns a loader over the same order and reads only its
//! shard of each global batch ([`Loader::sharded`]): worker `r` of `W` takes positions
//! `r·B/W .. (r+1)·B/W` of the batch, and the cursor still counts global samples, so a
//! checkpoint resumes on any number of workers.
//!
//! While the trainer computes a step, a background thread already reads and decodes the next
//! batch (the order is known in advance), so a slow source (parquet at 29k tokens per
//! sample) overlaps with compute. The batch returned is the same with or without it.

use std::sync::Arc;
use std::thread::JoinHandle;

use burn::tensor::{backend::Backend, Bool, Tensor, TensorData};

use super::{DataError, DataSource, DataSpec, Sample, TextCondition};
use crate::method::Batch;
use crate::rng::StreamRng;

/// Samples of one batch, on the host.
#[derive(Debug, Clone)]
pub struct HostBatch {
    /// Source indices of the samples.
    pub indices: Vec<usize>,
    /// Their positions in the run's data stream ([`crate::method::Batch::keys`]).
    pub keys: Vec<u64>,
    /// The samples.
    pub samples: Vec<Sample>,
}

/// Seeded, resumable batch loader over a [`DataSource`].
#[derive(Debug)]
pub struct Loader {
    source: Arc<dyn DataSource>,
    batch_size: usize,
    shuffle: bool,
    seed: u64,
    cursor: u64,
    perm_epoch: Option<u64>,
    perm: Vec<usize>,
    /// This worker's shard `(rank, workers)` of each global batch.
    shard: (usize, usize),
    /// The batches at a cursor, being read on a background thread.
    prefetch: Option<(u64, Prefetch)>,
}

/// Batches read on a background thread: their indices, in order, and the thread's samples.
type Prefetch = (Vec<usize>, JoinHandle<Result<Vec<Sample>, DataError>>);

impl Loader {
    /// A loader starting at cursor 0. Fails on an empty source.
    pub fn new(
        source: Arc<dyn DataSource>,
        batch_size: usize,
        shuffle: bool,
        seed: u64,
    ) -> Result<Self, DataError> {
        if source.is_empty() {
            return Err(DataError::Empty {
                source_name: format!("{source:?}").chars().take(120).collect(),
                reason: "no samples found".into(),
            });
        }
        Ok(Self {
            source,
            batch_size,
            shuffle,
            seed,
            cursor: 0,
            perm_epoch: None,
            perm: Vec::new(),
            shard: (0, 1),
            prefetch: None,
        })
    }

    /// Read only worker `rank`'s shard of each global batch of `batch_size` samples (which
    /// must split evenly over `workers`; the run config checks it).
    pub fn sharded(mut self, rank: usize, workers: usize) -> Self {
        assert!(
            rank < workers && self.batch_size.is_multiple_of(workers),
            "shard {rank} of {workers} over a global batch of {}",
            self.batch_size
        );
        self.shard = (rank, workers);
        self
    }

    /// Samples consumed so far.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Jump to a saved cursor (resume).
    pub fn set_cursor(&mut self, cursor: u64) {
        self.cursor = cursor;
    }

    /// The underlying source.
    pub fn source(&self) -> &Arc<dyn DataSource> {
        &self.source
    }

    fn index_at(&mut self, pos: u64) -> usize {
        let len = self.source.len() as u64;
        let epoch = pos / len;
        let offset = (pos % len) as usize;
        if !self.shuffle {
            return offset;
        }
        if self.perm_epoch != Some(epoch) {
            let mut rng = StreamRng::from_seed(
                self.seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xDA7A,
            );
            let mut perm: Vec<usize> = (0..len as usize).collect();
            for i in (1..perm.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                perm.swap(i, j);
            }
            self.perm = perm;
            self.perm_epoch = Some(epoch);
        }
        self.perm[offset]
    }

    /// The next `batch_size` samples (wrapping into the next epoch when needed); then starts
    /// reading the batch after it in the background.
    pub fn next_batch(&mut self) -> Result<HostBatch, DataError> {
        let mut one = self.next_batches(1)?;
        Ok(one.remove(0))
    }

    /// The next `n` batches (a step's micro-batches), read together; then starts reading the
    /// `n` after them in the background, so that a step's reads overlap the step before.
    /// A bad record's error comes with the batches that hold it (the cursor stays before
    /// them).
    pub fn next_batches(&mut self, n: usize) -> Result<Vec<HostBatch>, DataError> {
        let step = self.batch_size as u64;
        let starts: Vec<u64> = (0..n as u64).map(|k| self.cursor + k * step).collect();
        let indices: Vec<Vec<usize>> = starts.iter().map(|&c| self.indices_from(c)).collect();
        for batch in &indices {
            if crate::fault::fires("bad-record") {
                return Err(DataError::Record {
                    file: "REEL_FAULT".into(),
                    record: batch.first().copied().unwrap_or(0),
                    reason: "bad-record".into(),
                });
            }
        }
        let flat = indices.concat();
        let samples = match self.prefetch.take() {
            Some((at, (idx, job))) if at == self.cursor && idx == flat => job
                .join()
                // A panicking source: read again here, where the panic surfaces as before.
                .unwrap_or_else(|_| read_samples(&*self.source, &flat))?,
            _ => read_samples(&*self.source, &flat)?,
        };
        self.cursor += n as u64 * step;
        self.prefetch_next(n);
        let mut samples = samples.into_iter();
        let batches = indices
            .into_iter()
            .zip(&starts)
            .map(|(indices, &start)| HostBatch {
                samples: samples.by_ref().take(indices.len()).collect(),
                keys: self.keys_from(start),
                indices,
            });
        Ok(batches.collect())
    }

    /// Start reading the `n` batches at the cursor on a background thread. Without a thread
    /// (resource limits) they are simply read when asked for.
    fn prefetch_next(&mut self, n: usize) {
        let step = self.batch_size as u64;
        let next: Vec<usize> = (0..n as u64)
            .flat_map(|k| self.indices_from(self.cursor + k * step))
            .collect();
        let source = self.source.clone();
        let job = std::thread::Builder::new().name("reel-data".into()).spawn({
            let next = next.clone();
            move || read_samples(&*source, &next)
        });
        self.prefetch = job.ok().map(|job| (self.cursor, (next, job)));
    }

    /// The source indices of this worker's shard of the batch starting at `cursor`.
    fn indices_from(&mut self, cursor: u64) -> Vec<usize> {
        self.keys_from(cursor)
            .into_iter()
            .map(|at| self.index_at(at))
            .collect()
    }

    /// The stream positions of this worker's shard of the batch starting at `cursor`.
    fn keys_from(&self, cursor: u64) -> Vec<u64> {
        let (rank, workers) = self.shard;
        let per = (self.batch_size / workers) as u64;
        (0..per).map(|i| cursor + rank as u64 * per + i).collect()
    }
}

/// Read and check the samples at `indices`.
fn read_samples(source: &dyn DataSource, indices: &[usize]) -> Result<Vec<Sample>, DataError> {
    let spec = source.spec();
    indices
        .iter()
        .map(|&idx| {
            let sample = source.get(idx)?;
            check_sample(&sample, &spec, idx)?;
            Ok(sample)
        })
        .collect()
}

fn check_sample(s: &Sample, spec: &DataSpec, idx: usize) -> Result<(), DataError> {
    let bad = |reason: String| DataError::Record {
        file: "<source>".into(),
        record: idx,
        reason,
    };
    if s.latents.len() != spec.latent_numel() {
        return Err(bad(format!(
            "latents have {} values, expected {} ({}x{}x{}x{})",
            s.latents.len(),
            spec.latent_numel(),
            spec.channels,
            spec.frames,
            spec.height,
            spec.width
        )));
    }
    if s.text.embedding.len() != spec.text_numel() || s.text.mask.len() != spec.text_len {
        return Err(bad(format!(
            "text embedding has {} values / mask {}, expected {}x{}",
            s.text.embedding.len(),
            s.text.mask.len(),
            spec.text_len,
            spec.text_dim
        )));
    }
    if s.latents.iter().any(|v| !v.is_finite()) || s.text.embedding.iter().any(|v| !v.is_finite()) {
        return Err(bad("non-finite values".into()));
    }
    Ok(())
}

/// Stack text conditions into `[N, L, D]` and a mask `[N, L]`.
pub fn text_tensors<B: Backend>(
    texts: &[&TextCondition],
    spec: &DataSpec,
    device: &B::Device,
) -> (Tensor<B, 3>, Tensor<B, 2, Bool>) {
    let n = texts.len();
    let mut emb = Vec::with_capacity(n * spec.text_numel());
    let mut mask = Vec::with_capacity(n * spec.text_len);
    for t in texts {
        emb.extend_from_slice(&t.embedding);
        mask.extend_from_slice(&t.mask);
    }
    (
        Tensor::from_data(
            TensorData::new(emb, [n, spec.text_len, spec.text_dim]),
            device,
        ),
        Tensor::from_data(TensorData::new(mask, [n, spec.text_len]), device),
    )
}

/// The unconditional text condition: the source's negative prompt, else zeros.
pub fn negative_or_zeros(source: &dyn DataSource) -> TextCondition {
    let spec = source.spec();
    source.negative_text().unwrap_or_else(|| TextCondition {
        embedding: vec![0.0; spec.text_numel()],
        mask: vec![false; spec.text_len],
    })
}

/// Move a host batch to the device.
pub fn to_device<B: Backend>(
    host: &HostBatch,
    spec: &DataSpec,
    negative: &TextCondition,
    device: &B::Device,
) -> Batch<B> {
    let n = host.samples.len();
    let mut lat = Vec::with_capacity(n * spec.latent_numel());
    for s in &host.samples {
        lat.extend_from_slice(&s.latents);
    }
    let texts: Vec<&TextCondition> = host.samples.iter().map(|s| &s.text).collect();
    let (text, text_mask) = text_tensors::<B>(&texts, spec, device);
    let (negative_text, _) = text_tensors::<B>(&[negative], spec, device);
    Batch {
        latents: Tensor::from_data(
            TensorData::new(
                lat,
                [n, spec.channels, spec.frames, spec.height, spec.width],
            ),
            device,
        ),
        text,
        text_mask,
        negative_text,
        keys: host.keys.clone(),
        captions: host.samples.iter().map(|s| s.caption.clone()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Counting(usize);
    impl DataSource for Counting {
        fn spec(&self) -> DataSpec {
            DataSpec {
                channels: 1,
                frames: 1,
                height: 1,
                width: 1,
                text_len: 1,
                text_dim: 1,
            }
        }
        fn len(&self) -> usize {
            self.0
        }
        fn get(&self, index: usize) -> Result<Sample, DataError> {
            Ok(Sample {
                latents: vec![index as f32],
                text: TextCondition {
                    embedding: vec![0.0],
                    mask: vec![true],
                },
                caption: String::new(),
            })
        }
    }

    #[test]
    fn every_epoch_is_a_permutation_and_resume_is_exact() {
        let src: Arc<dyn DataSource> = Arc::new(Counting(10));
        let mut a = Loader::new(src.clone(), 3, true, 42).unwrap();
        let mut seen = vec![];
        for _ in 0..10 {
            seen.extend(a.next_batch().unwrap().indices);
        }
        for epoch in seen.chunks(10).take(3) {
            let mut e = epoch.to_vec();
            e.sort();
            assert_eq!(e, (0..10).collect::<Vec<_>>());
        }
        assert_ne!(&seen[0..10], &seen[10..20], "epochs are reshuffled");
        // Resume from cursor 9 (mid-epoch) reproduces the rest.
        let mut b = Loader::new(src, 3, true, 42).unwrap();
        b.set_cursor(9);
        let mut rest = vec![];
        for _ in 3..10 {
            rest.extend(b.next_batch().unwrap().indices);
        }
        assert_eq!(rest, seen[9..]);
    }

    #[test]
    fn shards_partition_every_global_batch_and_resume_on_another_count() {
        let src: Arc<dyn DataSource> = Arc::new(Counting(7));
        let mut whole = Loader::new(src.clone(), 6, true, 3).unwrap();
        let mut shards: Vec<Loader> = (0..3)
            .map(|r| Loader::new(src.clone(), 6, true, 3).unwrap().sharded(r, 3))
            .collect();
        for _ in 0..4 {
            let expected = whole.next_batch().unwrap();
            let (got, keys): (Vec<usize>, Vec<u64>) = shards
                .iter_mut()
                .flat_map(|l| {
                    let b = l.next_batch().unwrap();
                    b.indices.into_iter().zip(b.keys)
                })
                .unzip();
            assert_eq!((got, keys), (expected.indices, expected.keys));
            assert!(shards.iter().all(|l| l.cursor() == whole.cursor()));
        }
        // A 3-worker cursor resumes on 2 workers with the same global order.
        let cursor = shards[0].cursor();
        let expected = whole.next_batch().unwrap().indices;
        let got: Vec<usize> = (0..2)
            .flat_map(|r| {
                let mut l = Loader::new(src.clone(), 6, true, 3).unwrap().sharded(r, 2);
                l.set_cursor(cursor);
                l.next_batch().unwrap().indices
            })
            .collect();
        assert_eq!(got, expected);
    }

    /// Records which indices were read; index 7 is a bad record.
    #[derive(Debug, Default)]
    struct Watched {
        read: std::sync::Mutex<Vec<usize>>,
    }
    impl DataSource for Watched {
        fn spec(&self) -> DataSpec {
            Counting(0).spec()
        }
        fn len(&self) -> usize {
            8
        }
        fn get(&self, index: usize) -> Result<Sample, DataError> {
            self.read.lock().unwrap().push(index);
            if index == 7 {
                return Err(DataError::Record {
                    file: "bad.parquet".into(),
                    record: 7,
                    reason: "truncated".into(),
                });
            }
            Counting(8).get(index)
        }
    }

    #[test]
    fn the_next_batch_is_read_in_the_background_and_errors_arrive_with_it() {
        let src = Arc::new(Watched::default());
        let mut a = Loader::new(src.clone(), 2, false, 0).unwrap();
        assert_eq!(a.next_batch().unwrap().indices, [0, 1]);
        // Batch [2, 3] is read without being asked for.
        let t0 = std::time::Instant::now();
        while src.read.lock().unwrap().len() < 4 {
            assert!(t0.elapsed().as_secs() < 30, "no background read");
            std::thread::yield_now();
        }
        assert_eq!(*src.read.lock().unwrap(), [0, 1, 2, 3]);
        let b = a.next_batch().unwrap();
        assert_eq!(
            (b.indices, b.samples[1].latents.clone()),
            (vec![2, 3], vec![3.0])
        );
        // Not read again (the next batch, [4, 5], may already be on its way).
        let read = src.read.lock().unwrap().clone();
        let again = read.iter().filter(|&&i| i == 2 || i == 3).count();
        assert_eq!(again, 2, "the prefetched batch is used: {read:?}");
        assert_eq!(a.next_batch().unwrap().indices, [4, 5]);
        // The bad record's error comes with the batch that holds it, naming file and record.
        let err = a.next_batch().unwrap_err().to_string();
        assert!(
            err.contains("bad.parquet") && err.contains("record 7"),
            "{err}"
        );
        // A jump (resume) reads the batch at the new cursor, not the prefetched one.
        a.set_cursor(1);
        assert_eq!(a.next_batch().unwrap().indices, [1, 2]);
        assert_eq!(a.cursor(), 3);
    }

    #[test]
    fn a_steps_batches_are_read_together_and_the_next_steps_ahead() {
        let counting: Arc<dyn DataSource> = Arc::new(Counting(8));
        let mut one = Loader::new(counting.clone(), 2, true, 9).unwrap();
        let mut many = Loader::new(counting, 2, true, 9).unwrap();
        let batch = |b: HostBatch| (b.indices, b.keys, b.samples);
        let singles: Vec<_> = (0..3).map(|_| batch(one.next_batch().unwrap())).collect();
        let together: Vec<_> = many
            .next_batches(3)
            .unwrap()
            .into_iter()
            .map(batch)
            .collect();
        assert_eq!(singles, together);
        assert_eq!(one.cursor(), many.cursor());
        // Two batches, then the next two read in the background, record 7 failing among
        // them: the error comes with them and the cursor stays before them.
        let src = Arc::new(Watched::default());
        let mut a = Loader::new(src.clone(), 2, false, 0).unwrap();
        a.next_batches(2).unwrap();
        let t0 = std::time::Instant::now();
        while src.read.lock().unwrap().len() < 8 {
            assert!(t0.elapsed().as_secs() < 30, "no background read");
            std::thread::yield_now();
        }
        let err = a.next_batches(2).unwrap_err().to_string();
        assert!(err.contains("record 7"), "{err}");
        assert_eq!(a.cursor(), 4);
    }

    #[test]
    fn draw_keys_are_stream_positions_unique_where_samples_repeat() {
        // A batch of 4 over 2 samples holds each twice; their draw keys still differ (keyed by
        // the source index, the copies got the same noise and σ).
        let src: Arc<dyn DataSource> = Arc::new(Counting(2));
        let mut a = Loader::new(src, 4, true, 5).unwrap();
        let b = a.next_batch().unwrap();
        let mut once = b.indices.clone();
        once.sort();
        assert_eq!(once, [0, 0, 1, 1]);
        assert_eq!(b.keys, [0, 1, 2, 3]);
        assert_eq!(a.next_batch().unwrap().keys, [4, 5, 6, 7]);
        a.set_cursor(2);
        assert_eq!(a.next_batch().unwrap().keys, [2, 3, 4, 5]);
    }

    #[test]
    fn empty_source_is_an_error() {
        let src: Arc<dyn DataSource> = Arc::new(Counting(0));
        let err = Loader::new(src, 1, true, 0).unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
    }
}
