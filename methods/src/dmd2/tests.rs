//! DMD2's method on `wan-tiny`: the update cadence and the losses of each role, the GAN
//! terms' reach, and the few-step sampler.

use super::*;
use crate::test_util::{step_ctx, tiny_batch, TINY_SPEC};
use burn::tensor::Tensor;
use reel_core::data::{Prompt, TextCondition};
use reel_core::optim::OptimizerConfig;
use reel_core::role::RoleHandle;
use reel_models::WanConfig;

type B = burn::backend::Autodiff<burn::backend::NdArray>;
type I = burn::backend::NdArray;

fn method(rollout: Rollout) -> Dmd2<B> {
    let dev = Default::default();
    let tiny = WanConfig::preset("wan-tiny").unwrap();
    let cfg = Dmd2Config {
        rollout,
        guidance_scale: 3.0,
        ..Default::default()
    };
    let opt = OptimizerConfig {
        lr: 1e-3,
        ..Default::default()
    };
    Dmd2 {
        schedule: cfg.schedule(),
        cfg,
        student: TrainableRole::new(
            "student",
            DynModel::new(tiny.init_seeded::<B>(&dev, 1)),
            opt.clone(),
            None,
            10,
        ),
        critic: TrainableRole::new(
            "critic",
            DynModel::new(tiny.init_seeded::<B>(&dev, 2)),
            opt,
            None,
            10,
        ),
        teacher: Box::new(tiny.init_seeded::<I>(&dev, 3)),
        discriminator: None,
        checkpoint_student: false,
        checkpoint_critic: false,
        device: dev,
    }
}

fn batch() -> Batch<B> {
    tiny_batch(8, 8, 1, [4, 9])
}

fn ctx(step: u64) -> StepContext {
    step_ctx(step, 3)
}

#[test]
fn cadence_losses_and_a_frozen_teacher() {
    let _turn = reel_core::parallel::autodiff_turn();
    for rollout in [Rollout::Simulate, Rollout::DataLatent] {
        let mut m = method(rollout);
        let b = batch();
        let probe = |m: &Dmd2<B>| {
            let t = Tensor::<I, 1>::from_floats([500.0, 250.0], &Default::default());
            m.teacher
                .forward(b.latents.clone().inner(), t, b.text.clone().inner())
                .into_data()
        };
        let before = probe(&m);
        for step in 0..6u64 {
            let out = m.micro_step(&b, &ctx(step)).unwrap();
            let names: Vec<&str> = out.losses.iter().map(|(n, _)| n.as_str()).collect();
            let due = step % 5 == 0;
            let want: &[&str] = if due {
                &["generator_loss", "critic_loss"]
            } else {
                &["critic_loss"]
            };
            assert_eq!(names, want, "{rollout:?} step {step}");
            assert_eq!(
                m.student.has_pending_grads(),
                due,
                "{rollout:?} step {step}"
            );
            assert!(m.critic.has_pending_grads());
            for role in m.roles_mut() {
                role.apply_update(step, 1.0);
            }
        }
        assert_eq!(probe(&m), before, "the teacher must never change");
        assert_eq!(
            m.roles().iter().map(|r| r.name()).collect::<Vec<_>>(),
            ["student", "critic"]
        );
    }
}

/// DMD2 with the adversarial terms on, generator weight `g`, discriminator weight `d`.
fn gan_method(g: f64, d: f64) -> Dmd2<B> {
    let mut m = method(Rollout::Simulate);
    m.cfg.gan_generator_weight = g;
    m.cfg.gan_discriminator_weight = d;
    m.cfg.gan_heads.stride = 1;
    m.cfg.gan_heads.hidden = 8;
    let c = m.critic.model().info();
    let heads = m
        .cfg
        .gan_heads
        .init::<B>(c.hidden_size, c.num_layers, &Default::default())
        .unwrap();
    let opt = OptimizerConfig {
        lr: 1e-3,
        ..Default::default()
    };
    m.discriminator = Some(TrainableRole::new("discriminator", heads, opt, None, 10));
    m
}

