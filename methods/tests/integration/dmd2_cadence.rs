//! The `dmd2` method in real (tiny, random-init) training runs on the synthetic data: the
//! update cadence (critic every step, student every `generator_update_interval` steps, teacher
//! never and never saved), gradient accumulation for the critic, and bit-identical resume.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use reel_core::backend::CpuBackend;
use reel_core::config::{parse_run_config, LoadedConfig};
use reel_core::trainer::{train, TrainOptions, TrainSummary};
use reel_methods as _;
use reel_models::WanConfig;
use reel_plugins as _;

/// Three wan-tiny roles with different random inits on 4×2×12×12 synthetic latents.
const CONFIG: &str = r#"
[runtime]
seed = 5

[models.student]
arch = "wan"
preset = "wan-tiny"
init_seed = 12
trainable = true

[models.teacher]
arch = "wan"
preset = "wan-tiny"
init_seed = 11

[models.critic]
arch = "wan"
preset = "wan-tiny"
init_seed = 13
trainable = true

[method]
kind = "dmd2"
rollout = "simulate"
denoising_steps = [1000, 750, 500, 250]
generator_update_interval = 5
guidance_scale = 3.0
critic_optimizer = { lr = 0.002 }

[data]
kind = "synthetic"
batch_size = 2
num_samples = 32
frames = 2
height = 12
width = 12

[optimizer]
lr = 0.001

[training]
max_steps = 10
checkpoint_every = 1
keep_last = 20
"#;

fn load(overrides: &[&str]) -> LoadedConfig {
    let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    parse_run_config(CONFIG, Path::new("dmd2_test.toml"), &o)
        .unwrap_or_else(|e| panic!("config should load: {e}"))
}

fn run(loaded: &LoadedConfig, dir: &Path, resume: Option<&str>) -> TrainSummary {
    let opts = TrainOptions {
        resume: resume.map(str::to_string),
        output_dir: Some(dir.to_path_buf()),
        interrupt: None,
        processes: None,
    };
    train::<CpuBackend>(loaded, &opts).unwrap_or_else(|e| panic!("training should succeed: {e}"))
}

fn ckpt(dir: &Path, step: u64) -> PathBuf {
    dir.join("checkpoints").join(format!("step-{step:08}"))
}

fn tensors(path: &Path) -> BTreeMap<String, Vec<f32>> {
    let (t, _) = reel_core::io::read_safetensors(path).unwrap_or_else(|e| panic!("{e}"));
    t.into_iter()
        .map(|(k, d)| (k, d.to_vec::<f32>().unwrap()))
        .collect()
}

fn max_diff(a: &BTreeMap<String, Vec<f32>>, b: &BTreeMap<String, Vec<f32>>) -> f32 {
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    a.iter()
        .flat_map(|(k, va)| va.iter().zip(&b[k]).map(|(x, y)| (x - y).abs()))
        .fold(0.0, f32::max)
}

/// The weights a role starts from (`preset = "wan-tiny"`, `init_seed = seed`), as saved.
fn initial_weights(seed: u64, tmp: &Path) -> BTreeMap<String, Vec<f32>> {
    let model = WanConfig::preset("wan-tiny")
        .unwrap()
        .init_seeded::<burn::backend::NdArray>(&Default::default(), seed);
    let dir = tmp.join(format!("init-{seed}"));
    model.save_pretrained(&dir).unwrap();
    tensors(&dir.join("diffusion_pytorch_model.safetensors"))
}

