//! Pieces shared by the methods: per-sample random draws, text-condition selection, and the
//! Euler / few-step samplers used for validation and `reel sample`. Models are reached
//! through the seam ([`DiffusionModel`]), never by class.

use std::ops::Range;

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use reel_core::data::{text_tensors, DataSpec, TextCondition};
use reel_core::flow::{
    cfg_combine, euler_sample, sampling_sigmas, shift_sigma, TimestepDensity, TIMESTEP_SCALE,
};
use reel_core::method::{SampleRequest, StepContext};
use reel_core::model::DiffusionModel;
use reel_core::rng::StreamRng;

/// Per-sample standard-normal noise `[B, C, F, H, W]`, keyed by (step, stream position, stream),
/// so the draws of a sample do not depend on how samples are grouped into micro-batches.
pub fn per_sample_noise<B: Backend>(
    ctx: &StepContext,
    keys: &[u64],
    dims: [usize; 5],
    stream: &str,
    device: &B::Device,
) -> Tensor<B, 5> {
    let per = dims[1] * dims[2] * dims[3] * dims[4];
    let mut v = Vec::with_capacity(per * keys.len());
    for &k in keys {
        v.extend(ctx.rng.stream(ctx.step, k, stream).normal_vec(per));
    }
    Tensor::from_data(TensorData::new(v, dims), device)
}

/// One uniform draw in `[0, 1)` per sample, keyed like [`per_sample_noise`].
pub fn per_sample_uniform(ctx: &StepContext, keys: &[u64], stream: &str) -> Vec<f64> {
    keys.iter()
        .map(|&k| ctx.rng.stream(ctx.step, k, stream).uniform())
        .collect()
}

/// One shifted training σ per sample from `density`, keyed like [`per_sample_noise`].
pub fn per_sample_sigmas(
    ctx: &StepContext,
    keys: &[u64],
    density: &TimestepDensity,
    shift: f64,
    stream: &str,
) -> Vec<f32> {
    keys.iter()
        .map(|&k| {
            let mut r = ctx.rng.stream(ctx.step, k, stream);
            shift_sigma(density.sample(&mut r), shift) as f32
        })
        .collect()
}

/// Replace the text of samples where `drop[b]` with the negative embedding `[1, L, D]`.
pub fn drop_text<B: Backend>(
    text: Tensor<B, 3>,
    negative: Tensor<B, 3>,
    drop: &[bool],
) -> Tensor<B, 3> {
    if !drop.iter().any(|&d| d) {
        return text;
    }
    let [b, l, d] = text.dims();
    let keep: Vec<f32> = drop.iter().map(|&x| if x { 0.0 } else { 1.0 }).collect();
    let keep =
        Tensor::<B, 1>::from_data(TensorData::new(keep, [b]), &text.device()).reshape([b, 1, 1]);
    let neg = negative.expand([b, l, d]);
    text.mul(keep.clone())
        .add(neg.mul(keep.neg().add_scalar(1.0)))
}

/// Initial noise for a sampling request: prompt `i` draws from a stream of
/// `(seed, first_index + i)`.
pub fn request_noise<B: Backend>(req: &SampleRequest, device: &B::Device) -> Tensor<B, 5> {
    request_noise_of(req, 0..req.prompts.len(), device)
}

/// [`request_noise`] of the prompts `range` only (each keyed by its index in the request).
fn request_noise_of<B: Backend>(
    req: &SampleRequest,
    range: Range<usize>,
    device: &B::Device,
) -> Tensor<B, 5> {
    prompts_noise(req, range, device, |i| {
        req.seed ^ ((req.first_index + i) as u64).wrapping_mul(0x9E37_79B9)
    })
}

/// Standard-normal latents `[range.len(), C, F, H, W]`, prompt `i` from the stream `key(i)`.
fn prompts_noise<B: Backend>(
    req: &SampleRequest,
    range: Range<usize>,
    device: &B::Device,
    key: impl Fn(usize) -> u64,
) -> Tensor<B, 5> {
    let s = &req.spec;
    let per = s.latent_numel();
    let n = range.len();
    let mut v = Vec::with_capacity(per * n);
    for i in range {
        v.extend(StreamRng::from_seed(key(i)).normal_vec(per));
    }
    Tensor::from_data(
        TensorData::new(v, [n, s.channels, s.frames, s.height, s.width]),
        device,
    )
}

