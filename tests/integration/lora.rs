//! LoRA end to end on the CPU: a finetune run with an adapter trains and checkpoints only the
//! adapter; `reel export` writes an adapter file with the same keys as diffusers' (fixture)
//! that loads back to identical outputs, and a merged diffusers folder; bad adapter configs
//! fail with one-line errors naming the key.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use burn::tensor::{Tensor, TensorData};
use common::*;
use reel_core::config::parse_run_config;
use reel_core::io::{load_module_tensors, read_safetensors, write_safetensors, LoadOptions};
use reel_models::lora::{load_lora, read_lora_file, LoraSpec};
use reel_models::{build_wan_role, WanConfig, WanModel};

// Keep the plugin registrations (finetune, dmd2, lora, synthetic, ema) in this test binary.
use reel_methods as _;
use reel_plugins as _;

type Cpu = <TestBackend as burn::tensor::backend::AutodiffBackend>::InnerBackend;

/// The golden fixture folder (`$REEL_WAN_FIXTURES`, else the repository's
/// `tests/fixtures/wan_tiny`); the test fails when it is incomplete.
fn fixtures_dir() -> PathBuf {
    reel_core::fixtures::WAN.require(&[
        "config.json",
        "inputs.safetensors",
        "pytorch_lora_weights.safetensors",
    ])
}

/// The fixture's model config.
fn fixture_config() -> WanConfig {
    WanConfig::from_json_file(fixtures_dir().join("config.json")).unwrap()
}

/// The fixture adapter's spec (rank, alpha and targets from its metadata).
fn fixture_spec() -> LoraSpec {
    read_lora_file(fixtures_dir().join("pytorch_lora_weights.safetensors"))
        .unwrap()
        .spec
}

/// Eight samples of the fixture model's shapes as a `safetensors` data folder: latents of
/// `in_channels` over 2×6×6 patches, 8 text tokens of `text_dim`.
fn write_data(dir: &Path) -> PathBuf {
    let cfg = fixture_config();
    let [pt, ph, pw] = cfg.patch_size;
    let latent = [cfg.in_channels, 2 * pt, 6 * ph, 6 * pw];
    let text = [8, cfg.text_dim];
    let data_dir = dir.join("data");
    std::fs::create_dir_all(&data_dir).unwrap();
    for i in 0..8usize {
        let values = |n: usize, salt: usize| -> Vec<f32> {
            (0..n)
                .map(|j| (((j * 37 + i * 11 + salt) % 101) as f32 / 50.0) - 1.0)
                .collect()
        };
        let tensors = [
            (
                "latents".to_string(),
                TensorData::new(values(latent.iter().product(), 0), latent),
            ),
            (
                "text_embedding".to_string(),
                TensorData::new(values(text.iter().product(), 7), text),
            ),
        ];
        write_safetensors(data_dir.join(format!("{i:02}.safetensors")), &tensors, None).unwrap();
    }
    data_dir
}

/// A finetune run of the fixture's model with a LoRA of the fixture adapter's rank, alpha and
/// targets (`targets` overrides them), on the data folder `data`.
fn lora_config(data: &Path, targets: Option<&[String]>, extra_adapter: &str) -> String {
    let spec = fixture_spec();
    let targets = targets.unwrap_or(&spec.target_modules);
    let config = fixtures_dir().join("config.json");
    format!(
        r#"
[runtime]
seed = 11

[models.student]
arch = "wan"
config = {config:?}
init_seed = 5
trainable = true

[models.student.adapter]
kind = "lora"
rank = {rank}
alpha = {alpha}
target_modules = {targets:?}
{extra_adapter}

[method]
kind = "finetune"

[data]
kind = "safetensors"
path = {data:?}
batch_size = 2
text_len = 8

[optimizer]
lr = 0.01

[training]
max_steps = 3

[[callbacks]]
kind = "ema"
decay = 0.5
"#,
        rank = spec.rank,
        alpha = spec.alpha,
    )
}

