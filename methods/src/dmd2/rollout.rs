//! The student's side of DMD2: the denoising schedule, the per-sample random draws of a
//! rollout, and the rollout itself (the noisy point the student denoises in one step).
//!
//! FastVideo `DMD2Method._student_rollout`:
//!
//! - `simulate`: start from pure noise at the first listed step, let the student (no
//!   gradients) predict `x0` and re-noise it to the next listed step, and stop at a random
//!   index of the list; that noisy point is what the student then denoises.
//! - `data_latent`: noise a data latent to a random listed step.
//!
//! Differences from FastVideo, all in the spirit of "a sample's draws depend only on the run
//! seed, the step and the sample's stream position" (so gradient accumulation sees the same samples as a
//! bigger batch): the target index, the noises and the score σ are drawn **per sample**
//! (FastVideo draws one timestep for the whole batch; with `batch_size = 1`, its Wan recipe,
//! the two agree in distribution), and the simulated trajectory only runs as far as the largest
//! index in the micro-batch (FastVideo always runs `len − 1` no-grad steps and discards the
//! rest).

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use reel_core::flow::{
    add_noise, shift_sigma, sigma_tensor, timesteps_from_sigmas, x0_from_velocity, TIMESTEP_SCALE,
};
use reel_core::method::StepContext;
use reel_core::model::DiffusionModel;

use crate::common::per_sample_noise;

/// The student's few-step schedule: the listed model timesteps and their σ.
#[derive(Debug, Clone, PartialEq)]
pub struct DenoisingSchedule {
    /// σ of each listed step, in order (first = noisiest). No trailing zero.
    pub sigmas: Vec<f64>,
}

impl DenoisingSchedule {
    /// σ of each listed timestep: `t / 1000`, or with `warp` the shifted schedule's σ at that
    /// position, `shift(t / 1000)` (FastVideo `warp_denoising_step`: `timesteps[1000 − t]` of
    /// the shifted scheduler table).
    pub fn new(timesteps: &[u32], warp: bool, shift: f64) -> Self {
        let sigmas = timesteps
            .iter()
            .map(|&t| {
                let s = (t as f64 / TIMESTEP_SCALE).clamp(0.0, 1.0);
                if warp {
                    shift_sigma(s, shift)
                } else {
                    s
                }
            })
            .collect();
        Self { sigmas }
    }

    /// Number of listed steps.
    pub fn len(&self) -> usize {
        self.sigmas.len()
    }

    /// `true` for an empty list (never the case after validation).
    pub fn is_empty(&self) -> bool {
        self.sigmas.is_empty()
    }

    /// The σ a `steps`-step sampler uses: a linspace subset of the list that always keeps the
    /// first (noisiest) entry and, for `steps >= 2`, the last one: indices
    /// `round(i·(len−1)/(steps−1))`, `i < steps` (`steps = 1`: the first entry only). With the
    /// default list `[1000, 750, 500, 250]`: 4 → all, 3 → `[1000, 500, 250]`, 2 → `[1000,
    /// 250]`. `None` when `steps` is 0 or more than the list holds.
    pub fn sampling_sigmas(&self, steps: usize) -> Option<Vec<f64>> {
        let len = self.len();
        if steps == 0 || steps > len {
            return None;
        }
        if steps == 1 {
            return Some(vec![self.sigmas[0]]);
        }
        Some(
            (0..steps)
                .map(|i| {
                    let idx = (i as f64 * (len - 1) as f64 / (steps - 1) as f64).round() as usize;
                    self.sigmas[idx]
                })
                .collect(),
        )
    }
}

/// The student's prediction at per-sample σ `[B]`: `(x0, v)` with `v = model(x_t, 1000·σ,
/// text)` and `x0 = x_t − σ·v`.
pub fn student_x0<B: Backend>(
    model: &dyn DiffusionModel<B>,
    x_t: Tensor<B, 5>,
    sigma: Tensor<B, 1>,
    text: Tensor<B, 3>,
) -> (Tensor<B, 5>, Tensor<B, 5>) {
    let v = model.forward(x_t.clone(), timesteps_from_sigmas(sigma.clone()), text);
    (x0_from_velocity(x_t, v.clone(), sigma), v)
}

/// The random draws of one rollout, made explicit so the rollout itself is a pure function.
#[derive(Debug, Clone)]
pub struct RolloutDraws<B: Backend> {
    /// Per sample: index into the schedule of the step the student denoises with gradients.
    pub index: Vec<usize>,
    /// `simulate`: `noises[0]` is the starting noise (at σ₀) and `noises[k]` (k ≥ 1) the noise
    /// that re-noises the student's `x0` to σ_k; only up to the largest index are drawn.
    /// `data_latent`: `noises[0]` is the noise added to the data latent.
    pub noises: Vec<Tensor<B, 5>>,
}

impl<B: Backend> RolloutDraws<B> {
    /// Draw from the run's generators, per sample (keyed by the step and the sample's [`Batch::keys`](reel_core::method::Batch::keys) entry):
    /// stream `dmd2-rollout-index` for the index, `dmd2-rollout-noise-<k>` for `noises[k]`.
    /// `simulate` draws `max(index) + 1` noises, `data_latent` one.
    pub fn draw(
        ctx: &StepContext,
        keys: &[u64],
        dims: [usize; 5],
        schedule_len: usize,
        simulate: bool,
        device: &B::Device,
    ) -> Self {
        let index: Vec<usize> = keys
            .iter()
            .map(|&k| {
                ctx.rng
                    .stream(ctx.step, k, "dmd2-rollout-index")
                    .below(schedule_len as u64) as usize
            })
            .collect();
        let count = if simulate {
            index.iter().copied().max().unwrap_or(0) + 1
        } else {
            1
        };
        let noises = (0..count)
            .map(|k| {
                per_sample_noise::<B>(ctx, keys, dims, &format!("dmd2-rollout-noise-{k}"), device)
            })
            .collect();
        Self { index, noises }
    }
}

