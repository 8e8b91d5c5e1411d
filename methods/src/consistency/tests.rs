//! Unit tests of the consistency method on `wan-tiny`: the solver against the teacher's Euler
//! sampler, the target mapping, the EMA target (never any gradients) and the sampler.

use std::collections::BTreeMap;

use burn::tensor::Tensor;

use reel_core::data::{DataSpec, Prompt, TextCondition};
use reel_core::flow::x0_from_velocity;
use reel_core::method::{Batch, SampleRequest, StepContext, TrainingMethod};
use reel_core::model::DynModel;
use reel_core::optim::OptimizerConfig;
use reel_core::rng::StreamRng;
use reel_core::role::{RoleHandle, TrainableRole};
use reel_models::{WanConfig, WanModel};

use super::*;
use crate::common::{request_noise, request_text, sample_euler, split_clips};
use crate::dmd2::CfgForm;
use crate::test_util::{recorder, step_ctx, tiny_batch, TINY_SPEC};

type B = burn::backend::Autodiff<burn::backend::NdArray>;
type I = burn::backend::NdArray;

const SPEC: DataSpec = TINY_SPEC;

fn tiny() -> WanConfig {
    WanConfig::preset("wan-tiny").unwrap()
}

fn request(steps: Option<usize>, guidance: Option<f64>) -> SampleRequest {
    let prompt = |v: f32| Prompt {
        caption: String::new(),
        text: TextCondition {
            embedding: (0..8 * 32).map(|k| v * (k % 7) as f32).collect(),
            mask: vec![true; 8],
        },
    };
    SampleRequest {
        prompts: vec![prompt(0.1), prompt(-0.2)],
        negative: None,
        steps,
        guidance,
        seed: 7,
        first_index: 0,
        spec: SPEC,
        progress: None,
    }
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn euler_solver_reproduces_the_teachers_50_step_sample() {
    let dev = Default::default();
    let teacher: WanModel<I> = tiny().init_seeded(&dev, 3);
    let (g, shift) = (2.5, 3.0);
    let req = request(None, None);
    let reference = sample_euler(&teacher, &req, 50, g, shift, &dev);

    // With as many phases as points, each training target is the teacher's Euler step
    // itself; chaining them from pure noise must give the 50-step sample.
    let solver = EulerSolver::new(50, shift);
    let (cond, uncond) = request_text::<I>(&req, &dev);
    for (form, w) in [(CfgForm::Uncond, g), (CfgForm::Legacy, g - 1.0)] {
        let mut x = request_noise::<I>(&req, &dev);
        for i in (1..=50).rev() {
            let pts = Points::new(&solver, &[i, i], 50);
            assert!(pts.next_is_end(), "point {i}");
            let next = teacher_step(
                &teacher,
                x,
                &pts.sigma,
                &pts.sigma_next,
                cond.clone(),
                uncond.clone(),
                form,
                w,
            );
            x = consistency_target(
                || -> WanModel<I> { panic!("no target network needed at a phase end") },
                next,
                &pts,
                cond.clone(),
            );
        }
        let err = max_diff(&split_clips(x, &SPEC), &reference);
        assert!(err < 1e-5, "{form:?}: {err}");
    }
}

#[test]
fn the_euler_sampler_reports_each_step_and_the_same_clips() {
    let dev = Default::default();
    let teacher: WanModel<I> = tiny().init_seeded(&dev, 3);
    let plain = request(None, None);
    let (progress, calls) = recorder();
    let watched = SampleRequest {
        progress: Some(progress),
        ..plain.clone()
    };
    let a = sample_euler(&teacher, &plain, 5, 2.5, 3.0, &dev);
    let b = sample_euler(&teacher, &watched, 5, 2.5, 3.0, &dev);
    assert_eq!(a, b, "watching changes nothing");
    let want: Vec<(usize, usize)> = (1..=5).map(|k| (k, 5)).collect();
    assert_eq!(*calls.lock().unwrap(), want);
}

#[test]
fn target_maps_the_target_networks_prediction_to_the_phase_end() {
    let dev = Default::default();
    let model: WanModel<I> = tiny().init_seeded(&dev, 5);
    let solver = EulerSolver::new(8, 3.0);
    let mut r = StreamRng::from_seed(2);
    let x: Tensor<I, 5> = r.normal_tensor([2, 4, 2, 8, 8], &dev);
    let text: Tensor<I, 3> = r.normal_tensor([2, 8, 32], &dev);
    // One phase: the phase end is the clean sample, so the target is the target network's
    // x0 estimate at the teacher's point (points 8 → 7 and 3 → 2).
    let pts = Points::new(&solver, &[8, 3], 1);
    assert_eq!(pts.sigma_end, vec![0.0, 0.0]);
    let got = consistency_target(|| model.clone(), x.clone(), &pts, text.clone());
    let s: Vec<f32> = pts.sigma_next.iter().map(|&s| s as f32).collect();
    let sig = Tensor::<I, 1>::from_floats(s.as_slice(), &dev);
    let v = model.forward(x.clone(), sig.clone().mul_scalar(1000.0), text);
    let want = x0_from_velocity(x, v, sig);
    let err: f32 = got.sub(want).abs().max().into_scalar();
    assert!(err < 1e-5, "{err}");
}

fn method(target: TargetNetwork, decay: f64) -> Consistency<B> {
    let dev = Default::default();
    let cfg = ConsistencyConfig {
        num_euler_timesteps: 8,
        multi_phased_distill_schedule: "2-2,4-4".into(),
        distill_cfg: 2.0,
        target,
        ema_decay: decay,
        pred_decay_weight: 0.1,
        ..Default::default()
    };
    let opt = OptimizerConfig {
        lr: 1e-3,
        ..Default::default()
    };
    let student = TrainableRole::new(
        "student",
        DynModel::new(tiny().init_seeded::<B>(&dev, 1)),
        opt,
        None,
        10,
    );
    let target = (target == TargetNetwork::Ema).then(|| {
        let mut t = TrainableRole::new(
            "target",
            DynModel::new(tiny().init_seeded::<B>(&dev, 9)),
            OptimizerConfig::default(),
            None,
            10,
        );
        t.follow(&student, 0.0);
        t
    });
    Consistency {
        schedule: cfg.schedule(),
        solver: cfg.solver(),
        cfg,
        student,
        teacher: Box::new(tiny().init_seeded::<I>(&dev, 3)),
        target,
        checkpointing: false,
        followed: 0,
        device: dev,
    }
}

fn batch() -> Batch<B> {
    tiny_batch(8, 8, 1, [4, 9])
}

fn ctx(step: u64) -> StepContext {
    step_ctx(step, 3)
}

fn weights(role: &dyn RoleHandle<B>) -> BTreeMap<String, Vec<f32>> {
    role.trainable_tensors()
        .into_iter()
        .map(|(k, t)| (k, t.to_vec::<f32>().unwrap()))
        .collect()
}

/// One training step: losses, then the updates of the roles with gradients.
fn step(m: &mut Consistency<B>, s: u64) -> Vec<String> {
    let out = m.micro_step(&batch(), &ctx(s)).unwrap();
    for role in m.roles_mut() {
        if role.has_pending_grads() {
            role.apply_update(s, 1.0);
        }
    }
    out.losses.into_iter().map(|(n, _)| n).collect()
}

#[test]
fn the_ema_target_follows_the_student_and_never_gets_gradients() {
    let _turn = reel_core::parallel::autodiff_turn();
    let d = 0.5;
    let mut m = method(TargetNetwork::Ema, d);
    let names: Vec<String> = m.roles().iter().map(|r| r.name().to_string()).collect();
    assert_eq!(names, ["student", "target"]);
    assert_eq!(weights(m.target.as_ref().unwrap()), weights(&m.student));
    for s in 0..4u64 {
        let before = weights(m.target.as_ref().unwrap());
        let student = weights(&m.student);
        let out = m.micro_step(&batch(), &ctx(s)).unwrap();
        let names: Vec<&str> = out.losses.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["loss", "consistency_loss", "pred_decay_loss"]);
        let target = m.target.as_ref().unwrap();
        assert!(
            !target.has_pending_grads(),
            "step {s}: the target got gradients"
        );
        assert!(target.grad_norm_sq().is_none());
        assert!(m.student.has_pending_grads());
        // Step 0 uses the initial copy; later steps first move it towards the student.
        for (k, t) in weights(target) {
            let want: Vec<f32> = if s == 0 {
                before[&k].clone()
            } else {
                before[&k]
                    .iter()
                    .zip(&student[&k])
                    .map(|(e, p)| (d * *e as f64 + (1.0 - d) * *p as f64) as f32)
                    .collect()
            };
            let err = t
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(err < 1e-6, "step {s} `{k}`: {err}");
        }
        for role in m.roles_mut() {
            if role.has_pending_grads() {
                role.apply_update(s, 1.0);
            }
        }
    }
    assert_ne!(
        weights(m.target.as_ref().unwrap()),
        weights(&m.student),
        "the EMA target lags the student"
    );
}

