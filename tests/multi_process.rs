//! Runs of several processes (`runtime.launcher = "mpi"`, built with `--features mpi`): two
//! processes started by `mpirun` on this machine (loopback) equal the same workers in one
//! process, a failed or killed process stops the whole run without hanging, and the run
//! resumes from its last checkpoint. Needs Open MPI (`scripts/install-mpi.sh`).
#![cfg(feature = "mpi")]

mod common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{ckpt, max_diff, tensors};

/// Agreement bar between the processes' run and the one-process run (the sums differ only in
/// order; measured: bitwise equal on 2 processes of 1 worker).
const TOL: f32 = 1e-5;

/// A `wan-tiny` finetune: a 4-sample global batch, 2 micro-batches per step, tight clipping,
/// EMA and a checkpoint after every step.
const RUN: &str = r#"
[runtime]
backend = "cpu"
seed = 11

[models.student]
arch = "wan"
preset = "wan-tiny"
init_seed = 4
trainable = true

[method]
kind = "finetune"

[data]
kind = "synthetic"
batch_size = 4
num_samples = 9
frames = 2
height = 12
width = 12

[optimizer]
lr = 1e-3

[training]
max_steps = 4
grad_accumulation = 2
max_grad_norm = 0.05
checkpoint_every = 1
keep_last = 10

[[callbacks]]
kind = "ema"
decay = 0.9
"#;

/// Wait for `cmd` at most `secs` seconds (killed then, and the test fails: nothing hangs).
fn bounded(mut cmd: Command, secs: u64) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?} (is Open MPI installed?): {e}"));
    let id = child.id();
    let start = Instant::now();
    let waiter = std::thread::spawn(move || child.wait_with_output());
    while !waiter.is_finished() {
        if start.elapsed() > Duration::from_secs(secs) {
            let _ = Command::new("kill").args(["-9", &id.to_string()]).status();
            panic!("{cmd:?} did not finish within {secs} s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    waiter.join().unwrap().expect("wait for the command")
}

/// `reel train run.toml --output <out> --set runtime.launcher=mpi <extra...>` in every process
/// of an `mpirun` job of `processes` processes; `fault_on_last` sets `REEL_FAULT` in the last
/// process only.
fn mpirun(
    dir: &Path,
    processes: usize,
    out: &str,
    extra: &[&str],
    fault_on_last: Option<&str>,
) -> Output {
    match fault_on_last {
        None => mpirun_apps(dir, &[app(processes, out, extra, None)]),
        Some(f) => mpirun_apps(
            dir,
            &[
                app(processes - 1, out, extra, None),
                app(1, out, extra, Some(f)),
            ],
        ),
    }
}

/// The `mpirun` arguments of `np` processes running `reel train run.toml --output <out> --set
/// runtime.launcher=mpi <extra...>`, with `REEL_FAULT=<fault>`.
fn app(np: usize, out: &str, extra: &[&str], fault: Option<&str>) -> Vec<String> {
    let mut a: Vec<String> = vec!["-np".into(), np.to_string()];
    if let Some(f) = fault {
        a.extend(["-x".into(), format!("REEL_FAULT={f}")]);
    }
    let reel = env!("CARGO_BIN_EXE_reel");
    let train = [reel, "train", "run.toml", "--output", out];
    a.extend(
        train
            .iter()
            .chain(&["--set", "runtime.launcher=mpi"])
            .map(|s| s.to_string()),
    );
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// One `mpirun` job of these apps (each from [`app`]; their processes in order).
fn mpirun_apps(dir: &Path, apps: &[Vec<String>]) -> Output {
    let args = apps.join(&[":".to_string()][..]);
    let mut cmd = Command::new("mpirun");
    cmd.current_dir(dir)
        .args([
            "--oversubscribe",
            "--tag-output",
            "--mca",
            "btl",
            "self,tcp",
        ])
        .args(args)
        .env_remove("REEL_FAULT")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1");
    bounded(cmd, 300)
}

/// `reel train run.toml --output <out> <set...>` in one process.
fn single(dir: &Path, out: &str, set: &[&str], resume: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_reel"));
    cmd.current_dir(dir)
        .args(["train", "run.toml", "--output", out])
        .args(set.iter().flat_map(|s| ["--set", s]))
        .args(if resume {
            &["--resume", "latest"][..]
        } else {
            &[]
        })
        .env_remove("REEL_FAULT");
    bounded(cmd, 300)
}

/// What the job printed, without the `[job,rank]<stderr>:` tags `mpirun --tag-output`
/// puts before every chunk a process writes.
fn stderr(o: &Output) -> String {
    let mut out = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    for tag in ["]<stderr>:", "]<stdout>:"] {
        while let Some(end) = out.find(tag) {
            let start = out[..end].rfind('[').unwrap_or(end);
            out.replace_range(start..end + tag.len(), "");
        }
    }
    out
}

/// Every checkpoint file of steps `1..=steps` of runs `a` and `b` agree within `tol`.
fn assert_runs_agree(a: &Path, b: &Path, steps: u64) {
    for k in 1..=steps {
        let files: Vec<String> = std::fs::read_dir(ckpt(a, k))
            .unwrap_or_else(|e| panic!("{}: {e}", ckpt(a, k).display()))
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.ends_with(".safetensors"))
            .collect();
        assert!(files.len() >= 2, "{files:?}");
        for f in files {
            let d = max_diff(
                &tensors(&ckpt(a, k).join(&f)),
                &tensors(&ckpt(b, k).join(&f)),
            );
            assert!(d <= TOL, "{f} at step {k}: max |diff| {d}");
        }
    }
}

fn setup() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("run.toml"), RUN).unwrap();
    tmp
}

