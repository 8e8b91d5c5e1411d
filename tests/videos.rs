//! Videos out: with a VAE configured, validation and `reel sample` decode the sampled latents
//! to RGB videos (GIF; MP4 when FFmpeg is installed) with a labelled contact sheet, and
//! prompts written as text are encoded with the UMT5 encoder. Uses the tiny VAE and UMT5
//! fixtures (a `wan-tiny` DiT has their 4 latent channels and 32-wide text).

use std::path::Path;
use std::process::Command;

mod common;

use reel_plugins::media::decode::{read_gif, read_png};

/// `(width, height, frames)` of a GIF; its frames are not all one colour.
fn gif_info(path: &Path) -> (usize, usize, usize) {
    let clip = read_gif(path).unwrap_or_else(|e| panic!("{e}"));
    let first = clip.frames[0][0];
    assert!(
        clip.frames.iter().flatten().any(|p| *p != first),
        "{}: a flat clip",
        path.display()
    );
    (clip.width, clip.height, clip.frames.len())
}

fn config(vae: &Path, t5: &Path) -> String {
    format!(
        r#"
[runtime]
seed = 3

[models.student]
arch = "wan"
preset = "wan-tiny"
init_seed = 1
trainable = true

[method]
kind = "finetune"

[data]
kind = "synthetic"
batch_size = 2
num_samples = 4
frames = 2
height = 12
width = 12

[optimizer]
lr = 1e-3

[training]
max_steps = 2

[[callbacks]]
kind = "validation"
every_steps = 2
sampling_steps = 2
vae = {vae:?}
text_encoder = {t5:?}
tokenizer = {tok:?}
prompts = ["a red circle", "a cat on a sofa"]
negative_prompt = "blurry"
"#,
        tok = t5.join("tokenizer.json"),
    )
}

#[test]
fn validation_and_sample_decode_videos_with_the_vae() {
    let vae = reel_core::fixtures::WAN_VAE.require(&["config.json", "model.safetensors"]);
    let t5 = reel_core::fixtures::UMT5.require(&["config.json", "tokenizer.json"]);
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("run.toml"), config(&vae, &t5)).unwrap();
    let o = common::reel_train(tmp.path(), "run", &[], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // 2 latent frames of 12×12 decode to 1 + 4 frames of 96×96 pixels.
    let dir = tmp.path().join("run/samples/step-2");
    for name in ["0-a_red_circle.gif", "1-a_cat_on_a_sofa.gif"] {
        assert_eq!(gif_info(&dir.join(name)), (96, 96, 5), "{name}");
    }
    // 5 frames of 96 px per row (fewer than 8 are all shown), two rows under label bands.
    let (_, w, h) = read_png(&dir.join("sheet.png")).unwrap();
    assert_eq!(w, 5 * 97 + 1);
    assert!(h > 2 * 97 + 1, "label bands above the rows");

    let out = tmp.path().join("samples");
    let o = Command::new(env!("CARGO_BIN_EXE_reel"))
        .current_dir(tmp.path())
        .args(["sample", "run", "--prompt", "a cat", "--steps", "2"])
        .arg("--vae")
        .arg(&vae)
        .arg("--text-encoder")
        .arg(&t5)
        .arg("--tokenizer")
        .arg(t5.join("tokenizer.json"))
        .args(["--negative", "blurry", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(gif_info(&out.join("0-a_cat.gif")), (96, 96, 5));
    assert!(out.join("0-a_cat.safetensors").is_file() && out.join("sheet.png").is_file());

    // Text prompts without an encoder are a config error naming the key.
    let bad = config(&vae, &t5).replace("text_encoder =", "# text_encoder =");
    let err = reel_core::config::parse_run_config(&bad, Path::new("v.toml"), &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("callbacks[0].text_encoder"), "{err}");
}
