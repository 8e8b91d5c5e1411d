//! Crash anywhere: the real `reel` binary is killed at deterministic points (during every
//! checkpoint file write, before the manifest, before the rename, after a step) and at
//! random moments with SIGKILL; each time `--resume latest` finishes with exactly the weights
//! of an uninterrupted run. Ctrl-C writes a checkpoint and a resume continues from it. A
//! device that runs out of memory ends the run with a hint on what to change; a failed queued
//! device call stops it before any checkpoint holds its values.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{ckpt, tensors};

const BIN: &str = env!("CARGO_BIN_EXE_reel");

const CONFIG: &str = r#"
[runtime]
seed = 11
[models.student]
arch = "wan"
preset = "wan-tiny"
trainable = true
[method]
kind = "finetune"
cfg_dropout = 0.2
[data]
kind = "synthetic"
batch_size = 2
num_samples = 8
frames = 2
height = 12
width = 12
[optimizer]
lr = 1e-3
[training]
max_steps = 4
checkpoint_every = 1
keep_last = 2
[[callbacks]]
kind = "ema"
decay = 0.9
"#;

fn reel(config: &Path, out: &Path, extra: &[&str], fault: Option<&str>) -> std::process::Output {
    let mut cmd = Command::new(BIN);
    cmd.arg("train")
        .arg(config)
        .arg("--output")
        .arg(out)
        .args(extra);
    cmd.env_remove("REEL_FAULT");
    if let Some(f) = fault {
        cmd.env("REEL_FAULT", f);
    }
    cmd.output().expect("run reel")
}

fn final_weights(out: &Path) -> Vec<std::collections::BTreeMap<String, Vec<f32>>> {
    let d = ckpt(out, 4);
    [
        "student.safetensors",
        "student.optim.safetensors",
        "student.ema.safetensors",
    ]
    .iter()
    .map(|f| tensors(&d.join(f)))
    .collect()
}