#[test]
fn critic_every_step_student_every_fifth_teacher_never() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let t0 = std::time::Instant::now();
    let summary = run(&load(&[]), &dir, None);
    eprintln!("10 dmd2 steps: {:.1} s", t0.elapsed().as_secs_f64());
    assert_eq!(summary.steps, 10);
    assert!(summary
        .last_losses
        .iter()
        .any(|(k, v)| k == "critic_loss" && v.is_finite()));
    // Step 9 (0-based) is not a generator step.
    assert!(!summary
        .last_losses
        .iter()
        .any(|(k, _)| k == "generator_loss"));

    let mut student = initial_weights(12, tmp.path());
    let mut critic = initial_weights(13, tmp.path());
    for step in 0..10u64 {
        // Checkpoint `step + 1` holds the weights after 0-based step `step`.
        let c = ckpt(&dir, step + 1);
        let names: Vec<String> = std::fs::read_dir(&c)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        assert!(
            !names.iter().any(|n| n.contains("teacher")),
            "teacher saved at step {step}: {names:?}"
        );
        let s = tensors(&c.join("student.safetensors"));
        let k = tensors(&c.join("critic.safetensors"));
        let ds = max_diff(&student, &s);
        let dk = max_diff(&critic, &k);
        eprintln!("step {step}: student moved {ds:.2e}, critic moved {dk:.2e}");
        if step % 5 == 0 {
            assert!(ds > 0.0, "student must update at step {step}");
        } else {
            assert_eq!(ds, 0.0, "student must not change at step {step}");
        }
        assert!(dk > 0.0, "critic must update at step {step}");
        student = s;
        critic = k;
    }
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt(&dir, 10).join("state.json")).unwrap())
            .unwrap();
    assert_eq!(state["optimizer_steps"]["student"], 2);
    assert_eq!(state["optimizer_steps"]["critic"], 10);
    assert!(state["optimizer_steps"].get("teacher").is_none());
}

#[test]
fn critic_accumulation_equals_a_larger_batch() {
    // Every draw is keyed by the stream position, and the critic loss is a per-sample mean, so two
    // micro-batches of 2 give the critic the same update as one batch of 4. (The generator loss
    // divides by a micro-batch-wide normaliser, as in FastVideo, so the student is not compared.)
    let tmp = tempfile::tempdir().unwrap();
    let big = tmp.path().join("big");
    run(
        &load(&["training.max_steps=1", "data.batch_size=4"]),
        &big,
        None,
    );
    let acc = tmp.path().join("acc");
    run(
        &load(&[
            "training.max_steps=1",
            "data.batch_size=2",
            "training.grad_accumulation=2",
        ]),
        &acc,
        None,
    );
    let d = max_diff(
        &tensors(&ckpt(&big, 1).join("critic.safetensors")),
        &tensors(&ckpt(&acc, 1).join("critic.safetensors")),
    );
    assert!(d < 1e-5, "critic after an accumulated step differs by {d}");
    let small = tmp.path().join("small");
    run(
        &load(&["training.max_steps=1", "data.batch_size=2"]),
        &small,
        None,
    );
    let d = max_diff(
        &tensors(&ckpt(&big, 1).join("critic.safetensors")),
        &tensors(&ckpt(&small, 1).join("critic.safetensors")),
    );
    assert!(
        d > 1e-5,
        "the batch must matter (the comparison can fail): {d}"
    );
}

#[test]
fn resume_is_bit_identical() {
    let tmp = tempfile::tempdir().unwrap();
    let straight = tmp.path().join("straight");
    run(&load(&["training.max_steps=7"]), &straight, None);
    let split = tmp.path().join("split");
    run(&load(&["training.max_steps=4"]), &split, None);
    run(&load(&["training.max_steps=7"]), &split, Some("latest"));
    for file in [
        "student.safetensors",
        "critic.safetensors",
        "student.optim.safetensors",
        "critic.optim.safetensors",
    ] {
        assert_eq!(
            tensors(&ckpt(&straight, 7).join(file)),
            tensors(&ckpt(&split, 7).join(file)),
            "{file} differs after resume"
        );
    }
}

