//! `kind = "dmd2"`: DMD2 distribution-matching distillation of a few-step student, following
//! FastVideo's trainer (`fastvideo/train/methods/distribution_matching/dmd2.py`).
//!
//! Roles: `student` (trainable, the few-step generator), `teacher` (frozen, the real score,
//! loaded without autodiff) and `critic` (trainable, the fake score).
//!
//! Each step (0-based global step `s`):
//! 1. **Generator**, only when `s % generator_update_interval == 0` (steps 0, 5, 10, … with
//!    the default 5; FastVideo's `_should_update_student`): the student's sample `x0` from a
//!    rollout ([`rollout`]), then the distribution-matching loss against the critic and the
//!    teacher ([`loss`]); gradients go to the student only. Reported as `generator_loss`.
//! 2. **Critic**, every step: flow matching of the critic on the detached student sample
//!    (the generator step's sample when it ran, else a rollout without gradients). Reported
//!    as `critic_loss`.
//!
//! The unconditional text is the data source's negative embedding (zeros when it has none).
//! Every random draw (rollout index, noises, score σ, critic σ) is keyed by the step and the
//! sample's stream position (`Batch::keys`), so a sample draws the same numbers whatever micro-batch it lands in. The
//! critic loss is a mean of per-sample terms, so gradient accumulation equals a larger batch
//! for it; the generator loss divides by a micro-batch-wide normaliser (as in FastVideo) and
//! is therefore only approximately batch-size invariant.
//!
//! **Adversarial terms** (DMD2's GAN loss; on when `gan_generator_weight` and
//! `gan_discriminator_weight` are > 0): discriminator heads ([`crate::adversarial`]) read the
//! critic's hidden states at a score σ' (own stream). The generator step adds
//! `gan_generator_weight · L_G(D(noised x0))` to the student's loss (gradients through the
//! critic reach only the student); the critic step adds `gan_discriminator_weight ·
//! L_D(D(noised data latent), D(noised detached sample))` to the critic's loss, training the
//! heads (role `discriminator`, critic optimizer settings) and the critic's backbone
//! together. Reported as `gan_generator_loss` and `gan_discriminator_loss`.
//!
//! Sampling ([`TrainingMethod::sample`]) is the student's few-step sampler over
//! `denoising_steps` (x0 prediction at each step, re-noising to the next σ with fresh noise
//! from the request seed), without classifier-free guidance unless the request asks for it.
//!
//! ```toml
//! [method]
//! kind = "dmd2"
//! rollout = "simulate"
//! denoising_steps = [1000, 750, 500, 250]
//! guidance_scale = 4.5
//! generator_update_interval = 5
//! critic_optimizer = { lr = 8e-6, betas = [0.0, 0.999] }
//! ```

pub mod config;
pub mod loss;
pub mod rollout;

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;

use reel_core::flow::{
    add_noise, sigma_tensor, timesteps_from_sigmas, velocity_target, x0_from_velocity,
};
use reel_core::method::{
    Batch, BuildContext, BuildMethod, MethodError, SampleRequest, StepContext, StepOutput,
    TrainingMethod,
};
use reel_core::model::{DiffusionModel, DynModel};
use reel_core::profile::{enter, phase};
use reel_core::role::TrainableRole;

use crate::adversarial::DiscriminatorHeads;
use crate::common::{per_sample_noise, sample_few_step};
pub use config::{Dmd2Config, Rollout};
pub use loss::{critic_loss, dmd_scores, generator_loss, CfgForm, CriticLoss, DmdScores};
pub use rollout::{data_latent_input, simulate_input, student_x0, DenoisingSchedule, RolloutDraws};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