/// Conditional `[N, L, D]` and unconditional `[N, L, D]` text tensors of a request.
pub fn request_text<B: Backend>(
    req: &SampleRequest,
    device: &B::Device,
) -> (Tensor<B, 3>, Tensor<B, 3>) {
    request_text_of(req, 0..req.prompts.len(), device)
}

/// [`request_text`] of the prompts `range` only.
fn request_text_of<B: Backend>(
    req: &SampleRequest,
    range: Range<usize>,
    device: &B::Device,
) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let spec = &req.spec;
    let zeros = TextCondition {
        embedding: vec![0.0; spec.text_numel()],
        mask: vec![false; spec.text_len],
    };
    let neg = req.negative.as_ref().unwrap_or(&zeros);
    let prompts = &req.prompts[range];
    let conds: Vec<&TextCondition> = prompts.iter().map(|p| &p.text).collect();
    let negs: Vec<&TextCondition> = prompts.iter().map(|_| neg).collect();
    (
        text_tensors::<B>(&conds, spec, device).0,
        text_tensors::<B>(&negs, spec, device).0,
    )
}

/// Most latent values (of all its clips) one sampling forward takes: the prompts of a
/// request are sampled in groups within it, at least one prompt a group, each drawing the
/// noise of its index in the request (so the grouping does not change the clips beyond the
/// float rounding of batched products). A Wan2.1 clip of 81×480×832 (2.1 M values) goes
/// alone, so the forward's transient activations are one clip's (and its guidance twin's),
/// beside a training run's state in GPU memory; the quickstart's clips (2304 values) all go
/// together.
pub const SAMPLE_CHUNK_VALUES: usize = 1 << 20;

/// The groups of prompt indices of `req` that [`SAMPLE_CHUNK_VALUES`] allows, in order.
pub fn sample_chunks(req: &SampleRequest) -> Vec<Range<usize>> {
    chunks_within(req, SAMPLE_CHUNK_VALUES)
}

/// The groups of prompt indices of `req` of at most `values` latent values (at least one
/// prompt each), in order.
fn chunks_within(req: &SampleRequest, values: usize) -> Vec<Range<usize>> {
    let n = req.prompts.len();
    let size = (values / req.spec.latent_numel().max(1)).max(1);
    (0..n).step_by(size).map(|s| s..(s + size).min(n)).collect()
}

/// Tell the request's watcher (if any) that sampling step `done` of `total` is issued.
fn report<B: Backend>(req: &SampleRequest, device: &B::Device, done: usize, total: usize) {
    if let Some(progress) = &req.progress {
        progress.step::<B>(device, done, total);
    }
}

/// Model velocity at σ with classifier-free guidance (`guidance == 1` skips the
/// unconditional pass). `x` `[N, C, F, H, W]`.
pub fn guided_velocity<B: Backend>(
    model: &dyn DiffusionModel<B>,
    x: Tensor<B, 5>,
    sigma: f64,
    cond: &Tensor<B, 3>,
    uncond: &Tensor<B, 3>,
    guidance: f64,
) -> Tensor<B, 5> {
    let n = x.dims()[0];
    let device = x.device();
    if guidance == 1.0 {
        let t = Tensor::<B, 1>::full([n], sigma * TIMESTEP_SCALE, &device);
        return model.forward(x, t, cond.clone());
    }
    let t = Tensor::<B, 1>::full([2 * n], sigma * TIMESTEP_SCALE, &device);
    let both = model.forward(
        Tensor::cat(vec![x.clone(), x], 0),
        t,
        Tensor::cat(vec![cond.clone(), uncond.clone()], 0),
    );
    let c = both.clone().narrow(0, 0, n);
    let u = both.narrow(0, n, n);
    cfg_combine(c, u, guidance)
}

/// Euler flow-matching sampling of a request with `steps` steps and `shift`.
pub fn sample_euler<B: Backend>(
    model: &dyn DiffusionModel<B>,
    req: &SampleRequest,
    steps: usize,
    guidance: f64,
    shift: f64,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    sample_euler_sigmas(model, req, &sampling_sigmas(steps, shift), guidance, device)
}