/// Resume until the run completes (a kill before the first checkpoint restarts from scratch).
/// A run folder with a checkpoint folder is resumed even without its `latest` pointer (a kill
/// between the first checkpoint's rename and its pointer): `reel train` refuses a new run there, as it does any
/// folder holding checkpoints, and `--resume latest` finds the newest one.
fn finish(config: &Path, out: &Path) {
    let has_ckpt = !reel_core::checkpoint::CheckpointStore::new(out, 1)
        .list()
        .is_empty();
    let args: &[&str] = if has_ckpt {
        &["--resume", "latest"]
    } else {
        &[]
    };
    let o = reel(config, out, args, None);
    assert!(
        o.status.success(),
        "resume failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Resumes the stopped run in `out` to its end ([`finish`]) and asserts that its final weights
/// equal those of an uninterrupted run of `config` in `clean`.
fn finish_like_a_clean_run(config: &Path, out: &Path, clean: &Path) {
    finish(config, out);
    finish(config, clean);
    assert_eq!(final_weights(out), final_weights(clean));
}

/// A callback that fails after a step's update (a validation that cannot write its samples)
/// stops the run, but the state after that step is checkpointed first, though no checkpoint
/// was due: the resumed run ends as an uninterrupted one.
#[test]
fn a_failed_callback_keeps_the_steps_since_the_last_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("run.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let (out, clean) = (tmp.path().join("failed"), tmp.path().join("clean"));
    let rare = ["--set", "training.checkpoint_every=10"];
    let o = reel(&config, &out, &rare, Some("callback-error:3"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("callback-error at step 3") && err.contains("after step 3 was saved first"),
        "{err}"
    );
    let saved = reel_core::checkpoint::CheckpointStore::new(&out, 1).list();
    assert_eq!(saved.first().map(|(step, _)| *step), Some(3), "{err}");
    finish_like_a_clean_run(&config, &out, &clean);
}

#[test]
fn killed_at_every_fault_point_resume_matches_an_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("run.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let reference = tmp.path().join("reference");
    let o = reel(&config, &reference, &[], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let want = final_weights(&reference);

    // 4 checkpoints x 5 files (weights, optimizer, ema, state, config) = 20 file points.
    let mut points: Vec<String> = (1..=20).map(|n| format!("checkpoint-file:{n}")).collect();
    points.extend((1..=4).map(|n| format!("checkpoint-manifest:{n}")));
    points.extend((1..=4).map(|n| format!("checkpoint-rename:{n}")));
    points.extend((1..=4).map(|n| format!("checkpoint-latest:{n}")));
    points.extend((1..=3).map(|n| format!("step-end:{n}")));
    let mut killed = 0;
    for (i, point) in points.iter().enumerate() {
        let out = tmp.path().join(format!("run-{i}"));
        let o = reel(&config, &out, &[], Some(point));
        if !o.status.success() {
            killed += 1;
            assert!(
                String::from_utf8_lossy(&o.stderr).contains("REEL_FAULT"),
                "{point}: died for another reason"
            );
        }
        finish(&config, &out);
        assert_eq!(final_weights(&out), want, "{point}: resumed run differs");
    }
    assert_eq!(killed, points.len(), "every fault point must be reached");
    eprintln!("{killed} kill points, all resumed to identical weights");
}

#[test]
fn sigkill_at_random_moments_never_loses_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("run.toml");
    std::fs::write(&config, CONFIG.replace("max_steps = 4", "max_steps = 4\n")).unwrap();
    let reference = tmp.path().join("reference");
    assert!(reel(&config, &reference, &[], None).status.success());
    let want = final_weights(&reference);
    // Delays spread over start-up, steps and checkpoint writes (deterministic list).
    for (i, ms) in [40u64, 90, 150, 220, 300, 420, 600].iter().enumerate() {
        let out = tmp.path().join(format!("kill-{i}"));
        let mut child = Command::new(BIN)
            .arg("train")
            .arg(&config)
            .arg("--output")
            .arg(&out)
            .env_remove("REEL_FAULT")
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(*ms));
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        finish(&config, &out);
        assert_eq!(
            final_weights(&out),
            want,
            "killed after {ms} ms: resumed run differs"
        );
    }
}

#[test]
fn ctrl_c_writes_a_checkpoint_and_resume_continues() {
    interrupt_writes_a_checkpoint_and_resume_continues("-INT");
}

/// SIGTERM (Slurm's preemption and time limit, `mpirun` passing on a Ctrl-C) stops the run
/// as Ctrl-C does: with a checkpoint.
#[test]
fn sigterm_writes_a_checkpoint_as_ctrl_c_does() {
    interrupt_writes_a_checkpoint_and_resume_continues("-TERM");
}

/// `signal` (a `kill` flag) sent after the first step: the run checkpoints, says it was
/// interrupted, exits non-zero, and resumes from that checkpoint.
fn interrupt_writes_a_checkpoint_and_resume_continues(signal: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("run.toml");
    std::fs::write(
        &config,
        CONFIG
            .replace("max_steps = 4", "max_steps = 100000")
            .replace("checkpoint_every = 1", "checkpoint_every = 100000")
            + common::STEP_LOG,
    )
    .unwrap();
    let out = tmp.path().join("run");
    let mut child = Command::new(BIN)
        .arg("train")
        .arg(&config)
        .arg("--output")
        .arg(&out)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_for_steps(&mut child, &out, 1);
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args([signal, &pid])
        .status()
        .unwrap()
        .success());
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "an interrupted run exits non-zero");
    assert!(err.contains("interrupted at step"), "{err}");
    let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap();
    let step: u64 = latest.trim().trim_start_matches("step-").parse().unwrap();
    assert!(step >= 1, "at least one step ran before the interrupt");
    let o = reel(
        &config,
        &out,
        &[
            "--resume",
            "latest",
            "--set",
            &format!("training.max_steps={}", step + 2),
        ],
        None,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(ckpt(&out, step + 2).join("manifest.json").is_file());
}

/// Two SIGINTs in a row: the second exits at once (status 130) whatever the run was doing,
/// often in the middle of a checkpoint write; the newest complete checkpoint stays intact and
/// the run resumes from it.
///
/// The second signal is sent only once the first has been acknowledged on stderr (two signals
/// sent back to back can merge into one pending SIGINT in the kernel). A step is short, so the
/// first interrupt's checkpoint may still win the race and end the run with status 1; that
/// attempt is checked for damage too, and the test needs three attempts where the second
/// interrupt arrived in time.
#[test]
fn a_second_ctrl_c_exits_at_once_without_damage() {
    use std::io::BufRead;
    let tmp = tempfile::tempdir().unwrap();
    // A long run (checkpoint after every step) so the signals land mid-training.
    let long = tmp.path().join("long.toml");
    std::fs::write(
        &long,
        CONFIG
            .replace("max_steps = 4", "max_steps = 100000")
            .replace("keep_last = 2", "keep_last = 100")
            + common::STEP_LOG,
    )
    .unwrap();
    // After the first logged step, so that the signals land in training on a loaded machine.
    let delays = [200u64, 500, 800, 300, 600, 900, 400, 700, 1000, 250];
    let mut exited_at_once = 0;
    for (i, ms) in delays.iter().enumerate() {
        if exited_at_once == 3 {
            break;
        }
        let out = tmp.path().join(format!("twice-{i}"));
        let mut child = Command::new(BIN)
            .arg("train")
            .arg(&long)
            .arg("--output")
            .arg(&out)
            .env_remove("REEL_FAULT")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            let mut all = String::new();
            for line in std::io::BufReader::new(stderr).lines() {
                let line = line.unwrap_or_default();
                all.push_str(&line);
                all.push('\n');
                let _ = tx.send(line);
            }
            all
        });
        common::wait_for_steps(&mut child, &out, 1);
        std::thread::sleep(Duration::from_millis(*ms));
        let pid = child.id().to_string();
        let kill = || {
            assert!(Command::new("kill")
                .args(["-INT", &pid])
                .status()
                .unwrap()
                .success())
        };
        kill();
        // Wait for the acknowledgement of the first interrupt, then send the second.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains("interrupt received") => break,
                Ok(_) => continue,
                Err(e) => panic!("no acknowledgement of the first interrupt: {e}"),
            }
        }
        kill();
        let status = child.wait().unwrap();
        let err = reader.join().unwrap();
        if status.code() == Some(130) {
            assert!(err.contains("second interrupt, exiting now"), "{err}");
            exited_at_once += 1;
        } else {
            // The first interrupt's checkpoint finished before the second signal arrived.
            assert_eq!(status.code(), Some(1), "{err}");
            assert!(err.contains("interrupted at step"), "{err}");
        }
        // The newest checkpoint verifies (no fallback to an older one) and training goes on.
        let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap();
        let step: u64 = latest.trim().trim_start_matches("step-").parse().unwrap();
        assert!(step >= 1, "the run made progress before the signals");
        let o = reel(
            &long,
            &out,
            &[
                "--resume",
                "latest",
                "--set",
                &format!("training.max_steps={}", step + 1),
            ],
            None,
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert!(!err.contains("skipp"), "no checkpoint was damaged: {err}");
        assert!(ckpt(&out, step + 1).join("manifest.json").is_file());
    }
    assert_eq!(
        exited_at_once,
        3,
        "the second interrupt should exit at once in 3 of {} attempts",
        delays.len()
    );
}