impl<B: AutodiffBackend> BuildMethod<B> for Dmd2Config {
    fn build_method(
        &self,
        ctx: &BuildContext<B>,
    ) -> Result<Box<dyn TrainingMethod<B>>, MethodError> {
        let max_steps = ctx.training.max_steps;
        let student = ctx.trainable_role("student", ctx.model("student")?, None);
        let critic_model = ctx.model("critic")?;
        let critic = ctx.trainable_role("critic", critic_model, self.critic_optimizer.as_ref());
        let teacher = ctx.frozen_model("teacher")?;
        let discriminator = if self.gan_enabled() {
            let cc = critic.model().info();
            let heads = self
                .gan_heads
                .init::<B>(cc.hidden_size, cc.num_layers, &ctx.device)
                .map_err(|e| MethodError::Config(e.in_section("method.gan_heads")))?;
            Some(TrainableRole::new(
                "discriminator",
                heads,
                // The critic's settings, its role table's `optimizer` included (there is
                // no `[models.discriminator]`).
                ctx.role_optimizer("critic", self.critic_optimizer.as_ref()),
                ctx.role_max_grad_norm("critic"),
                max_steps,
            ))
        } else {
            None
        };
        Ok(Box::new(Dmd2 {
            schedule: self.schedule(),
            cfg: self.clone(),
            student,
            critic,
            teacher,
            discriminator,
            checkpoint_student: ctx.role("student")?.gradient_checkpointing,
            checkpoint_critic: ctx.role("critic")?.gradient_checkpointing,
            device: ctx.device.clone(),
        }))
    }
}

/// What the generator step logs and hands to the critic step.
struct GeneratorParts<B: AutodiffBackend> {
    /// The DMD loss, detached.
    dmd: Tensor<B, 1>,
    /// The GAN generator term, detached (when on).
    gan: Option<Tensor<B, 1>>,
    /// The student's sample `x0`, without autodiff.
    sample: Tensor<Inner<B>, 5>,
}

/// The runtime DMD2 method.
#[derive(reel_core::Roles)]
pub struct Dmd2<B: AutodiffBackend> {
    cfg: Dmd2Config,
    schedule: DenoisingSchedule,
    #[role]
    student: TrainableRole<B, DynModel<B>>,
    #[role]
    critic: TrainableRole<B, DynModel<B>>,
    teacher: Box<dyn DiffusionModel<Inner<B>>>,
    /// Heads on the critic's hidden states, when the adversarial terms are on.
    #[role]
    discriminator: Option<TrainableRole<B, DiscriminatorHeads<B>>>,
    /// Block-level activation checkpointing of the student / the critic.
    checkpoint_student: bool,
    checkpoint_critic: bool,
    device: B::Device,
}

impl<B: AutodiffBackend> Dmd2<B> {
    /// Per-sample score σ drawn from stream `stream`.
    fn score_sigmas(&self, ctx: &StepContext, keys: &[u64], stream: &str) -> Vec<f32> {
        keys.iter()
            .map(|&k| {
                self.cfg
                    .score_sigma(ctx.rng.stream(ctx.step, k, stream).uniform())
                    as f32
            })
            .collect()
    }

    /// `x [B, C, F, H, W]` noised to the adversarial σ' of this step (same draws for real
    /// and fake), and its model timesteps `[B]`.
    fn gan_point(
        &self,
        x: Tensor<B, 5>,
        ctx: &StepContext,
        keys: &[u64],
    ) -> (Tensor<B, 5>, Tensor<B, 1>) {
        let sigma = sigma_tensor::<B>(
            &self.score_sigmas(ctx, keys, "dmd2-gan-sigma"),
            &self.device,
        );
        let noise = per_sample_noise::<B>(ctx, keys, x.dims(), "dmd2-gan-noise", &self.device);
        (
            add_noise(x, noise, sigma.clone()),
            timesteps_from_sigmas(sigma),
        )
    }