#[test]
fn two_processes_equal_the_same_workers_in_one_process() {
    let tmp = setup();
    let dir = tmp.path();
    for (local, total) in [(1, 2), (2, 4)] {
        let one_out = format!("one-{total}");
        let mp_out = format!("mp-{local}x2");
        let set = format!("runtime.num_devices={total}");
        let one = single(dir, &one_out, &[&set], false);
        assert!(one.status.success(), "{}", stderr(&one));
        let set = format!("runtime.num_devices={local}");
        let mp = mpirun(dir, 2, &mp_out, &["--set", &set], None);
        let log = stderr(&mp);
        assert!(mp.status.success(), "{log}");
        assert!(
            log.contains(&format!(
                "process 1 of 2: {local} worker(s) here, {total} in all"
            )),
            "{log}"
        );
        assert!(
            log.contains("all workers of the 2 processes ended with identical weights"),
            "{log}"
        );
        assert_runs_agree(&dir.join(&one_out), &dir.join(&mp_out), 4);
        // Only process 0 writes the run folder's logs and checkpoints.
        assert_eq!(log.matches("reel: done: 4 steps").count(), 1, "{log}");
    }
}

#[test]
fn a_failed_or_killed_process_stops_the_run_which_resumes() {
    let tmp = setup();
    let dir = tmp.path();
    let clean = single(dir, "clean", &["runtime.num_devices=2"], false);
    assert!(clean.status.success(), "{}", stderr(&clean));
    // A worker that panics at the end of step 3 in the second process: named, and every
    // process stops.
    let failed = mpirun(dir, 2, "panicked", &[], Some("worker-panic:3"));
    let log = stderr(&failed);
    assert!(!failed.status.success(), "{log}");
    assert!(
        log.contains(
            "process 1 of 2: worker 1 (device 0) failed: panicked: REEL_FAULT: worker-panic"
        ),
        "{log}"
    );
    // A panic on the main thread of the second process, outside any worker: every process
    // stops (unwinding into MPI's finalize left the first waiting for it).
    let main = mpirun(dir, 2, "main-panic", &[], Some("main-panic:1"));
    let log = stderr(&main);
    assert!(!main.status.success(), "{log}");
    assert!(
        log.contains("process 1 of 2: error: panicked: REEL_FAULT: main-panic"),
        "{log}"
    );
    // A process killed outright (abort at its third step end): the launcher ends the job.
    let killed = mpirun(dir, 2, "killed", &[], Some("step-end:3"));
    let log = stderr(&killed);
    assert!(!killed.status.success(), "{log}");
    assert!(
        log.contains("REEL_FAULT: killing the process at `step-end`"),
        "{log}"
    );
    // A bad record read by the second process's worker at step 3 (its fifth batch: two
    // micro-batches a step): every process stops there by agreement, none is killed, and the
    // state after step 2 is kept.
    let bad = mpirun_apps(
        dir,
        &[
            app(1, "bad-record", &[], None),
            app(1, "bad-record", &[], Some("bad-record:5")),
        ],
    );
    let log = stderr(&bad);
    assert!(!bad.status.success(), "{log}");
    assert!(
        log.contains("reel: worker 1 (device 0): REEL_FAULT: record ")
            && log.contains("a data record failed on worker 1")
            && log.contains("the state after step 2 was saved first"),
        "{log}"
    );
    assert!(!log.contains("stopping every process"), "{log}");
    assert!(ckpt(&dir.join("bad-record"), 2).is_dir(), "{log}");
    assert!(!ckpt(&dir.join("bad-record"), 3).exists(), "{log}");
    // All resume from their last checkpoint and end where the clean run ended: on 2
    // processes, and on one process of 2 workers.
    for run in ["panicked", "bad-record"] {
        let again = mpirun(dir, 2, run, &["--resume", "latest"], None);
        assert!(again.status.success(), "{}", stderr(&again));
    }
    let again = single(dir, "killed", &["runtime.num_devices=2"], true);
    assert!(again.status.success(), "{}", stderr(&again));
    for run in ["panicked", "killed", "bad-record"] {
        let files = ["student.safetensors", "student.ema.safetensors"];
        for f in files {
            let d = max_diff(
                &tensors(&ckpt(&dir.join("clean"), 4).join(f)),
                &tensors(&ckpt(&dir.join(run), 4).join(f)),
            );
            assert!(d <= TOL, "{run}/{f}: max |diff| {d}");
        }
    }
}

