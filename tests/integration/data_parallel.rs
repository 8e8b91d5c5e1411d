//! Data parallelism (`runtime.devices` / `runtime.num_devices`): 2 and 3 workers in threads
//! equal one worker with the whole batch, stay bitwise identical to each other, resume on
//! another worker count, and a failed worker stops the run without hanging.

use crate::common;

use std::path::Path;
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::time::Duration;

use common::{ckpt, distill_config, load, max_diff, run, tensors, DMD2_GAN_METHOD};
use reel_core::config::LoadedConfig;
use reel_core::trainer::TrainSummary;

/// Agreement bar between a group and one worker with the whole batch (float summation order
/// differs; AdamW sees the same gradients up to rounding).
const TOL: f32 = 1e-5;

/// Run `f` on a thread; fail the test if it takes longer than `secs` (no test hangs).
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(RecvTimeoutError::Timeout) => panic!("did not finish within {secs} s"),
        Err(RecvTimeoutError::Disconnected) => panic!("the run panicked (see above)"),
    }
}

/// Train `text` with `overrides` in `dir`, within a time bound.
fn train(text: &str, overrides: &[&str], dir: &Path, resume: Option<&str>) -> TrainSummary {
    let loaded: LoadedConfig = load(text, overrides);
    let (dir, resume) = (dir.to_path_buf(), resume.map(str::to_string));
    within(600, move || run(&loaded, &dir, resume.as_deref()))
}

/// A `wan-tiny` finetune: a 6-sample global batch, 2 micro-batches per step, tight
/// clipping, EMA, a checkpoint after every step.
const FINETUNE: &str = r#"
[runtime]
backend = "cpu"
seed = 11

[models.student]
arch = "wan"
preset = "wan-tiny"
init_seed = 4
trainable = true
{adapter}

[method]
kind = "finetune"

[data]
kind = "synthetic"
batch_size = 6
num_samples = 9
frames = 2
height = 12
width = 12

[optimizer]
lr = 1e-3

[training]
max_steps = 3
grad_accumulation = 2
max_grad_norm = 0.05
checkpoint_every = 1
keep_last = 10

[[callbacks]]
kind = "ema"
decay = 0.9
"#;

fn finetune(adapter: &str) -> String {
    FINETUNE.replace("{adapter}", adapter)
}

/// Every checkpoint file of step `k` of `a` and `b` agree within `tol` (weights, AdamW
/// moments, EMA of every role).
fn assert_checkpoints_agree(a: &Path, b: &Path, k: u64, tol: f32) {
    let files: Vec<String> = std::fs::read_dir(ckpt(a, k))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    assert!(files.len() >= 2, "{files:?}");
    for f in files {
        let d = max_diff(
            &tensors(&ckpt(a, k).join(&f)),
            &tensors(&ckpt(b, k).join(&f)),
        );
        assert!(d <= tol, "{f} at step {k}: max |diff| {d}");
    }
}

/// The group's losses equal the single run's, and every worker ended bitwise identical.
fn assert_same_run(one: &TrainSummary, group: &TrainSummary, workers: usize) {
    assert_eq!(group.worker_digests.len(), workers);
    assert!(
        group
            .worker_digests
            .iter()
            .all(|d| *d == group.worker_digests[0]),
        "workers diverged: {:?}",
        group.worker_digests
    );
    assert!(one.worker_digests.is_empty());
    assert_eq!(one.last_losses.len(), group.last_losses.len());
    for ((n, a), (m, b)) in one.last_losses.iter().zip(&group.last_losses) {
        assert_eq!(n, m);
        assert!(
            (a - b).abs() <= TOL as f64 * a.abs().max(1.0),
            "{n}: {a} vs {b}"
        );
    }
}

