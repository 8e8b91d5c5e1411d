//! The runtime `adversarial` method.
//!
//! Per micro-batch, with per-sample σ (student input) and σ' (comparison level), both drawn
//! from `sigma_density` and shifted:
//!
//! ```text
//! x_t    = (1−σ)·x0 + σ·ε                 v = student(x_t, 1000σ, text)
//! fake   = x_t − σ·v                      (the student's one-step x0)
//! fake'  = (1−σ')·fake + σ'·ε'            real' = (1−σ')·x0 + σ'·ε'
//! D(·)   = heads(teacher hidden states at σ')            (teacher frozen)
//! student loss = generator_weight · L_G(D(fake')) + flow_matching_weight · ‖v − (ε − x0)‖²
//! discriminator loss (steps with step % discriminator_interval == 0) =
//!     discriminator_weight · L_D(D(real'), D(stopgrad fake'))
//!   + r1_weight / 2 · (D(real' + ε_r1·n) − D(real'))² / ε_r1²
//! ```
//!
//! The student's backward reaches only the student (the teacher is frozen and the heads'
//! gradients of that pass are dropped); the discriminator's backward starts from detached
//! inputs, so it reaches only the heads.

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;

use reel_core::flow::{add_noise, sigma_tensor, timesteps_from_sigmas};
use reel_core::flow::{velocity_target, x0_from_velocity};
use reel_core::method::{
    Batch, BuildContext, BuildMethod, MethodError, SampleRequest, StepContext, StepOutput,
    TrainingMethod,
};
use reel_core::model::{DiffusionModel, DynModel};
use reel_core::role::TrainableRole;

use super::config::AdversarialConfig;
use super::heads::DiscriminatorHeads;
use super::loss::approx_r1;
use crate::common::{per_sample_noise, per_sample_sigmas, sample_euler};

impl<B: AutodiffBackend> BuildMethod<B> for AdversarialConfig {
    fn build_method(
        &self,
        ctx: &BuildContext<B>,
    ) -> Result<Box<dyn TrainingMethod<B>>, MethodError> {
        let student = ctx.trainable_role("student", ctx.model("student")?, None);
        // The feature network stays on the autodiff backend (the student's gradient flows
        // through it to its input) with every parameter frozen.
        let teacher = ctx.model("teacher")?.frozen();
        let tc = teacher.info();
        let heads = self
            .heads
            .init::<B>(tc.hidden_size, tc.num_layers, &ctx.device)
            .map_err(|e| MethodError::Config(e.in_section("method.heads")))?;
        let discriminator = TrainableRole::new(
            "discriminator",
            heads,
            ctx.role_optimizer("discriminator", self.discriminator_optimizer.as_ref()),
            ctx.training.max_grad_norm,
            ctx.training.max_steps,
        );
        Ok(Box::new(Adversarial {
            cfg: self.clone(),
            student,
            teacher,
            discriminator,
            checkpointing: ctx.role("student")?.gradient_checkpointing,
            device: ctx.device.clone(),
        }))
    }
}

/// The runtime adversarial method.
#[derive(reel_core::Roles)]
pub struct Adversarial<B: AutodiffBackend> {
    cfg: AdversarialConfig,
    #[role]
    student: TrainableRole<B, DynModel<B>>,
    /// Frozen feature network.
    teacher: DynModel<B>,
    #[role]
    discriminator: TrainableRole<B, DiscriminatorHeads<B>>,
    /// Block-level activation checkpointing of the student.
    checkpointing: bool,
    device: B::Device,
}

impl<B: AutodiffBackend> Adversarial<B> {
    /// Shifted σ per sample from the run's generators (stream `name`).
    fn sigmas(&self, batch: &Batch<B>, ctx: &StepContext, name: &str) -> Vec<f32> {
        per_sample_sigmas(
            ctx,
            &batch.keys,
            &self.cfg.sigma_density,
            self.cfg.shift,
            name,
        )
    }

    /// Logits on the inner backend (no graph through the teacher), lifted back as constants.
    fn features_detached(
        &self,
        x: Tensor<B, 5>,
        t: Tensor<B, 1>,
        text: Tensor<B, 3>,
    ) -> Vec<Tensor<B, 3>> {
        let teacher = self.teacher.valid();
        let (_, feats) = teacher.forward_hidden_states(
            x.inner(),
            t.inner(),
            text.inner(),
            self.discriminator.model().blocks(),
        );
        feats.into_iter().map(Tensor::from_inner).collect()
    }
}

