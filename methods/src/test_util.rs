//! Helpers shared by the methods' unit tests: the CPU test backends, a `wan-tiny`-shaped
//! micro-batch, a step context and a recording sampling-progress watcher.

use burn::tensor::{Bool, Tensor, TensorData};

use reel_core::data::DataSpec;
use reel_core::method::{Batch, SampleProgress, StepContext};
use reel_core::rng::{RunRng, StreamRng};

/// The autodiff backend the unit tests train on.
pub type Ad = burn::backend::Autodiff<burn::backend::NdArray>;

/// The clip shape of [`tiny_batch`] with `side = 8`, `text_len = 8` (for sampling requests).
pub const TINY_SPEC: DataSpec = DataSpec {
    channels: 4,
    frames: 2,
    height: 8,
    width: 8,
    text_len: 8,
    text_dim: 32,
};

/// Two `wan-tiny`-shaped samples (4 channels, 2 frames, `side × side`, `text_len` tokens of
/// width 32, all valid, zero negative text) drawn from `seed`, with draw `keys`.
pub fn tiny_batch(side: usize, text_len: usize, seed: u64, keys: [u64; 2]) -> Batch<Ad> {
    let dev = Default::default();
    let mut r = StreamRng::from_seed(seed);
    Batch {
        latents: r.normal_tensor([2, 4, 2, side, side], &dev),
        text: r.normal_tensor([2, text_len, 32], &dev),
        text_mask: Tensor::<Ad, 2, Bool>::from_bool(
            TensorData::new(vec![true; 2 * text_len], [2, text_len]),
            &dev,
        ),
        negative_text: Tensor::zeros([1, text_len, 32], &dev),
        keys: keys.to_vec(),
        captions: vec![String::new(); 2],
    }
}

/// The context of micro-batch 0 of 1 at global `step` of a 10-step run seeded `seed`.
pub fn step_ctx(step: u64, seed: u64) -> StepContext {
    StepContext {
        step,
        micro: 0,
        num_micro: 1,
        max_steps: 10,
        rng: RunRng::new(seed),
    }
}

/// The `(done, total)` calls a [`recorder`] saw, in order.
pub type Calls = std::sync::Arc<std::sync::Mutex<Vec<(usize, usize)>>>;

/// A [`SampleProgress`] that records its calls, and the list it writes them to.
pub fn recorder() -> (SampleProgress, Calls) {
    let calls = Calls::default();
    let sink = calls.clone();
    let progress = SampleProgress::new(move |done, total| sink.lock().unwrap().push((done, total)));
    (progress, calls)
}
