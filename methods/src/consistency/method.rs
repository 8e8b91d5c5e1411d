//! The runtime `consistency` method: one training step and the phase sampler.

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;

use reel_core::flow::{add_noise, sigma_tensor, timesteps_from_sigmas};
use reel_core::method::{
    Batch, BuildContext, BuildMethod, MethodError, SampleRequest, StepContext, StepOutput,
    TrainingMethod,
};
use reel_core::model::{DiffusionModel, DynModel};
use reel_core::role::{RoleHandle as _, TrainableRole};

use super::config::{ConsistencyConfig, TargetNetwork};
use super::schedule::PhaseSchedule;
use super::solver::{euler_segment, EulerSolver};
use crate::common::{per_sample_noise, per_sample_uniform, sample_euler_sigmas};
use crate::dmd2::CfgForm;

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Model timesteps `[B]` of host σ values.
fn timesteps<B: Backend>(sigmas: &[f64], device: &B::Device) -> Tensor<B, 1> {
    let s: Vec<f32> = sigmas.iter().map(|&s| s as f32).collect();
    timesteps_from_sigmas(sigma_tensor::<B>(&s, device))
}

/// The teacher's guided Euler step from `x` `[B, C, F, H, W]` at σ `from` to σ `to` (host,
/// per sample): `x + (to − from)·v̂` with `v̂ = form.combine(v(cond), v(uncond), w)`. The
/// unconditional pass is skipped when the combination ignores it. `text`, `uncond`:
/// `[B, L, D]`.
#[allow(clippy::too_many_arguments)]
pub fn teacher_step<B: Backend>(
    teacher: &dyn DiffusionModel<B>,
    x: Tensor<B, 5>,
    from: &[f64],
    to: &[f64],
    text: Tensor<B, 3>,
    uncond: Tensor<B, 3>,
    form: CfgForm,
    w: f64,
) -> Tensor<B, 5> {
    let n = x.dims()[0];
    let device = x.device();
    let v = if form.is_cond_only(w) {
        teacher.forward(x.clone(), timesteps::<B>(from, &device), text)
    } else {
        let both: Vec<f64> = from.iter().chain(from).copied().collect();
        let out = teacher.forward(
            Tensor::cat(vec![x.clone(), x.clone()], 0),
            timesteps::<B>(&both, &device),
            Tensor::cat(vec![text, uncond], 0),
        );
        form.combine(out.clone().narrow(0, 0, n), out.narrow(0, n, n), w)
    };
    euler_segment(x, v, from, to)
}

/// Where the training points of one micro-batch sit on the Euler grid.
#[derive(Debug, Clone, PartialEq)]
pub struct Points {
    /// σ of each sample's point `i`.
    pub sigma: Vec<f64>,
    /// σ of the teacher's next point `i − 1`.
    pub sigma_next: Vec<f64>,
    /// σ of the phase end of `i`.
    pub sigma_end: Vec<f64>,
}

impl Points {
    /// The σ values of `points` (each in `1..=N`) with `phases` phases.
    pub fn new(solver: &EulerSolver, points: &[usize], phases: usize) -> Self {
        let end = |i: usize| solver.sigma(solver.phase_end(i, phases));
        Self {
            sigma: points.iter().map(|&i| solver.sigma(i)).collect(),
            sigma_next: points.iter().map(|&i| solver.sigma(i - 1)).collect(),
            sigma_end: points.iter().map(|&i| end(i)).collect(),
        }
    }

    /// Whether every teacher step already lands on its phase end (then the target is the
    /// teacher's step itself and the target network is not needed).
    pub fn next_is_end(&self) -> bool {
        self.sigma_next == self.sigma_end
    }
}

