//! The trainer loop on the toy plugins (example crate): resume, accumulation, cadence,
//! clipping.

use crate::common;

use common::*;

#[test]
fn resume_is_bit_identical_to_an_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let text = toy_config(
        "student_interval = 2\nnoise = 0.1",
        "checkpoint_every = 3\ngrad_accumulation = 2",
    );
    let straight = tmp.path().join("straight");
    run(&load(&text, &[]), &straight, None);
    // Stop after 3 steps, then resume with a longer max_steps.
    let split = tmp.path().join("split");
    run(&load(&text, &["training.max_steps=3"]), &split, None);
    let s = run(&load(&text, &[]), &split, Some("latest"));
    assert_eq!(s.steps, 6);
    for file in [
        "student.safetensors",
        "critic.safetensors",
        "student.optim.safetensors",
        "critic.optim.safetensors",
    ] {
        let a = tensors(&ckpt(&straight, 6).join(file));
        let b = tensors(&ckpt(&split, 6).join(file));
        assert!(!a.is_empty(), "{file} has tensors");
        assert_eq!(a, b, "{file} differs after resume");
    }
    let sa = std::fs::read_to_string(ckpt(&straight, 6).join("state.json")).unwrap();
    let sb = std::fs::read_to_string(ckpt(&split, 6).join("state.json")).unwrap();
    assert_eq!(
        sa, sb,
        "trainer state (data cursor, optimizer steps) differs"
    );
}

#[test]
fn accumulation_equals_one_larger_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let text = toy_config("noise = 0.1", "");
    let big = tmp.path().join("big");
    run(
        &load(&text, &["training.max_steps=3", "data.batch_size=4"]),
        &big,
        None,
    );
    let acc = tmp.path().join("acc");
    run(
        &load(
            &text,
            &[
                "training.max_steps=3",
                "data.batch_size=2",
                "training.grad_accumulation=2",
            ],
        ),
        &acc,
        None,
    );
    for file in ["student.safetensors", "critic.safetensors"] {
        let d = max_diff(
            &tensors(&ckpt(&big, 3).join(file)),
            &tensors(&ckpt(&acc, 3).join(file)),
        );
        assert!(d < 1e-5, "{file}: accumulated run differs by {d}");
    }
    // And a different micro-batching without accumulation really differs (the test can fail).
    let small = tmp.path().join("small");
    run(
        &load(&text, &["training.max_steps=3", "data.batch_size=2"]),
        &small,
        None,
    );
    let d = max_diff(
        &tensors(&ckpt(&big, 3).join("student.safetensors")),
        &tensors(&ckpt(&small, 3).join("student.safetensors")),
    );
    assert!(d > 1e-4, "batch size should matter: {d}");
}

#[test]
fn a_role_not_due_keeps_weights_and_optimizer_state() {
    let tmp = tempfile::tempdir().unwrap();
    let text = toy_config(
        "student_interval = 5",
        "checkpoint_every = 1\nkeep_last = 10",
    );
    let dir = tmp.path().join("cad");
    run(&load(&text, &["training.max_steps=4"]), &dir, None);
    let s1 = tensors(&ckpt(&dir, 1).join("student.safetensors"));
    let o1 = tensors(&ckpt(&dir, 1).join("student.optim.safetensors"));
    let init_c = tensors(&ckpt(&dir, 1).join("critic.safetensors"));
    for step in 2..=4 {
        assert_eq!(
            s1,
            tensors(&ckpt(&dir, step).join("student.safetensors")),
            "student changed at step {step}"
        );
        assert_eq!(
            o1,
            tensors(&ckpt(&dir, step).join("student.optim.safetensors")),
            "student optimizer changed"
        );
        let c = tensors(&ckpt(&dir, step).join("critic.safetensors"));
        assert!(max_diff(&init_c, &c) > 0.0, "critic must update every step");
    }
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt(&dir, 4).join("state.json")).unwrap())
            .unwrap();
    assert_eq!(state["optimizer_steps"]["student"], 1);
    assert_eq!(state["optimizer_steps"]["critic"], 4);
}

#[test]
fn clipping_uses_the_global_norm_of_each_role() {
    // One step without clipping gives exp_avg = (1-β1)·g; with max_grad_norm = c every
    // element of exp_avg is scaled by c / ‖g‖ where ‖g‖ is the L2 norm over all of the role's
    // gradients together (not per tensor).
    let tmp = tempfile::tempdir().unwrap();
    let text = toy_config("target_scale = 50.0", "");
    let free = tmp.path().join("free");
    run(&load(&text, &["training.max_steps=1"]), &free, None);
    let clip = tmp.path().join("clip");
    run(
        &load(
            &text,
            &["training.max_steps=1", "training.max_grad_norm=0.5"],
        ),
        &clip,
        None,
    );
    let m_free = tensors(&ckpt(&free, 1).join("student.optim.safetensors"));
    let m_clip = tensors(&ckpt(&clip, 1).join("student.optim.safetensors"));
    let g_sq: f64 = m_free
        .iter()
        .filter(|(k, _)| k.starts_with("exp_avg."))
        .flat_map(|(_, v)| v.iter().map(|&m| (m as f64 / 0.1).powi(2)))
        .sum();
    let norm = g_sq.sqrt();
    assert!(
        norm > 0.5,
        "the test needs a gradient larger than the threshold: {norm}"
    );
    let scale = 0.5 / (norm + 1e-6);
    let mut per_tensor_scales = vec![];
    for (k, v) in m_free.iter().filter(|(k, _)| k.starts_with("exp_avg.")) {
        let c = &m_clip[k];
        let t_norm: f64 = v
            .iter()
            .map(|&m| (m as f64 / 0.1).powi(2))
            .sum::<f64>()
            .sqrt();
        per_tensor_scales.push(t_norm);
        for (a, b) in v.iter().zip(c) {
            let expect = *a as f64 * scale;
            assert!(
                (expect - *b as f64).abs() <= 1e-6 + 1e-4 * expect.abs(),
                "{k}: {b} vs {expect}"
            );
        }
    }
    assert!(
        per_tensor_scales.len() >= 2,
        "two tensors, so global ≠ per-tensor clipping"
    );
}