/// `simulate` rollout without gradients: the noisy input of every sample at its drawn index
/// and the σ `[B]` there (as host values). Runs `max(index)` student forwards on the whole
/// batch and picks each sample's state.
pub fn simulate_input<B: Backend>(
    student: &dyn DiffusionModel<B>,
    schedule: &DenoisingSchedule,
    draws: &RolloutDraws<B>,
    text: Tensor<B, 3>,
) -> (Tensor<B, 5>, Vec<f32>) {
    let n = draws.index.len();
    let device = draws.noises[0].device();
    let max_idx = draws.index.iter().copied().max().unwrap_or(0);
    let mut states = Vec::with_capacity(max_idx + 1);
    let mut x = draws.noises[0].clone();
    states.push(x.clone());
    for k in 0..max_idx {
        let sigma = sigma_tensor::<B>(&vec![schedule.sigmas[k] as f32; n], &device);
        let (x0, _) = student_x0(student, x, sigma, text.clone());
        let next = sigma_tensor::<B>(&vec![schedule.sigmas[k + 1] as f32; n], &device);
        x = add_noise(x0, draws.noises[k + 1].clone(), next);
        states.push(x.clone());
    }
    let x_t = if draws.index.iter().all(|&i| i == max_idx) {
        x
    } else {
        Tensor::cat(
            draws
                .index
                .iter()
                .enumerate()
                .map(|(b, &i)| states[i].clone().narrow(0, b, 1))
                .collect(),
            0,
        )
    };
    let sigma = draws
        .index
        .iter()
        .map(|&i| schedule.sigmas[i] as f32)
        .collect();
    (x_t, sigma)
}

/// `data_latent` rollout: `x_t = (1−σ)·x0 + σ·ε` with each sample's σ at its drawn index;
/// returns `(x_t, σ)`.
pub fn data_latent_input<B: Backend>(
    latents: Tensor<B, 5>,
    schedule: &DenoisingSchedule,
    draws: &RolloutDraws<B>,
) -> (Tensor<B, 5>, Vec<f32>) {
    let sigma: Vec<f32> = draws
        .index
        .iter()
        .map(|&i| schedule.sigmas[i] as f32)
        .collect();
    let device = latents.device();
    let x_t = add_noise(
        latents,
        draws.noises[0].clone(),
        sigma_tensor::<B>(&sigma, &device),
    );
    (x_t, sigma)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_sigmas_and_warp() {
        let s = DenoisingSchedule::new(&[1000, 750, 500, 250], false, 3.0);
        assert_eq!(s.sigmas, vec![1.0, 0.75, 0.5, 0.25]);
        let w = DenoisingSchedule::new(&[1000, 500], true, 3.0);
        assert_eq!(w.sigmas, vec![1.0, 0.75]);
    }

    #[test]
    fn simulate_picks_each_samples_own_state() {
        type I = burn::backend::NdArray;
        let dev = Default::default();
        let model = reel_models::WanConfig::preset("wan-tiny")
            .unwrap()
            .init_seeded::<I>(&dev, 3);
        let schedule = DenoisingSchedule::new(&[1000, 750, 500, 250], false, 1.0);
        let mut r = reel_core::rng::StreamRng::from_seed(9);
        let noises: Vec<Tensor<I, 5>> = (0..3)
            .map(|_| r.normal_tensor([3, 4, 2, 8, 8], &dev))
            .collect();
        let text: Tensor<I, 3> = r.normal_tensor([3, 8, 32], &dev);
        let run = |index: Vec<usize>| {
            let draws = RolloutDraws {
                index,
                noises: noises.clone(),
            };
            simulate_input(&model, &schedule, &draws, text.clone())
        };
        let (mixed, sigma) = run(vec![2, 0, 1]);
        assert_eq!(sigma, vec![0.5, 1.0, 0.75]);
        // Sample 1 at index 0 is its starting noise.
        let start: Vec<f32> = noises[0]
            .clone()
            .narrow(0, 1, 1)
            .into_data()
            .to_vec()
            .unwrap();
        let got: Vec<f32> = mixed.clone().narrow(0, 1, 1).into_data().to_vec().unwrap();
        assert_eq!(got, start);
        for (b, k) in [(0usize, 2usize), (1, 0), (2, 1)] {
            let (uniform, _) = run(vec![k; 3]);
            let want: Vec<f32> = uniform.narrow(0, b, 1).into_data().to_vec().unwrap();
            let got: Vec<f32> = mixed.clone().narrow(0, b, 1).into_data().to_vec().unwrap();
            assert_eq!(got, want, "sample {b} at index {k}");
        }
    }

    #[test]
    fn sampling_subset_keeps_first_and_last() {
        let s = DenoisingSchedule::new(&[1000, 750, 500, 250], false, 1.0);
        assert_eq!(s.sampling_sigmas(4).unwrap(), vec![1.0, 0.75, 0.5, 0.25]);
        assert_eq!(s.sampling_sigmas(3).unwrap(), vec![1.0, 0.5, 0.25]);
        assert_eq!(s.sampling_sigmas(2).unwrap(), vec![1.0, 0.25]);
        assert_eq!(s.sampling_sigmas(1).unwrap(), vec![1.0]);
        assert!(s.sampling_sigmas(0).is_none());
        assert!(s.sampling_sigmas(5).is_none());
    }
}