/// Euler flow-matching sampling of a request over an explicit σ schedule (starting at
/// `sigmas[0]` from the request's noise; see [`euler_sample`]), in the groups of
/// [`sample_chunks`].
pub fn sample_euler_sigmas<B: Backend>(
    model: &dyn DiffusionModel<B>,
    req: &SampleRequest,
    sigmas: &[f64],
    guidance: f64,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    euler_in_chunks(model, req, sigmas, guidance, device, sample_chunks(req))
}

/// [`sample_euler_sigmas`] over the prompt groups `chunks`.
fn euler_in_chunks<B: Backend>(
    model: &dyn DiffusionModel<B>,
    req: &SampleRequest,
    sigmas: &[f64],
    guidance: f64,
    device: &B::Device,
    chunks: Vec<Range<usize>>,
) -> Vec<Vec<f32>> {
    let steps = sigmas.len().saturating_sub(1);
    let total = steps * chunks.len();
    in_groups(req, device, chunks, steps, |g| {
        let mut done = g.steps_before;
        euler_sample(g.noise, sigmas, |x, s| {
            let v = guided_velocity(model, x, s, &g.cond, &g.uncond, guidance);
            done += 1;
            report::<B>(req, device, done, total);
            v
        })
    })
}

/// One prompt group of a sampling request ([`sample_chunks`]).
struct Group<B: Backend> {
    /// The group's prompts, as indices into the request's.
    range: Range<usize>,
    /// Their text embeddings `[n, L, D]`, conditional and unconditional.
    cond: Tensor<B, 3>,
    uncond: Tensor<B, 3>,
    /// Their initial noise `[n, C, F, H, W]`.
    noise: Tensor<B, 5>,
    /// The sampling steps of the groups before this one (for progress counts).
    steps_before: usize,
}

/// Sample each prompt group of `chunks` with `sample` (which takes `steps` sampling steps a
/// group and returns the group's final latents) and split the results into the request's
/// clips, in prompt order.
fn in_groups<B: Backend>(
    req: &SampleRequest,
    device: &B::Device,
    chunks: Vec<Range<usize>>,
    steps: usize,
    mut sample: impl FnMut(Group<B>) -> Tensor<B, 5>,
) -> Vec<Vec<f32>> {
    let mut clips = Vec::with_capacity(req.prompts.len());
    for (c, range) in chunks.into_iter().enumerate() {
        let (cond, uncond) = request_text_of::<B>(req, range.clone(), device);
        let noise = request_noise_of::<B>(req, range.clone(), device);
        let group = Group {
            range,
            cond,
            uncond,
            noise,
            steps_before: c * steps,
        };
        clips.extend(split_clips(sample(group), &req.spec));
    }
    clips
}

/// Host clips `[C, F, H, W]` from a batch tensor.
pub fn split_clips<B: Backend>(x: Tensor<B, 5>, spec: &DataSpec) -> Vec<Vec<f32>> {
    let all = x
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("f32 clips");
    all.chunks(spec.latent_numel())
        .map(<[f32]>::to_vec)
        .collect()
}

/// Fresh noise for step `step` (≥ 1) of a few-step sampler: prompt `i` draws from a stream of
/// `(seed, i, step)`, independent of [`request_noise`] (which is step 0).
pub fn request_step_noise<B: Backend>(
    req: &SampleRequest,
    step: usize,
    device: &B::Device,
) -> Tensor<B, 5> {
    request_step_noise_of(req, 0..req.prompts.len(), step, device)
}

/// [`request_step_noise`] of the prompts `range` only.
fn request_step_noise_of<B: Backend>(
    req: &SampleRequest,
    range: Range<usize>,
    step: usize,
    device: &B::Device,
) -> Tensor<B, 5> {
    prompts_noise(req, range, device, |i| {
        req.seed
            ^ ((req.first_index + i) as u64).wrapping_mul(0x9E37_79B9)
            ^ (step as u64).wrapping_mul(0xD1B5_4A32_D192_ED03)
    })
}