/// `text` on 1, 2 and 3 workers: every checkpoint of every step agrees.
fn one_two_three(text: &str, extra: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let one = train(text, extra, &tmp.path().join("one"), None);
    for workers in [2, 3] {
        let set = format!("runtime.num_devices={workers}");
        let overrides: Vec<&str> = extra.iter().copied().chain([set.as_str()]).collect();
        let dir = tmp.path().join(format!("w{workers}"));
        let group = train(text, &overrides, &dir, None);
        assert_eq!(group.steps, one.steps);
        assert_same_run(&one, &group, workers);
        for k in 1..=one.steps {
            assert_checkpoints_agree(&tmp.path().join("one"), &dir, k, TOL);
        }
    }
}

#[test]
fn finetune_on_two_and_three_workers_equals_one_worker_with_the_whole_batch() {
    one_two_three(&finetune(""), &[]);
}

#[test]
fn lora_on_two_and_three_workers_equals_one_worker() {
    let adapter = r#"
[models.student.adapter]
kind = "lora"
rank = 4
alpha = 4
target_modules = ["to_q", "to_v", "to_out.0"]
init_seed = 1
"#;
    one_two_three(&finetune(adapter), &[]);
}

#[test]
fn dmd2_with_gan_terms_and_a_cadence_on_two_and_three_workers_equals_one_worker() {
    let text = distill_config(&DMD2_GAN_METHOD.replace("non_saturating", "hinge"), true, 3);
    one_two_three(
        &text,
        &[
            "data.batch_size=6",
            "training.grad_accumulation=2",
            "training.max_grad_norm=0.1",
        ],
    );
}

#[test]
fn adversarial_and_consistency_on_two_workers_equal_one_worker() {
    let adversarial = distill_config(
        r#"kind = "adversarial"
heads = { stride = 1, hidden = 16 }
flow_matching_weight = 0.5
r1_weight = 1.0
r1_epsilon = 0.05
discriminator_interval = 2
discriminator_optimizer = { eps = 1e-3 }"#,
        false,
        3,
    );
    // At initialisation the heads' output-bias gradient is a cancellation (real and fake
    // terms of equal size), so it is pure f32 rounding (~1e-9), which differs with the
    // summation order of 1 vs 2 workers; AdamW's `g / (sqrt(v) + eps)` at eps = 1e-8 turns
    // that into lr-sized steps (measured: 3.8e-4 apart after step 1, while every moment
    // agreed within 1e-6). eps = 1e-3 keeps this comparison about data parallelism.
    let consistency = distill_config(
        r#"kind = "consistency"
num_euler_timesteps = 8
multi_phased_distill_schedule = "2-4,8-2"
distill_cfg = 2.0
ema_decay = 0.5"#,
        false,
        3,
    );
    for text in [adversarial, consistency] {
        let tmp = tempfile::tempdir().unwrap();
        let extra = ["data.batch_size=4", "training.grad_accumulation=2"];
        let one = train(&text, &extra, &tmp.path().join("one"), None);
        let two = [extra[0], extra[1], "runtime.num_devices=2"];
        let group = train(&text, &two, &tmp.path().join("two"), None);
        assert_same_run(&one, &group, 2);
        assert_checkpoints_agree(&tmp.path().join("one"), &tmp.path().join("two"), 3, TOL);
    }
}

#[test]
fn a_group_checkpoint_resumes_on_one_worker_and_the_other_way_round() {
    let text = finetune("");
    let tmp = tempfile::tempdir().unwrap();
    let two = tmp.path().join("two");
    train(&text, &["runtime.num_devices=2"], &two, None);
    // 2 workers for 2 steps, then 1 worker to the end.
    let a = tmp.path().join("a");
    train(
        &text,
        &["runtime.num_devices=2", "training.max_steps=2"],
        &a,
        None,
    );
    train(&text, &[], &a, Some("latest"));
    assert_checkpoints_agree(&two, &a, 3, TOL);
    // 1 worker for 1 step, then 3 workers (devices listed) to the end.
    let b = tmp.path().join("b");
    train(&text, &["training.max_steps=1"], &b, None);
    train(&text, &["runtime.devices=[0, 1, 2]"], &b, Some("latest"));
    assert_checkpoints_agree(&two, &b, 3, TOL);
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt(&b, 3).join("state.json")).unwrap())
            .unwrap();
    assert_eq!(state["workers"], 3);
}