#[test]
fn running_out_of_device_memory_says_what_to_change_and_keeps_the_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("run.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let out = tmp.path().join("run");
    // A failed device allocation (as CubeCL panics) at the end of step 3.
    let o = reel(&config, &out, &[], Some("device-out-of-memory:3"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains(reel::panic_hint::OUT_OF_MEMORY_HINT),
        "the out-of-memory hint: {err}"
    );
    assert!(
        err.contains("can't allocate buffer") && err.contains("at step 3"),
        "the cause: {err}"
    );
    // Steps 1 and 2 were saved and resume to the uninterrupted result.
    assert!(ckpt(&out, 2).join("manifest.json").is_file(), "{err}");
    finish_like_a_clean_run(&config, &out, &tmp.path().join("clean"));
}

/// A device call that fails after its caller went on (a queued cuBLAS or cuDNN call; here the
/// `device-fault` fault point) stops the run with an error at the step's host sync, before
/// the update, or before a checkpoint's commit: no checkpoint holds values computed from it,
/// and resuming from the last good one gives the uninterrupted result.
#[test]
fn a_failed_queued_device_call_stops_the_run_before_any_checkpoint_holds_its_values() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("run.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let out = tmp.path().join("run");
    let latest = || std::fs::read_to_string(out.join("checkpoints/latest")).unwrap();
    // Checks: step 0's host sync (1), checkpoint 1 (2), step 1's host sync (3).
    let o = reel(&config, &out, &[], Some("device-fault:3"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("step 1: a device call queued by REEL_FAULT failed")
            && err.contains("step-00000001")
            && !err.contains("panicked"),
        "the error names the step, the failure and the last good checkpoint: {err}"
    );
    assert!(!ckpt(&out, 2).exists(), "{err}");
    assert_eq!(latest(), "step-00000001");
    // Resumed: step 1's host sync (1), then checkpoint 2 (2) is not committed.
    let o = reel(
        &config,
        &out,
        &["--resume", "latest"],
        Some("device-fault:2"),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("step 2: a device call"), "{err}");
    assert!(!ckpt(&out, 2).exists(), "{err}");
    assert_eq!(latest(), "step-00000001");
    let leftovers: Vec<_> = std::fs::read_dir(out.join("checkpoints"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(
        leftovers.is_empty(),
        "temporary folders left: {leftovers:?}"
    );
    finish_like_a_clean_run(&config, &out, &tmp.path().join("clean"));
}