/// The consistency target (no gradients): the target network's prediction from the teacher's
/// point `x_next` (at `points.sigma_next`), mapped to the phase end. When every point's next
/// point is its phase end the target is `x_next` itself and `target` is not called.
pub fn consistency_target<B: Backend, M: DiffusionModel<B>>(
    target: impl FnOnce() -> M,
    x_next: Tensor<B, 5>,
    points: &Points,
    text: Tensor<B, 3>,
) -> Tensor<B, 5> {
    if points.next_is_end() {
        return x_next;
    }
    let device = x_next.device();
    let v = target().forward(
        x_next.clone(),
        timesteps::<B>(&points.sigma_next, &device),
        text,
    );
    euler_segment(x_next, v, &points.sigma_next, &points.sigma_end)
}

impl<B: AutodiffBackend> BuildMethod<B> for ConsistencyConfig {
    fn build_method(
        &self,
        ctx: &BuildContext<B>,
    ) -> Result<Box<dyn TrainingMethod<B>>, MethodError> {
        let max_steps = ctx.training.max_steps;
        let student = ctx.trainable_role("student", ctx.model("student")?, None);
        let teacher = ctx.frozen_model("teacher")?;
        let target = match self.target {
            TargetNetwork::Student => None,
            TargetNetwork::Ema => {
                // A second copy of the student (own parameter ids, same adapter layout),
                // then an exact copy of its values (a LoRA adapter's random init included).
                let mut t = TrainableRole::new(
                    "target",
                    ctx.model("student")?,
                    ctx.role_optimizer("student", None),
                    None,
                    max_steps,
                );
                t.follow(&student, 0.0);
                Some(t)
            }
        };
        Ok(Box::new(Consistency {
            schedule: self.schedule(),
            solver: self.solver(),
            cfg: self.clone(),
            student,
            teacher,
            target,
            checkpointing: ctx.role("student")?.gradient_checkpointing,
            followed: 0,
            device: ctx.device.clone(),
        }))
    }
}

/// The runtime consistency-distillation method.
#[derive(reel_core::Roles)]
pub struct Consistency<B: AutodiffBackend> {
    pub(crate) cfg: ConsistencyConfig,
    pub(crate) schedule: PhaseSchedule,
    pub(crate) solver: EulerSolver,
    #[role]
    pub(crate) student: TrainableRole<B, DynModel<B>>,
    pub(crate) teacher: Box<dyn DiffusionModel<Inner<B>>>,
    /// The EMA target (role `target`, never given gradients), when `target = "ema"`.
    #[role]
    pub(crate) target: Option<TrainableRole<B, DynModel<B>>>,
    /// Block-level activation checkpointing of the student.
    pub(crate) checkpointing: bool,
    /// The student's optimizer steps when the EMA target last followed it (saved with the
    /// method's state).
    pub(crate) followed: u64,
    pub(crate) device: B::Device,
}

/// The key of [`Consistency`]'s method state: the student's optimizer steps when the EMA
/// target last followed it.
const FOLLOWED: &str = "target_followed_student_step";