#[test]
fn a_batch_that_does_not_split_over_the_workers_is_a_config_error() {
    let text = finetune("");
    let o = vec!["runtime.num_devices=4".to_string()];
    let err = reel_core::config::parse_run_config(&text, Path::new("run.toml"), &o)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("run.toml")
            && err.contains("data.batch_size")
            && err.contains("multiple of 4"),
        "{err}"
    );
    let o = vec![
        "runtime.num_devices=2".into(),
        "runtime.devices=[0, 1]".into(),
    ];
    let err = reel_core::config::parse_run_config(&text, Path::new("run.toml"), &o)
        .unwrap_err()
        .to_string();
    assert!(err.contains("runtime.num_devices"), "{err}");
    let o = vec!["runtime.devices=[1, 1]".to_string()];
    let err = reel_core::config::parse_run_config(&text, Path::new("run.toml"), &o)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("runtime.devices") && err.contains("distinct"),
        "{err}"
    );
}

#[test]
fn the_processes_of_a_run_agree_on_all_but_their_devices_and_folder() {
    let digest = |o: &[&str]| load(&finetune(""), o).run_digest();
    let base = digest(&[]);
    // What each process of a multi-process run may set for itself.
    let own = ["runtime.num_devices=2", "runtime.output_dir=\"/scratch/x\""];
    assert_eq!(digest(&own), base);
    assert_eq!(digest(&["runtime.devices=[3]"]), base);
    assert_eq!(digest(&["runtime.device=1"]), base);
    // What makes two processes train apart.
    for other in [
        "training.max_steps=4",
        "optimizer.lr=0.5",
        "runtime.seed=12",
        "data.batch_size=4",
    ] {
        assert_ne!(digest(&[other]), base, "{other}");
    }
}

/// `reel train run.toml --output <out> --set runtime.num_devices=2 <extra>`, killed after
/// `secs` seconds if it has not ended.
fn reel_group(dir: &Path, out: &str, extra: &[&str], fault: Option<&str>) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_reel"));
    cmd.current_dir(dir)
        .args([
            "train",
            "run.toml",
            "--output",
            out,
            "--set",
            "runtime.num_devices=2",
        ])
        .args(extra)
        .env_remove("REEL_FAULT")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if let Some(f) = fault {
        cmd.env("REEL_FAULT", f);
    }
    let mut child = cmd.spawn().expect("run reel");
    let t0 = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(600) {
            let _ = child.kill();
            panic!("reel train did not end within 600 s (a hung worker?)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn ctrl_c_stops_every_worker_at_the_same_step_and_the_group_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let long = finetune("")
        .replace("max_steps = 3", "max_steps = 100000")
        .replace("checkpoint_every = 1", "checkpoint_every = 100000")
        + common::STEP_LOG;
    std::fs::write(tmp.path().join("run.toml"), long).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_reel"))
        .current_dir(tmp.path())
        .args([
            "train",
            "run.toml",
            "--output",
            "run",
            "--set",
            "runtime.num_devices=2",
        ])
        .env_remove("REEL_FAULT")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_for_steps(&mut child, &tmp.path().join("run"), 1);
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let o = rx
        .recv_timeout(Duration::from_secs(300))
        .expect("the interrupted group ends")
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("interrupted at step"),
        "{err}"
    );
    let out = tmp.path().join("run");
    let latest = std::fs::read_to_string(out.join("checkpoints/latest")).unwrap();
    let step: u64 = latest.trim().trim_start_matches("step-").parse().unwrap();
    assert!(
        err.contains(&format!("interrupted at step {step}")),
        "{err}"
    );
    let more = format!("training.max_steps={}", step + 2);
    let o = reel_group(
        tmp.path(),
        "run",
        &["--resume", "latest", "--set", &more],
        None,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(ckpt(&out, step + 2).join("manifest.json").is_file());
}

#[test]
fn a_panicking_worker_stops_the_group_with_its_name_and_the_run_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("run.toml"), finetune("")).unwrap();
    let clean = reel_group(tmp.path(), "clean", &[], None);
    assert!(
        clean.status.success(),
        "{}",
        String::from_utf8_lossy(&clean.stderr)
    );
    // The 4th hit: the end of step 2 on one of the two workers.
    let crashed = reel_group(tmp.path(), "run", &[], Some("worker-panic:4"));
    let err = String::from_utf8_lossy(&crashed.stderr);
    assert!(!crashed.status.success(), "{err}");
    assert!(
        err.contains("failed: panicked: REEL_FAULT: worker-panic in worker")
            && err.contains("at step 2")
            && err.matches("failed").count() == 1,
        "one line naming the worker and the cause: {err}"
    );
    let resumed = reel_group(tmp.path(), "run", &["--resume", "latest"], None);
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let (clean, run) = (tmp.path().join("clean"), tmp.path().join("run"));
    for f in [
        "student.safetensors",
        "student.optim.safetensors",
        "student.ema.safetensors",
    ] {
        assert_eq!(
            tensors(&ckpt(&clean, 3).join(f)),
            tensors(&ckpt(&run, 3).join(f)),
            "{f}: the resumed group equals the uninterrupted one"
        );
    }
}