#[test]
fn processes_started_by_mpirun_without_a_launcher_are_refused() {
    let tmp = setup();
    let reel = env!("CARGO_BIN_EXE_reel");
    let mut cmd = Command::new("mpirun");
    cmd.current_dir(tmp.path())
        .args([
            "--oversubscribe",
            "-np",
            "2",
            reel,
            "train",
            "run.toml",
            "--output",
            "x",
        ])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    let o = bounded(cmd, 120);
    let log = stderr(&o);
    assert!(!o.status.success(), "{log}");
    assert!(
        log.contains(
            "run.toml: runtime.launcher: this process is one of 2 started by an MPI launcher"
        ),
        "{log}"
    );
    assert!(!tmp.path().join("x").exists(), "nothing may be written");
}

/// A process that MPI sees alone while Slurm says the step has several tasks (`srun
/// --mpi=none`: each copy would be the whole job and write the same run folder) is refused.
#[test]
fn a_lone_mpi_process_of_a_slurm_step_of_several_is_refused() {
    let tmp = setup();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_reel"));
    cmd.current_dir(tmp.path())
        .args(["train", "run.toml", "--output", "x"])
        .args(["--set", "runtime.launcher=mpi"])
        .env("SLURM_STEP_NUM_TASKS", "2")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env_remove("REEL_FAULT");
    let o = bounded(cmd, 120);
    let log = stderr(&o);
    assert!(!o.status.success(), "{log}");
    assert!(
        log.contains("MPI sees this process alone, but it is one of 2 (SLURM_STEP_NUM_TASKS=2)"),
        "{log}"
    );
    assert!(!tmp.path().join("x").exists(), "nothing may be written");
}

#[test]
fn processes_that_disagree_or_fail_alone_stop_the_run_with_the_reason() {
    let tmp = setup();
    let dir = tmp.path();
    // A flag given to one process only: each says so (all lines are written before `mpirun`
    // ends the job), and nothing is written.
    let steps = ["--set", "training.max_steps=5"];
    let apart = mpirun_apps(
        dir,
        &[app(1, "apart", &[], None), app(1, "apart", &steps, None)],
    );
    let log = stderr(&apart);
    assert!(!apart.status.success(), "{log}");
    let said = "the processes of the run: they were started with different configs: `run.toml`";
    assert_eq!(log.matches(said).count(), 2, "{log}");
    assert!(!dir.join("apart").exists(), "nothing may be written: {log}");
    // A run with checkpoints at steps 1 and 2, in one process of 2 workers.
    let first = single(
        dir,
        "run",
        &["runtime.num_devices=2", "training.max_steps=2"],
        false,
    );
    assert!(first.status.success(), "{}", stderr(&first));
    // One process resumes, the other would start a new run in the same folder: its own
    // check fails; every process learns it in the same sum, and all stop there with a reason.
    let resume = ["--resume", "latest"];
    let alone = mpirun_apps(
        dir,
        &[app(1, "run", &resume, None), app(1, "run", &[], None)],
    );
    let log = stderr(&alone);
    assert!(!alone.status.success(), "{log}");
    assert!(
        log.contains("error: process 1 of 2: `--output`: `run` already holds a run")
            && log.contains("(checkpoints up to step 2)")
            && log.contains("process(es) 1 of 2 failed their checks before training"),
        "{log}"
    );
    assert!(!log.contains("stopping every process"), "no abort: {log}");
    // Resuming different checkpoints: every worker says where it starts, and process 0,
    // resuming the older one, leaves the newer checkpoint where it is.
    let step1 = dir.join("run/checkpoints/step-00000001");
    let older = ["--resume", step1.to_str().unwrap()];
    let mixed = mpirun_apps(
        dir,
        &[app(1, "run", &older, None), app(1, "run", &resume, None)],
    );
    let log = stderr(&mixed);
    assert!(!mixed.status.success(), "{log}");
    assert!(
        log.contains("they start from different checkpoints: worker 0 resumes")
            && log.contains("step-00000001` at step 1")
            && log.contains("worker 1 resumes")
            && log.contains("step-00000002` at step 2"),
        "{log}"
    );
    assert!(ckpt(&dir.join("run"), 2).exists(), "{log}");
    assert!(!log.contains("moved"), "nothing is set aside: {log}");
    // The same step of another run (trained on one worker: its state differs): refused too.
    let other = single(dir, "other", &["training.max_steps=2"], false);
    assert!(other.status.success(), "{}", stderr(&other));
    let two_runs = mpirun_apps(
        dir,
        &[app(1, "run", &resume, None), app(1, "other", &resume, None)],
    );
    let log = stderr(&two_runs);
    assert!(!two_runs.status.success(), "{log}");
    assert!(
        log.contains("they start from different checkpoints: worker 1 resumes")
            && log.contains("other/checkpoints/step-00000002` at step 2")
            && log.contains("worker 0 resumes `run/checkpoints/step-00000002` at step 2"),
        "{log}"
    );
    // The run is intact: the same two processes resume it together to its end.
    let again = mpirun(dir, 2, "run", &resume, None);
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(ckpt(&dir.join("run"), 4).exists());
}
