//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use reel_core::backend::CpuBackend;
use reel_core::config::{parse_run_config, LoadedConfig};
use reel_core::trainer::{train, TrainOptions, TrainSummary};
use reel_plugins::callbacks::logging::jsonl::read_metrics;

// Link the example plugin crate so its registrations exist in the test binary.
pub use custom_method as _;

/// The CPU backend the tests train on.
pub type TestBackend = CpuBackend;

/// A two-role toy run; `method_extra` and `training_extra` are appended to those tables.
pub fn toy_config(method_extra: &str, training_extra: &str) -> String {
    format!(
        r#"
[runtime]
seed = 7

[models.student]
arch = "toy"
preset = "tiny"
trainable = true

[models.critic]
arch = "toy"
preset = "tiny"
trainable = true

[method]
kind = "toy"
{method_extra}

[data]
kind = "toy"
batch_size = 4

[optimizer]
lr = 0.01

[training]
max_steps = 6
{training_extra}
"#
    )
}

/// Parse a config from text with overrides.
pub fn load(text: &str, overrides: &[&str]) -> LoadedConfig {
    let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    parse_run_config(text, Path::new("test.toml"), &o)
        .unwrap_or_else(|e| panic!("config should load: {e}"))
}

/// In-process trainings of this test binary take turns through this lock. Burn 0.21's
/// autodiff graph cleanup is process-wide: a `backward()` on one thread can free graph steps
/// another thread is still building (tracel-ai/burn#5573), which the staged backward of
/// gradient checkpointing exposes. Every training takes `reel-core`'s process-wide turn
/// around its graphs and backwards (`Seat::autodiff_turn`, since a one-device DMD2 run side by
/// side with the others lost a gradient about one test run in six), so plain runs share the
/// lock and run side by side; [`run_alone`] still takes it whole.
static TRAININGS: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Train in `dir`, side by side with the binary's other plain runs.
pub fn run(loaded: &LoadedConfig, dir: &Path, resume: Option<&str>) -> TrainSummary {
    let _shared = TRAININGS.read().unwrap_or_else(|e| e.into_inner());
    train_in(loaded, dir, resume)
}

/// Train in `dir` while no other in-process training of this binary runs (for runs with
/// gradient checkpointing; see [`TRAININGS`]).
pub fn run_alone(loaded: &LoadedConfig, dir: &Path, resume: Option<&str>) -> TrainSummary {
    let _alone = TRAININGS.write().unwrap_or_else(|e| e.into_inner());
    train_in(loaded, dir, resume)
}

fn train_in(loaded: &LoadedConfig, dir: &Path, resume: Option<&str>) -> TrainSummary {
    let opts = TrainOptions {
        resume: resume.map(str::to_string),
        output_dir: Some(dir.to_path_buf()),
        interrupt: None,
        processes: None,
    };
    train::<TestBackend>(loaded, &opts).unwrap_or_else(|e| panic!("training should succeed: {e}"))
}

/// All tensors of a safetensors file as flat f32 vectors.
pub fn tensors(path: &Path) -> BTreeMap<String, Vec<f32>> {
    let (t, _) = reel_core::io::read_safetensors(path).unwrap_or_else(|e| panic!("{e}"));
    t.into_iter()
        .map(|(k, d)| (k, d.to_vec::<f32>().unwrap()))
        .collect()
}

/// The checkpoint folder of `step` in run `dir`.
pub fn ckpt(dir: &Path, step: u64) -> std::path::PathBuf {
    dir.join("checkpoints").join(format!("step-{step:08}"))
}

/// Max |a − b| over two tensor maps with equal keys.
pub fn max_diff(a: &BTreeMap<String, Vec<f32>>, b: &BTreeMap<String, Vec<f32>>) -> f32 {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    a.iter()
        .flat_map(|(k, va)| va.iter().zip(&b[k]).map(|(x, y)| (x - y).abs()))
        .fold(0.0, f32::max)
}

/// A 5-step finetune of `wan-tiny` on small synthetic clips with EMA, logging every step and a
/// checkpoint after every step (for tests that run the `reel` binary).
pub const TINY_WAN_RUN: &str = r#"
[runtime]
backend = "cpu"
seed = 5

[models.student]
arch = "wan"
preset = "wan-tiny"
init_seed = 2
trainable = true

[method]
kind = "finetune"

[data]
kind = "synthetic"
batch_size = 2
num_samples = 16
frames = 2
height = 12
width = 12

[optimizer]
lr = 1e-3

[training]
max_steps = 5
checkpoint_every = 1
keep_last = 10

[[callbacks]]
kind = "ema"
decay = 0.9

[[callbacks]]
kind = "logging"
every_steps = 1
"#;