#[test]
fn a_bad_record_on_one_worker_stops_a_dmd2_group_which_keeps_its_steps() {
    // DMD2's generator loss averages its normaliser over the workers inside the forward: a
    // worker that skipped the step's forwards for a bad record alone would leave the other
    // waiting there.
    let tmp = tempfile::tempdir().unwrap();
    let method = "kind = \"dmd2\"\ndenoising_steps = [1000, 500]\ngenerator_update_interval = 1";
    let text = distill_config(method, true, 3);
    std::fs::write(tmp.path().join("run.toml"), text).unwrap();
    let set = ["--set", "training.checkpoint_every=10"];
    // The third batch the process reads: step 2, on one of the two workers.
    let bad = reel_group(tmp.path(), "run", &set, Some("bad-record:3"));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success(), "{err}");
    assert!(
        err.contains("REEL_FAULT: record ")
            && err.contains("the state after step 1 was saved first"),
        "{err}"
    );
    for word in ["panicked", "collective"] {
        assert!(!err.contains(word), "{err}");
    }
    let run_dir = tmp.path().join("run");
    assert!(ckpt(&run_dir, 1).join("manifest.json").is_file(), "{err}");
    let resume = [&set[..], &["--resume", "latest"]].concat();
    let resumed = reel_group(tmp.path(), "run", &resume, None);
    let err = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{err}");
    assert!(
        err.contains("resumed from") && err.contains("at step 1"),
        "{err}"
    );
}

#[test]
fn a_launcher_needs_the_mpi_build_and_a_known_name() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("run.toml"), finetune("")).unwrap();
    let unknown = reel_group(tmp.path(), "x", &["--set", "runtime.launcher=slurm"], None);
    let err = String::from_utf8_lossy(&unknown.stderr).to_string();
    assert!(!unknown.status.success());
    assert!(
        err.contains("run.toml") && err.contains("launcher") && err.contains("mpi"),
        "{err}"
    );
    let mpi = reel_group(tmp.path(), "x", &["--set", "runtime.launcher=mpi"], None);
    let err = String::from_utf8_lossy(&mpi.stderr).to_string();
    if cfg!(feature = "mpi") {
        // Built with MPI and started without a launcher: a one-process MPI job that trains.
        assert!(mpi.status.success(), "{err}");
    } else {
        assert!(!mpi.status.success());
        let want = "run.toml: `runtime.launcher`: \"mpi\" needs a reel built with MPI support";
        assert!(
            err.contains(want) && err.contains("--features mpi"),
            "{err}"
        );
        assert!(!tmp.path().join("x").exists(), "nothing may be written");
        // `reel check` says so too.
        let check = std::process::Command::new(env!("CARGO_BIN_EXE_reel"))
            .current_dir(tmp.path())
            .args(["check", "run.toml", "--set", "runtime.launcher=mpi"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&check.stderr).to_string();
        assert!(!check.status.success() && err.contains(want), "{err}");
    }
}
