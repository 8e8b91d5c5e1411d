//! `reel bench --breakdown`: real trainer steps split into phases, for fine-tuning, DMD2 and
//! a run config, on the CPU backend (the same code times CUDA with device syncs).

use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_reel");

/// Run `reel bench --breakdown … --json` and return its one breakdown.
fn breakdown(args: &[&str]) -> Value {
    let out = Command::new(BIN)
        .args([
            "bench",
            "--breakdown",
            "--json",
            "--steps",
            "1",
            "--warmup",
            "1",
        ])
        .args(args)
        .output()
        .expect("reel runs");
    assert!(
        out.status.success(),
        "reel bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");
    v[0].clone()
}

fn phases(b: &Value) -> Vec<(String, f64)> {
    b["phases"]
        .as_array()
        .expect("phases")
        .iter()
        .map(|p| {
            (
                p["phase"].as_str().expect("name").to_string(),
                p["ms"]["median"].as_f64().expect("ms"),
            )
        })
        .collect()
}

/// With one timed step, the phases add up to the profiled step; every phase is timed.
fn check_sums(b: &Value) {
    let p = phases(b);
    let sum: f64 = p.iter().map(|(_, ms)| ms).sum();
    let step = b["profiled_step_ms"]["median"].as_f64().expect("step");
    assert!(
        (sum - step).abs() <= 1e-6 * step.max(1.0),
        "{sum} vs {step}"
    );
    assert!(p.iter().all(|(_, ms)| *ms >= 0.0), "{p:?}");
    assert!(b["step_ms"]["median"].as_f64().expect("plain") > 0.0);
}

fn names(b: &Value) -> Vec<String> {
    phases(b).into_iter().map(|(n, _)| n).collect()
}

#[test]
fn finetune_splits_forward_backward_optimizer_and_ema() {
    let b = breakdown(&[
        "--preset", "wan-tiny", "--shape", "2", "4", "4", "--batch", "2",
    ]);
    check_sums(&b);
    let n = names(&b);
    for want in [
        "data",
        "student forward",
        "student backward",
        "host sync (losses, norms)",
        "clip + optimizer",
        "callbacks",
    ] {
        assert!(n.iter().any(|x| x == want), "no `{want}` in {n:?}");
    }
    assert_eq!(b["samples_per_step"], 2);
    assert_eq!(b["tokens"], 2 * 2 * 2, "wan-tiny patches 1x2x2");
}

#[test]
fn dmd2_splits_student_critic_and_teacher_forwards() {
    let b = breakdown(&[
        "--method",
        "dmd2",
        "--preset",
        "wan-tiny",
        "--shape",
        "2",
        "4",
        "4",
        "--gradient-checkpointing",
    ]);
    check_sums(&b);
    let n = names(&b);
    for want in [
        "student rollout (no grad)",
        "teacher forward",
        "critic forward (score)",
        "student forward + backward (checkpointed)",
        "critic forward + backward (checkpointed)",
        "clip + optimizer",
    ] {
        assert!(n.iter().any(|x| x == want), "no `{want}` in {n:?}");
    }
}

#[test]
fn a_run_config_is_benched_with_random_weights_and_overrides() {
    let config = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/configs/dmd2_gan_quickstart.toml"
    );
    let b = breakdown(&[
        "--config",
        config,
        "--random-weights",
        "--set",
        "data.batch_size=1",
    ]);
    check_sums(&b);
    assert_eq!(b["samples_per_step"], 1);
    assert!(
        names(&b).iter().any(|x| x == "discriminator forward"),
        "{b}"
    );
}

#[test]
fn bad_arguments_are_refused_with_a_message() {
    let out = Command::new(BIN)
        .args(["bench", "--breakdown", "--method", "sft"])
        .output()
        .expect("reel runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("finetune") && err.contains("dmd2"), "{err}");
    let out = Command::new(BIN)
        .args(["bench", "--config", "x.toml"])
        .output()
        .expect("reel runs");
    assert!(!out.status.success(), "--config needs --breakdown");
}