#[test]
fn the_ema_target_follows_each_update_once() {
    let _turn = reel_core::parallel::autodiff_turn();
    let mut m = method(TargetNetwork::Ema, 0.5);
    let target = |m: &Consistency<B>| weights(m.target.as_ref().unwrap());
    m.micro_step(&batch(), &ctx(0)).unwrap();
    m.student.apply_update(0, 1.0);
    // Step 1 follows the update of step 0; its update is skipped (non-finite): step 2 does
    // not move the target again.
    m.micro_step(&batch(), &ctx(1)).unwrap();
    let after_1 = target(&m);
    m.student.discard_grads();
    m.micro_step(&batch(), &ctx(2)).unwrap();
    assert_eq!(target(&m), after_1, "moved without an update");
    // A checkpoint written mid-step 2 (after the move) and resumed at step 2: not followed
    // twice.
    let state = m.state();
    let mut resumed = method(TargetNetwork::Ema, 0.5);
    resumed
        .student
        .load_trainable_tensors(&host(&m.student))
        .unwrap();
    let (moments, steps) = (m.student.optimizer_tensors(), m.student.optimizer_steps());
    let moments = moments.into_iter().collect();
    resumed
        .student
        .load_optimizer_tensors(&moments, steps)
        .unwrap();
    let t = resumed.target.as_mut().unwrap();
    t.load_trainable_tensors(&host(m.target.as_ref().unwrap()))
        .unwrap();
    resumed.load_state(&state).unwrap();
    resumed.micro_step(&batch(), &ctx(2)).unwrap();
    assert_eq!(target(&resumed), after_1, "followed again on resume");
    // The next update is followed.
    resumed.student.apply_update(2, 1.0);
    resumed.micro_step(&batch(), &ctx(3)).unwrap();
    assert_ne!(target(&resumed), after_1);
}

