//! `gradient_checkpointing = true` on a role: block-level activation checkpointing recomputes
//! each block in the backward pass, so the run must train exactly as the plain one does (same
//! losses and weights up to float rounding): fine-tuning with gradient accumulation and with
//! a LoRA adapter; DMD2 with the student and the critic checkpointed, with the GAN terms; the
//! adversarial and consistency students.

use crate::common;

use common::*;
use reel_plugins::callbacks::logging::jsonl::read_metrics;

/// Train `text` with `extra` overrides, plain and with `gradient_checkpointing` on each of
/// `roles`, and compare the last checkpoint's weights of every role in `roles` (and
/// `others`) and the logged losses named `losses`.
fn compare(text: &str, extra: &[&str], roles: &[&str], others: &[&str], losses: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let mut base = vec!["training.max_steps=3"];
    base.extend_from_slice(extra);
    let sets: Vec<String> = roles
        .iter()
        .map(|r| format!("models.{r}.gradient_checkpointing=true"))
        .collect();
    let mut ck = base.clone();
    ck.extend(sets.iter().map(String::as_str));
    let plain = run_alone(&load(text, &base), &tmp.path().join("plain"), None);
    let check = run_alone(&load(text, &ck), &tmp.path().join("ck"), None);
    assert_eq!((plain.steps, check.steps), (3, 3));

    for (i, role) in roles.iter().chain(others).enumerate() {
        let file = format!("{role}.safetensors");
        let a = tensors(&ckpt(&tmp.path().join("plain"), 3).join(&file));
        let b = tensors(&ckpt(&tmp.path().join("ck"), 3).join(&file));
        let w0 = tensors(&ckpt(&tmp.path().join("plain"), 1).join(&file));
        let moved = max_diff(&a, &w0);
        let diff = max_diff(&a, &b);
        eprintln!("{extra:?} {role}: max |plain − checkpointed| = {diff:.2e}, moved {moved:.2e}");
        assert!(moved > 1e-4, "{role}: training moved the weights: {moved}");
        // A checkpointed role's gradients equal the plain ones up to rounding. A role trained
        // on its outputs (a discriminator on the student's samples) sees those rounding
        // differences in its inputs, and AdamW magnifies them where a gradient element is
        // near its eps (as in the AdamW golden test): it gets a bound relative to its motion.
        let bound = if i < roles.len() {
            1e-5
        } else {
            (0.05 * moved).max(1e-5)
        };
        assert!(
            diff <= bound,
            "{role}: checkpointed weights differ: {diff:.3e}"
        );
    }

    let logged = |dir: &str, key: &str| -> Vec<f64> {
        read_metrics(&tmp.path().join(dir).join("metrics.jsonl"))
            .unwrap()
            .iter()
            .filter_map(|r| r.get(key).and_then(|x| x.as_f64()))
            .collect()
    };
    for key in losses {
        let (la, lb) = (logged("plain", key), logged("ck", key));
        assert!(!la.is_empty(), "`{key}` is logged");
        assert_eq!(la.len(), lb.len(), "{key}");
        for (x, y) in la.iter().zip(&lb) {
            assert!(
                (x - y).abs() <= 1e-5 * x.abs().max(1.0),
                "{key}: {x} vs {y}"
            );
        }
    }
}

fn plain_vs_checkpointed(text: &str, extra: &[&str]) {
    compare(text, extra, &["student"], &[], &["loss"]);
}

#[test]
fn checkpointed_dmd2_student_and_critic_match_plain_with_gan_terms() {
    let text = distill_config(DMD2_GAN_METHOD, true, 3);
    let losses = [
        "generator_loss",
        "critic_loss",
        "gan_generator_loss",
        "gan_discriminator_loss",
    ];
    let roles = ["student", "critic"];
    compare(
        &text,
        &["training.grad_accumulation=2"],
        &roles,
        &["discriminator"],
        &losses,
    );
    // Each role alone, without the GAN terms.
    let plain = text
        .replace("gan_generator_weight = 0.5", "gan_generator_weight = 0.0")
        .replace(
            "gan_discriminator_weight = 0.5",
            "gan_discriminator_weight = 0.0",
        );
    compare(
        &plain,
        &[],
        &["student"],
        &["critic"],
        &["generator_loss", "critic_loss"],
    );
    compare(&plain, &[], &["critic"], &["student"], &["critic_loss"]);
}

#[test]
fn checkpointed_finetune_matches_plain_with_accumulation() {
    plain_vs_checkpointed(TINY_WAN_RUN, &["training.grad_accumulation=2"]);
}

#[test]
fn checkpointed_lora_finetune_matches_plain() {
    // The adapter table goes right after the student's table.
    let text = TINY_WAN_RUN.replace(
        "\n[method]",
        "\n[models.student.adapter]\nkind = \"lora\"\nrank = 4\nalpha = 4.0\n\
         target_modules = [\"to_q\", \"to_v\", \"ffn.net.0.proj\"]\ninit_seed = 1\n\n[method]",
    );
    assert!(text.contains("lora"));
    plain_vs_checkpointed(&text, &[]);
}

#[test]
fn checkpointed_adversarial_and_consistency_students_match_plain() {
    let adversarial = distill_config(
        r#"kind = "adversarial"
heads = { stride = 1, hidden = 16 }
flow_matching_weight = 0.5
r1_weight = 1.0
r1_epsilon = 0.05"#,
        false,
        3,
    );
    let losses = ["generator_loss", "flow_matching_loss", "discriminator_loss"];
    let accumulate = ["training.grad_accumulation=2"];
    compare(
        &adversarial,
        &accumulate,
        &["student"],
        &["discriminator"],
        &losses,
    );
    let consistency = distill_config(
        r#"kind = "consistency"
num_euler_timesteps = 8
distill_cfg = 2.0
ema_decay = 0.5
pred_decay_weight = 0.01
pred_decay_type = "l2""#,
        false,
        3,
    );
    let losses = ["loss", "consistency_loss", "pred_decay_loss"];
    compare(
        &consistency,
        &accumulate,
        &["student"],
        &["target"],
        &losses,
    );
}
