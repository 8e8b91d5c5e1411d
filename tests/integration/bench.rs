//! `reel bench --breakdown`: real trainer steps split into phases, for fine-tuning, DMD2 and
//! a run config, on the CPU backend (the same code times CUDA with device syncs); the encoder
//! and attention-alone timings.

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
    check_progress(&String::from_utf8_lossy(&out.stderr));
    v[0].clone()
}

/// One progress line on stderr per trainer step: the warm-up, the profiled and the timed
/// steps (1 + 1 + 1 here), in order.
fn check_progress(stderr: &str) {
    let kinds: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("bench: "))
        .map(|l| {
            let (_, rest) = l
                .split_once(": step ")
                .expect("`: step ` in a progress line");
            rest.split_whitespace().nth(1).expect("the step's kind")
        })
        .collect();
    assert_eq!(kinds, ["(warm-up)", "(profiled)", "(timed)"], "{stderr}");
    assert!(stderr.contains("step 3/3 (timed)"), "{stderr}");
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
    // The memory floor: float32 weights, AdamW's two moments and the EMA's copy (16 bytes a
    // parameter), and the larger of the gradients (4) and each block's float32 input for 2
    // samples (one micro-batch: a backward frees the inputs as it makes the gradients).
    let cfg = reel_models::WanConfig::preset("wan-tiny").unwrap();
    let model = cfg.init::<burn::backend::NdArray>(&Default::default());
    let params = burn::module::Module::num_params(&model) as f64;
    let blocks = 2.0 * 8.0 * cfg.inner_dim() as f64 * cfg.num_layers as f64 * 4.0;
    let want = (16.0 * params + (4.0 * params).max(blocks)) / (1u64 << 20) as f64;
    let got = b["floor_mib"].as_f64().expect("floor_mib");
    assert!(
        (got - want).abs() < 1e-9 * want,
        "floor {got} MiB, want {want}"
    );
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
    // The shipped config, its validation decoding with a VAE that is not here.
    let shipped = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/configs/dmd2_gan_quickstart.toml"
    );
    let text = std::fs::read_to_string(shipped).unwrap();
    let edited = text.replace(
        "kind = \"validation\"\n",
        "kind = \"validation\"\nvae = \"no_vae\"\nvae_tile = 256\n",
    );
    assert_ne!(edited, text, "the config has a validation callback");
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("run.toml");
    std::fs::write(&config, edited).unwrap();
    let b = breakdown(&[
        "--config",
        config.to_str().unwrap(),
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
    // `--set` reaches the run generated from a preset.
    let out = Command::new(BIN)
        .args(["bench", "--breakdown", "--preset", "wan-tiny"])
        .args(["--set", "optimizer.fused=3"])
        .output()
        .expect("reel runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("optimizer.fused"), "{err}");
}

#[test]
fn vae_and_text_encoder_timings_have_the_models_shapes() {
    let vae = reel_core::fixtures::WAN_VAE.require(&["config.json", "model.safetensors"]);
    let t5 = reel_core::fixtures::UMT5.require(&["config.json", "model.safetensors"]);
    let out = Command::new(BIN)
        .args(["bench", "--json", "--steps", "1", "--warmup", "0"])
        .arg("--vae")
        .arg(&vae)
        .arg("--text-encoder")
        .arg(&t5)
        .args([
            "--video",
            "5",
            "16",
            "24",
            "--text-len",
            "7",
            "--batch",
            "2",
        ])
        .output()
        .expect("reel runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(vae.join("config.json")).unwrap()).unwrap();
    let z = cfg["z_dim"].as_u64().unwrap();
    let t5cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(t5.join("config.json")).unwrap()).unwrap();
    let ops: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["op"].as_str().unwrap())
        .collect();
    assert_eq!(ops, ["vae decode", "vae encode", "umt5 encode"]);
    // Decode: latents [1, z, f, h, w] -> the video asked for; encode: back to the latents.
    let (lat, video) = (&rows[0]["input"], &rows[0]["output"]);
    assert_eq!(video, &serde_json::json!([1, 3, 5, 16, 24]));
    assert_eq!(lat[1].as_u64(), Some(z));
    assert_eq!(&rows[1]["input"], video);
    assert_eq!(&rows[1]["output"], lat);
    assert_eq!(
        rows[2]["output"],
        serde_json::json!([2, 7, t5cfg["d_model"].as_u64().unwrap()])
    );
    for r in rows.as_array().unwrap() {
        assert!(r["ms"]["median"].as_f64().unwrap() > 0.0, "{r}");
    }
    let err = String::from_utf8_lossy(&out.stderr);
    for op in ops {
        assert!(
            err.contains(&format!("bench: {op}: step 1/1 (timed)")),
            "{err}"
        );
    }
    // `--vae-op encode`: the encode alone, of a random video of the size asked for.
    let out = Command::new(BIN)
        .args([
            "bench", "--json", "--steps", "1", "--warmup", "0", "--vae-op", "encode",
        ])
        .arg("--vae")
        .arg(&vae)
        .args(["--video", "5", "16", "24"])
        .output()
        .expect("reel runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let only: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(only.as_array().map(Vec::len), Some(1), "{only}");
    assert_eq!(only[0]["op"], "vae encode");
    assert_eq!(only[0]["input"], serde_json::json!([1, 3, 5, 16, 24]));
    assert_eq!(&only[0]["output"], &rows[0]["input"]);
    let out = Command::new(BIN)
        .args(["bench", "--vae", "no/such/vae"])
        .output()
        .expect("reel runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no/such/vae"),
        "{err}"
    );
}

#[test]
fn devices_reports_one_and_n_workers_with_the_global_batch_and_efficiency() {
    let out = Command::new(BIN)
        .args([
            "bench",
            "--devices",
            "3",
            "--preset",
            "wan-tiny",
            "--shape",
            "2",
            "8",
            "8",
            "--batch",
            "2",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--json",
        ])
        .output()
        .expect("run reel bench");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Value = serde_json::from_slice(&out.stdout).expect("JSON rows");
    let rows = rows.as_array().expect("a list of rows");
    let field = |r: &Value, k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
    assert_eq!(rows.len(), 2);
    for (r, (workers, batch)) in rows.iter().zip([(1.0, 2.0), (3.0, 6.0)]) {
        assert_eq!(
            (field(r, "workers"), field(r, "global_batch")),
            (workers, batch)
        );
        let ms = &r["step_ms"];
        assert!(field(ms, "min") > 0.0 && field(ms, "min") <= field(ms, "median"));
        let sps = batch / (field(ms, "median") / 1e3);
        assert!((field(r, "samples_per_s") - sps).abs() <= 1e-6 * sps);
    }
    assert_eq!(field(&rows[0], "efficiency"), 1.0);
    let expected = field(&rows[1], "samples_per_s") / (3.0 * field(&rows[0], "samples_per_s"));
    assert!((field(&rows[1], "efficiency") - expected).abs() < 1e-9);
}

#[test]
fn attention_only_times_every_kernel_at_the_presets_shape() {
    // Two, four and three patches along frames, height and width.
    let cfg = reel_models::WanConfig::preset("wan-quickstart").expect("preset");
    let [pt, ph, pw] = cfg.patch_size;
    let shape = [2 * pt, 4 * ph, 3 * pw].map(|n| n.to_string());
    let dims = [2, cfg.num_attention_heads, 24, cfg.attention_head_dim];
    let run = |extra: &[&str]| {
        let out = Command::new(BIN)
            .args([
                "bench",
                "--attention-only",
                "--json",
                "--steps",
                "1",
                "--warmup",
                "0",
            ])
            .args(["--preset", "wan-quickstart", "--batch", "2", "--shape"])
            .args(&shape)
            .args(extra)
            .output()
            .expect("reel runs");
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{err}");
        let rows: Value = serde_json::from_slice(&out.stdout).expect("JSON");
        (rows.as_array().expect("rows").clone(), err)
    };
    let (rows, err) = run(&[]);
    let kernels: Vec<&str> = rows.iter().map(|r| r["kernel"].as_str().unwrap()).collect();
    assert_eq!(kernels, ["memory_efficient", "fused", "flash", "cubek"]);
    for r in &rows[..3] {
        assert_eq!(r["shape"], serde_json::json!(dims), "{r}");
        for key in ["forward", "train"] {
            assert!(
                r[format!("{key}_ms")]["median"].as_f64().unwrap() > 0.0,
                "{r}"
            );
            assert!(r[format!("{key}_tflops")].as_f64().unwrap() > 0.0, "{r}");
        }
        // Checked against the float32 reference: on the CPU every mode computes the same.
        let e = r["max_error"].as_f64().expect("a checked row");
        assert!((0.0..1e-5).contains(&e), "{r}");
        assert!(r["error"].is_null(), "{r}");
        let line = format!(
            "bench: {} attention {dims:?}, forward + backward: step 1/1 (timed)",
            r["kernel"].as_str().unwrap()
        );
        assert!(err.contains(&line), "{line} in {err}");
    }
    // The CPU build has no cubek kernel: the row says why instead of timing.
    assert!(rows[3]["forward_ms"].is_null(), "{}", rows[3]);
    assert!(rows[3]["max_error"].is_null(), "{}", rows[3]);
    assert!(
        rows[3]["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{}",
        rows[3]
    );
    // One mode asked for: that row alone.
    let (rows, _) = run(&["--attention", "fused"]);
    let kernels: Vec<&str> = rows.iter().map(|r| r["kernel"].as_str().unwrap()).collect();
    assert_eq!(kernels, ["fused"]);
    // `--tiles` launches the tiled kernels, which the CPU build has not: it says so before
    // timing anything.
    let out = Command::new(BIN)
        .args(["bench", "--attention-only", "--tiles", "32x32"])
        .args(["--preset", "wan-quickstart", "--batch", "2", "--shape"])
        .args(&shape)
        .output()
        .expect("reel runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--tiles 32x32") && err.contains("cuda or wgpu"),
        "{err}"
    );
    assert!(!err.contains("(timed)"), "{err}");
}

#[test]
fn matmul_only_times_a_blocks_products_and_names_the_best_kernel() {
    // Two, four and three patches along frames, height and width: 24 tokens.
    let cfg = reel_models::WanConfig::preset("wan-quickstart").expect("preset");
    let [pt, ph, pw] = cfg.patch_size;
    let shape = [2 * pt, 4 * ph, 3 * pw].map(|n| n.to_string());
    let (rows, d, f) = (2 * 24, cfg.inner_dim(), cfg.ffn_dim);
    let out = Command::new(BIN)
        .args([
            "bench",
            "--matmul-only",
            "--json",
            "--steps",
            "2",
            "--warmup",
            "0",
        ])
        .args(["--preset", "wan-quickstart", "--batch", "2", "--shape"])
        .args(&shape)
        .args(["--matmul-kernel", "double-mma", "--matmul-kernel", "burn"])
        .output()
        .expect("reel runs");
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{err}");
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let rows_json = report["rows"].as_array().expect("rows");
    // Nine products (three layers, three layouts), each on Burn's matmul and the kernel.
    assert_eq!(rows_json.len(), 18);
    let shapes: Vec<Value> = rows_json
        .iter()
        .filter(|r| r["kernel"] == "burn")
        .map(|r| r["product"]["shape"].clone())
        .collect();
    let want = [
        [rows, d, d],
        [rows, d, d],
        [d, rows, d],
        [rows, d, f],
        [rows, f, d],
        [f, rows, d],
        [rows, f, d],
        [rows, d, f],
        [d, rows, f],
    ];
    assert_eq!(shapes, want.map(|s| serde_json::json!(s)));
    for r in rows_json {
        if r["kernel"] == "burn" {
            assert!(r["ms"]["median"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["tflops"].as_f64().unwrap() > 0.0, "{r}");
            assert_eq!(r["max_error"].as_f64(), Some(0.0), "{r}");
        } else {
            // The CPU backend has no cubek kernel: the row says why instead of timing.
            assert!(r["ms"].is_null(), "{r}");
            assert!(r["error"].as_str().unwrap().contains("CubeCL"), "{r}");
        }
    }
    assert_eq!(report["best"], "burn");
    // Per layout too: Burn's matmul for all three, with the block's total.
    assert_eq!(report["best_pin"], "burn");
    let total = report["summary"][0]["block_ms"].as_f64().unwrap();
    let per_layout = report["best_pin_block_ms"].as_f64().unwrap();
    assert!(
        (per_layout - total).abs() <= 1e-9 * total,
        "{per_layout} vs {total}"
    );
    assert_eq!(report["summary"][0]["kernel"], "burn");
    assert_eq!(report["summary"][0]["vs_burn"].as_f64(), Some(1.0));
    assert!(report["summary"][1]["block_ms"].is_null());
    assert!(err.contains("bench: matmul burn attn x·wᵀ"), "{err}");

    // An unknown kernel fails before any timing, naming the flag and the kernels.
    let out = Command::new(BIN)
        .args(["bench", "--matmul-only", "--matmul-kernel", "fastest"])
        .output()
        .expect("reel runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--matmul-kernel") && err.contains("`fastest`") && err.contains("tma-mma"),
        "{err}"
    );
}

/// `reel bench` without `--breakdown`: one row for the preset with its parameter count (the
/// built model's), its tokens (the shape under the preset's patch), timed steps, and the
/// setup line on stderr (what a GPU session spends before the first step).
#[test]
fn a_presets_step_row_counts_its_parameters_and_tokens() {
    let (f, h, w) = (2usize, 4usize, 4usize);
    let dims = [f, h, w].map(|d| d.to_string());
    let out = Command::new(BIN)
        .args(["bench", "--json", "--steps", "1", "--warmup", "0"])
        .args([
            "--preset", "wan-tiny", "--shape", &dims[0], &dims[1], &dims[2],
        ])
        .output()
        .expect("reel runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let rows: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(rows.as_array().map(Vec::len), Some(1), "{rows}");
    let cfg = reel_models::WanConfig::preset("wan-tiny").unwrap();
    let model = cfg.init::<burn::backend::NdArray>(&Default::default());
    let params = burn::module::Module::num_params(&model) as u64;
    assert_eq!(rows[0]["trainable_params"].as_u64(), Some(params));
    let tokens = cfg.model_info().tokens(f, h, w).unwrap() as u64;
    assert_eq!(rows[0]["tokens"].as_u64(), Some(tokens));
    assert!(rows[0]["train_step_ms"]["median"].as_f64().unwrap() > 0.0);
    assert!(
        err.contains(", setup: inputs and random weights on the device in "),
        "{err}"
    );
}