    /// The generator's objective on the student's `x0` (with its graph): the DMD loss plus the
    /// weighted GAN term, and its parts for logging with the detached sample.
    fn generator_objective(
        &self,
        x0: Tensor<B, 5>,
        batch: &Batch<B>,
        ctx: &StepContext,
        text: Tensor<B, 3>,
        uncond: Tensor<Inner<B>, 3>,
    ) -> Result<(Tensor<B, 1>, GeneratorParts<B>), MethodError> {
        let idx = &batch.keys;
        let dims = batch.latents.dims();
        let x0_i = x0.clone().inner();
        // The critic and teacher forwards (their own phases inside `dmd_scores`).
        let scores = dmd_scores(
            x0_i.clone(),
            per_sample_noise::<Inner<B>>(ctx, idx, dims, "dmd2-score-noise", &self.device),
            sigma_tensor::<Inner<B>>(
                &self.score_sigmas(ctx, idx, "dmd2-score-sigma"),
                &self.device,
            ),
            &*self.critic.model().valid(),
            &*self.teacher,
            text.clone().inner(),
            uncond,
            self.cfg.guidance_scale,
            self.cfg.cfg_form,
        )?;
        let dmd = generator_loss(x0.clone(), scores.grad);
        let mut loss = dmd.clone();
        let mut gan_loss = None;
        if let Some(d) = &self.discriminator {
            let (x, t) = self.gan_point(x0, ctx, idx);
            let logits = phase::<B, _>("discriminator forward", &self.device, || {
                d.model().judge(self.critic.model(), x, t, text)
            });
            let gan = self.cfg.gan_loss.generator_heads(logits);
            loss = loss + gan.clone().mul_scalar(self.cfg.gan_generator_weight);
            gan_loss = Some(gan.detach());
        }
        let parts = GeneratorParts {
            dmd: dmd.detach(),
            gan: gan_loss,
            sample: x0_i,
        };
        Ok((loss, parts))
    }

    /// The critic's flow matching on the detached student `sample` (block-checkpointed when
    /// the critic role asks), plus the discriminator's GAN terms when on.
    fn critic_step(
        &mut self,
        sample: Tensor<B, 5>,
        batch: &Batch<B>,
        ctx: &StepContext,
        mut out: StepOutput<B>,
    ) -> Result<StepOutput<B>, MethodError> {
        let (idx, dims, text) = (&batch.keys, batch.latents.dims(), batch.text.clone());
        let noise = per_sample_noise::<B>(ctx, idx, dims, "dmd2-critic-noise", &self.device);
        let sigma = sigma_tensor::<B>(
            &self.score_sigmas(ctx, idx, "dmd2-critic-sigma"),
            &self.device,
        );
        let scale = ctx.grad_scale();
        let mut loss = None;
        if self.checkpoint_critic {
            let noisy = add_noise(sample.clone(), noise.clone(), sigma.clone());
            let target = velocity_target(sample.clone(), noise);
            let t = timesteps_from_sigmas(sigma);
            let mse = Box::new(move |pred: Tensor<B, 5>| pred.sub(target).square().mean());
            let l = phase::<B, _>(
                "critic forward + backward (checkpointed)",
                &self.device,
                || {
                    self.critic
                        .checkpointed_backward(noisy, t, text.clone(), mse, scale)
                },
            );
            out = out.with_loss("critic_loss", l);
        } else {
            let critic = phase::<B, _>("critic forward", &self.device, || {
                critic_loss(
                    self.critic.model(),
                    sample.clone(),
                    noise,
                    sigma,
                    text.clone(),
                )
            });
            out = out.with_loss("critic_loss", critic.loss.clone());
            loss = Some(critic.loss);
        }
        if let Some(d) = &self.discriminator {
            let (real, t) = self.gan_point(batch.latents.clone(), ctx, idx);
            let (fake, _) = self.gan_point(sample, ctx, idx);
            let heads = d.model();
            let judging = enter::<B>("discriminator forward", &self.device);
            let real = heads.judge(self.critic.model(), real, t.clone(), text.clone());
            let fake = heads.judge(self.critic.model(), fake, t, text);
            drop(judging);
            let gan = self.cfg.gan_loss.discriminator_heads(real, fake);
            out = out.with_loss("gan_discriminator_loss", gan.clone());
            let gan = gan.mul_scalar(self.cfg.gan_discriminator_weight);
            loss = Some(match loss {
                Some(l) => l + gan,
                None => gan,
            });
        }
        if let Some(loss) = loss {
            let _b = enter::<B>("critic backward", &self.device);
            let grads = loss.backward();
            self.critic.accumulate(&grads, scale);
            if let Some(d) = &mut self.discriminator {
                d.accumulate(&grads, scale);
            }
        }
        Ok(out)
    }

