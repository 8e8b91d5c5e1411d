//! A second model architecture, registered outside the built-in crates (`arch = "toy"` from
//! the example crate), is trained from TOML by the built-in `finetune` and `dmd2` (with its
//! GAN terms): the methods reach models only through the model seam.

use crate::common;

use std::path::Path;

use common::*;
use reel_plugins::callbacks::logging::jsonl::read_metrics;

use reel_methods as _;
use reel_plugins as _;

/// `[models.<role>]` tables of toy models.
fn toy_roles(roles: &[(&str, bool)]) -> String {
    roles
        .iter()
        .map(|(role, trainable)| {
            format!(
                "[models.{role}]\narch = \"toy\"\nhidden_size = 16\nnum_layers = 2\n\
                 init_seed = 4\ntrainable = {trainable}\n"
            )
        })
        .collect()
}

fn config(roles: &str, method: &str, max_steps: u64, lr: f64) -> String {
    format!(
        r#"
[runtime]
seed = 11
{roles}
[method]
{method}

[data]
kind = "synthetic"
batch_size = 4
num_samples = 16
frames = 2
height = 12
width = 12

[optimizer]
lr = {lr}

[training]
max_steps = {max_steps}
checkpoint_every = 1
keep_last = 100

[[callbacks]]
kind = "logging"
every_steps = 1

[[callbacks]]
kind = "validation"
every_steps = {max_steps}
sampling_steps = 2
num_prompts = 2
"#
    )
}

/// The logged values of `key`, in step order.
fn logged(run_dir: &Path, key: &str) -> Vec<f64> {
    read_metrics(&run_dir.join("metrics.jsonl"))
        .unwrap()
        .iter()
        .filter_map(|r| r.get(key).and_then(|v| v.as_f64()))
        .collect()
}

#[test]
fn finetune_trains_the_toy_architecture() {
    let tmp = tempfile::tempdir().unwrap();
    let text = config(
        &toy_roles(&[("student", true)]),
        "kind = \"finetune\"\nsample_steps = 2",
        40,
        1e-2,
    );
    let s = run(&load(&text, &[]), tmp.path(), None);
    assert_eq!(s.steps, 40);
    let loss = logged(tmp.path(), "loss");
    assert_eq!(loss.len(), 40);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (first, last) = (mean(&loss[..8]), mean(&loss[32..]));
    assert!(
        last < 0.9 * first,
        "loss {first} -> {last}: the toy model did not learn"
    );
    let w = weights(tmp.path(), 40, "student");
    for key in ["embed.weight", "blocks.1.fc2.bias", "head.weight"] {
        assert!(
            w.contains_key(key),
            "checkpoint keys are the toy model's: {key}"
        );
    }
    assert_ne!(w, weights(tmp.path(), 1, "student"), "the student trained");
    let sheet = tmp.path().join("samples").join("step-40").join("sheet.png");
    assert!(
        sheet.is_file(),
        "validation sampled the toy model: {}",
        sheet.display()
    );
}

#[test]
fn dmd2_with_gan_terms_trains_the_toy_architecture() {
    let tmp = tempfile::tempdir().unwrap();
    let roles = toy_roles(&[("student", true), ("teacher", false), ("critic", true)]);
    let method = "kind = \"dmd2\"\ndenoising_steps = [1000, 500]\ngenerator_update_interval = 2\n\
                  gan_generator_weight = 0.1\ngan_discriminator_weight = 0.1\n\
                  gan_heads = { stride = 1, hidden = 8 }";
    let s = run(
        &load(&config(&roles, method, 4, 1e-3), &[]),
        tmp.path(),
        None,
    );
    assert_eq!(s.steps, 4);
    // The generator (with its GAN term) runs on steps 0 and 2, the critic every step.
    assert_eq!(logged(tmp.path(), "generator_loss").len(), 2);
    assert_eq!(logged(tmp.path(), "gan_generator_loss").len(), 2);
    assert_eq!(logged(tmp.path(), "critic_loss").len(), 4);
    assert_eq!(logged(tmp.path(), "gan_discriminator_loss").len(), 4);
    for key in ["generator_loss", "critic_loss", "gan_discriminator_loss"] {
        assert!(
            logged(tmp.path(), key).iter().all(|v| v.is_finite()),
            "{key}"
        );
    }
    for role in ["student", "critic", "discriminator"] {
        assert_ne!(
            weights(tmp.path(), 4, role),
            weights(tmp.path(), 1, role),
            "{role} trained"
        );
    }
    assert!(
        !ckpt(tmp.path(), 4).join("teacher.safetensors").exists(),
        "the frozen teacher is not checkpointed"
    );
}
