//! Videos out: with a VAE configured, validation and `reel sample` decode the sampled latents
//! to RGB videos (GIF; MP4 when FFmpeg is installed) with a labelled contact sheet, and
//! prompts written as text are encoded with the UMT5 encoder. Uses the tiny VAE and UMT5
//! fixtures (a `wan-tiny` DiT has their 4 latent channels and 32-wide text).

use std::path::Path;
use std::process::Command;

use crate::common;

use reel_plugins::media::decode::{read_gif, read_png, FrameNeed};

/// `(width, height, frames)` of a GIF; its frames are not all one colour.
fn gif_info(path: &Path) -> (usize, usize, usize) {
    let clip = read_gif(path, FrameNeed::ALL).unwrap_or_else(|e| panic!("{e}"));
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
    // The synthetic data scores its clips: each score names its clip's GIF (and not the MP4
    // written beside it when FFmpeg is installed).
    let scores: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("scores.json")).unwrap()).unwrap();
    assert_eq!(scores["clips"][1]["file"], "1-a_cat_on_a_sofa.gif");
    if reel_plugins::media::decode::ffmpeg_for_tests() {
        assert!(dir.join("1-a_cat_on_a_sofa.mp4").is_file());
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

/// A validation VAE, text encoder or tokenizer that will not open (a mistyped path, weights cut
/// short or stored under other keys) or a VAE whose latents are not the data's is named with its
/// key by `reel check`, and `reel train` stops before its first step and its run folder, not at
/// the first validation.
#[test]
fn a_validation_model_that_will_not_open_fails_before_training() {
    let vae = reel_core::fixtures::WAN_VAE.require(&["config.json", "model.safetensors"]);
    let t5 = reel_core::fixtures::UMT5.require(&["config.json", "tokenizer.json"]);
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let check = |text: &str| {
        std::fs::write(d.join("run.toml"), text).unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_reel"))
            .current_dir(d)
            .args(["check", "run.toml"])
            .output()
            .unwrap();
        o.status
            .success()
            .then_some(())
            .ok_or_else(|| String::from_utf8_lossy(&o.stderr).to_string())
    };
    let good = config(&vae, &t5);
    check(&good).unwrap();
    // Tiles are multiples of the VAE's spatial compression, at least twice it.
    let s = reel_models::vae::WanVaeConfig::from_json_file(vae.join("config.json"))
        .unwrap()
        .spatial_factor();
    let tiled = |t: usize| {
        good.replace(
            "negative_prompt",
            &format!("vae_tile = {t}\nnegative_prompt"),
        )
    };
    check(&tiled(2 * s)).unwrap();

    // A copy of the VAE whose weights lost their second half.
    let cut = d.join("cut_vae");
    std::fs::create_dir(&cut).unwrap();
    std::fs::copy(vae.join("config.json"), cut.join("config.json")).unwrap();
    let bytes = std::fs::read(vae.join("model.safetensors")).unwrap();
    std::fs::write(cut.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    // A copy whose weights name one tensor under another key: the keys are checked too.
    let renamed = d.join("renamed_vae");
    std::fs::create_dir(&renamed).unwrap();
    std::fs::copy(vae.join("config.json"), renamed.join("config.json")).unwrap();
    let (mut tensors, _) = reel_core::io::read_safetensors(vae.join("model.safetensors")).unwrap();
    let moved = tensors.keys().next().unwrap().clone();
    let value = tensors.remove(&moved).unwrap();
    tensors.insert(format!("{moved}_renamed"), value);
    let tensors: Vec<_> = tensors.into_iter().collect();
    reel_core::io::write_safetensors(renamed.join("model.safetensors"), &tensors, None).unwrap();
    let tok = format!("{:?}", t5.join("tokenizer.json"));
    // A model of more latent channels than the VAE's, on data of as many: only the validation
    // VAE does not fit the data.
    let z = reel_models::vae::WanVaeConfig::from_json_file(vae.join("config.json"))
        .unwrap()
        .z_dim;
    let width = reel_models::umt5::Umt5Config::from_json_file(t5.join("config.json"))
        .unwrap()
        .d_model;
    let mut wide = reel_models::WanConfig::preset("wan-tiny").unwrap();
    (wide.in_channels, wide.out_channels, wide.text_dim) = (z + 4, z + 4, width);
    std::fs::write(d.join("wide.json"), serde_json::to_string(&wide).unwrap()).unwrap();
    let random = format!(
        "kind = \"random\"\nbatch_size = 2\nnum_samples = 4\nchannels = {}\nframes = 2\n\
         height = 12\nwidth = 12\ntext_len = 16\ntext_dim = {width}\n",
        z + 4
    );
    let synthetic = "kind = \"synthetic\"\nbatch_size = 2\nnum_samples = 4\nframes = 2\n\
                     height = 12\nwidth = 12\n";
    let vae_too_narrow = good
        .replace("preset = \"wan-tiny\"", "config = \"wide.json\"")
        .replace(synthetic, &random);
    let z_dim = format!("z_dim = {z}");
    // Without `tokenizer` the one in the text encoder's folder is used; a copy of the encoder
    // with none there (nor a `tokenizer/` folder beside it) is refused.
    let no_tok = good.replace(&format!("tokenizer = {tok}\n"), "");
    assert_ne!(no_tok, good);
    check(&no_tok).unwrap();
    let bare = d.join("bare/text_encoder");
    std::fs::create_dir_all(&bare).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(t5.join(f), bare.join(f)).unwrap();
    }
    let cases = [
        (tiled(s), "callbacks[0].vae_tile", "at least"),
        (tiled(3 * s + 1), "callbacks[0].vae_tile", "a multiple of"),
        (
            good.replace(&format!("{vae:?}"), "\"no_vae\""),
            "callbacks[0].vae",
            "no_vae",
        ),
        (
            good.replace(&format!("{vae:?}"), &format!("{cut:?}")),
            "callbacks[0].vae",
            "truncated",
        ),
        (
            good.replace(&format!("{vae:?}"), &format!("{renamed:?}")),
            "callbacks[0].vae",
            moved.as_str(),
        ),
        (
            good.replace(
                &format!("text_encoder = {t5:?}"),
                "text_encoder = \"no_t5\"",
            ),
            "callbacks[0].text_encoder",
            "no_t5",
        ),
        (
            good.replace(&tok, "\"no_tokenizer.json\""),
            "callbacks[0].tokenizer",
            "no_tokenizer.json",
        ),
        (vae_too_narrow, "callbacks[0].vae", z_dim.as_str()),
        (
            no_tok.replace(&format!("{t5:?}"), &format!("{bare:?}")),
            "callbacks[0].tokenizer",
            "no tokenizer given",
        ),
    ];
    for (text, key, why) in cases {
        assert_ne!(text, good, "{key}: the edit applies");
        let err = check(&text).expect_err(key);
        assert!(
            err.contains(key) && err.contains(why),
            "`{key}`, `{why}` not in: {err}"
        );
        let o = common::reel_train(d, "out", &[], None);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(key), "train: {err}");
        assert!(!err.contains("step 1/"), "a step was taken: {err}");
        assert!(!d.join("out").exists(), "train made its run folder: {err}");
    }
}

