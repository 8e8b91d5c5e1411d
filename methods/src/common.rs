//! Pieces shared by the methods: per-sample random draws, text-condition selection, and the
//! Euler / few-step samplers used for validation and `reel sample`. Models are reached
//! through the seam ([`DiffusionModel`]), never by class.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use reel_core::data::{text_tensors, DataSpec, TextCondition};
use reel_core::flow::{
    cfg_combine, euler_sample, sampling_sigmas, shift_sigma, TimestepDensity, TIMESTEP_SCALE,
};
use reel_core::method::{SampleRequest, StepContext};
use reel_core::model::DiffusionModel;
use reel_core::rng::StreamRng;

/// Per-sample standard-normal noise `[B, C, F, H, W]`, keyed by (step, sample index, stream),
/// so the draws of a sample do not depend on how samples are grouped into micro-batches.
pub fn per_sample_noise<B: Backend>(
    ctx: &StepContext,
    indices: &[usize],
    dims: [usize; 5],
    stream: &str,
    device: &B::Device,
) -> Tensor<B, 5> {
    let per = dims[1] * dims[2] * dims[3] * dims[4];
    let mut v = Vec::with_capacity(per * indices.len());
    for &i in indices {
        v.extend(ctx.rng.stream(ctx.step, i as u64, stream).normal_vec(per));
    }
    Tensor::from_data(TensorData::new(v, dims), device)
}

/// One uniform draw in `[0, 1)` per sample, keyed like [`per_sample_noise`].
pub fn per_sample_uniform(ctx: &StepContext, indices: &[usize], stream: &str) -> Vec<f64> {
    indices
        .iter()
        .map(|&i| ctx.rng.stream(ctx.step, i as u64, stream).uniform())
        .collect()
}

/// One shifted training σ per sample from `density`, keyed like [`per_sample_noise`].
pub fn per_sample_sigmas(
    ctx: &StepContext,
    indices: &[usize],
    density: &TimestepDensity,
    shift: f64,
    stream: &str,
) -> Vec<f32> {
    indices
        .iter()
        .map(|&i| {
            let mut r = ctx.rng.stream(ctx.step, i as u64, stream);
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

/// Initial noise for a sampling request: prompt `i` draws from a stream of `(seed, i)`.
pub fn request_noise<B: Backend>(req: &SampleRequest, device: &B::Device) -> Tensor<B, 5> {
    let s = &req.spec;
    let per = s.latent_numel();
    let mut v = Vec::with_capacity(per * req.prompts.len());
    for i in 0..req.prompts.len() {
        v.extend(
            StreamRng::from_seed(req.seed ^ (i as u64).wrapping_mul(0x9E37_79B9)).normal_vec(per),
        );
    }
    Tensor::from_data(
        TensorData::new(
            v,
            [req.prompts.len(), s.channels, s.frames, s.height, s.width],
        ),
        device,
    )
}

/// Conditional `[N, L, D]` and unconditional `[N, L, D]` text tensors of a request.
pub fn request_text<B: Backend>(
    req: &SampleRequest,
    device: &B::Device,
) -> (Tensor<B, 3>, Tensor<B, 3>) {
    let spec = &req.spec;
    let zeros = TextCondition {
        embedding: vec![0.0; spec.text_numel()],
        mask: vec![false; spec.text_len],
    };
    let neg = req.negative.as_ref().unwrap_or(&zeros);
    let conds: Vec<&TextCondition> = req.prompts.iter().map(|p| &p.text).collect();
    let negs: Vec<&TextCondition> = req.prompts.iter().map(|_| neg).collect();
    (
        text_tensors::<B>(&conds, spec, device).0,
        text_tensors::<B>(&negs, spec, device).0,
    )
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
/// `sigmas[0]` from the request's noise; see [`euler_sample`]).
pub fn sample_euler_sigmas<B: Backend>(
    model: &dyn DiffusionModel<B>,
    req: &SampleRequest,
    sigmas: &[f64],
    guidance: f64,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    let (cond, uncond) = request_text::<B>(req, device);
    let x = request_noise::<B>(req, device);
    let total = sigmas.len().saturating_sub(1);
    let mut done = 0;
    let out = euler_sample(x, sigmas, |x, s| {
        if let Some(progress) = req.progress.as_ref().filter(|_| done > 0) {
            progress.step::<B>(device, done, total);
        }
        done += 1;
        guided_velocity(model, x, s, &cond, &uncond, guidance)
    });
    if let Some(progress) = &req.progress {
        progress.step::<B>(device, total, total);
    }
    split_clips(out, &req.spec)
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
    let s = &req.spec;
    let per = s.latent_numel();
    let mut v = Vec::with_capacity(per * req.prompts.len());
    for i in 0..req.prompts.len() {
        let key = req.seed
            ^ (i as u64).wrapping_mul(0x9E37_79B9)
            ^ (step as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
        v.extend(StreamRng::from_seed(key).normal_vec(per));
    }
    Tensor::from_data(
        TensorData::new(
            v,
            [req.prompts.len(), s.channels, s.frames, s.height, s.width],
        ),
        device,
    )
}

/// Few-step x0 sampling (DMD-style, FastVideo `WanDMDPipeline`): start from the request's
/// noise at `sigmas[0]`; at each σ predict `x0 = x − σ·v` (with classifier-free guidance on
/// `v` unless `guidance == 1`) and, before every later step, re-noise it to the next σ with
/// fresh noise from [`request_step_noise`]. Returns the last `x0`. Deterministic in the
/// request's seed.
pub fn sample_few_step<B: Backend>(
    model: &dyn DiffusionModel<B>,
    req: &SampleRequest,
    sigmas: &[f64],
    guidance: f64,
    device: &B::Device,
) -> Vec<Vec<f32>> {
    let (cond, uncond) = request_text::<B>(req, device);
    let mut x = request_noise::<B>(req, device);
    let mut x0 = x.clone();
    for (k, &sigma) in sigmas.iter().enumerate() {
        if k > 0 {
            let noise = request_step_noise::<B>(req, k, device);
            x = x0
                .clone()
                .mul_scalar(1.0 - sigma)
                .add(noise.mul_scalar(sigma));
        }
        let v = guided_velocity(model, x.clone(), sigma, &cond, &uncond, guidance);
        x0 = x.clone().sub(v.mul_scalar(sigma));
        if let Some(progress) = &req.progress {
            progress.step::<B>(device, k + 1, sigmas.len());
        }
    }
    split_clips(x0, &req.spec)
}