/// Few-step x0 sampling (DMD-style, FastVideo `WanDMDPipeline`): start from the request's
/// noise at `sigmas[0]`; at each σ predict `x0 = x − σ·v` (with classifier-free guidance on
/// `v` unless `guidance == 1`) and, before every later step, re-noise it to the next σ with
/// fresh noise from [`request_step_noise`]. Returns the last `x0`. Deterministic in the
/// request's seed; in the groups of [`sample_chunks`].
pub fn sample_few_step<B: Backend>(
    model: &dyn DiffusionModel<B>,
    req: &SampleRequest,
    sigmas: &[f64],
    guidance: f64,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    few_step_in_chunks(model, req, sigmas, guidance, device, sample_chunks(req))
}

/// [`sample_few_step`] over the prompt groups `chunks`.
fn few_step_in_chunks<B: Backend>(
    model: &dyn DiffusionModel<B>,
    req: &SampleRequest,
    sigmas: &[f64],
    guidance: f64,
    device: &B::Device,
    chunks: Vec<Range<usize>>,
) -> Vec<Vec<f32>> {
    let total = sigmas.len() * chunks.len();
    in_groups(req, device, chunks, sigmas.len(), |g| {
        let mut x = g.noise;
        let mut x0 = x.clone();
        for (k, &sigma) in sigmas.iter().enumerate() {
            if k > 0 {
                let noise = request_step_noise_of::<B>(req, g.range.clone(), k, device);
                x = x0
                    .clone()
                    .mul_scalar(1.0 - sigma)
                    .add(noise.mul_scalar(sigma));
            }
            let v = guided_velocity(model, x.clone(), sigma, &g.cond, &g.uncond, guidance);
            x0 = x.clone().sub(v.mul_scalar(sigma));
            report::<B>(req, device, g.steps_before + k + 1, total);
        }
        x0
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{recorder, TINY_SPEC};
    use reel_core::data::Prompt;
    use reel_models::WanConfig;

    type I = burn::backend::NdArray;

    fn whole_again() -> Vec<Range<usize>> {
        std::iter::once(0..5).collect()
    }

    /// Five prompts sampled whole and in groups of two (as a clip too large for one forward
    /// with the others would be): the same clips, and the progress counts every group's steps.
    #[test]
    fn prompts_sampled_in_groups_give_the_clips_of_one_batch() {
        let dev = Default::default();
        let model: reel_models::WanModel<I> =
            WanConfig::preset("wan-tiny").unwrap().init_seeded(&dev, 5);
        let prompt = |v: f32| Prompt {
            caption: String::new(),
            text: TextCondition {
                embedding: (0..8 * 32).map(|k| v * (k % 5) as f32).collect(),
                mask: vec![true; 8],
            },
        };
        let req = SampleRequest {
            prompts: (0..5).map(|i| prompt(0.1 * i as f32 - 0.2)).collect(),
            negative: None,
            steps: None,
            guidance: None,
            seed: 3,
            first_index: 0,
            spec: TINY_SPEC,
            progress: None,
        };
        let pairs = chunks_within(&req, 2 * TINY_SPEC.latent_numel());
        assert_eq!(pairs, vec![0..2, 2..4, 4..5]);
        let whole = whole_again();
        let close = |a: &[Vec<f32>], b: &[Vec<f32>]| {
            assert_eq!(a.len(), b.len());
            let d = a
                .iter()
                .flatten()
                .zip(b.iter().flatten())
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(d < 1e-5, "{d}");
        };
        let sigmas = sampling_sigmas(3, 3.0);
        let (progress, calls) = recorder();
        let watched = SampleRequest {
            progress: Some(progress),
            ..req.clone()
        };
        let a = euler_in_chunks(&model, &req, &sigmas, 2.0, &dev, whole.clone());
        let b = euler_in_chunks(&model, &watched, &sigmas, 2.0, &dev, pairs.clone());
        close(&a, &b);
        let want: Vec<(usize, usize)> = (1..=9).map(|k| (k, 9)).collect();
        assert_eq!(*calls.lock().unwrap(), want, "3 steps in each of 3 groups");
        let few = [1.0, 0.6, 0.3];
        let a = few_step_in_chunks(&model, &req, &few, 2.0, &dev, whole);
        let b = few_step_in_chunks(&model, &req, &few, 2.0, &dev, pairs);
        close(&a, &b);
        assert_eq!(sample_chunks(&req), whole_again(), "tiny clips go together");
    }
}