/// Resume with EMA on both trainable roles and gradient accumulation, split in the middle of
/// a student cadence period (steps 0 and 5 update the student; the split is after step 3),
/// and with `max_steps` raised on resume: every weight, optimizer moment and EMA shadow equals
/// the uninterrupted run's.
#[test]
fn resume_with_ema_and_accumulation_is_bit_identical() {
    let text = format!(
        "{CONFIG}\n[[callbacks]]\nkind = \"ema\"\ndecay = 0.9\nroles = [\"student\", \"critic\"]\n"
    );
    let load_ema = |overrides: &[&str]| {
        let mut o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        o.push("training.grad_accumulation=2".into());
        parse_run_config(&text, Path::new("dmd2_ema_test.toml"), &o)
            .unwrap_or_else(|e| panic!("config should load: {e}"))
    };
    let tmp = tempfile::tempdir().unwrap();
    let straight = tmp.path().join("straight");
    run(&load_ema(&["training.max_steps=7"]), &straight, None);
    let split = tmp.path().join("split");
    run(&load_ema(&["training.max_steps=3"]), &split, None);
    run(&load_ema(&["training.max_steps=7"]), &split, Some("latest"));
    for file in [
        "student.safetensors",
        "critic.safetensors",
        "student.optim.safetensors",
        "critic.optim.safetensors",
        "student.ema.safetensors",
        "critic.ema.safetensors",
    ] {
        let a = tensors(&ckpt(&straight, 7).join(file));
        assert!(!a.is_empty(), "{file} is saved");
        assert_eq!(
            a,
            tensors(&ckpt(&split, 7).join(file)),
            "{file} differs after resume"
        );
    }
    let state = |d: &Path| std::fs::read_to_string(ckpt(d, 7).join("state.json")).unwrap();
    assert_eq!(
        state(&straight),
        state(&split),
        "data cursor / optimizer steps differ"
    );
}

/// DMD2 with a LoRA student from TOML: the student trains (and checkpoints) only its adapter,
/// the critic stays a full model, and the teacher is untouched.
#[test]
fn dmd2_with_a_lora_student_trains_only_the_adapter() {
    let student = "init_seed = 12\ntrainable = true\n";
    assert!(CONFIG.contains(student));
    let text = CONFIG.replacen(
        student,
        "init_seed = 12\ntrainable = true\n\n[models.student.adapter]\nkind = \"lora\"\n\
         rank = 2\nalpha = 4\ntarget_modules = [\"to_q\", \"to_v\", \"ffn.net.2\"]\n",
        1,
    );
    let loaded = parse_run_config(
        &text,
        Path::new("dmd2_lora_test.toml"),
        &["training.max_steps=6".to_string()],
    )
    .unwrap_or_else(|e| panic!("config should load: {e}"));
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let summary = run(&loaded, &dir, None);
    assert_eq!(summary.steps, 6);
    let student = tensors(&ckpt(&dir, 6).join("student.safetensors"));
    assert!(!student.is_empty());
    assert!(
        student
            .keys()
            .all(|k| k.contains(".lora_A.") || k.contains(".lora_B.")),
        "only adapter weights are trainable: {:?}",
        student.keys().take(4).collect::<Vec<_>>()
    );
    // 2 blocks x (to_q, to_v of attn1 and attn2, ffn.net.2) x (A, B).
    assert_eq!(student.len(), 2 * 5 * 2, "{:?}", student.keys());
    let b_moved = student
        .iter()
        .filter(|(k, _)| k.contains(".lora_B."))
        .any(|(_, v)| v.iter().any(|x| *x != 0.0));
    assert!(
        b_moved,
        "the student's updates (steps 0 and 5) moved lora_B off zero"
    );
    let optim = tensors(&ckpt(&dir, 6).join("student.optim.safetensors"));
    assert_eq!(
        optim.len(),
        2 * student.len(),
        "AdamW moments for the adapter only"
    );
    let critic = tensors(&ckpt(&dir, 6).join("critic.safetensors"));
    assert!(critic.keys().all(|k| !k.contains("lora_")));
    assert!(
        max_diff(&critic, &initial_weights(13, tmp.path())) > 0.0,
        "the critic trained"
    );
    assert!(!ckpt(&dir, 6).join("teacher.safetensors").exists());
}
