//! `runtime.dtype = "bf16"` and the attention choice through the real binary: a short
//! fine-tune on the Flex backend (bfloat16 kernels on CPU) trains, and its checkpoints hold
//! float32 master weights.

use crate::common;

use common::*;

#[test]
fn bf16_finetune_trains_and_checkpoints_float32_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("run.toml"), TINY_WAN_RUN).unwrap();
    let flex = [
        "--set",
        "runtime.backend=\"flex\"",
        "--set",
        "training.max_steps=3",
    ];
    let mut bf16 = flex.to_vec();
    bf16.extend([
        "--set",
        "runtime.dtype=\"bf16\"",
        "--set",
        "models.student.attention=\"memory_efficient\"",
    ]);
    let o = reel_train(dir, "bf16", &bf16, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = reel_train(dir, "f32", &flex, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let header = reel_core::io::read_safetensors_header(
        ckpt(&dir.join("bf16"), 3).join("student.safetensors"),
    )
    .unwrap();
    assert!(!header.is_empty());
    assert!(
        header.values().all(|h| h.dtype == "F32"),
        "master weights are stored as float32"
    );
    let w16 = tensors(&ckpt(&dir.join("bf16"), 3).join("student.safetensors"));
    let w32 = tensors(&ckpt(&dir.join("f32"), 3).join("student.safetensors"));
    let w0 = tensors(&ckpt(&dir.join("f32"), 1).join("student.safetensors"));
    // bf16 rounding perturbs the updates, not their direction: over all weights, the
    // distance between the bf16 and f32 runs is small next to how far training moved them.
    let (mut diff, mut step) = (0f64, 0f64);
    for (k, v) in &w16 {
        assert!(v.iter().all(|x| x.is_finite()), "{k}");
        for ((a, b), c) in v.iter().zip(&w32[k]).zip(&w0[k]) {
            diff += ((a - b) as f64).powi(2);
            step += ((b - c) as f64).powi(2);
        }
    }
    let ratio = (diff / step).sqrt();
    eprintln!("|w_bf16 - w_f32| / |w_f32(3) - w_f32(1)| = {ratio:.3}");
    assert!(
        step > 0.0 && ratio < 0.3,
        "bf16 run strays from the f32 run: ratio {ratio:.3}"
    );
    let metrics = std::fs::read_to_string(dir.join("bf16/metrics.jsonl")).unwrap();
    assert_eq!(
        metrics.lines().filter(|l| l.contains("\"loss\"")).count(),
        3,
        "{metrics}"
    );
}