    /// The rollout's noisy input (no gradients) and its σ `[B]`.
    fn rollout_input(
        &self,
        batch: &Batch<B>,
        ctx: &StepContext,
        text: Tensor<Inner<B>, 3>,
    ) -> (Tensor<Inner<B>, 5>, Vec<f32>) {
        let simulate = self.cfg.rollout == Rollout::Simulate;
        let draws = RolloutDraws::<Inner<B>>::draw(
            ctx,
            &batch.keys,
            batch.latents.dims(),
            self.schedule.len(),
            simulate,
            &self.device,
        );
        if simulate {
            phase::<B, _>("student rollout (no grad)", &self.device, || {
                simulate_input(&*self.student.model().valid(), &self.schedule, &draws, text)
            })
        } else {
            data_latent_input(batch.latents.clone().inner(), &self.schedule, &draws)
        }
    }
}

impl<B: AutodiffBackend> TrainingMethod<B> for Dmd2<B> {
    fn micro_step(
        &mut self,
        batch: &Batch<B>,
        ctx: &StepContext,
    ) -> Result<StepOutput<B>, MethodError> {
        let [n, l, d] = batch.text.dims();
        let text = batch.text.clone();
        let text_i = text.clone().inner();
        let uncond_i = batch.negative_text.clone().inner().expand([n, l, d]);
        let (x_t, sigma) = self.rollout_input(batch, ctx, text_i.clone());
        let mut out = StepOutput::default();

        let sample = if self.cfg.generator_due(ctx.step) {
            let sigma_a = sigma_tensor::<B>(&sigma, &self.device);
            let x_t = Tensor::<B, 5>::from_inner(x_t);
            let (text_a, scale) = (text.clone(), ctx.grad_scale());
            let mut parts = None;
            if self.checkpoint_student {
                // The student's blocks are recomputed in the backward; the objective (teacher
                // and critic scores, GAN term) runs on its prediction.
                let t = timesteps_from_sigmas(sigma_a.clone());
                let objective = |v: Tensor<B, 5>| {
                    let x0 = x0_from_velocity(x_t.clone(), v.clone(), sigma_a.clone());
                    match self.generator_objective(x0, batch, ctx, text_a, uncond_i) {
                        Ok((loss, p)) => {
                            parts = Some(Ok(p));
                            loss
                        }
                        // The error is returned below; the backward of a zero loss is moot.
                        Err(e) => {
                            parts = Some(Err(e));
                            v.sum().mul_scalar(0.0)
                        }
                    }
                };
                let _p = enter::<B>("student forward + backward (checkpointed)", &self.device);
                let (_, stages) = self.student.checkpointed_grads(
                    x_t.clone(),
                    t,
                    text.clone(),
                    Box::new(objective),
                );
                for g in stages {
                    self.student.add_grads(g, scale);
                }
            } else {
                let (x0, _) = phase::<B, _>("student forward", &self.device, || {
                    student_x0(self.student.model(), x_t, sigma_a, text.clone())
                });
                let (loss, p) = self.generator_objective(x0, batch, ctx, text_a, uncond_i)?;
                // Only the student takes these gradients (the critic's and heads' are dropped).
                let _b = enter::<B>("student backward", &self.device);
                let grads = loss.backward();
                self.student.accumulate(&grads, scale);
                parts = Some(Ok(p));
            }
            let p = parts.expect("the generator objective ran")?;
            out = out.with_loss("generator_loss", p.dmd);
            if let Some(gan) = p.gan {
                out = out.with_loss("gan_generator_loss", gan);
            }
            p.sample
        } else {
            let _p = enter::<B>("student forward (no grad)", &self.device);
            student_x0(
                &*self.student.model().valid(),
                x_t,
                sigma_tensor::<Inner<B>>(&sigma, &self.device),
                text_i,
            )
            .0
        };
        self.critic_step(Tensor::from_inner(sample), batch, ctx, out)
    }

    fn sample(&mut self, req: &SampleRequest) -> Result<Vec<Vec<f32>>, MethodError> {
        let steps = req.steps.unwrap_or(self.cfg.default_sample_steps());
        let sigmas = self.schedule.sampling_sigmas(steps).ok_or_else(|| {
            MethodError::Unsupported(format!(
                "dmd2 samples with 1 to {} steps (the entries of `method.denoising_steps`), {steps} were requested",
                self.schedule.len()
            ))
        })?;
        let guidance = req.guidance.unwrap_or(1.0);
        let model = self.student.model().valid();
        Ok(sample_few_step(
            &*model,
            req,
            &sigmas,
            guidance,
            &self.device,
        ))
    }
}

#[cfg(test)]
mod tests;
