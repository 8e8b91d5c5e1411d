//! `models.student.gradient_checkpointing = true` in a real fine-tune: block-level activation
//! checkpointing recomputes each block in the backward pass, so the run must train exactly as
//! the plain one does (same losses and weights up to float rounding), with gradient
//! accumulation and with a LoRA adapter.

mod common;

use common::*;
use reel_plugins::callbacks::logging::jsonl::read_metrics;

/// Train `text` with `extra` overrides, plain and checkpointed, and compare the last
/// checkpoint's student weights and the logged losses.
fn plain_vs_checkpointed(text: &str, extra: &[&str]) {
    let file = "student.safetensors";
    let tmp = tempfile::tempdir().unwrap();
    let mut base = vec!["training.max_steps=3"];
    base.extend_from_slice(extra);
    let mut ck = base.clone();
    ck.push("models.student.gradient_checkpointing=true");
    let plain = run(&load(text, &base), &tmp.path().join("plain"), None);
    let check = run(&load(text, &ck), &tmp.path().join("ck"), None);
    assert_eq!(plain.steps, 3);
    assert_eq!(check.steps, 3);

    let a = tensors(&ckpt(&tmp.path().join("plain"), 3).join(file));
    let b = tensors(&ckpt(&tmp.path().join("ck"), 3).join(file));
    let w0 = tensors(&ckpt(&tmp.path().join("plain"), 1).join(file));
    let moved = max_diff(&a, &w0);
    let diff = max_diff(&a, &b);
    eprintln!("{extra:?}: max |plain − checkpointed| = {diff:.2e}, training moved {moved:.2e}");
    assert!(moved > 1e-4, "training moved the weights: {moved}");
    assert!(
        diff <= 1e-5,
        "checkpointed weights differ from plain: {diff:.3e}"
    );

    let losses = |dir: &str| -> Vec<f64> {
        read_metrics(&tmp.path().join(dir).join("metrics.jsonl"))
            .unwrap()
            .iter()
            .filter_map(|r| r.get("loss").and_then(|x| x.as_f64()))
            .collect()
    };
    let (la, lb) = (losses("plain"), losses("ck"));
    assert_eq!(la.len(), 3, "one logged loss per step: {la:?}");
    assert_eq!(la.len(), lb.len());
    for (x, y) in la.iter().zip(&lb) {
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "loss {x} vs {y}");
    }
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
