//! A minimal method plugin (shown verbatim in docs/extending.md): flow matching at one fixed noise
//! level. `#[plugin]` on the config makes `kind = "fixed_sigma"` usable; `#[derive(Roles)]`
//! hands the student to the trainer. It trains any registered model architecture.

use burn::tensor::backend::AutodiffBackend;
use reel_core::config::{check, ConfigError};
use reel_core::method::{Batch, BuildContext, BuildMethod, MethodConfig, MethodError};
use reel_core::method::{StepContext, StepOutput, TrainingMethod};
use reel_core::model::DynModel;
use reel_core::role::{RoleRequirement, TrainableRole};
use reel_methods::common::per_sample_noise;
use serde::{Deserialize, Serialize};

/// `[method] kind = "fixed_sigma"`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixedSigma {
    /// The noise level every sample is trained at.
    pub sigma: f64,
}

#[reel_core::plugin(name = "fixed_sigma", summary = "Flow matching at one noise level")]
impl MethodConfig for FixedSigma {
    fn validate(&self) -> Result<(), ConfigError> {
        check::in_range("sigma", self.sigma, 0.0, 1.0)
    }
    fn roles(&self) -> Vec<RoleRequirement> {
        vec![RoleRequirement::trainable("student")]
    }
}

impl<B: AutodiffBackend> BuildMethod<B> for FixedSigma {
    fn build_method(
        &self,
        ctx: &BuildContext<B>,
    ) -> Result<Box<dyn TrainingMethod<B>>, MethodError> {
        let student = ctx.trainable_role("student", ctx.model("student")?, None);
        Ok(Box::new(FixedSigmaMethod {
            sigma: self.sigma as f32,
            student,
        }))
    }
}

#[derive(reel_core::Roles)]
struct FixedSigmaMethod<B: AutodiffBackend> {
    sigma: f32,
    #[role]
    student: TrainableRole<B, DynModel<B>>,
}

impl<B: AutodiffBackend> TrainingMethod<B> for FixedSigmaMethod<B> {
    fn micro_step(
        &mut self,
        batch: &Batch<B>,
        ctx: &StepContext,
    ) -> Result<StepOutput<B>, MethodError> {
        let x0 = batch.latents.clone();
        let device = x0.device();
        // Noise keyed by (step, stream position): accumulation equals a larger batch.
        let noise = per_sample_noise::<B>(ctx, &batch.keys, x0.dims(), "noise", &device);
        let sigma = reel_core::flow::sigma_tensor::<B>(&vec![self.sigma; x0.dims()[0]], &device);
        let text = batch.text.clone();
        let (loss, _) =
            reel_methods::flow_matching_loss(self.student.model(), x0, noise, sigma, text, false);
        self.student.accumulate(&loss.backward(), ctx.grad_scale());
        Ok(StepOutput::default().with_loss("loss", loss))
    }
}
