//! Distillation methods end to end on the CPU. `kind = "adversarial"`: a short run on
//! `wan-tiny` trains the student and the discriminator heads (checkpointed as the
//! `discriminator` role, on the configured interval), logs its losses, and resumes bit for
//! bit. `kind = "dmd2"` with the GAN weights: the heads on the critic train as a third role,
//! the losses are logged, and a resume is exact. `kind = "consistency"`: the student trains,
//! the EMA target (role `target`) follows it by the configured decay without gradients, and a
//! resume across a change of the phase count is exact.

use crate::common;

use common::*;

#[test]
fn adversarial_run_trains_both_roles_on_their_cadence_and_resumes_exactly() {
    let text = distill_config(
        r#"kind = "adversarial"
heads = { stride = 1, hidden = 16 }
flow_matching_weight = 0.5
r1_weight = 1.0
r1_epsilon = 0.05
discriminator_interval = 2
discriminator_optimizer = { lr = 1e-2 }"#,
        false,
        4,
    );
    let tmp = tempfile::tempdir().unwrap();
    let files = [
        "student.safetensors",
        "student.optim.safetensors",
        "discriminator.safetensors",
        "discriminator.optim.safetensors",
    ];
    let straight = straight_and_resumed(tmp.path(), &text, 2, &files);

    // Checkpoint k holds the state after steps 0..k. The discriminator updates on steps 0
    // and 2 (interval 2), the student on every step.
    let disc = |k| weights(&straight, k, "discriminator");
    let keys: Vec<String> = disc(1).into_keys().collect();
    assert!(keys.iter().all(|k| k.starts_with("heads.")), "{keys:?}");
    assert_eq!(keys.len(), 2 * 4, "two heads x (fc1, fc2) x (weight, bias)");
    assert_eq!(disc(2), disc(1), "no discriminator update on step 1");
    assert!(
        max_diff(&disc(3), &disc(2)) > 0.0,
        "discriminator update on step 2"
    );
    assert_eq!(disc(4), disc(3), "no discriminator update on step 3");
    for k in 2..=4 {
        let moved = max_diff(
            &weights(&straight, k, "student"),
            &weights(&straight, k - 1, "student"),
        );
        assert!(moved > 0.0, "student step {k}");
    }
    assert_eq!(records_with(&straight, "generator_loss"), 4);
    assert_eq!(records_with(&straight, "flow_matching_loss"), 4);
    assert!(records_with(&straight, "discriminator_loss") >= 2);
}

#[test]
fn dmd2_with_gan_trains_heads_on_the_critic_and_resumes_exactly() {
    let text = distill_config(DMD2_GAN_METHOD, true, 3);
    let tmp = tempfile::tempdir().unwrap();
    let files = [
        "student.safetensors",
        "critic.safetensors",
        "discriminator.safetensors",
        "discriminator.optim.safetensors",
    ];
    let straight = straight_and_resumed(tmp.path(), &text, 1, &files);
    let disc = |k| weights(&straight, k, "discriminator");
    assert_eq!(disc(1).len(), 4, "one head x (fc1, fc2) x (weight, bias)");
    for k in 2..=3 {
        assert!(
            max_diff(&disc(k), &disc(k - 1)) > 0.0,
            "heads train every step ({k})"
        );
    }
    assert_eq!(records_with(&straight, "gan_discriminator_loss"), 3);
    assert_eq!(
        records_with(&straight, "gan_generator_loss"),
        2,
        "generator steps 0 and 2"
    );
}

#[test]
fn consistency_run_keeps_an_ema_target_and_resumes_exactly_across_a_phase_change() {
    // 8 Euler points; (1-based) steps 1-2 use 4 phases, later steps 2. The split at step 2
    // resumes exactly where the phase count changes.
    let text = distill_config(
        r#"kind = "consistency"
num_euler_timesteps = 8
multi_phased_distill_schedule = "2-4,8-2"
distill_cfg = 2.0
ema_decay = 0.5
pred_decay_weight = 0.01
pred_decay_type = "l2""#,
        false,
        4,
    );
    let tmp = tempfile::tempdir().unwrap();
    let files = [
        "student.safetensors",
        "student.optim.safetensors",
        "target.safetensors",
    ];
    let straight = straight_and_resumed(tmp.path(), &text, 2, &files);

    // Checkpoint k holds the state after steps 0..k. The target starts as a copy of the
    // student and, from step 1 on, first moves halfway (decay 0.5) to the student.
    let student = |k| weights(&straight, k, "student");
    let target = |k| weights(&straight, k, "target");
    assert_eq!(
        target(1).keys().collect::<Vec<_>>(),
        student(1).keys().collect::<Vec<_>>()
    );
    assert!(
        max_diff(&target(1), &student(1)) > 0.0,
        "step 0 moved the student"
    );
    for k in 2..=4 {
        assert!(
            max_diff(&student(k), &student(k - 1)) > 0.0,
            "student step {k}"
        );
        let (t, prev, s) = (target(k), target(k - 1), student(k - 1));
        let err = t
            .iter()
            .flat_map(|(key, v)| {
                v.iter()
                    .zip(&prev[key])
                    .zip(&s[key])
                    .map(|((t, e), p)| (t - (0.5 * e + 0.5 * p)).abs())
            })
            .fold(0.0, f32::max);
        assert!(err < 1e-6, "target at checkpoint {k}: {err}");
    }
    let optim = tensors(&ckpt(&straight, 4).join("target.optim.safetensors"));
    assert!(optim.is_empty(), "the target has no optimizer state");
    assert_eq!(records_with(&straight, "loss"), 4);
    assert_eq!(records_with(&straight, "pred_decay_loss"), 4);
}