/// The tiny real workflow: a folder of clips with captions goes through `reel preprocess`
/// (tiny VAE + UMT5; it also writes the negative prompt's embedding), a `finetune` run trains
/// on the parquet it wrote with that negative, and `reel sample`
/// decodes clips whose frame count and size are the VAE's compression undone. The text
/// encoder is laid out as diffusers lays a model out (`text_encoder/`, `tokenizer/`), so
/// neither `reel preprocess` nor `reel sample` is told where its tokenizer is. A VAE that
/// does not match the model's latent channels is refused before sampling.
#[test]
fn clips_to_trained_weights_to_videos() {
    let vae = reel_core::fixtures::WAN_VAE.require(&["config.json", "model.safetensors"]);
    let fixture = reel_core::fixtures::UMT5.require(&["config.json", "tokenizer.json"]);
    let tmp = tempfile::tempdir().unwrap();
    let (t5, tok) = (
        tmp.path().join("m/text_encoder"),
        tmp.path().join("m/tokenizer"),
    );
    for (dir, files) in [
        (&t5, &["config.json", "model.safetensors"][..]),
        (&tok, &["tokenizer.json"][..]),
    ] {
        std::fs::create_dir_all(dir).unwrap();
        for f in files {
            std::fs::copy(fixture.join(f), dir.join(f)).unwrap();
        }
    }
    let tok = tok.join("tokenizer.json");
    let clips = tmp.path().join("clips");
    std::fs::create_dir(&clips).unwrap();
    let (side, frames) = (32usize, 5usize);
    for (i, caption) in ["a red circle", "a blue square", "a cat", "a dog"]
        .iter()
        .enumerate()
    {
        let clip: Vec<Vec<[u8; 3]>> = (0..frames)
            .map(|f| {
                (0..side * side)
                    .map(|p| [((p * 3 + f * 17 + i * 50) % 256) as u8, (i * 60) as u8, 90])
                    .collect()
            })
            .collect();
        let name = format!("clip{i}");
        reel_plugins::media::write_gif(
            &clips.join(format!("{name}.gif")),
            &clip,
            side,
            side,
            1,
            16,
        )
        .unwrap();
        std::fs::write(clips.join(format!("{name}.txt")), caption).unwrap();
    }
    let reel = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_reel"))
            .current_dir(tmp.path())
            .args(args)
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        )
    };
    let (vae_s, t5_s, tok_s) = (
        vae.to_str().unwrap(),
        t5.to_str().unwrap(),
        tok.to_str().unwrap(),
    );
    let (ok, err) = reel(&[
        "preprocess",
        "clips",
        "--out",
        "data",
        "--vae",
        vae_s,
        "--text-encoder",
        t5_s,
        "--frames",
        "5",
        "--height",
        "32",
        "--width",
        "32",
        "--fps",
        "0",
        "--text-len",
        "16",
    ]);
    assert!(ok, "preprocess: {err}");
    // The negative prompt's embedding beside the shards is the one `reel data negative` makes.
    let (ok, err) = reel(&[
        "data",
        "negative",
        "--text-encoder",
        t5_s,
        "--tokenizer",
        tok_s,
        "--text-len",
        "16",
        "--out",
        "negative.safetensors",
    ]);
    assert!(ok, "data negative: {err}");
    let embedding = |p: &str| {
        let bytes = std::fs::read(tmp.path().join(p)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        st.tensor("text_embedding").unwrap().data().to_vec()
    };
    assert_eq!(
        embedding("data/negative.safetensors"),
        embedding("negative.safetensors")
    );

    let run = |student: &str, data: &str| {
        format!(
            "[runtime]\nseed = 1\n\n[models.student]\narch = \"wan\"\n{student}\ninit_seed = 1\n\
             trainable = true\n\n[method]\nkind = \"finetune\"\n\n[data]\n{data}\n\n\
             [optimizer]\nlr = 1e-3\n\n[training]\nmax_steps = 2\n"
        )
    };
    let parquet = "kind = \"fastvideo_parquet\"\npath = \"data\"\nbatch_size = 2\ntext_len = 16\n\
                   normalize = \"none\"\nnegative_embedding = \"data/negative.safetensors\"";
    std::fs::write(
        tmp.path().join("run.toml"),
        run("preset = \"wan-tiny\"", parquet),
    )
    .unwrap();
    let o = common::reel_train(tmp.path(), "run", &[], None);
    assert!(
        o.status.success(),
        "train: {}",
        String::from_utf8_lossy(&o.stderr)
    );

    let (ok, err) = reel(&[
        "sample",
        "run",
        "--prompt",
        "a red circle",
        "--steps",
        "2",
        "--vae",
        vae_s,
        "--text-encoder",
        t5_s,
        "--out",
        "samples",
    ]);
    assert!(ok, "sample: {err}");
    // 32 px / 8 = 4 latent pixels and 5 frames -> 2 latent frames, decoded back to 5 × 32².
    assert_eq!(
        gif_info(&tmp.path().join("samples/0-a_red_circle.gif")),
        (side, side, frames)
    );
    // With FFmpeg (CI installs it) the same clip is also an MP4 that reads back.
    if reel_plugins::media::decode::ffmpeg_for_tests() {
        let mp4 = tmp.path().join("samples/0-a_red_circle.mp4");
        let clip = reel_plugins::media::decode::read_clip(&mp4, FrameNeed::ALL)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (clip.width, clip.height, clip.frames.len()),
            (side, side, frames)
        );
    }

    // Without the run's data (another machine; here it is moved away) the text encoder embeds
    // the prompt and the checkpoint's recorded shapes stand in for the data's; without an
    // encoder the prompt would come from the data, which is then named.
    std::fs::rename(tmp.path().join("data"), tmp.path().join("data-away")).unwrap();
    let away = |out: &str, encoder: &[&str]| {
        let args = ["sample", "run", "--prompt", "a red circle", "--steps", "2"];
        let rest = ["--vae", vae_s, "--out", out];
        reel(&[&args[..], encoder, &rest[..]].concat())
    };
    let (ok, err) = away("away", &["--text-encoder", t5_s]);
    assert!(ok, "sample without the data: {err}");
    assert!(
        err.contains("state.json") && err.contains("--negative"),
        "{err}"
    );
    assert_eq!(
        gif_info(&tmp.path().join("away/0-a_red_circle.gif")),
        (side, side, frames)
    );
    let (ok, err) = away("no-encoder", &[]);
    assert!(!ok && err.contains("the run's `[data]`"), "{err}");
    // The run's `final/` folder records its shapes in `shapes.json`, named from the run's
    // parent or as `.` from inside it; one published without that file takes those of the
    // run's last checkpoint, and with neither the size must be given.
    let abs = |p: &Path| std::fs::canonicalize(p).unwrap();
    let final_dir = abs(&tmp.path().join("run/final"));
    let sample_final = |dir: &Path, name: &str, out: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_reel"))
            .current_dir(dir)
            .args(["sample", name, "--prompt", "a red circle", "--steps", "2"])
            .arg("--text-encoder")
            .arg(abs(&t5))
            .arg("--vae")
            .arg(abs(&vae))
            .arg("--out")
            .arg(tmp.path().join(out))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        (o.status.success(), err)
    };
    let cases = [
        (tmp.path(), "run/final", "shapes.json recorded"),
        (final_dir.as_path(), ".", "shapes.json recorded"),
        (tmp.path(), "run/final", "state.json recorded"),
    ];
    // `shapes.json` serves with the checkpoints gone; without it, they are read.
    let checkpoints = |away: bool| {
        let [run, moved] = [
            tmp.path().join("run/checkpoints"),
            tmp.path().join("ck-away"),
        ];
        let (from, to) = if away { (run, moved) } else { (moved, run) };
        std::fs::rename(from, to).unwrap();
    };
    checkpoints(true);
    for (i, (dir, name, recorded)) in cases.into_iter().enumerate() {
        if i == 2 {
            std::fs::remove_file(final_dir.join("shapes.json")).unwrap();
            checkpoints(false);
        }
        let out = format!("away-final-{i}");
        let (ok, err) = sample_final(dir, name, &out);
        assert!(ok, "sample {name} without the data: {err}");
        assert!(err.contains(recorded), "{err}");
        let clip = tmp.path().join(out).join("0-a_red_circle.gif");
        assert_eq!(gif_info(&clip), (side, side, frames));
    }
    checkpoints(true);
    let (ok, err) = sample_final(tmp.path(), "run/final", "away-final-3");
    assert!(
        !ok && err.contains("--video-size or --latent-size"),
        "{err}"
    );
    checkpoints(false);
    let encoded =
        |out: &str, flags: &[&str]| away(out, &[&["--text-encoder", t5_s][..], flags].concat());
    sized_samples(tmp.path(), &vae, encoded);
    // An untrained model has no recorded shapes: a size and the model's own channels and text
    // width stand in for the data, with Wan's 512 text tokens.
    let untrained = |flags: &[&str]| {
        let args = [
            "sample",
            "--untrained",
            "--config",
            "run.toml",
            "--prompt",
            "a cat",
        ];
        let rest = ["--steps", "2", "--text-encoder", t5_s, "--out", "untrained"];
        reel(&[&args[..], &rest[..], flags].concat())
    };
    let p = reel_models::WanConfig::preset("wan-tiny")
        .unwrap()
        .patch_size;
    let latents = [2 * p[0], 2 * p[1], 3 * p[2]];
    let size = format!("{}x{}x{}", latents[0], latents[1], latents[2]);
    let (ok, err) = untrained(&["--latent-size", &size]);
    assert!(ok, "untrained, without data: {err}");
    assert!(
        err.contains("the models' latent channels") && err.contains("text 512x"),
        "{err}"
    );
    let bytes = std::fs::read(tmp.path().join("untrained/0-a_cat.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.tensor("latents").unwrap().shape()[1..], latents);
    let (ok, err) = untrained(&["--force"]);
    assert!(
        !ok && err.contains("--video-size or --latent-size"),
        "{err}"
    );
    std::fs::rename(tmp.path().join("data-away"), tmp.path().join("data")).unwrap();

    // A model with 8 latent channels cannot use this 4-channel VAE.
    let mut wide = reel_models::WanConfig::preset("wan-tiny").unwrap();
    wide.in_channels = 8;
    wide.out_channels = 8;
    std::fs::write(
        tmp.path().join("wide.json"),
        serde_json::to_string(&wide).unwrap(),
    )
    .unwrap();
    let random = "kind = \"random\"\nchannels = 8\nframes = 2\nheight = 4\nwidth = 4\n\
                  text_len = 16\ntext_dim = 32";
    std::fs::write(
        tmp.path().join("run.toml"),
        run("config = \"wide.json\"", random),
    )
    .unwrap();
    let o = common::reel_train(tmp.path(), "wide", &[], None);
    assert!(
        o.status.success(),
        "train: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let (ok, err) = reel(&["sample", "wide", "--vae", vae_s, "--out", "wide-samples"]);
    assert!(!ok, "a mismatched VAE is refused");
    assert!(
        err.contains("--vae") && err.contains("8 channels") && err.contains("z_dim = 4"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// `reel sample --video-size` and `--latent-size` (through `sample(out, flags)`, a sample of
/// one prompt without the run's data): clips of the size asked for, whatever the VAE's
/// compression; the two flags asking for the same latents give the same clip; sizes the VAE
/// or the model cannot make are refused naming the flag and the axis.
fn sized_samples(dir: &Path, vae: &Path, sample: impl Fn(&str, &[&str]) -> (bool, String)) {
    let vae_cfg = reel_models::vae::WanVaeConfig::from_json_file(vae.join("config.json")).unwrap();
    let (t, s) = (vae_cfg.temporal_factor(), vae_cfg.spatial_factor());
    let tiny = reel_models::WanConfig::preset("wan-tiny").unwrap();
    let p = tiny.patch_size;
    // 3 × 2 × 4 patches: a wide clip, so that swapped axes would show.
    let latents = [3 * p[0], 2 * p[1], 4 * p[2]];
    let video = [1 + (latents[0] - 1) * t, latents[1] * s, latents[2] * s];
    let text = |d: [usize; 3]| format!("{}x{}x{}", d[0], d[1], d[2]);
    let (ok, err) = sample("sized", &["--video-size", &text(video)]);
    assert!(ok, "--video-size: {err}");
    let clip = dir.join("sized/0-a_red_circle");
    assert_eq!(
        gif_info(&clip.with_extension("gif")),
        (video[2], video[1], video[0])
    );
    let stored = |clip: &Path| {
        let bytes = std::fs::read(clip.with_extension("safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let t = st.tensor("latents").unwrap();
        (t.shape().to_vec(), t.data().to_vec())
    };
    let (shape, values) = stored(&clip);
    assert_eq!(shape, [vae_cfg.z_dim, latents[0], latents[1], latents[2]]);
    let (ok, err) = sample("latent-sized", &["--latent-size", &text(latents)]);
    assert!(ok, "--latent-size: {err}");
    assert_eq!(stored(&dir.join("latent-sized/0-a_red_circle")).1, values);

    let refused = |flags: &[&str], says: &[&str]| {
        let (ok, err) = sample("refused", flags);
        assert!(!ok, "{flags:?} sampled");
        for s in says {
            assert!(err.contains(s), "{flags:?}: `{s}` not in {err}");
        }
        assert!(!err.contains("panicked"), "{err}");
    };
    if t > 1 {
        let frames = [video[0] + 1, video[1], video[2]];
        refused(
            &["--video-size", &text(frames)],
            &["--video-size", &format!("1 + {t}·k frames")],
        );
    }
    if s > 1 {
        let width = [video[0], video[1], video[2] + 1];
        refused(
            &["--video-size", &text(width)],
            &["width", "spatial compression"],
        );
    }
    if p[1] > 1 {
        let height = [latents[0], latents[1] + 1, latents[2]];
        refused(
            &["--latent-size", &text(height)],
            &["--latent-size", "height", "patch"],
        );
    }
    let long = [latents[0], (tiny.rope_max_seq_len + 1) * p[1], latents[2]];
    refused(&["--latent-size", &text(long)], &["position encoding"]);
    refused(&["--latent-size", "3x8"], &["FRAMESxHEIGHTxWIDTH"]);
    assert!(
        !dir.join("refused").exists(),
        "a refused sample made its --out"
    );
}

/// `reel data negative` writes what the UMT5 encoder gives for the prompt (Wan2.1's by
/// default, recorded in the file), read back at the data's text length; a text encoder that
/// is not there is named, and nothing is written.
#[test]
fn data_negative_writes_the_encoders_output_for_the_prompt() {
    use reel_plugins::data::negative::{read_negative, stored_prompt, WAN_NEGATIVE_PROMPT};
    let t5 = reel_core::fixtures::UMT5.require(&["config.json", "tokenizer.json"]);
    let tok = t5.join("tokenizer.json");
    let tmp = tempfile::tempdir().unwrap();
    let text_len = 12;
    let run = |encoder: &Path, out: &str, prompt: Option<&str>, force: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_reel"));
        cmd.current_dir(tmp.path())
            .args(["data", "negative", "--text-encoder"]);
        cmd.arg(encoder)
            .arg("--tokenizer")
            .arg(&tok)
            .args(["--out", out]);
        cmd.args(["--text-len", &text_len.to_string()]);
        if let Some(p) = prompt {
            cmd.args(["--prompt", p]);
        }
        if force {
            cmd.arg("--force");
        }
        let o = cmd.output().unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        )
    };
    let encoder = reel_models::umt5::Umt5TextEncoder::<reel_core::backend::CpuBackend>::load(
        &tok,
        &t5,
        &Default::default(),
    )
    .unwrap();
    let dim = encoder.encoder.config.d_model;
    let spec = reel_core::data::DataSpec {
        channels: 16,
        frames: 1,
        height: 2,
        width: 2,
        text_len,
        text_dim: dim,
    };
    for (out, prompt) in [
        ("wan.safetensors", None),
        ("short.safetensors", Some("blurry")),
    ] {
        let (ok, err) = run(&t5, out, prompt, false);
        assert!(ok && err.contains("negative_embedding"), "{err}");
        let text = prompt.unwrap_or(WAN_NEGATIVE_PROMPT);
        let want = reel_plugins::data::prompts::encode_text(&encoder, text, text_len).unwrap();
        let got = read_negative(&tmp.path().join(out), &spec).unwrap();
        assert_eq!(got.mask, want.mask, "{out}");
        let worst = got
            .embedding
            .iter()
            .zip(&want.embedding)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst <= 1e-5, "{out}: max |diff| {worst}");
        let stored = stored_prompt(&tmp.path().join(out));
        assert_eq!(stored, Some((text.to_string(), text_len)), "{out}");
    }
    let (ok, err) = run(&tmp.path().join("no_t5"), "none.safetensors", None, false);
    assert!(!ok && err.contains("no_t5"), "{err}");
    assert!(!tmp.path().join("none.safetensors").exists());
    // An earlier negative file is replaced (and said so); any other file only with --force.
    let (ok, err) = run(&t5, "wan.safetensors", Some("grey"), false);
    assert!(ok && err.contains("replacing the negative file"), "{err}");
    let stored = stored_prompt(&tmp.path().join("wan.safetensors"));
    assert_eq!(stored, Some(("grey".to_string(), text_len)));
    let shard = tmp.path().join("data_00001.parquet");
    std::fs::write(&shard, b"PAR1 not a negative PAR1").unwrap();
    let (ok, err) = run(&t5, "data_00001.parquet", None, false);
    assert!(
        !ok && err.contains("--force") && err.contains("data_00001"),
        "{err}"
    );
    assert_eq!(std::fs::read(&shard).unwrap(), b"PAR1 not a negative PAR1");
    let (ok, err) = run(&t5, "data_00001.parquet", None, true);
    assert!(ok, "{err}");
    assert!(stored_prompt(&shard).is_some());
}
