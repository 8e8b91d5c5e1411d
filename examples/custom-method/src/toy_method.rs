//! `[method] kind = "toy"`: the student regresses a fixed linear target of the latents (plus
//! per-sample noise from the run's generators); the critic regresses the student's detached
//! output. The critic updates every step, the student every `student_interval` steps. The
//! roles' models are [`ToyModel`]s (linear maps) built by the method itself; its role tables
//! name `arch = "toy"` for their `init_seed`.

use burn::module::{Module, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use serde::{Deserialize, Serialize};

use reel_core::config::{check, ConfigError};
use reel_core::method::{
    Batch, BuildContext, BuildMethod, MethodConfig, MethodError, StepContext, StepOutput,
    TrainingMethod,
};
use reel_core::rng::StreamRng;
use reel_core::role::{RoleRequirement, TrainableRole};

/// A linear model `y = x·Wᵀ + b` with `weight` `[out, in]`.
#[derive(Module, Debug)]
pub struct ToyModel<B: Backend> {
    /// `[out, in]`.
    pub weight: Param<Tensor<B, 2>>,
    /// `[out]`.
    pub bias: Param<Tensor<B, 1>>,
}

impl<B: Backend> ToyModel<B> {
    /// Deterministic init from `seed`.
    pub fn new(inputs: usize, outputs: usize, seed: u64, device: &B::Device) -> Self {
        let mut rng = StreamRng::from_seed(seed);
        let w: Vec<f32> = rng
            .normal_vec(inputs * outputs)
            .iter()
            .map(|v| v / (inputs as f32).sqrt())
            .collect();
        Self {
            weight: Param::from_tensor(Tensor::from_data(
                TensorData::new(w, [outputs, inputs]),
                device,
            )),
            bias: Param::from_tensor(Tensor::zeros([outputs], device)),
        }
    }

    /// `x` `[B, in]` → `[B, out]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let out = self.bias.dims()[0];
        x.matmul(self.weight.val().transpose())
            .add(self.bias.val().reshape([1, out]))
    }
}

/// `[method] kind = "toy"`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToyMethodConfig {
    /// The student updates on steps where `step % student_interval == 0`.
    #[serde(default = "one")]
    pub student_interval: u64,
    /// Standard deviation of the target noise.
    #[serde(default)]
    pub noise: f64,
    /// Scale of the targets (large values make large gradients, for clipping tests).
    #[serde(default = "one_f")]
    pub target_scale: f64,
}
fn one() -> u64 {
    1
}
fn one_f() -> f64 {
    1.0
}

/// The runtime toy method.
#[derive(reel_core::Roles)]
pub struct ToyMethod<B: AutodiffBackend> {
    cfg: ToyMethodConfig,
    #[role]
    student: TrainableRole<B, ToyModel<B>>,
    #[role]
    critic: TrainableRole<B, ToyModel<B>>,
    device: B::Device,
}

const OUT: usize = 3;

impl<B: AutodiffBackend> BuildMethod<B> for ToyMethodConfig {
    fn build_method(
        &self,
        ctx: &BuildContext<B>,
    ) -> Result<Box<dyn TrainingMethod<B>>, MethodError> {
        let n = ctx.data_spec.latent_numel();
        let s = ctx.role("student")?;
        let c = ctx.role("critic")?;
        let student = ToyModel::new(n, OUT, s.init_seed.unwrap_or(1), &ctx.device);
        let critic = ToyModel::new(OUT, OUT, c.init_seed.unwrap_or(2), &ctx.device);
        Ok(Box::new(ToyMethod {
            cfg: self.clone(),
            student: ctx.trainable_role("student", student, None),
            critic: ctx.trainable_role("critic", critic, None),
            device: ctx.device.clone(),
        }))
    }
}

#[reel_core::plugin(name = "toy", summary = "Toy two-role regression (example crate)")]
impl MethodConfig for ToyMethodConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        check::positive_u64("student_interval", self.student_interval)
    }
    fn roles(&self) -> Vec<RoleRequirement> {
        vec![
            RoleRequirement::trainable("student"),
            RoleRequirement::trainable("critic"),
        ]
    }
}

impl<B: AutodiffBackend> TrainingMethod<B> for ToyMethod<B> {
    fn micro_step(
        &mut self,
        batch: &Batch<B>,
        ctx: &StepContext,
    ) -> Result<StepOutput<B>, MethodError> {
        let [b, c, f, h, w] = batch.latents.dims();
        let x = batch.latents.clone().reshape([b, c * f * h * w]);
        // Fixed target map plus per-sample noise (keyed by stream position, so accumulation
        // over micro-batches equals one big batch).
        let target_map = ToyModel::<B>::new(c * f * h * w, OUT, 99, &self.device);
        let mut noise = Vec::with_capacity(b * OUT);
        for &k in &batch.keys {
            let mut r = ctx.rng.stream(ctx.step, k, "toy-noise");
            noise.extend(
                r.normal_vec(OUT)
                    .into_iter()
                    .map(|v| v * self.cfg.noise as f32),
            );
        }
        let noise = Tensor::<B, 2>::from_data(TensorData::new(noise, [b, OUT]), &self.device);
        let target = target_map
            .forward(x.clone())
            .detach()
            .mul_scalar(self.cfg.target_scale)
            .add(noise);
        let mut out = StepOutput::default();
        let pred = self.student.model().forward(x);
        let student_due = ctx.step.is_multiple_of(self.cfg.student_interval);
        if student_due {
            let loss = pred.clone().sub(target).square().mean();
            let grads = loss.backward();
            self.student.accumulate(&grads, ctx.grad_scale());
            out = out.with_loss("student_loss", loss);
        }
        let critic_pred = self.critic.model().forward(pred.detach());
        let critic_loss = critic_pred
            .sub(
                batch
                    .latents
                    .clone()
                    .reshape([b, c * f * h * w])
                    .narrow(1, 0, OUT),
            )
            .square()
            .mean();
        let grads = critic_loss.backward();
        self.critic.accumulate(&grads, ctx.grad_scale());
        Ok(out.with_loss("critic_loss", critic_loss))
    }
}
