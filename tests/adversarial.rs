//! Adversarial training end to end on the CPU. `kind = "adversarial"`: a short run on
//! `wan-tiny` trains the student and the discriminator heads (checkpointed as the
//! `discriminator` role, on the configured interval), logs its losses, and resumes bit for
//! bit. `kind = "dmd2"` with the GAN weights: the heads on the critic train as a third role,
//! the losses are logged, and a resume is exact.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;
use reel_plugins::callbacks::logging::jsonl::read_metrics;

/// A `wan-tiny` run: student, frozen teacher (and a critic when `critic`), the given
/// `[method]` body, `max_steps` steps with a checkpoint after each and per-step logging.
fn config(method: &str, critic: bool, max_steps: u64) -> String {
    let wan = |role: &str, trainable: bool| {
        format!(
            "[models.{role}]\narch = \"wan\"\npreset = \"wan-tiny\"\ninit_seed = 2\ntrainable = {trainable}\n"
        )
    };
    let critic = if critic {
        wan("critic", true)
    } else {
        String::new()
    };
    format!(
        r#"
[runtime]
backend = "cpu"
seed = 3

{student}
{teacher}
{critic}
[method]
{method}

[data]
kind = "synthetic"
batch_size = 2
num_samples = 16
frames = 2
height = 12
width = 12

[optimizer]
lr = 1e-3

[training]
max_steps = {max_steps}
checkpoint_every = 1
keep_last = 10

[[callbacks]]
kind = "logging"
every_steps = 1
"#,
        student = wan("student", true),
        teacher = wan("teacher", false),
    )
}

/// Number of logged records holding `key`.
fn records_with(run_dir: &Path, key: &str) -> usize {
    let records = read_metrics(&run_dir.join("metrics.jsonl")).unwrap();
    records.iter().filter(|r| r.contains_key(key)).count()
}

/// Train `text` straight to its last step in `tmp/straight`, and in `tmp/split` to
/// `split_at` then resumed to the end; the listed checkpoint files of the final step must be
/// identical. Returns the straight run's folder.
fn straight_and_resumed(tmp: &Path, text: &str, split_at: u64, files: &[&str]) -> PathBuf {
    let straight = tmp.join("straight");
    let steps = run(&load(text, &[]), &straight, None).steps;
    let split = tmp.join("split");
    let at = format!("training.max_steps={split_at}");
    run(&load(text, &[at.as_str()]), &split, None);
    assert_eq!(run(&load(text, &[]), &split, Some("latest")).steps, steps);
    for file in files {
        let a = tensors(&ckpt(&straight, steps).join(file));
        assert!(!a.is_empty(), "{file}");
        assert_eq!(
            a,
            tensors(&ckpt(&split, steps).join(file)),
            "{file} after resume"
        );
    }
    straight
}

/// `role.safetensors` of checkpoint `k`.
fn weights(run_dir: &Path, k: u64, role: &str) -> BTreeMap<String, Vec<f32>> {
    tensors(&ckpt(run_dir, k).join(format!("{role}.safetensors")))
}

#[test]
fn adversarial_run_trains_both_roles_on_their_cadence_and_resumes_exactly() {
    let text = config(
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
    let text = config(
        r#"kind = "dmd2"
denoising_steps = [1000, 500]
generator_update_interval = 2
gan_generator_weight = 0.5
gan_discriminator_weight = 0.5
gan_loss = "non_saturating"
gan_heads = { blocks = [0], hidden = 16 }"#,
        true,
        3,
    );
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
