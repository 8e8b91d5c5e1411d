//! DMD2's losses as pure functions of explicit noises and σ (the golden test drives them with
//! the fixture's tensors; the method draws them from the run's generators).
//!
//! Generator (distribution-matching) loss, FastVideo `DMD2Method._dmd_loss`:
//!
//! ```text
//! x_s    = (1−σ)·x0 + σ·ε                       (σ: the score σ, shifted and clamped)
//! fake   = x_s − σ·critic(x_s, 1000σ, cond)     (no gradients)
//! cond   = x_s − σ·teacher(x_s, 1000σ, cond)    (no gradients, batched with uncond as 2N)
//! uncond = x_s − σ·teacher(x_s, 1000σ, uncond)
//! real   = uncond + g·(cond − uncond)           (cfg_form = "uncond", FastVideo's new trainer)
//!        | cond + g·(cond − uncond)             (cfg_form = "legacy", its DistillationPipeline)
//! grad   = nan_to_num((fake − real) / mean|x0 − real|)      (one mean over the micro-batch,
//!                                                           all workers' shards together)
//! loss   = 0.5·mean((x0 − stopgrad(x0 − grad))²)
//! ```
//!
//! Critic (fake-score) loss, FastVideo `_critic_flow_matching_loss`: flow matching on the
//! detached student sample, `mean((critic(x_s, 1000σ, cond) − (ε − x0))²)`.

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

use reel_core::flow::{add_noise, timesteps_from_sigmas, velocity_target, x0_from_velocity};
use reel_core::model::DiffusionModel;
use reel_core::parallel::{mean_over_workers, ParallelError};
use reel_core::profile::{enter, phase};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// How the teacher's conditional and unconditional predictions are combined into the real
/// score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum CfgForm {
    /// `uncond + g·(cond − uncond)` (standard CFG; FastVideo's new trainer).
    #[default]
    Uncond,
    /// `cond + g·(cond − uncond)` (the DMD2 paper / FastVideo's legacy
    /// `DistillationPipeline`; standard CFG with weight `g + 1`).
    Legacy,
}

impl CfgForm {
    /// Combine conditional and unconditional predictions with guidance `g`.
    pub fn combine<B: Backend, const D: usize>(
        self,
        cond: Tensor<B, D>,
        uncond: Tensor<B, D>,
        g: f64,
    ) -> Tensor<B, D> {
        let delta = cond.clone().sub(uncond.clone()).mul_scalar(g);
        match self {
            CfgForm::Uncond => uncond.add(delta),
            CfgForm::Legacy => cond.add(delta),
        }
    }

    /// Whether the combination ignores `uncond` (then the unconditional pass is skipped):
    /// `g = 1` for [`CfgForm::Uncond`], `g = 0` for [`CfgForm::Legacy`].
    pub fn is_cond_only(self, g: f64) -> bool {
        match self {
            CfgForm::Uncond => g == 1.0,
            CfgForm::Legacy => g == 0.0,
        }
    }
}

/// Everything the real/fake score evaluation computes (all without gradients).
#[derive(Debug, Clone)]
pub struct DmdScores<B: Backend> {
    /// `x_s = (1−σ)·x0 + σ·ε`.
    pub noisy: Tensor<B, 5>,
    /// Critic velocity at `x_s`.
    pub v_critic: Tensor<B, 5>,
    /// Critic (fake score) `x0`.
    pub fake_x0: Tensor<B, 5>,
    /// Teacher conditional velocity.
    pub v_teacher_cond: Tensor<B, 5>,
    /// Teacher conditional `x0`.
    pub real_cond_x0: Tensor<B, 5>,
    /// Teacher unconditional velocity (`None` when the CFG form does not need it).
    pub v_teacher_uncond: Option<Tensor<B, 5>>,
    /// Teacher unconditional `x0` (`None` when the CFG form does not need it).
    pub real_uncond_x0: Option<Tensor<B, 5>>,
    /// Guided real-score `x0`.
    pub real_x0: Tensor<B, 5>,
    /// `mean|x0 − real|` over every element, `[1]`.
    pub normalizer: Tensor<B, 1>,
    /// `nan_to_num((fake − real) / normalizer)`.
    pub grad: Tensor<B, 5>,
}

/// `torch.nan_to_num`: NaN → 0, ±inf → ±f32::MAX.
pub fn nan_to_num<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let nan = x.clone().is_nan();
    x.mask_fill(nan, 0.0).clamp(f32::MIN, f32::MAX)
}

