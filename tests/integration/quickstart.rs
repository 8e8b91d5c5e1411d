//! A short version of the quickstart (the shipped `configs/quickstart.toml`, fewer steps and
//! a smaller model) runs end to end: checkpoints, final weights, samples, metrics, TensorBoard
//! events and the loss curve, `reel eval` scores its final checkpoint and `reel sample` makes
//! clips from it.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_reel");

/// `reel train configs/quickstart.toml --output <out>` with `--set` overrides.
fn train_quickstart(out: &std::path::Path, sets: &[&str]) -> std::process::Output {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/configs/quickstart.toml");
    let mut cmd = Command::new(BIN);
    cmd.args(["train", config, "--output"]).arg(out);
    for s in sets {
        cmd.args(["--set", s]);
    }
    cmd.output().unwrap()
}

#[test]
fn short_quickstart_runs_end_to_end_and_evaluates() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("qs");
    let o = train_quickstart(
        &out,
        &[
            "models.student.preset=wan-tiny",
            "training.max_steps=4",
            "training.checkpoint_every=2",
            "callbacks.2.every_steps=2",
            "callbacks.2.num_prompts=2",
            "callbacks.2.sampling_steps=2",
            "data.batch_size=2",
            "data.frames=2",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("validation @ step 4"), "{err}");
    for f in [
        "checkpoints/step-00000004/manifest.json",
        "final/student.safetensors",
        "final/student.ema.safetensors",
        "samples/step-4/sheet.png",
        "metrics.jsonl",
        "loss.png",
        "config.resolved.toml",
    ] {
        assert!(out.join(f).exists(), "missing {f}");
    }
    assert!(
        std::fs::read_dir(out.join("tensorboard"))
            .unwrap()
            .next()
            .is_some(),
        "no TensorBoard events"
    );
    let o = Command::new(BIN)
        .args(["eval"])
        .arg(&out)
        .args(["--clips", "2", "--steps", "2"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let overall = report["overall"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&overall), "{report}");
    assert_eq!(report["clips"], 2);
    assert_eq!(report["ema"], true);
    // The score does not depend on how the clips are batched: clip `i` draws the same noise
    // in a batch of 2 as alone.
    let alone = Command::new(BIN)
        .args(["eval"])
        .arg(&out)
        .args(["--clips", "2", "--steps", "2", "--batch", "1"])
        .output()
        .unwrap();
    assert!(
        alone.status.success(),
        "{}",
        String::from_utf8_lossy(&alone.stderr)
    );
    let alone: serde_json::Value = serde_json::from_slice(&alone.stdout).unwrap();
    let d = (alone["overall"].as_f64().unwrap() - overall).abs();
    assert!(d < 1e-4, "{report} / {alone}");

    // The README's `reel sample` line: a prompt the synthetic data embeds, no text encoder.
    let samples = tmp.path().join("samples");
    let o = Command::new(BIN)
        .args(["sample"])
        .arg(&out)
        .args([
            "--prompt",
            "a red circle moving left",
            "--steps",
            "2",
            "--out",
        ])
        .arg(&samples)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    // Its progress (not a terminal here: one line a tenth of the steps, and the last).
    assert!(err.contains("reel: sampling 1 clip(s): step 2/2"), "{err}");
    for f in [
        "0-a_red_circle_moving_left.gif",
        "0-a_red_circle_moving_left.safetensors",
        "sheet.png",
    ] {
        assert!(samples.join(f).is_file(), "reel sample wrote no {f}");
    }
    // Again into the same folder: refused (before sampling) without --force, which replaces.
    let sheet = std::fs::read(samples.join("sheet.png")).unwrap();
    let again = |force: bool| {
        let mut cmd = Command::new(BIN);
        cmd.args(["sample"]).arg(&out);
        cmd.args([
            "--prompt",
            "a red circle moving left",
            "--steps",
            "2",
            "--seed",
            "9",
        ]);
        cmd.arg("--out").arg(&samples);
        if force {
            cmd.arg("--force");
        }
        cmd.output().unwrap()
    };
    let o = again(false);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("already holds sheet.png and ") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(std::fs::read(samples.join("sheet.png")).unwrap(), sheet);
    let o = again(true);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_ne!(std::fs::read(samples.join("sheet.png")).unwrap(), sheet);
    // The run's `final/` folder samples as its last checkpoint does: the same weights, the
    // EMA swapped in, the same latents bit for bit.
    let from_final = tmp.path().join("from_final");
    let o = Command::new(BIN)
        .args(["sample"])
        .arg(out.join("final"))
        .args(["--prompt", "a red circle moving left", "--steps", "2"])
        .args(["--seed", "9", "--out"])
        .arg(&from_final)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let clip = "0-a_red_circle_moving_left.safetensors";
    assert_eq!(
        std::fs::read(from_final.join(clip)).unwrap(),
        std::fs::read(samples.join(clip)).unwrap(),
        "final/ and the last checkpoint sample differently"
    );

    // A caption outside the synthetic data's grammar: an error that shows captions it takes.
    let o = Command::new(BIN)
        .args(["sample"])
        .arg(&out)
        .args(["--prompt", "a red circle", "--out"])
        .arg(tmp.path().join("no-samples"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "cannot embed the prompt `a red circle`: it embeds only its own captions, such as `a "
        ),
        "{err}"
    );
    assert!(err.contains("--text-encoder, a UMT5 folder"), "{err}");
    assert!(!tmp.path().join("no-samples").exists());
    // Decoding flags without a VAE are refused, not ignored.
    for flags in [&["--vae-tile", "64"][..], &["--raw-latents"]] {
        let o = Command::new(BIN)
            .arg("sample")
            .arg(&out)
            .args(flags)
            .arg("--out")
            .arg(tmp.path().join("no-samples"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.contains(&format!("{}: it is for decoding with --vae", flags[0])),
            "{err}"
        );
    }
}

/// The quickstart model's temporal patch is 4 frames: a clip length it cannot tile is a
/// clear error naming the config file, the role's table and the data key before any step, not
/// a panic in the patch embedding.
#[test]
fn clip_length_the_patch_cannot_tile_is_a_config_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("qs");
    let o = train_quickstart(&out, &["data.frames=6"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    for want in [
        "quickstart.toml",
        "`models.student`",
        "`data.frames` = 6",
        "patch size 4",
    ] {
        assert!(err.contains(want), "missing {want:?} in: {err}");
    }
    assert!(!out.join("checkpoints").exists(), "no step was taken");
}