fn reel(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_reel"))
        .args(args)
        .output()
        .expect("reel runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "reel {args:?} failed: {err}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The model's output on the fixture's forward inputs.
fn forward(model: &WanModel<Cpu>) -> Vec<f32> {
    let dev = Default::default();
    let (inputs, _) = read_safetensors(fixtures_dir().join("inputs.safetensors")).unwrap();
    let x = Tensor::<Cpu, 5>::from_data(inputs["hidden_states"].clone(), &dev);
    let t = Tensor::<Cpu, 1>::from_data(inputs["timestep"].clone(), &dev);
    let ctx = Tensor::<Cpu, 3>::from_data(inputs["encoder_hidden_states"].clone(), &dev);
    model
        .forward(x, t, ctx)
        .into_data()
        .to_vec::<f32>()
        .unwrap()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn base_model() -> WanModel<Cpu> {
    fixture_config().init_seeded::<Cpu>(&Default::default(), 5)
}

#[test]
fn lora_run_trains_checkpoints_and_exports_only_the_adapter() {
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let spec = fixture_spec();
    let text = lora_config(&write_data(tmp.path()), None, "init_seed = 3");
    let loaded = load(&text, &[]);
    let summary = run(&loaded, &run_dir, None);
    assert_eq!(summary.steps, 3);

    // Checkpoint: adapter weights only, optimizer moments only for them.
    let ckpt = summary.checkpoint.clone();
    let weights = tensors(&ckpt.join("student.safetensors"));
    let fixture_keys: Vec<String> =
        read_safetensors(fixtures_dir().join("pytorch_lora_weights.safetensors"))
            .unwrap()
            .0
            .into_keys()
            .collect();
    let want: Vec<String> = fixture_keys
        .iter()
        .map(|k| k.strip_prefix("transformer.").unwrap().to_string())
        .collect();
    assert_eq!(
        weights.keys().cloned().collect::<Vec<_>>(),
        want,
        "checkpoint = adapter keys"
    );
    let optim = tensors(&ckpt.join("student.optim.safetensors"));
    let mut want_optim: Vec<String> = want
        .iter()
        .flat_map(|k| [format!("exp_avg.{k}"), format!("exp_avg_sq.{k}")])
        .collect();
    want_optim.sort();
    assert_eq!(
        optim.keys().cloned().collect::<Vec<_>>(),
        want_optim,
        "moments for the adapter only"
    );
    let b_norm: f32 = weights
        .iter()
        .filter(|(k, _)| k.ends_with("lora_B.weight"))
        .flat_map(|(_, v)| v.iter().map(|x| x.abs()))
        .sum();
    assert!(b_norm > 0.0, "lora_B moved away from zero");

    // Export the adapter (diffusers layout): same keys and metadata fields as the fixture.
    let cfg_path = tmp.path().join("run.toml");
    std::fs::write(&cfg_path, &text).unwrap();
    let (ck, cfg) = (ckpt.to_str().unwrap(), cfg_path.to_str().unwrap());
    let lora_out = tmp.path().join("lora");
    let file = reel(&[
        "export",
        ck,
        "--config",
        cfg,
        "--format",
        "lora",
        "--out",
        lora_out.to_str().unwrap(),
    ]);
    let (exported, meta) = read_safetensors(&file).unwrap();
    assert_eq!(
        exported.keys().cloned().collect::<Vec<_>>(),
        fixture_keys,
        "diffusers keys"
    );
    let meta: serde_json::Value =
        serde_json::from_str(&meta.unwrap()["lora_adapter_metadata"]).unwrap();
    assert_eq!(
        (
            meta["transformer.r"].as_u64(),
            meta["transformer.lora_alpha"].as_f64()
        ),
        (Some(spec.rank as u64), Some(spec.alpha))
    );

    // The checkpoint's own weights file lacks the alpha: refused, pointing at the export.
    let err = read_lora_file(ckpt.join("student.safetensors")).unwrap_err();
    assert!(
        err.to_string()
            .contains("`reel export <checkpoint> --format lora`"),
        "{err}"
    );

    // Loaded back onto the base model: identical to the role rebuilt with the checkpoint.
    let from_file = load_lora(base_model(), &file).unwrap();
    let role = &loaded.config.models["student"];
    let rebuilt = build_wan_role::<Cpu>(
        role,
        Path::to_path_buf,
        loaded.config.runtime.seed,
        &Default::default(),
    )
    .unwrap();
    let ck_tensors: BTreeMap<String, TensorData> =
        read_safetensors(ckpt.join("student.safetensors"))
            .unwrap()
            .0;
    let opts = LoadOptions {
        allow_missing: true,
        ..LoadOptions::default()
    };
    let rebuilt = load_module_tensors(rebuilt, &ck_tensors, &opts).unwrap();
    let (a, b) = (forward(&from_file), forward(&rebuilt));
    assert_eq!(a, b, "saved and reloaded adapter gives identical outputs");
    assert!(
        max_abs_diff(&a, &forward(&base_model())) > 1e-4,
        "the adapter changes the output"
    );

    // ComfyUI export: original Wan module names with lora_down / lora_up / alpha, one triple
    // per adapted module, and it loads back to the same outputs.
    let comfy_out = tmp.path().join("comfy");
    let comfy_file = reel(&[
        "export",
        ck,
        "--config",
        cfg,
        "--format",
        "comfyui",
        "--out",
        comfy_out.to_str().unwrap(),
    ]);
    let (comfy, _) = read_safetensors(&comfy_file).unwrap();
    assert_eq!(
        comfy.len(),
        fixture_keys.len() / 2 * 3,
        "down, up, alpha per module"
    );
    for key in comfy.keys() {
        assert!(key.starts_with("diffusion_model.blocks."), "{key}");
        assert!(
            [".lora_down.weight", ".lora_up.weight", ".alpha"]
                .iter()
                .any(|s| key.ends_with(s)),
            "{key}"
        );
        assert!(
            !key.contains("attn1") && !key.contains("to_q"),
            "Wan names: {key}"
        );
    }
    let alpha = comfy
        .iter()
        .find(|(k, _)| k.ends_with(".alpha"))
        .map(|(_, v)| v.to_vec::<f32>().unwrap())
        .unwrap();
    assert_eq!(alpha, [spec.alpha as f32]);
    let comfy_read = read_lora_file(&comfy_file).unwrap();
    assert_eq!(comfy_read.style, reel_models::lora::KeyStyle::Comfy);
    assert!(comfy_read
        .scaling
        .values()
        .all(|s| (s - spec.scaling()).abs() < 1e-12));
    let from_comfy = load_lora(base_model(), &comfy_file).unwrap();
    assert_eq!(
        forward(&from_comfy),
        a,
        "the ComfyUI file gives identical outputs"
    );

    // Merged diffusers export: equals the adapted model; untargeted weights are the base's.
    let merged_out = tmp.path().join("transformer");
    let merged_args = [
        "export",
        ck,
        "--config",
        cfg,
        "--out",
        merged_out.to_str().unwrap(),
    ];
    reel(&merged_args);
    let merged = WanModel::<Cpu>::from_pretrained(&merged_out, &Default::default()).unwrap();
    let d = max_abs_diff(&forward(&merged), &a);
    eprintln!("merged export vs adapter: max |diff| = {d:.3e}");
    assert!(d < 1e-4, "merged export differs by {d}");
    let merged_w = read_safetensors(merged_out.join("diffusion_pytorch_model.safetensors"))
        .unwrap()
        .0;
    assert!(
        !merged_w.keys().any(|k| k.contains("lora_")),
        "no adapter keys in the merged model"
    );
    let base_w: BTreeMap<String, TensorData> = reel_core::params::named_tensor_data(&base_model())
        .into_iter()
        .collect();
    let module = |key: &str| {
        key.rsplit_once('.')
            .map_or(String::new(), |(m, _)| m.into())
    };
    let (targeted, frozen): (Vec<&String>, Vec<&String>) = base_w
        .keys()
        .filter(|k| k.ends_with(".weight"))
        .partition(|k| spec.targets(&module(k)));
    assert!(!targeted.is_empty() && !frozen.is_empty());
    for k in frozen {
        assert_eq!(merged_w[k], base_w[k], "frozen weight {k} unchanged");
    }
    for k in targeted {
        assert_ne!(merged_w[k], base_w[k], "targeted weight {k} merged");
    }

    // A second export into the same folder is refused (naming the file and --force), and
    // leaves the first export as it was; with --force it replaces it.
    let merged_file = merged_out.join("diffusion_pytorch_model.safetensors");
    let first = std::fs::read(&merged_file).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_reel"))
        .args(merged_args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a second export replaced the first");
    assert!(
        err.contains("diffusion_pytorch_model.safetensors") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(std::fs::read(&merged_file).unwrap(), first);
    reel(&[&merged_args[..], &["--force"]].concat());

    // The EMA shadow exports the same way.
    let ema_file = reel(&[
        "export",
        run_dir.to_str().unwrap(),
        "--ema",
        "--format",
        "lora",
        "--out",
        tmp.path().join("ema").to_str().unwrap(),
    ]);
    assert_eq!(
        read_safetensors(&ema_file)
            .unwrap()
            .0
            .into_keys()
            .collect::<Vec<_>>(),
        fixture_keys
    );

    // A config that builds the adapter at another rank cannot read the run's weights: the
    // error names the file and says why, for `export` and `sample` alike.
    let rank = format!("rank = {}", spec.rank);
    assert_eq!(text.matches(&rank).count(), 1, "{text}");
    let other = tmp.path().join("other_rank.toml");
    std::fs::write(
        &other,
        text.replace(&rank, &format!("rank = {}", spec.rank + 1)),
    )
    .unwrap();
    let other = other.to_str().unwrap();
    let out_dir = tmp.path().join("other_out");
    let out_dir = out_dir.to_str().unwrap();
    let export = [
        "export", ck, "--config", other, "--format", "lora", "--out", out_dir,
    ];
    let sample = [
        "sample", ck, "--config", other, "--prompt", "a", "--steps", "1",
    ];
    let weights = ckpt.join("student.safetensors").display().to_string();
    for args in [&export[..], &[&sample[..], &["--out", out_dir]].concat()] {
        let out = Command::new(env!("CARGO_BIN_EXE_reel"))
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "{args:?} read weights of another rank"
        );
        assert!(
            err.contains(&format!("{weights}: role `student`: weights:"))
                && err.contains("wrong shape")
                && err.contains("builds the role differently"),
            "{args:?}: {err}"
        );
    }
    assert!(!Path::new(out_dir).exists(), "nothing written");
}

/// A LoRA run with EMA and gradient accumulation resumes exactly: 6 steps straight equal
/// 2 steps + resume (with `max_steps` raised) + 4 steps, for the adapter weights, their AdamW
/// moments, the EMA shadows and the data cursor.
#[test]
fn lora_resume_with_ema_and_accumulation_is_bit_identical() {
    let tmp = tempfile::tempdir().unwrap();
    let text = lora_config(&write_data(tmp.path()), None, "init_seed = 3");
    let acc = "training.grad_accumulation=2";
    let straight = tmp.path().join("straight");
    run(
        &load(&text, &["training.max_steps=6", acc]),
        &straight,
        None,
    );
    let split = tmp.path().join("split");
    run(&load(&text, &["training.max_steps=2", acc]), &split, None);
    let s = run(
        &load(&text, &["training.max_steps=6", acc]),
        &split,
        Some("latest"),
    );
    assert_eq!(s.steps, 6);
    for file in [
        "student.safetensors",
        "student.optim.safetensors",
        "student.ema.safetensors",
    ] {
        let a = tensors(&ckpt(&straight, 6).join(file));
        assert!(!a.is_empty(), "{file} is saved");
        assert_eq!(
            a,
            tensors(&ckpt(&split, 6).join(file)),
            "{file} differs after resume"
        );
    }
    let state = |d: &Path| std::fs::read_to_string(ckpt(d, 6).join("state.json")).unwrap();
    assert_eq!(state(&straight), state(&split));
}

fn config_error(text: &str) -> String {
    let err = parse_run_config(text, Path::new("lora.toml"), &[])
        .expect_err("config must be rejected")
        .to_string();
    assert!(!err.contains('\n'), "one-line error: {err}");
    err
}

#[test]
fn bad_adapter_configs_name_the_key() {
    let spec = fixture_spec();
    let data = Path::new("data");
    let good = lora_config(data, None, "");
    parse_run_config(&good, Path::new("lora.toml"), &[]).unwrap();
    let shipped = include_str!("../../configs/lora_quickstart.toml");
    parse_run_config(shipped, Path::new("configs/lora_quickstart.toml"), &[]).unwrap();

    // A block the model lacks is refused by key from the config's file checks (`reel check`),
    // before any weights are looked at; the model's last block is taken.
    let blocks = WanConfig::preset("wan-quickstart").unwrap().num_layers;
    let file_problems = |block: usize| {
        let set = format!("models.student.adapter.target_modules=[\"blocks.{block}.attn1.to_q\"]");
        let path = Path::new("configs/lora_quickstart.toml");
        let loaded = parse_run_config(shipped, path, &[set]).unwrap();
        loaded
            .file_problems()
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
    };
    let problems = file_problems(blocks);
    let key = "models.student.adapter.target_modules[0]";
    let want = format!("names block {blocks}, but the model has {blocks} blocks");
    assert!(
        problems
            .iter()
            .any(|p| p.contains(key) && p.contains(&want)),
        "{problems:?}"
    );
    let problems = file_problems(blocks - 1);
    assert!(!problems.iter().any(|p| p.contains(key)), "{problems:?}");

    let err = config_error(&good.replace(&format!("rank = {}", spec.rank), "rank = 0"));
    assert!(err.contains("models.student.adapter.rank"), "{err}");
    let err = config_error(&lora_config(
        data,
        Some(&["to_q".into(), "to_qq".into()]),
        "",
    ));
    assert!(
        err.contains("models.student.adapter.target_modules[1]") && err.contains("to_qq"),
        "{err}"
    );
    let err = config_error(&good.replace(&format!("alpha = {}", spec.alpha), "alpha = 0.0"));
    assert!(err.contains("models.student.adapter.alpha"), "{err}");
    let err = config_error(&lora_config(data, None, "dropout = 0.1"));
    assert!(
        err.contains("models.student.adapter.dropout") && err.contains("not supported"),
        "{err}"
    );
    let err = config_error(&lora_config(data, None, "rnak = 3"));
    assert!(
        err.contains("models.student.adapter") && err.contains("rnak"),
        "{err}"
    );

    // An adapter on a frozen role (the DMD2 teacher).
    let dmd2 = good
        .replace("kind = \"finetune\"", "kind = \"dmd2\"")
        .replace(
            "[method]",
            "[models.teacher]\narch = \"wan\"\npreset = \"wan-tiny\"\n[models.teacher.adapter]\nkind = \"lora\"\nrank = 2\n\n\
             [models.critic]\narch = \"wan\"\npreset = \"wan-tiny\"\ntrainable = true\n\n[method]",
        );
    let err = config_error(&dmd2);
    assert!(
        err.contains("models.teacher.adapter") && err.contains("trainable"),
        "{err}"
    );
}
