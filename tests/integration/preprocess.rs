//! `reel preprocess` end to end on the CPU with the tiny VAE and UMT5 fixtures: a folder of
//! GIFs, PNG frame folders and images with captions becomes FastVideo parquet that the
//! `fastvideo_parquet` source reads back, holding exactly the VAE posterior mean of the
//! clip and the UMT5 embedding of the caption; bad files are named and skipped; a second
//! run resumes; other settings are refused.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use burn::tensor::{Tensor, TensorData};
use reel_core::data::DataConfig;
use reel_models::umt5::Umt5TextEncoder;
use reel_models::vae::WanVae;
use reel_plugins::media::{write_gif, write_png};

use reel_plugins as _;

type Cpu = burn::backend::NdArray;

const SIDE: usize = 16;
const FRAMES: usize = 5;

fn frame(seed: usize) -> Vec<[u8; 3]> {
    (0..SIDE * SIDE)
        .map(|i| {
            let v = (i * 7 + seed * 31) % 200;
            [v as u8, (255 - v) as u8, ((i + seed) % 64) as u8 * 4]
        })
        .collect()
}

fn preprocess(input: &Path, out: &Path, extra: &[&str]) -> Output {
    let vae = reel_core::fixtures::WAN_VAE.require(&["config.json", "model.safetensors"]);
    let t5 = reel_core::fixtures::UMT5.require(&["config.json", "tokenizer.json"]);
    preprocess_with(input, out, &vae, &t5, extra)
}

/// [`preprocess`] with other VAE and UMT5 folders.
fn preprocess_with(input: &Path, out: &Path, vae: &Path, t5: &Path, extra: &[&str]) -> Output {
    let side = SIDE.to_string();
    let frames = FRAMES.to_string();
    Command::new(env!("CARGO_BIN_EXE_reel"))
        .arg("preprocess")
        .arg(input)
        .arg("--out")
        .arg(out)
        .arg("--vae")
        .arg(vae)
        .arg("--text-encoder")
        .arg(t5)
        .arg("--tokenizer")
        .arg(t5.join("tokenizer.json"))
        .args(["--frames", &frames, "--height", &side, "--width", &side])
        .args(["--text-len", "24", "--rows-per-file", "2"])
        .args(if extra.contains(&"--fps") {
            &[][..]
        } else {
            &["--fps", "0"][..]
        })
        .args(extra)
        .output()
        .expect("reel runs")
}

/// A folder `clips` in `dir` holding `<name>.gif` of the same frames for each of `names`.
fn gif_folder(dir: &Path, names: &[&str]) -> PathBuf {
    let input = dir.join("clips");
    std::fs::create_dir(&input).unwrap();
    let frames: Vec<_> = (0..FRAMES).map(frame).collect();
    for name in names {
        let gif = input.join(format!("{name}.gif"));
        write_gif(&gif, &frames, SIDE, SIDE, 1, 10).unwrap();
    }
    input
}