/// Run `reel train run.toml --output <out> <extra>` in `dir` (REEL_FAULT set to `fault`, or
/// cleared).
pub fn reel_train(
    dir: &Path,
    out: &str,
    extra: &[&str],
    fault: Option<&str>,
) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_reel"));
    cmd.current_dir(dir)
        .args(["train", "run.toml", "--output", out])
        .args(extra)
        .env_remove("REEL_FAULT");
    if let Some(f) = fault {
        cmd.env("REEL_FAULT", f);
    }
    cmd.output().expect("run reel")
}

/// A temporary folder holding `run.toml` (= [`TINY_WAN_RUN`]) and its uninterrupted run
/// (with `extra` arguments) in `clean/`.
pub fn tiny_run_with_clean(extra: &[&str]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("temp dir");
    std::fs::write(tmp.path().join("run.toml"), TINY_WAN_RUN).expect("write run.toml");
    let o = reel_train(tmp.path(), "clean", extra, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    tmp
}

/// A `[method]` body for [`distill_config`]: DMD2 on two denoising steps, the student
/// updated every second step, and the GAN terms with heads on the critic's first block.
pub const DMD2_GAN_METHOD: &str = r#"kind = "dmd2"
denoising_steps = [1000, 500]
generator_update_interval = 2
gan_generator_weight = 0.5
gan_discriminator_weight = 0.5
gan_loss = "non_saturating"
gan_heads = { blocks = [0], hidden = 16 }"#;

/// A `wan-tiny` run: student, frozen teacher (and a critic when `critic`), the given
/// `[method]` body, `max_steps` steps with a checkpoint after each and per-step logging.
pub fn distill_config(method: &str, critic: bool, max_steps: u64) -> String {
    let wan = |role: &str, trainable: bool| {
        format!(
            "[models.{role}]\narch = \"wan\"\npreset = \"wan-tiny\"\ninit_seed = 2\ntrainable = {trainable}\n"
        )
    };
    let critic = if critic {
        wan("critic", true)
    } else {
        String::new()
    };
    format!(
        r#"
[runtime]
backend = "cpu"
seed = 3

{student}
{teacher}
{critic}
[method]
{method}

[data]
kind = "synthetic"
batch_size = 2
num_samples = 16
frames = 2
height = 12
width = 12

[optimizer]
lr = 1e-3

[training]
max_steps = {max_steps}
checkpoint_every = 1
keep_last = 10

[[callbacks]]
kind = "logging"
every_steps = 1
"#,
        student = wan("student", true),
        teacher = wan("teacher", false),
    )
}

/// A `logging` callback that writes only `metrics.jsonl`, one line per step: appended to a
/// run config, it lets [`wait_for_steps`] see the run's progress.
pub const STEP_LOG: &str =
    "\n[[callbacks]]\nkind = \"logging\"\nprogress = false\ntensorboard = false\nplot = false\n";

/// Wait until the `reel train` child writing `run_dir` has logged `steps` steps to its
/// `metrics.jsonl` (its config needs [`STEP_LOG`]), so that a signal sent next lands in
/// training, whatever the machine's load, not before the interrupt handler is installed.
/// Panics if the child exits first or after 120 s.
pub fn wait_for_steps(child: &mut std::process::Child, run_dir: &Path, steps: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let logged = std::fs::read_to_string(run_dir.join("metrics.jsonl"))
            .map_or(0, |text| text.matches('\n').count());
        if logged >= steps {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("reel train exited ({status}) before logging step {steps}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "reel train logged no step {steps} within 120 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Number of logged records holding `key`.
pub fn records_with(run_dir: &Path, key: &str) -> usize {
    let records = read_metrics(&run_dir.join("metrics.jsonl")).unwrap();
    records.iter().filter(|r| r.contains_key(key)).count()
}

/// Train `text` straight to its last step in `tmp/straight`, and in `tmp/split` to
/// `split_at` then resumed to the end; the listed checkpoint files of the final step must be
/// identical. Returns the straight run's folder.
pub fn straight_and_resumed(tmp: &Path, text: &str, split_at: u64, files: &[&str]) -> PathBuf {
    let straight = tmp.join("straight");
    let steps = run(&load(text, &[]), &straight, None).steps;
    let split = tmp.join("split");
    let at = format!("training.max_steps={split_at}");
    run(&load(text, &[at.as_str()]), &split, None);
    assert_eq!(run(&load(text, &[]), &split, Some("latest")).steps, steps);
    for file in files {
        let a = tensors(&ckpt(&straight, steps).join(file));
        assert!(!a.is_empty(), "{file}");
        assert_eq!(
            a,
            tensors(&ckpt(&split, steps).join(file)),
            "{file} after resume"
        );
    }
    straight
}

/// `role.safetensors` of checkpoint `k`.
pub fn weights(run_dir: &Path, k: u64, role: &str) -> BTreeMap<String, Vec<f32>> {
    tensors(&ckpt(run_dir, k).join(format!("{role}.safetensors")))
}