impl<B: AutodiffBackend> TrainingMethod<B> for Adversarial<B> {
    fn micro_step(
        &mut self,
        batch: &Batch<B>,
        ctx: &StepContext,
    ) -> Result<StepOutput<B>, MethodError> {
        let dims = batch.latents.dims();
        let idx = &batch.keys;
        let x0 = batch.latents.clone();
        let text = batch.text.clone();
        let sigma = sigma_tensor::<B>(&self.sigmas(batch, ctx, "sigma"), &self.device);
        let sigma_d = sigma_tensor::<B>(&self.sigmas(batch, ctx, "sigma-disc"), &self.device);
        let t_d = timesteps_from_sigmas(sigma_d.clone());
        let noise = per_sample_noise::<B>(ctx, idx, dims, "noise", &self.device);
        let noise_d = per_sample_noise::<B>(ctx, idx, dims, "noise-disc", &self.device);

        // Student (generator) step: the objective on the student's velocity `v`.
        let x_t = add_noise(x0.clone(), noise.clone(), sigma.clone());
        let t = timesteps_from_sigmas(sigma.clone());
        let mut parts = None;
        let objective = |v: Tensor<B, 5>| {
            let fake = x0_from_velocity(x_t.clone(), v.clone(), sigma);
            let fake_d = add_noise(fake, noise_d.clone(), sigma_d.clone());
            let logits = (self.discriminator.model()).judge(
                &self.teacher,
                fake_d.clone(),
                t_d.clone(),
                text.clone(),
            );
            let gen_loss = self.cfg.gan_loss.generator_heads(logits);
            let mut loss = gen_loss.clone().mul_scalar(self.cfg.generator_weight);
            let mut fm_loss = None;
            if self.cfg.flow_matching_weight > 0.0 {
                let fm = v.sub(velocity_target(x0.clone(), noise)).square().mean();
                loss = loss + fm.clone().mul_scalar(self.cfg.flow_matching_weight);
                fm_loss = Some(fm.detach());
            }
            parts = Some((gen_loss.detach(), fm_loss, fake_d.detach()));
            loss
        };
        let scale = ctx.grad_scale();
        if self.checkpointing {
            let (_, stages) =
                self.student
                    .checkpointed_grads(x_t.clone(), t, text.clone(), Box::new(objective));
            for g in stages {
                self.student.add_grads(g, scale);
            }
        } else {
            let v = self.student.model().forward(x_t.clone(), t, text.clone());
            let grads = objective(v).backward();
            self.student.accumulate(&grads, scale);
        }
        let (gen_loss, fm_loss, fake_d) = parts.expect("the generator objective ran");
        let mut out = StepOutput::default().with_loss("generator_loss", gen_loss);
        if let Some(fm) = fm_loss {
            out = out.with_loss("flow_matching_loss", fm);
        }

        // Discriminator step, from detached inputs.
        if ctx
            .step
            .is_multiple_of(self.cfg.discriminator_interval as u64)
        {
            let real_d = add_noise(x0, noise_d, sigma_d);
            let heads = self.discriminator.model();
            let real_logits =
                heads.forward(self.features_detached(real_d.clone(), t_d.clone(), text.clone()));
            let fake_logits =
                heads.forward(self.features_detached(fake_d, t_d.clone(), text.clone()));
            let mut d_loss = self
                .cfg
                .gan_loss
                .discriminator_heads(real_logits.clone(), fake_logits);
            out = out.with_loss("discriminator_loss", d_loss.clone());
            d_loss = d_loss.mul_scalar(self.cfg.discriminator_weight);
            if self.cfg.r1_weight > 0.0 {
                let eps = self.cfg.r1_epsilon;
                let n = per_sample_noise::<B>(ctx, idx, dims, "r1", &self.device);
                let perturbed =
                    heads.forward(self.features_detached(real_d + n.mul_scalar(eps), t_d, text));
                let k = perturbed.len() as f64;
                let r1 = real_logits
                    .into_iter()
                    .zip(perturbed)
                    .map(|(r, p)| approx_r1(r, p, eps))
                    .reduce(|a, b| a + b)
                    .expect("at least one head")
                    .div_scalar(k);
                out = out.with_loss("r1", r1.clone());
                d_loss = d_loss + r1.mul_scalar(self.cfg.r1_weight / 2.0);
            }
            let grads = d_loss.backward();
            self.discriminator.accumulate(&grads, ctx.grad_scale());
        }
        Ok(out)
    }

