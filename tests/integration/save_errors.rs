//! A checkpoint write that fails (a full disk, injected with
//! `REEL_FAULT=checkpoint-disk-full:<n>`, or an output folder that cannot hold checkpoints)
//! never damages the previous checkpoint. `on_save_error = "stop"` (default) exits non-zero
//! with the error and the run resumes to the uninterrupted result; `"continue"` warns and
//! trains on, except at the last step.

use crate::common;

use std::path::Path;

use common::{ckpt, reel_train, tensors, tiny_run_with_clean, TINY_WAN_RUN};

/// The 7th checkpoint file written: inside the second or a later checkpoint (each holds
/// weights, optimizer state, EMA, state.json and config.toml).
const FAULT: &str = "checkpoint-disk-full:7";

/// Step folders under `run/checkpoints`, and whether any temporary folder was left behind.
fn checkpoint_dirs(run: &Path) -> (Vec<String>, bool) {
    let mut steps = vec![];
    let mut leftovers = false;
    for e in std::fs::read_dir(run.join("checkpoints")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if name.starts_with("step-") {
            steps.push(name);
        } else if name.starts_with('.') {
            leftovers = true;
        }
    }
    steps.sort();
    (steps, leftovers)
}

const FILES: [&str; 3] = [
    "student.safetensors",
    "student.optim.safetensors",
    "student.ema.safetensors",
];

#[test]
fn disk_full_stops_keeping_the_previous_checkpoint_and_resume_matches() {
    let tmp = tiny_run_with_clean(&[]);
    let dir = tmp.path();
    let o = reel_train(dir, "full", &[], Some(FAULT));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a failed save stops the run: {err}");
    assert!(err.contains("No space left on device"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let run = dir.join("full");
    let (steps, leftovers) = checkpoint_dirs(&run);
    assert!(!leftovers, "the failed save left its temporary folder");
    assert!(
        !steps.is_empty() && steps.len() < 5,
        "a checkpoint before the failure, none after: {steps:?}"
    );
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    assert_eq!(
        latest.trim(),
        steps.last().unwrap(),
        "latest = newest intact"
    );
    // The previous checkpoint is intact (the resume verifies its checksums) and the run
    // finishes exactly as the uninterrupted one.
    let o = reel_train(dir, "full", &["--resume", "latest"], None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("skipped"), "no checkpoint was damaged: {err}");
    for file in FILES {
        assert_eq!(
            tensors(&ckpt(&run, 5).join(file)),
            tensors(&ckpt(&dir.join("clean"), 5).join(file)),
            "{file}"
        );
    }
}

#[test]
fn disk_full_with_continue_warns_and_trains_on() {
    let tmp = tiny_run_with_clean(&[]);
    let dir = tmp.path();
    let o = reel_train(
        dir,
        "cont",
        &["--set", "training.on_save_error=\"continue\""],
        Some(FAULT),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("failed, training continues") && err.contains("No space left on device"),
        "{err}"
    );
    let run = dir.join("cont");
    let (steps, leftovers) = checkpoint_dirs(&run);
    assert!(!leftovers, "{steps:?}");
    assert_eq!(
        steps.len(),
        4,
        "exactly one checkpoint is missing: {steps:?}"
    );
    for file in FILES {
        assert_eq!(
            tensors(&ckpt(&run, 5).join(file)),
            tensors(&ckpt(&dir.join("clean"), 5).join(file)),
            "{file}: a failed save must not change training"
        );
    }
}

/// The last step's save is the run's result: its failure stops the run even with
/// `"continue"` (which would otherwise publish the step before as `final/` and report the run
/// done), and the run then resumes to the uninterrupted result.
#[test]
fn a_failed_last_save_is_an_error_even_with_continue() {
    let tmp = tiny_run_with_clean(&[]);
    let dir = tmp.path();
    // The files of one checkpoint (its manifest is written apart from them): the fault falls
    // on the second file of the last step's checkpoint.
    let clean = ckpt(&dir.join("clean"), 1);
    let per_checkpoint = std::fs::read_dir(&clean).unwrap().count() - 1;
    let steps = 5;
    let fault = format!("checkpoint-disk-full:{}", (steps - 1) * per_checkpoint + 2);
    let cont = ["--set", "training.on_save_error=\"continue\""];
    let o = reel_train(dir, "last", &cont, Some(fault.as_str()));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "a failed last save ends the run: {err}"
    );
    assert!(err.contains("No space left on device"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let run = dir.join("last");
    assert!(
        !run.join("final").exists(),
        "final/ was published from an older checkpoint"
    );
    let (saved, leftovers) = checkpoint_dirs(&run);
    assert_eq!((saved.len(), leftovers), (steps - 1, false), "{saved:?}");
    let o = reel_train(dir, "last", &["--resume", "latest"], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for file in FILES.iter().filter(|f| !f.contains(".optim.")) {
        assert_eq!(
            tensors(&run.join("final").join(file)),
            tensors(&dir.join("clean/final").join(file)),
            "{file}"
        );
    }
}

/// A checkpoint is complete once renamed into place: the `latest` pointer failing after it
/// (a disk full by then) is a warning that leaves no pointer, the run goes on, and `--resume latest` finds the
/// newest checkpoint without the pointer.
#[test]
fn a_latest_pointer_that_cannot_be_written_is_a_warning() {
    let tmp = tiny_run_with_clean(&[]);
    let dir = tmp.path();
    let o = reel_train(dir, "pointer", &[], Some("latest-pointer-fails:5"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("no pointer to the newest checkpoint was written"),
        "{err}"
    );
    let run = dir.join("pointer");
    // The 5th pointer write failed: no pointer, rather than one naming step 4 (which a
    // rotation could have pruned).
    assert!(!run.join("checkpoints/latest").exists(), "{err}");
    // The pointer's path still names the newest checkpoint.
    let o = reel_train(
        dir,
        "pointer",
        &["--resume", "pointer/checkpoints/latest"],
        None,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && err.contains("nothing to train"),
        "{err}"
    );
    assert_eq!(checkpoint_dirs(&run).0.len(), 5);
    let o = reel_train(dir, "pointer", &["--resume", "latest"], None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("nothing to train: the run is at step 5"),
        "{err}"
    );
    for file in FILES {
        assert_eq!(
            tensors(&ckpt(&run, 5).join(file)),
            tensors(&ckpt(&dir.join("clean"), 5).join(file)),
            "{file}"
        );
    }
}

#[test]
fn an_output_folder_that_cannot_hold_checkpoints_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("run.toml"), TINY_WAN_RUN).unwrap();
    // A file where the checkpoints folder should be: not writable even for root.
    std::fs::create_dir_all(dir.join("blocked")).unwrap();
    std::fs::write(dir.join("blocked/checkpoints"), b"not a folder").unwrap();
    let o = reel_train(dir, "blocked", &[], None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("checkpoints"),
        "the error names the path: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        std::fs::read(dir.join("blocked/checkpoints")).unwrap(),
        b"not a folder",
        "nothing was overwritten"
    );
}
