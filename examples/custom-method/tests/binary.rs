//! The example crate's own binary (`reel-custom`, three lines through `reel::cli::run`)
//! carries the built-in plugins and the crate's own, and trains a config that names them.

use std::process::Command;

fn reel_custom() -> Command {
    Command::new(env!("CARGO_BIN_EXE_reel-custom"))
}

#[test]
fn list_shows_the_built_in_and_the_crates_plugins() {
    let out = reel_custom().arg("list").output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for name in [
        "fixed_sigma",
        "toy",
        "finetune",
        "dmd2",
        "wan",
        "synthetic",
        "ema",
    ] {
        assert!(text.contains(name), "`{name}` missing from:\n{text}");
    }
}

#[test]
fn trains_the_fixed_sigma_method_on_the_toy_architecture() {
    let tmp = tempfile::tempdir().unwrap();
    let config = r#"
[runtime]
seed = 1
[models.student]
arch = "toy"
trainable = true
[method]
kind = "fixed_sigma"
sigma = 0.5
[data]
kind = "toy"
batch_size = 2
[optimizer]
lr = 1e-2
[training]
max_steps = 3
"#;
    std::fs::write(tmp.path().join("run.toml"), config).unwrap();
    let out = reel_custom()
        .current_dir(tmp.path())
        .args(["train", "run.toml", "--output", "out"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ckpt = tmp
        .path()
        .join("out/checkpoints/step-00000003/student.safetensors");
    assert!(ckpt.is_file(), "{}", ckpt.display());
}
