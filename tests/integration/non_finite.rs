//! Non-finite values: a NaN loss injected at a chosen step (`REEL_FAULT=non-finite-loss:<n>`)
//! is caught before any update. `skip` drops exactly that update and says so; `stop` writes a
//! checkpoint of the last good state, exits non-zero, and resuming from it reproduces the
//! uninterrupted run.

use crate::common;

use std::path::Path;

use common::{ckpt, reel_train, tensors, tiny_run_with_clean};

fn weights(run: &Path, step: u64, file: &str) -> std::collections::BTreeMap<String, Vec<f32>> {
    tensors(&ckpt(run, step).join(file))
}

#[test]
fn skip_drops_exactly_the_bad_update() {
    let tmp = tiny_run_with_clean(&[]);
    let dir = tmp.path();
    let o = reel_train(
        dir,
        "skip",
        &["--set", "training.non_finite=\"skip\""],
        Some("non-finite-loss:3"),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("step 3: non-finite loss=NaN: update skipped"),
        "the skip is not reported: {err}"
    );
    let metrics = std::fs::read_to_string(dir.join("skip/metrics.jsonl")).unwrap();
    let skipped: Vec<u64> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["skipped"] == true)
        .filter_map(|v| v["step"].as_u64())
        .collect();
    assert_eq!(skipped, [3], "{metrics}");
    // Step 3 changed nothing: weights, optimizer state and EMA after it equal those after 2.
    for file in [
        "student.safetensors",
        "student.optim.safetensors",
        "student.ema.safetensors",
    ] {
        let before = weights(&dir.join("skip"), 2, file);
        assert!(!before.is_empty(), "{file}");
        assert_eq!(
            before,
            weights(&dir.join("skip"), 3, file),
            "{file} changed"
        );
        assert_eq!(before, weights(&dir.join("clean"), 2, file), "{file}");
    }
    // Later updates happen and stay finite.
    let last = weights(&dir.join("skip"), 5, "student.safetensors");
    assert_ne!(last, weights(&dir.join("skip"), 3, "student.safetensors"));
    assert!(last.values().flatten().all(|v| v.is_finite()));
    assert!(err.contains("1 step(s) were skipped"), "{err}");
    // Resumed from step 4 (after the skip), the run's count is still the whole run's.
    let step4 = ckpt(&dir.join("skip"), 4);
    let o = reel_train(
        dir,
        "skip",
        &[
            "--resume",
            step4.to_str().unwrap(),
            "--set",
            "training.non_finite=\"skip\"",
        ],
        None,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("1 step(s) were skipped"), "{err}");
}

#[test]
fn stop_checkpoints_the_last_good_state_and_resume_matches() {
    let tmp = tiny_run_with_clean(&[]);
    let dir = tmp.path();
    let o = reel_train(dir, "stop", &[], Some("non-finite-loss:3"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "stop must exit non-zero: {err}");
    assert!(
        err.contains("non-finite values at step 3") && err.contains("step-00000002"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        !ckpt(&dir.join("stop"), 3).exists(),
        "no checkpoint of the bad step"
    );
    for file in [
        "student.safetensors",
        "student.optim.safetensors",
        "student.ema.safetensors",
    ] {
        assert_eq!(
            weights(&dir.join("stop"), 2, file),
            weights(&dir.join("clean"), 2, file),
            "{file}: the stop checkpoint is not the last good state"
        );
    }
    // Resuming (the fault gone) re-reads the batch of the failed step and ends exactly where
    // the clean run ended.
    let o = reel_train(dir, "stop", &["--resume", "latest"], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for file in [
        "student.safetensors",
        "student.optim.safetensors",
        "student.ema.safetensors",
    ] {
        assert_eq!(
            weights(&dir.join("stop"), 5, file),
            weights(&dir.join("clean"), 5, file),
            "{file} differs after resume"
        );
    }
}
