//! `kind = "finetune"`: flow-matching fine-tuning of the `student` role.
//!
//! Per sample: σ from the configured density, shifted; `x_t = (1−σ)·x0 + σ·ε`; timestep
//! `1000·σ`; loss `MSE(v, ε − x0)` in float32 (or, with `precondition_outputs`, the x0
//! prediction `x_t − σ·v` against `x0`). Classifier-free-guidance dropout replaces the text of
//! a sample with the negative embedding with probability `cfg_dropout`, decided from the run
//! seed, the step and the sample's stream position (`Batch::keys`).

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

use reel_core::config::{check, ConfigError};
use reel_core::flow::{
    add_noise, sigma_tensor, timesteps_from_sigmas, velocity_target, x0_from_velocity,
    TimestepDensity,
};
use reel_core::method::{
    Batch, BuildContext, BuildMethod, MethodConfig, MethodError, SampleRequest, StepContext,
    StepOutput, TrainingMethod,
};
use reel_core::model::{DiffusionModel, DynModel};
use reel_core::profile::phase;
use reel_core::role::{RoleRequirement, TrainableRole};

use crate::common::{
    drop_text, per_sample_noise, per_sample_sigmas, per_sample_uniform, sample_euler,
};

/// `[method] kind = "finetune"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinetuneConfig {
    /// Density of training σ before the shift (`{ kind = "uniform" }`, `{ kind =
    /// "logit_normal", logit_mean = 0.0, logit_std = 1.0 }`, `{ kind = "mode", mode_scale =
    /// 1.29 }`).
    #[serde(default)]
    pub sigma_density: TimestepDensity,
    /// Timestep shift applied to training σ (`1` = none; Wan uses 3–5).
    #[serde(default = "one")]
    pub shift: f64,
    /// Regress the x0 prediction instead of the velocity.
    #[serde(default)]
    pub precondition_outputs: bool,
    /// Probability of replacing a sample's text with the negative embedding.
    #[serde(default)]
    pub cfg_dropout: f64,
    /// Default sampling steps for validation / `reel sample`.
    #[serde(default = "fifty")]
    pub sample_steps: usize,
    /// Default guidance scale for sampling.
    #[serde(default = "one")]
    pub guidance_scale: f64,
    /// Shift of the sampling schedule (defaults to `shift`).
    #[serde(default)]
    pub sample_shift: Option<f64>,
}

fn one() -> f64 {
    1.0
}
fn fifty() -> usize {
    50
}

impl Default for FinetuneConfig {
    fn default() -> Self {
        Self {
            sigma_density: TimestepDensity::Uniform {},
            shift: 1.0,
            precondition_outputs: false,
            cfg_dropout: 0.0,
            sample_steps: 50,
            guidance_scale: 1.0,
            sample_shift: None,
        }
    }
}

#[reel_core::plugin(
    name = "finetune",
    summary = "Flow-matching fine-tuning of the student (velocity or x0 target, CFG dropout)"
)]
impl MethodConfig for FinetuneConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        self.sigma_density
            .validate()
            .map_err(|e| e.in_section("sigma_density"))?;
        check::positive_f64("shift", self.shift)?;
        check::in_half_open("cfg_dropout", self.cfg_dropout, 0.0, 1.0)?;
        check::sampling_steps("sample_steps", self.sample_steps)?;
        check::positive_f64("guidance_scale", self.guidance_scale)?;
        if let Some(s) = self.sample_shift {
            check::positive_f64("sample_shift", s)?;
        }
        Ok(())
    }

    fn roles(&self) -> Vec<RoleRequirement> {
        vec![RoleRequirement::trainable("student")]
    }

    fn supports_gradient_checkpointing(&self) -> bool {
        true
    }
}

impl<B: AutodiffBackend> BuildMethod<B> for FinetuneConfig {
    fn build_method(
        &self,
        ctx: &BuildContext<B>,
    ) -> Result<Box<dyn TrainingMethod<B>>, MethodError> {
        let student = ctx.trainable_role("student", ctx.model("student")?, None);
        Ok(Box::new(Finetune {
            cfg: self.clone(),
            student,
            checkpointing: ctx.role("student")?.gradient_checkpointing,
            device: ctx.device.clone(),
        }))
    }
}

/// The runtime fine-tuning method.
#[derive(reel_core::Roles)]
pub struct Finetune<B: AutodiffBackend> {
    cfg: FinetuneConfig,
    #[role]
    student: TrainableRole<B, DynModel<B>>,
    /// Block-level activation checkpointing (`models.student.gradient_checkpointing`).
    checkpointing: bool,
    device: B::Device,
}