/// Per role: name, squared gradient norm and trainable weights after one step (step 0:
/// the generator is due).
fn after_one_step(mut m: Dmd2<B>) -> Vec<(String, f32, Vec<Vec<f32>>)> {
    let out = m.micro_step(&batch(), &ctx(0)).unwrap();
    let names: Vec<&str> = out.losses.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "generator_loss",
            "gan_generator_loss",
            "critic_loss",
            "gan_discriminator_loss"
        ]
    );
    let mut result = Vec::new();
    for role in m.roles_mut() {
        let norm = role
            .grad_norm_sq()
            .unwrap_or_else(|| panic!("{} has no gradients", role.name()))
            .into_scalar();
        role.apply_update(0, 1.0);
        let w = role
            .trainable_tensors()
            .into_iter()
            .map(|(_, t)| t.to_vec::<f32>().unwrap())
            .collect();
        result.push((role.name().to_string(), norm, w));
    }
    result
}

#[test]
fn gan_terms_reach_only_their_own_roles() {
    let _turn = reel_core::parallel::autodiff_turn();
    let base = after_one_step(gan_method(1.0, 1.0));
    let roles: Vec<&str> = base.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(roles, ["student", "critic", "discriminator"]);
    // A different generator weight changes the student's update only.
    let g = after_one_step(gan_method(3.0, 1.0));
    assert_ne!(
        g[0].2, base[0].2,
        "the GAN generator term reaches the student"
    );
    assert_eq!(g[1], base[1], "the generator step changed the critic");
    assert_eq!(
        g[2], base[2],
        "the generator step changed the discriminator"
    );
    // A different discriminator weight changes the critic and the heads, never the student.
    let d = after_one_step(gan_method(1.0, 5.0));
    assert_eq!(d[0], base[0], "the discriminator step changed the student");
    assert_ne!(
        d[1].2, base[1].2,
        "the discriminator loss trains the critic's backbone"
    );
    // The heads learn from the discriminator loss alone: 5× the weight, 25× the norm².
    let ratio = d[2].1 / base[2].1;
    assert!(
        (ratio - 25.0).abs() < 1e-2,
        "heads' gradient norm² ratio {ratio}"
    );
}

#[test]
fn sampler_is_deterministic_and_honours_steps() {
    let _turn = reel_core::parallel::autodiff_turn();
    let mut m = method(Rollout::Simulate);
    let spec = TINY_SPEC;
    let prompt = |v: f32| Prompt {
        caption: String::new(),
        text: TextCondition {
            embedding: vec![v; 8 * 32],
            mask: vec![true; 8],
        },
    };
    let mut req = SampleRequest {
        prompts: vec![prompt(0.1), prompt(-0.2)],
        negative: None,
        steps: None,
        guidance: None,
        seed: 7,
        first_index: 0,
        spec,
        progress: None,
    };
    let a = m.sample(&req).unwrap();
    assert_eq!(a.len(), 2);
    assert_eq!(a[0].len(), spec.latent_numel());
    assert_eq!(a, m.sample(&req).unwrap(), "same seed, same clips");
    let (progress, calls) = crate::test_util::recorder();
    req.progress = Some(progress);
    assert_eq!(a, m.sample(&req).unwrap(), "watching changes nothing");
    let steps = calls.lock().unwrap().len();
    let want: Vec<(usize, usize)> = (1..=steps).map(|k| (k, steps)).collect();
    assert!(steps > 1, "one report a step");
    assert_eq!(*calls.lock().unwrap(), want);
    req.progress = None;
    req.steps = Some(2);
    assert_ne!(a, m.sample(&req).unwrap(), "2 steps differ from 4");
    req.steps = Some(5);
    let e = m.sample(&req).unwrap_err().to_string();
    assert!(e.contains("denoising_steps"), "{e}");
}