/// Evaluate the critic (fake score) and the teacher (real score, conditional and
/// unconditional batched as `2N`) at `x_s = (1−σ)·x0 + σ·ε` and form the DMD gradient.
/// `x0` is the student's sample (detached); `sigma` `[B]` per sample; `cond` / `uncond`
/// `[B, L, D]`.
#[allow(clippy::too_many_arguments)]
pub fn dmd_scores<B: Backend>(
    x0: Tensor<B, 5>,
    noise: Tensor<B, 5>,
    sigma: Tensor<B, 1>,
    critic: &dyn DiffusionModel<B>,
    teacher: &dyn DiffusionModel<B>,
    cond: Tensor<B, 3>,
    uncond: Tensor<B, 3>,
    guidance: f64,
    form: CfgForm,
) -> Result<DmdScores<B>, ParallelError> {
    let n = x0.dims()[0];
    let noisy = add_noise(x0.clone(), noise, sigma.clone());
    let t = timesteps_from_sigmas(sigma.clone());
    let dev = x0.device();
    let v_critic = phase::<B, _>("critic forward (score)", &dev, || {
        critic.forward(noisy.clone(), t.clone(), cond.clone())
    });
    let fake_x0 = x0_from_velocity(noisy.clone(), v_critic.clone(), sigma.clone());

    let teacher_phase = enter::<B>("teacher forward", &dev);
    let (v_teacher_cond, v_teacher_uncond) = if form.is_cond_only(guidance) {
        (teacher.forward(noisy.clone(), t, cond), None)
    } else {
        let both = teacher.forward(
            Tensor::cat(vec![noisy.clone(), noisy.clone()], 0),
            Tensor::cat(vec![t.clone(), t], 0),
            Tensor::cat(vec![cond, uncond], 0),
        );
        (both.clone().narrow(0, 0, n), Some(both.narrow(0, n, n)))
    };
    drop(teacher_phase);
    let real_cond_x0 = x0_from_velocity(noisy.clone(), v_teacher_cond.clone(), sigma.clone());
    let real_uncond_x0 = v_teacher_uncond
        .clone()
        .map(|v| x0_from_velocity(noisy.clone(), v, sigma.clone()));
    let real_x0 = match &real_uncond_x0 {
        Some(u) => form.combine(real_cond_x0.clone(), u.clone(), guidance),
        // Cond-only forms: the combination is `cond` whatever `uncond` is.
        None => form.combine(real_cond_x0.clone(), real_cond_x0.clone(), guidance),
    };
    // Over the whole global micro-batch in a data-parallel run.
    let normalizer = mean_over_workers(x0.sub(real_x0.clone()).abs().mean())?;
    let grad = nan_to_num(
        fake_x0
            .clone()
            .sub(real_x0.clone())
            .div(normalizer.clone().reshape([1, 1, 1, 1, 1])),
    );
    Ok(DmdScores {
        noisy,
        v_critic,
        fake_x0,
        v_teacher_cond,
        real_cond_x0,
        v_teacher_uncond,
        real_uncond_x0,
        real_x0,
        normalizer,
        grad,
    })
}

/// The generator loss `0.5·mean((x0 − stopgrad(x0 − grad))²)` (value `0.5·mean(grad²)`;
/// gradient `grad / numel` with respect to `x0`). `x0` carries the student's graph.
pub fn generator_loss<B: AutodiffBackend>(
    x0: Tensor<B, 5>,
    grad: Tensor<Inner<B>, 5>,
) -> Tensor<B, 1> {
    let target = Tensor::<B, 5>::from_inner(x0.clone().inner().sub(grad));
    x0.sub(target).square().mean().mul_scalar(0.5)
}

/// The critic's flow-matching step on a detached student sample.
#[derive(Debug, Clone)]
pub struct CriticLoss<B: Backend> {
    /// `x_s = (1−σ)·x0 + σ·ε`.
    pub noisy: Tensor<B, 5>,
    /// Critic velocity at `x_s`.
    pub pred: Tensor<B, 5>,
    /// Target `ε − x0`.
    pub target: Tensor<B, 5>,
    /// `mean((pred − target)²)`, `[1]`.
    pub loss: Tensor<B, 1>,
}

/// Flow-matching loss of the critic on the student's sample `x0` (no gradient flows into
/// `x0`: pass a detached tensor) at per-sample `sigma` `[B]` with noise `noise`.
pub fn critic_loss<B: Backend>(
    critic: &dyn DiffusionModel<B>,
    x0: Tensor<B, 5>,
    noise: Tensor<B, 5>,
    sigma: Tensor<B, 1>,
    text: Tensor<B, 3>,
) -> CriticLoss<B> {
    let noisy = add_noise(x0.clone(), noise.clone(), sigma.clone());
    let pred = critic.forward(noisy.clone(), timesteps_from_sigmas(sigma), text);
    let target = velocity_target(x0, noise);
    let loss = pred.clone().sub(target.clone()).square().mean();
    CriticLoss {
        noisy,
        pred,
        target,
        loss,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    type B = burn::backend::NdArray;

    fn t(v: &[f32]) -> Tensor<B, 1> {
        Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), &Default::default())
    }

    #[test]
    fn cfg_forms() {
        let (c, u) = (t(&[2.0]), t(&[1.0]));
        let a: f32 = CfgForm::Uncond
            .combine(c.clone(), u.clone(), 4.5)
            .into_scalar();
        let b: f32 = CfgForm::Legacy.combine(c, u, 4.5).into_scalar();
        assert_eq!((a, b), (5.5, 6.5));
        assert!(CfgForm::Uncond.is_cond_only(1.0) && !CfgForm::Uncond.is_cond_only(4.5));
        assert!(CfgForm::Legacy.is_cond_only(0.0) && !CfgForm::Legacy.is_cond_only(1.0));
    }

    #[test]
    fn nan_to_num_matches_torch() {
        let x = t(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.5]);
        let v = nan_to_num(x).into_data().to_vec::<f32>().unwrap();
        assert_eq!(v, vec![0.0, f32::MAX, f32::MIN, 1.5]);
    }
}