/// The fine-tuning loss of one batch with given σ `[B]` and noise: returns `(loss, pred)`.
/// Public so the golden test can drive it with the fixture's σ and noise.
pub fn flow_matching_loss<B: burn::tensor::backend::Backend>(
    model: &dyn DiffusionModel<B>,
    x0: Tensor<B, 5>,
    noise: Tensor<B, 5>,
    sigma: Tensor<B, 1>,
    text: Tensor<B, 3>,
    precondition_outputs: bool,
) -> (Tensor<B, 1>, Tensor<B, 5>) {
    let x_t = add_noise(x0.clone(), noise.clone(), sigma.clone());
    let pred = model.forward(x_t.clone(), timesteps_from_sigmas(sigma.clone()), text);
    let loss = loss_of_prediction(pred.clone(), x_t, x0, noise, sigma, precondition_outputs);
    (loss, pred)
}

/// The flow-matching loss of a prediction `pred` made from `x_t`: MSE against the velocity
/// `noise − x0`, or (with `precondition_outputs`) of the implied x0 against `x0`.
pub fn loss_of_prediction<B: burn::tensor::backend::Backend>(
    pred: Tensor<B, 5>,
    x_t: Tensor<B, 5>,
    x0: Tensor<B, 5>,
    noise: Tensor<B, 5>,
    sigma: Tensor<B, 1>,
    precondition_outputs: bool,
) -> Tensor<B, 1> {
    if precondition_outputs {
        x0_from_velocity(x_t, pred, sigma).sub(x0).square().mean()
    } else {
        pred.sub(velocity_target(x0, noise)).square().mean()
    }
}

impl<B: AutodiffBackend> TrainingMethod<B> for Finetune<B> {
    fn micro_step(
        &mut self,
        batch: &Batch<B>,
        ctx: &StepContext,
    ) -> Result<StepOutput<B>, MethodError> {
        let dims = batch.latents.dims();
        let idx = &batch.keys;
        let sigmas = per_sample_sigmas(ctx, idx, &self.cfg.sigma_density, self.cfg.shift, "sigma");
        let noise = per_sample_noise::<B>(ctx, idx, dims, "noise", &self.device);
        let drop: Vec<bool> = per_sample_uniform(ctx, idx, "cfg-dropout")
            .into_iter()
            .map(|u| u < self.cfg.cfg_dropout)
            .collect();
        let text = drop_text(batch.text.clone(), batch.negative_text.clone(), &drop);
        let sigma = sigma_tensor::<B>(&sigmas, &self.device);
        let x0 = batch.latents.clone();
        let loss = if self.checkpointing {
            // Block-level activation checkpointing: the backward runs in stages, each giving
            // the gradients of its own parameters.
            let x_t = add_noise(x0.clone(), noise.clone(), sigma.clone());
            let t = timesteps_from_sigmas(sigma.clone());
            let pre = self.cfg.precondition_outputs;
            phase::<B, _>(
                "student forward + backward (checkpointed)",
                &self.device,
                || {
                    self.student.checkpointed_backward(
                        x_t.clone(),
                        t,
                        text,
                        Box::new(|pred| loss_of_prediction(pred, x_t, x0, noise, sigma, pre)),
                        ctx.grad_scale(),
                    )
                },
            )
        } else {
            let (loss, _) = phase::<B, _>("student forward", &self.device, || {
                flow_matching_loss(
                    self.student.model(),
                    x0,
                    noise,
                    sigma,
                    text,
                    self.cfg.precondition_outputs,
                )
            });
            phase::<B, _>("student backward", &self.device, || {
                let grads = loss.backward();
                self.student.accumulate(&grads, ctx.grad_scale());
            });
            loss
        };
        Ok(StepOutput::default().with_loss("loss", loss))
    }

    fn sample(&mut self, req: &SampleRequest) -> Result<Vec<Vec<f32>>, MethodError> {
        let model = self.student.model().valid();
        let steps = req.steps.unwrap_or(self.cfg.sample_steps);
        let guidance = req.guidance.unwrap_or(self.cfg.guidance_scale);
        let shift = self.cfg.sample_shift.unwrap_or(self.cfg.shift);
        Ok(sample_euler(
            &*model,
            req,
            steps,
            guidance,
            shift,
            &self.device,
        ))
    }
}