/// A role's trainable tensors by name, as host tensors.
fn host(role: &TrainableRole<B, DynModel<B>>) -> BTreeMap<String, burn::tensor::TensorData> {
    role.trainable_tensors().into_iter().collect()
}

#[test]
fn targets_carry_no_gradient_into_the_student() {
    let _turn = reel_core::parallel::autodiff_turn();
    // At step 0 the EMA target equals the student, so the student's update must be the same
    // with either target: no gradient flows through the target's prediction.
    let mut ema = method(TargetNetwork::Ema, 0.9);
    let mut own = method(TargetNetwork::Student, 0.9);
    assert!(own.roles().len() == 1 && own.target.is_none());
    step(&mut ema, 0);
    step(&mut own, 0);
    assert_eq!(weights(&ema.student), weights(&own.student));
    // Later steps differ: the EMA target lags, the student target does not.
    for s in 1..3 {
        step(&mut ema, s);
        step(&mut own, s);
    }
    assert_ne!(weights(&ema.student), weights(&own.student));
}

#[test]
fn sampler_takes_one_step_per_phase() {
    let _turn = reel_core::parallel::autodiff_turn();
    let mut m = method(TargetNetwork::Student, 0.9);
    let a = m.sample(&request(None, None)).unwrap();
    assert_eq!((a.len(), a[0].len()), (2, SPEC.latent_numel()));
    assert_eq!(a, m.sample(&request(None, None)).unwrap(), "deterministic");
    // The default is the schedule's last phase count (4): the same as asking for 4 steps,
    // and the same as Euler sampling the student over the 4-phase boundaries.
    assert_eq!(a, m.sample(&request(Some(4), None)).unwrap());
    let student = m.student.model_valid();
    let dev = Default::default();
    let sigmas = m.solver.phase_sigmas(4);
    let want =
        crate::common::sample_euler_sigmas(&student, &request(None, None), &sigmas, 1.0, &dev);
    assert_eq!(a, want);
    assert_ne!(
        a,
        m.sample(&request(Some(8), None)).unwrap(),
        "8 steps differ"
    );
    assert_ne!(
        a,
        m.sample(&request(None, Some(2.0))).unwrap(),
        "guidance is honoured"
    );
    let e = m.sample(&request(Some(9), None)).unwrap_err().to_string();
    assert!(e.contains("num_euler_timesteps"), "{e}");
}

#[test]
fn phase_count_follows_the_schedule() {
    let _turn = reel_core::parallel::autodiff_turn();
    // "2-2,4-4": (1-based) steps 1-2 use two phases, then four.
    let m = method(TargetNetwork::Student, 0.9);
    assert_eq!(
        (0..6).map(|s| m.schedule.phases_at(s)).collect::<Vec<_>>(),
        [2, 2, 4, 4, 4, 4]
    );
}