impl<B: AutodiffBackend> TrainingMethod<B> for Consistency<B> {
    fn micro_step(
        &mut self,
        batch: &Batch<B>,
        ctx: &StepContext,
    ) -> Result<StepOutput<B>, MethodError> {
        // The EMA target follows the student after each of its updates, at the start of the
        // next step: once per update, counted by the student's optimizer steps, so that a
        // skipped update (non-finite) moves nothing and a checkpoint written mid-step (a
        // stop, a bad record) is not followed again on resume.
        let updates = self.student.optimizer_steps();
        if updates > self.followed {
            if let Some(t) = &mut self.target {
                t.follow(&self.student, self.cfg.ema_decay);
            }
            self.followed = updates;
        }
        let idx = &batch.keys;
        let dims = batch.latents.dims();
        let device = batch.latents.device();
        let [n, l, d] = batch.text.dims();
        let phases = self.schedule.phases_at(ctx.step);
        let points: Vec<usize> = per_sample_uniform(ctx, idx, "consistency-point")
            .into_iter()
            .map(|u| self.solver.point_from_uniform(u))
            .collect();
        let pts = Points::new(&self.solver, &points, phases);

        let s: Vec<f32> = pts.sigma.iter().map(|&s| s as f32).collect();
        let noise = per_sample_noise::<Inner<B>>(ctx, idx, dims, "consistency-noise", &device);
        let x_t = add_noise(
            batch.latents.clone().inner(),
            noise,
            sigma_tensor::<Inner<B>>(&s, &device),
        );
        let text_i = batch.text.clone().inner();

        // The teacher's guided step and the target from its point (no gradients).
        let x_next = teacher_step(
            &self.teacher,
            x_t.clone(),
            &pts.sigma,
            &pts.sigma_next,
            text_i.clone(),
            batch.negative_text.clone().inner().expand([n, l, d]),
            self.cfg.cfg_form,
            self.cfg.distill_cfg,
        );
        let target = consistency_target(
            || match &self.target {
                Some(t) => t.model().valid(),
                None => self.student.model().valid(),
            },
            x_next,
            &pts,
            text_i,
        );

        // The student's phase-end prediction (with gradients) against the target.
        let x_t_ad = Tensor::<B, 5>::from_inner(x_t);
        let t = timesteps::<B>(&pts.sigma, &device);
        let mut out = None;
        let objective = |v: Tensor<B, 5>| {
            let pred = euler_segment(x_t_ad.clone(), v, &pts.sigma, &pts.sigma_end);
            let target = Tensor::from_inner(target);
            let distance = self.cfg.loss.loss(pred.clone(), target, self.cfg.huber_c);
            if self.cfg.pred_decay_weight <= 0.0 {
                out = Some(StepOutput::default().with_loss("loss", distance.clone().detach()));
                return distance;
            }
            let decay = self.cfg.pred_decay_type.loss(pred);
            let total =
                (distance.clone()).add(decay.clone().mul_scalar(self.cfg.pred_decay_weight));
            out = Some(
                StepOutput::default()
                    .with_loss("loss", total.clone().detach())
                    .with_loss("consistency_loss", distance.detach())
                    .with_loss("pred_decay_loss", decay.detach()),
            );
            total
        };
        let scale = ctx.grad_scale();
        if self.checkpointing {
            let (_, stages) = (self.student).checkpointed_grads(
                x_t_ad.clone(),
                t,
                batch.text.clone(),
                Box::new(objective),
            );
            for g in stages {
                self.student.add_grads(g, scale);
            }
        } else {
            let v = self
                .student
                .model()
                .forward(x_t_ad.clone(), t, batch.text.clone());
            let grads = objective(v).backward();
            self.student.accumulate(&grads, scale);
        }
        Ok(out.expect("the objective ran"))
    }

    fn state(&self) -> serde_json::Value {
        serde_json::json!({ FOLLOWED: self.followed })
    }

    fn load_state(&mut self, state: &serde_json::Value) -> Result<(), MethodError> {
        // A checkpoint of an earlier version (no state): as that version did, follow at the
        // next step (right for its due checkpoints, saved between an update and the move
        // after it; one saved mid-step by a stop or a bad record was already followed).
        let before = self.student.optimizer_steps().saturating_sub(1);
        self.followed = state
            .get(FOLLOWED)
            .and_then(|v| v.as_u64())
            .unwrap_or(before);
        Ok(())
    }

    fn sample(&mut self, req: &SampleRequest) -> Result<Vec<Vec<f32>>, MethodError> {
        let steps = req.steps.unwrap_or(self.cfg.default_sample_steps());
        let n = self.solver.points();
        if !(1..=n).contains(&steps) {
            return Err(MethodError::Unsupported(format!(
                "consistency samples with 1 to {n} steps (one per phase, at most \
                 `method.num_euler_timesteps`), {steps} were requested"
            )));
        }
        let guidance = req.guidance.unwrap_or(self.cfg.guidance_scale);
        Ok(sample_euler_sigmas(
            &*self.student.model().valid(),
            req,
            &self.solver.phase_sigmas(steps),
            guidance,
            &self.device,
        ))
    }
}