    fn sample(&mut self, req: &SampleRequest) -> Result<Vec<Vec<f32>>, MethodError> {
        let model = self.student.model().valid();
        let steps = req.steps.unwrap_or(self.cfg.sample_steps);
        let guidance = req.guidance.unwrap_or(self.cfg.guidance_scale);
        Ok(sample_euler(
            &*model,
            req,
            steps,
            guidance,
            self.cfg.shift,
            &self.device,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{step_ctx, tiny_batch};
    use reel_core::optim::OptimizerConfig;
    use reel_core::role::{RoleHandle, RoleModule};
    use reel_models::WanConfig;

    type Ad = burn::backend::Autodiff<burn::backend::NdArray>;

    /// A method on `wan-tiny` with student = teacher weights, two heads, R1 and a
    /// flow-matching term on.
    fn method(interval: usize) -> Adversarial<Ad> {
        let dev = Default::default();
        let wan = WanConfig::preset("wan-tiny").unwrap();
        let mut cfg = AdversarialConfig {
            discriminator_interval: interval,
            flow_matching_weight: 0.5,
            r1_weight: 1.0,
            r1_epsilon: 0.05,
            ..AdversarialConfig::default()
        };
        cfg.heads.stride = 1;
        cfg.heads.hidden = 8;
        let opt = OptimizerConfig::default();
        let heads = cfg
            .heads
            .init::<Ad>(wan.inner_dim(), wan.num_layers, &dev)
            .unwrap();
        Adversarial {
            student: TrainableRole::new(
                "student",
                DynModel::new(wan.init_seeded(&dev, 3)),
                opt.clone(),
                None,
                10,
            ),
            teacher: DynModel::new(wan.init_seeded::<Ad>(&dev, 3)).frozen(),
            discriminator: TrainableRole::new("discriminator", heads, opt, None, 10),
            cfg,
            checkpointing: false,
            device: dev,
        }
    }

    fn batch() -> Batch<Ad> {
        tiny_batch(4, 3, 9, [0, 1])
    }

    fn ctx(step: u64) -> StepContext {
        step_ctx(step, 1)
    }

    fn weights<R: RoleHandle<Ad> + ?Sized>(role: &R) -> Vec<Vec<f32>> {
        role.trainable_tensors()
            .into_iter()
            .map(|(_, t)| t.to_vec::<f32>().unwrap())
            .collect()
    }

    #[test]
    fn generator_step_never_touches_the_discriminator() {
        let _turn = reel_core::parallel::autodiff_turn();
        // Step 1 with interval 2: only the generator step runs.
        let mut m = method(2);
        let out = m.micro_step(&batch(), &ctx(1)).unwrap();
        let names: Vec<&str> = out.losses.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["generator_loss", "flow_matching_loss"]);
        assert!(
            m.student.grad_norm_sq().is_some(),
            "the student has gradients"
        );
        assert!(
            m.discriminator.grad_norm_sq().is_none(),
            "the generator step gives the discriminator no gradients"
        );
    }

    #[test]
    fn discriminator_step_never_touches_the_student_or_the_teacher() {
        let _turn = reel_core::parallel::autodiff_turn();
        // Step 3: interval 3 runs the discriminator step, interval 2 does not. The student's
        // update must be identical, the heads must move, the teacher must not.
        let (mut with_d, mut without_d) = (method(3), method(2));
        let teacher_before = with_d
            .teacher
            .all_params()
            .into_iter()
            .map(|p| p.value.into_data().to_vec::<f32>().unwrap())
            .collect::<Vec<_>>();
        let heads_before = weights(&with_d.discriminator);
        let out = with_d.micro_step(&batch(), &ctx(3)).unwrap();
        let names: Vec<&str> = out.losses.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "generator_loss",
                "flow_matching_loss",
                "discriminator_loss",
                "r1"
            ]
        );
        without_d.micro_step(&batch(), &ctx(3)).unwrap();
        for m in [&mut with_d, &mut without_d] {
            for role in m.roles_mut() {
                if role.grad_norm_sq().is_some() {
                    role.apply_update(3, 1.0);
                }
            }
        }
        assert_eq!(
            weights(&with_d.student),
            weights(&without_d.student),
            "the discriminator step changed the student's update"
        );
        assert_ne!(
            weights(&with_d.discriminator),
            heads_before,
            "heads trained"
        );
        assert_eq!(weights(&without_d.discriminator), heads_before);
        let teacher_after = with_d
            .teacher
            .all_params()
            .into_iter()
            .map(|p| p.value.into_data().to_vec::<f32>().unwrap())
            .collect::<Vec<_>>();
        assert_eq!(teacher_before, teacher_after, "the teacher never changes");
    }
}
