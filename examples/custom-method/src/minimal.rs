//! A minimal method plugin (shown verbatim in the README): flow matching at one fixed noise
//! level. One typetag impl plus one registration line make `kind = "fixed_sigma"` usable.

use burn::tensor::backend::AutodiffBackend;
use reel_core::config::{check, ConfigError};
use reel_core::method::{Batch, BuildContext, BuildMethod, MethodConfig, MethodError};
use reel_core::method::{StepContext, StepOutput, TrainingMethod};
use reel_core::role::{RoleHandle, RoleRequirement, TrainableRole};
use reel_models::WanModel;
use serde::{Deserialize, Serialize};

/// `[method] kind = "fixed_sigma"`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixedSigma {
    /// The noise level every sample is trained at.
    pub sigma: f64,
}

#[typetag::serde(name = "fixed_sigma")]
impl MethodConfig for FixedSigma {
    fn validate(&self) -> Result<(), ConfigError> {
        check::in_range("sigma", self.sigma, 0.0, 1.0)
    }
    fn roles(&self) -> Vec<RoleRequirement> {
        vec![RoleRequirement::trainable("student")]
    }
}
reel_core::register_plugin!(
    Method,
    "fixed_sigma",
    "Flow matching at one noise level (README example)"
);

impl<B: AutodiffBackend> BuildMethod<B> for FixedSigma {
    fn build_method(
        &self,
        ctx: &BuildContext<B>,
    ) -> Result<Box<dyn TrainingMethod<B>>, MethodError> {
        let model = reel_methods::common::load_role(ctx, "student")?;
        let student = ctx.trainable_role("student", model, None);
        Ok(Box::new(FixedSigmaMethod {
            sigma: self.sigma as f32,
            student,
        }))
    }
}

struct FixedSigmaMethod<B: AutodiffBackend> {
    sigma: f32,
    student: TrainableRole<B, WanModel<B>>,
}

impl<B: AutodiffBackend> TrainingMethod<B> for FixedSigmaMethod<B> {
    fn micro_step(
        &mut self,
        batch: &Batch<B>,
        ctx: &StepContext,
    ) -> Result<StepOutput<B>, MethodError> {
        let x0 = batch.latents.clone();
        let device = x0.device();
        let mut rng = ctx.rng.stream(ctx.step, ctx.micro as u64, "noise");
        let noise = rng.normal_tensor(x0.dims(), &device);
        let sigma = reel_core::flow::sigma_tensor::<B>(&vec![self.sigma; x0.dims()[0]], &device);
        let text = batch.text.clone();
        let (loss, _) =
            reel_methods::flow_matching_loss(self.student.model(), x0, noise, sigma, text, false);
        self.student.accumulate(&loss.backward(), ctx.grad_scale());
        Ok(StepOutput::default().with_loss("loss", loss))
    }
    fn roles_mut(&mut self) -> Vec<&mut dyn RoleHandle<B>> {
        vec![&mut self.student]
    }
    fn roles(&self) -> Vec<&dyn RoleHandle<B>> {
        vec![&self.student]
    }
}