/// The clips as `[1, 3, F, H, W]` in [-1, 1].
fn video(frames: &[Vec<[u8; 3]>]) -> Tensor<Cpu, 5> {
    let plane = SIDE * SIDE;
    let mut v = vec![0f32; 3 * frames.len() * plane];
    for (f, img) in frames.iter().enumerate() {
        for (p, px) in img.iter().enumerate() {
            for c in 0..3 {
                v[(c * frames.len() + f) * plane + p] = px[c] as f32 / 127.5 - 1.0;
            }
        }
    }
    Tensor::from_data(
        TensorData::new(v, [1, 3, frames.len(), SIDE, SIDE]),
        &Default::default(),
    )
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn preprocess_writes_what_the_encoders_compute_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("clips");
    std::fs::create_dir(&input).unwrap();
    let gif_frames: Vec<_> = (0..FRAMES + 2).map(frame).collect();
    write_gif(&input.join("a.gif"), &gif_frames, SIDE, SIDE, 1, 10).unwrap();
    std::fs::write(input.join("a.txt"), "a red circle moving left").unwrap();
    let folder = input.join("b");
    std::fs::create_dir(&folder).unwrap();
    let folder_frames: Vec<_> = (10..10 + FRAMES).map(frame).collect();
    for (i, f) in folder_frames.iter().enumerate() {
        write_png(&folder.join(format!("{i:03}.png")), f, SIDE, SIDE).unwrap();
    }
    std::fs::write(folder.join("caption.txt"), "a blue square").unwrap();
    std::fs::write(input.join("c.gif"), b"GIF89a broken").unwrap();
    std::fs::write(input.join("c.txt"), "broken").unwrap();
    write_gif(&input.join("d.gif"), &gif_frames, SIDE, SIDE, 1, 10).unwrap();

    let out = tmp.path().join("pq");
    let o = preprocess(&input, &out, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("c.gif") && err.contains("d.gif"), "{err}");
    assert!(err.contains("d.txt"), "the missing caption is named: {err}");
    assert!(!err.contains("panicked"), "{err}");

    // Read back through the data source.
    let cfg = format!(
        "kind = \"fastvideo_parquet\"\npath = {:?}\ntext_len = 24\nnormalize = \"none\"",
        out
    );
    let data: Box<dyn DataConfig> = toml::from_str(&cfg).unwrap();
    let source = data.build(tmp.path()).unwrap();
    assert_eq!(source.len(), 2, "a.gif and the frame folder b");

    let dev = Default::default();
    let vae = WanVae::<Cpu>::load(reel_core::fixtures::WAN_VAE.dir(), &dev).unwrap();
    let t5dir = reel_core::fixtures::UMT5.dir();
    let text = Umt5TextEncoder::<Cpu>::load(t5dir.join("tokenizer.json"), &t5dir, &dev).unwrap();
    for (i, (frames, caption)) in [
        (&gif_frames[..FRAMES], "a red circle moving left"),
        (&folder_frames[..], "a blue square"),
    ]
    .into_iter()
    .enumerate()
    {
        let s = source.get(i).unwrap();
        assert_eq!(s.caption, caption);
        let want = vae.encode(video(frames)).unwrap().mean;
        let want = want.into_data().to_vec::<f32>().unwrap();
        let d = max_diff(&s.latents, &want);
        assert!(
            d < 1e-5,
            "clip {i}: latent differs from the VAE mean by {d}"
        );
        let (embeds, lengths) = text.encode_prompts(&[caption], 24).unwrap();
        let want = embeds.into_data().to_vec::<f32>().unwrap();
        let d = max_diff(&s.text.embedding, &want);
        assert!(d < 1e-5, "clip {i}: text embedding differs by {d}");
        assert_eq!(s.text.mask.iter().filter(|m| **m).count(), lengths[0]);
    }

    // A second run resumes: nothing is redone and the files are unchanged.
    let before = std::fs::read(out.join("data_00000.parquet")).unwrap();
    let o = preprocess(&input, &out, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && err.contains("already there"), "{err}");
    assert_eq!(
        std::fs::read(out.join("data_00000.parquet")).unwrap(),
        before
    );

    // Other settings into the same folder are refused.
    let o = preprocess(&input, &out, &["--text-len", "16"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("preprocess.json"),
        "{err}"
    );

    // An image is one frame; `--frames` must be 1 + 4k.
    let images = tmp.path().join("images");
    std::fs::create_dir(&images).unwrap();
    write_png(&images.join("x.png"), &frame(3), SIDE, SIDE).unwrap();
    std::fs::write(images.join("x.txt"), "a still").unwrap();
    let o = preprocess(&images, &tmp.path().join("img"), &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = preprocess(&images, &tmp.path().join("bad"), &["--frames", "4"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--frames 4"), "{err}");
}

/// The file names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn resuming_never_mixes_runs_and_retries_what_failed() {
    let tmp = tempfile::tempdir().unwrap();
    let input = gif_folder(tmp.path(), &["a", "b", "c"]);
    std::fs::write(input.join("a.txt"), "first").unwrap();
    std::fs::write(input.join("c.txt"), "third").unwrap();
    // The output folder inside the input folder.
    let out = input.join("pq");

    // A mistyped model folder stops the run before any shard; the corrected run may use the
    // folder.
    let t5 = reel_core::fixtures::UMT5.require(&["config.json", "tokenizer.json"]);
    let o = preprocess_with(&input, &out, &tmp.path().join("no-such-vae"), &t5, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("no-such-vae"), "{err}");
    // Sizes no clip needs (a typo) are refused before anything is read or allocated, and a
    // --text-encoder that is no text encoder is blamed, not the tokenizer it lacks.
    for (flag, value, want) in [
        ("--frames", "18446744073709551613", "at most 4097"),
        ("--width", "100000", "from 1 to 8192"),
        ("--text-len", "2000000000", "from 1 to 8192"),
        (
            "--text-encoder",
            "/no/such/encoder",
            "not a diffusers `text_encoder/` folder",
        ),
    ] {
        let o = preprocess(&input, &out, &[flag, value]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(want), "{flag}: {err}");
        assert!(!err.contains("panicked") && !out.exists(), "{flag}: {err}");
    }
    // Sizes the VAE cannot encode exactly are refused, naming the flag.
    // (An odd height: the VAE's spatial compression is a power of two, at least 2.)
    let odd = (SIDE + 1).to_string();
    let o = preprocess(&input, &out, &["--height", &odd]);
    let err = String::from_utf8_lossy(&o.stderr);
    let flag = format!("--height {odd}");
    assert!(!o.status.success() && err.contains(&flag), "{err}");

    // b.gif has no caption: its shard (a, b) is written without it and listed as failed; the
    // negative prompt's embedding is written beside the shards.
    let o = preprocess(&input, &out, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("b.txt") && err.contains("failed.txt"), "{err}");
    // Not on a terminal: a line per shard says how far the run is.
    assert!(
        err.contains("data_00000.parquet (2/3 clips")
            && err.contains("data_00001.parquet (3/3 clips"),
        "{err}"
    );
    assert_eq!(
        names(&out),
        [
            "data_00000.failed.txt",
            "data_00000.parquet",
            "data_00001.parquet",
            "negative.safetensors",
            "preprocess.json"
        ]
    );
    let listed = std::fs::read_to_string(out.join("data_00000.failed.txt")).unwrap();
    assert!(
        listed.contains("b.gif") && listed.contains("b.txt"),
        "{listed}"
    );
    let second = std::fs::read(out.join("data_00001.parquet")).unwrap();

    // A run with nothing changed leaves the failed clip out again without encoding its shard
    // again; --retry-failed tries it (and fails again: still no caption).
    let zeroth = std::fs::read(out.join("data_00000.parquet")).unwrap();
    let o = preprocess(&input, &out, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && !err.contains("redoing"), "{err}");
    assert!(
        err.contains("2 already there") && err.contains("1 left out by an earlier run"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(out.join("data_00000.parquet")).unwrap(),
        zeroth
    );
    let o = preprocess(&input, &out, &["--retry-failed"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("redoing") && err.contains("--retry-failed") && err.contains("b.txt"),
        "{err}"
    );
    assert!(err.contains("1 skipped with errors"), "{err}");
    let relisted = std::fs::read_to_string(out.join("data_00000.failed.txt")).unwrap();
    assert_eq!(relisted, listed);

    // A run after the caption is written redoes shard 0 only, now with b; it keeps the
    // negative prompt's file (the same file, not a rewritten one).
    let negative = out.join("negative.safetensors");
    let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let negative_inode = inode(&negative);
    std::fs::write(input.join("b.txt"), "second").unwrap();
    let o = preprocess(&input, &out, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(inode(&negative), negative_inode, "{err}");
    assert!(!err.contains("replacing"), "{err}");
    assert!(
        err.contains("redoing") && err.contains("1 already there"),
        "{err}"
    );
    assert!(!out.join("data_00000.failed.txt").exists());
    assert_eq!(
        std::fs::read(out.join("data_00001.parquet")).unwrap(),
        second
    );
    let cfg = format!(
        "kind = \"fastvideo_parquet\"\npath = {out:?}\ntext_len = 24\nnormalize = \"none\""
    );
    let data: Box<dyn DataConfig> = toml::from_str(&cfg).unwrap();
    let source = data.build(tmp.path()).unwrap();
    let captions: Vec<String> = (0..source.len())
        .map(|i| source.get(i).unwrap().caption)
        .collect();
    assert_eq!(captions, ["first", "second", "third"]);

    // Another negative prompt replaces the file, saying so; the shards stay.
    let o = preprocess(&input, &out, &["--negative", "blurry"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && err.contains("replacing"), "{err}");
    let (prompt, _) = reel_plugins::data::negative::stored_prompt(&negative).unwrap();
    assert_eq!(prompt, "blurry");
    assert_eq!(
        std::fs::read(out.join("data_00001.parquet")).unwrap(),
        second
    );
    // A negative newer than the recorded settings (its run stopped before recording its
    // models, which may be others) is made again, though its prompt is the same.
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    let file = std::fs::File::options()
        .write(true)
        .open(&negative)
        .unwrap();
    file.set_modified(later).unwrap();
    drop(file);
    let o = preprocess(&input, &out, &["--negative", "blurry"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && err.contains("replacing"), "{err}");

    // A caption edited since its shard was written redoes that shard (c's, shard 1), naming
    // the clip; the other shard is left as it was.
    let first = std::fs::read(out.join("data_00000.parquet")).unwrap();
    std::fs::write(input.join("c.txt"), "third, edited").unwrap();
    let o = preprocess(&input, &out, &["--negative", "blurry"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("redoing")
            && err.contains("c.gif: changed")
            && err.contains("2 already there"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(out.join("data_00000.parquet")).unwrap(),
        first
    );
    let source = data.build(tmp.path()).unwrap();
    assert_eq!(source.get(2).unwrap().caption, "third, edited");

    // A clip added since would shift the shards: refused, naming it, and nothing changes.
    let frames: Vec<_> = (0..FRAMES).map(frame).collect();
    write_gif(&input.join("0.gif"), &frames, SIDE, SIDE, 1, 10).unwrap();
    std::fs::write(input.join("0.txt"), "new").unwrap();
    let before: Vec<_> = names(&out)
        .iter()
        .map(|n| std::fs::read(out.join(n)).unwrap())
        .collect();
    let o = preprocess(&input, &out, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("clips: 1 added (0.gif)"), "{err}");
    let after: Vec<_> = names(&out)
        .iter()
        .map(|n| std::fs::read(out.join(n)).unwrap())
        .collect();
    assert_eq!(before, after);

    // A run that stopped before its first shard, resumed with another text encoder (a copy
    // elsewhere: other settings): the negative file of the first encoder is replaced.
    std::fs::remove_file(input.join("0.gif")).unwrap();
    std::fs::remove_file(input.join("0.txt")).unwrap();
    for name in names(&out).iter().filter(|n| n.starts_with("data_")) {
        std::fs::remove_file(out.join(name)).unwrap();
    }
    let copy = tmp.path().join("umt5-copy");
    std::fs::create_dir(&copy).unwrap();
    for file in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::fs::copy(t5.join(file), copy.join(file)).unwrap();
    }
    let vae = reel_core::fixtures::WAN_VAE.require(&["config.json", "model.safetensors"]);
    let negative_inode = inode(&negative);
    let o = preprocess_with(&input, &out, &vae, &copy, &["--negative", "blurry"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && err.contains("replacing"), "{err}");
    assert_ne!(inode(&negative), negative_inode, "{err}");
}

/// Named pipes in the input folder (a `.gif` that is a FIFO, a sidecar caption that is one)
/// are reported as failed items, and the run goes on: nothing waits for a writer.
#[cfg(unix)]
#[test]
fn named_pipes_are_reported_not_waited_on() {
    let tmp = tempfile::tempdir().unwrap();
    let input = gif_folder(tmp.path(), &["a", "e"]);
    std::fs::write(input.join("a.txt"), "first").unwrap();
    std::fs::write(input.join("p.txt"), "a pipe").unwrap();
    for fifo in ["p.gif", "e.txt"] {
        let made = Command::new("mkfifo").arg(input.join(fifo)).status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("skipped: mkfifo is not available");
            return;
        }
    }
    let out = tmp.path().join("pq");
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let (input_c, out_c) = (input.clone(), out.clone());
    std::thread::spawn(move || done_tx.send(preprocess(&input_c, &out_c, &[])).unwrap());
    let Ok(o) = done_rx.recv_timeout(std::time::Duration::from_secs(300)) else {
        // Unblock the reader so that the process can end, then fail.
        for fifo in ["p.gif", "e.txt"] {
            let _ = std::fs::OpenOptions::new()
                .write(true)
                .open(input.join(fifo));
        }
        panic!("reel preprocess waited on a named pipe");
    };
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("p.gif") && err.contains("not a regular file or folder"),
        "{err}"
    );
    assert!(err.contains("e.txt is not a regular file"), "{err}");
    let listed = std::fs::read_to_string(out.join("data_00000.failed.txt")).unwrap();
    assert!(listed.contains("e.txt"), "{listed}");
}

/// A video goes through FFmpeg (skipped without it, unless `REEL_REQUIRE_FFMPEG` is set, as
/// CI does): a lossless QuickTime clip with a quarter-turn rotation is encoded upright,
/// exactly the VAE mean of its first frames turned.
#[test]
fn a_rotated_video_is_encoded_upright() {
    if !reel_plugins::media::decode::ffmpeg_for_tests() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (pngs, input) = (tmp.path().join("pngs"), tmp.path().join("clips"));
    std::fs::create_dir(&pngs).unwrap();
    std::fs::create_dir(&input).unwrap();
    let frames: Vec<_> = (0..FRAMES + 4).map(|i| frame(3 * i)).collect();
    for (i, f) in frames.iter().enumerate() {
        write_png(&pngs.join(format!("f{i:03}.png")), f, SIDE, SIDE).unwrap();
    }
    // Encoded first, then the rotation set on a stream copy (FFmpeg 5 drops it when encoding).
    let plain = tmp.path().join("plain.mov");
    let run = |cmd: &mut Command| assert!(cmd.status().unwrap().success(), "{cmd:?}");
    run(Command::new("ffmpeg")
        .args(["-v", "error", "-framerate", "8", "-i"])
        .arg(pngs.join("f%03d.png"))
        .args(["-c:v", "png"])
        .arg(&plain));
    run(Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(&plain)
        .args(["-c", "copy", "-metadata:s:v:0", "rotate=90"])
        .arg(input.join("v.mov")));
    std::fs::write(input.join("v.txt"), "a turned clip").unwrap();

    let out = tmp.path().join("pq");
    let o = preprocess(&input, &out, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let cfg = format!(
        "kind = \"fastvideo_parquet\"\npath = {out:?}\ntext_len = 24\nnormalize = \"none\""
    );
    let data: Box<dyn DataConfig> = toml::from_str(&cfg).unwrap();
    let got = data.build(tmp.path()).unwrap().get(0).unwrap().latents;

    let vae = WanVae::<Cpu>::load(reel_core::fixtures::WAN_VAE.dir(), &Default::default()).unwrap();
    type Turn<'a> = &'a dyn Fn(&[[u8; 3]]) -> Vec<[u8; 3]>;
    let mean = |turn: Turn| {
        let turned: Vec<_> = frames[..FRAMES].iter().map(|f| turn(f)).collect();
        let m = vae.encode(video(&turned)).unwrap().mean;
        max_diff(&got, &m.into_data().to_vec::<f32>().unwrap())
    };
    let n = SIDE - 1;
    let left = mean(&|f| {
        (0..SIDE * SIDE)
            .map(|i| f[(i % SIDE) * SIDE + n - i / SIDE])
            .collect()
    });
    let right = mean(&|f| {
        (0..SIDE * SIDE)
            .map(|i| f[(n - i % SIDE) * SIDE + i / SIDE])
            .collect()
    });
    let upright = mean(&|f| f.to_vec());
    assert!(
        left.min(right) < 1e-5 && upright > 1e-3,
        "latent against the frames turned left {left}, right {right}, not turned {upright}"
    );
}

/// `--fps` samples each clip at that rate from its first frame, as FastVideo does (frame
/// `⌊i · source rate / target rate⌋`): a 10 fps GIF and (with FFmpeg) a lossless 10 fps
/// QuickTime clip at `--fps 5` are encoded from their frames 0, 2, 4, …; a clip too short for
/// the frames at that rate is named and left out.
#[test]
fn frames_are_sampled_at_the_target_rate() {
    let tmp = tempfile::tempdir().unwrap();
    let (pngs, input) = (tmp.path().join("pngs"), tmp.path().join("clips"));
    std::fs::create_dir(&pngs).unwrap();
    std::fs::create_dir(&input).unwrap();
    let frames: Vec<_> = (0..2 * FRAMES + 1).map(|i| frame(5 * i)).collect();
    // 10 cs per frame: 10 fps.
    write_gif(&input.join("a.gif"), &frames, SIDE, SIDE, 1, 10).unwrap();
    std::fs::write(input.join("a.txt"), "every other frame").unwrap();
    let short = &frames[..2 * FRAMES - 2];
    write_gif(&input.join("b.gif"), short, SIDE, SIDE, 1, 10).unwrap();
    std::fs::write(input.join("b.txt"), "too short at 5 fps").unwrap();
    let with_video = reel_plugins::media::decode::ffmpeg_for_tests();
    if with_video {
        for (i, f) in frames.iter().enumerate() {
            write_png(&pngs.join(format!("f{i:03}.png")), f, SIDE, SIDE).unwrap();
        }
        let o = Command::new("ffmpeg")
            .args(["-v", "error", "-framerate", "10", "-i"])
            .arg(pngs.join("f%03d.png"))
            .args(["-c:v", "png"])
            .arg(input.join("c.mov"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::write(input.join("c.txt"), "every other frame, from a video").unwrap();
    }

    let out = tmp.path().join("pq");
    let o = preprocess(&input, &out, &["--fps", "5"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("b.gif"), "the short clip is named: {err}");
    let cfg = format!(
        "kind = \"fastvideo_parquet\"\npath = {out:?}\ntext_len = 24\nnormalize = \"none\""
    );
    let data: Box<dyn DataConfig> = toml::from_str(&cfg).unwrap();
    let source = data.build(tmp.path()).unwrap();
    assert_eq!(
        source.len(),
        1 + usize::from(with_video),
        "b.gif is left out"
    );

    let vae = WanVae::<Cpu>::load(reel_core::fixtures::WAN_VAE.dir(), &Default::default()).unwrap();
    let mean = |picked: Vec<Vec<[u8; 3]>>| {
        let m = vae.encode(video(&picked)).unwrap().mean;
        m.into_data().to_vec::<f32>().unwrap()
    };
    let every_other = mean(frames.iter().step_by(2).take(FRAMES).cloned().collect());
    let first = mean(frames[..FRAMES].to_vec());
    for i in 0..source.len() {
        let got = source.get(i).unwrap().latents;
        let (d, d_first) = (max_diff(&got, &every_other), max_diff(&got, &first));
        assert!(
            d < 1e-5 && d_first > 1e-3,
            "clip {i}: {d} from frames 0, 2, 4, …; {d_first} from the first {FRAMES}"
        );
    }
}
