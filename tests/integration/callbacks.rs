//! The `ema`, `validation` and `logging` callbacks in real (tiny) fine-tuning runs on the
//! synthetic data: the files they write, the EMA arithmetic, and resume.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;
use reel_core::config::parse_run_config;
use reel_core::data::DataSource;
use reel_methods as _;
use reel_plugins::callbacks::logging::jsonl::{is_validation, read_metrics, record_step, Record};
use reel_plugins::callbacks::logging::tensorboard::{read_events, Event, FILE_VERSION};
use reel_plugins::callbacks::validation::clip_file_name;
use reel_plugins::data::{SyntheticConfig, SyntheticSource};

/// wan-tiny (4 channels, text_dim 32) on 4×12×12 synthetic latents: 144 tokens a clip.
const CONFIG: &str = r#"
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
num_samples = 64
frames = 4
height = 12
width = 12

[optimizer]
lr = 0.002

[training]
max_steps = 6
checkpoint_every = 1
keep_last = 10

[[callbacks]]
kind = "ema"
decay = 0.9
start_step = 3

[[callbacks]]
kind = "validation"
every_steps = 2
sampling_steps = 2
num_prompts = 2

[[callbacks]]
kind = "logging"
"#;

const DECAY: f32 = 0.9;

/// `(width, height, frames)` of a GIF, walking its block structure (header, colour tables,
/// extensions, image descriptors, LZW sub-blocks, trailer).
fn gif_info(path: &Path) -> (usize, usize, usize) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..6], b"GIF89a", "{}", path.display());
    let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]) as usize;
    let (w, h) = (u16_at(6), u16_at(8));
    let table = |flags: u8| {
        if flags & 0x80 != 0 {
            3 << ((flags & 7) + 1)
        } else {
            0
        }
    };
    let mut pos = 13 + table(b[10]);
    let skip_blocks = |mut pos: usize| loop {
        let n = b[pos] as usize;
        pos += 1 + n;
        if n == 0 {
            return pos;
        }
    };
    let mut frames = 0;
    loop {
        match b[pos] {
            0x21 => pos = skip_blocks(pos + 2),
            0x2C => {
                assert_eq!((u16_at(pos + 5), u16_at(pos + 7)), (w, h), "frame size");
                frames += 1;
                pos = skip_blocks(pos + 10 + table(b[pos + 9]) + 1);
            }
            0x3B => {
                assert_eq!(pos, b.len() - 1, "trailer ends the file");
                return (w, h, frames);
            }
            other => panic!(
                "{}: unexpected block 0x{other:02x} at {pos}",
                path.display()
            ),
        }
    }
}

fn crc32(data: &[u8]) -> u32 {
    !data.iter().fold(!0u32, |mut c, &byte| {
        c ^= byte as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
        c
    })
}

/// `(width, height)` of a PNG, checking the signature, every chunk's CRC and the IEND chunk.
fn png_size(path: &Path) -> (u32, u32) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
    let be = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
    let (mut pos, mut size, mut idat) = (8, None, false);
    while pos < b.len() {
        let len = be(pos) as usize;
        let kind = &b[pos + 4..pos + 8];
        assert_eq!(
            be(pos + 8 + len),
            crc32(&b[pos + 4..pos + 8 + len]),
            "chunk CRC"
        );
        match kind {
            b"IHDR" => size = Some((be(pos + 8), be(pos + 12))),
            b"IDAT" => idat = true,
            b"IEND" => {
                assert_eq!(pos + 12, b.len(), "IEND ends the file");
                assert!(idat, "image data present");
                return size.expect("IHDR first");
            }
            _ => {}
        }
        pos += 12 + len;
    }
    panic!("{}: no IEND chunk", path.display());
}

fn metrics(dir: &Path) -> (Vec<Record>, Vec<Record>) {
    read_metrics(&dir.join("metrics.jsonl"))
        .unwrap()
        .into_iter()
        .partition(|r| !is_validation(r))
}

fn steps(records: &[Record]) -> Vec<u64> {
    records.iter().map(|r| record_step(r).unwrap()).collect()
}

fn event_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("tensorboard"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
}

/// `tag → [(step, value)]` over all events.
fn scalars(events: &[Event]) -> BTreeMap<String, Vec<(i64, f32)>> {
    let mut out: BTreeMap<String, Vec<(i64, f32)>> = BTreeMap::new();
    for e in events {
        for (tag, v) in &e.values {
            out.entry(tag.clone()).or_default().push((e.step, *v));
        }
    }
    out
}

fn check_samples(dir: &Path, step: u64, captions: &[String]) {
    let folder = dir.join("samples").join(format!("step-{step}"));
    for (i, caption) in captions.iter().enumerate() {
        let gif = folder.join(clip_file_name(i, caption));
        assert_eq!(
            gif_info(&gif),
            (96, 96, 4),
            "{}: 12 px × 8, 4 frames",
            gif.display()
        );
    }
    // Contact sheet: 2 rows × 4 frames of 96 px cells with 1 px gutters, each row under a
    // 18 px band with its score and caption (Unifont's 16 px glyphs, plus 2 px).
    assert_eq!(
        png_size(&folder.join("sheet.png")),
        (4 * 97 + 1, 2 * (18 + 97) + 1)
    );
    let scores: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("scores.json")).unwrap())
            .unwrap();
    assert_eq!(scores["clips"].as_array().unwrap().len(), 2);
}

#[test]
fn callbacks_write_samples_logs_and_ema_and_survive_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let straight = tmp.path().join("straight");
    run(&load(CONFIG, &[]), &straight, None);

    // Validation: GIFs, sheet and scores of the first two prompts at steps 2, 4 and 6.
    let data: SyntheticConfig = toml::from_str("frames = 4\nheight = 12\nwidth = 12").unwrap();
    let captions: Vec<String> = SyntheticSource::new(&data)
        .prompts()
        .into_iter()
        .take(2)
        .map(|p| p.caption)
        .collect();
    for step in [2, 4, 6] {
        check_samples(&straight, step, &captions);
    }
    assert!(!straight.join("samples/step-3").exists());

    // metrics.jsonl: one line per step, then validation lines with scores in [0, 1].
    let (train_lines, val_lines) = metrics(&straight);
    assert_eq!(steps(&train_lines), [1, 2, 3, 4, 5, 6]);
    for r in &train_lines {
        let step = record_step(r).unwrap();
        assert!(r["loss"].as_f64().unwrap().is_finite());
        assert!(r["grad_norm/student"].as_f64().unwrap() > 0.0);
        assert_eq!(r["lr/student"].as_f64().unwrap(), 0.002);
        assert!(r["step_seconds"].as_f64().unwrap() > 0.0);
        assert_eq!(r["samples_seen"], step * 2);
        assert_eq!(r["skipped"], false);
    }
    assert_eq!(steps(&val_lines), [2, 4, 6]);
    for r in &val_lines {
        for key in ["val/overall", "val/colour", "val/shape", "val/direction"] {
            let v = r[key].as_f64().unwrap_or_else(|| panic!("{key} in {r:?}"));
            assert!((0.0..=1.0).contains(&v), "{key} = {v}");
        }
    }

    // TensorBoard: one file, valid records, the same numbers as metrics.jsonl.
    let files = event_files(&straight);
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("events.out.tfevents."));
    let events = read_events(&files[0]).unwrap();
    assert_eq!(events[0].file_version.as_deref(), Some(FILE_VERSION));
    let tb = scalars(&events);
    for tag in [
        "train/loss",
        "grad_norm/student",
        "lr/student",
        "perf/step_seconds",
    ] {
        assert_eq!(
            tb[tag].iter().map(|p| p.0).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5, 6],
            "{tag}"
        );
    }
    for (r, (_, v)) in train_lines.iter().zip(&tb["train/loss"]) {
        assert_eq!(r["loss"].as_f64().unwrap() as f32, *v);
    }
    for tag in ["val/overall", "val/colour", "val/shape", "val/direction"] {
        assert_eq!(
            tb[tag].iter().map(|p| p.0).collect::<Vec<_>>(),
            [2, 4, 6],
            "{tag}"
        );
    }
    for (r, (_, v)) in val_lines.iter().zip(&tb["val/overall"]) {
        assert_eq!(r["val/overall"].as_f64().unwrap() as f32, *v);
    }

    // The loss plot.
    assert_eq!(png_size(&straight.join("loss.png")), (800, 480));

    // EMA: step 1 initialises, step 2 tracks (before start_step = 3), then e = d·e + (1−d)·w.
    let w = |s| tensors(&ckpt(&straight, s).join("student.safetensors"));
    let e = |s| tensors(&ckpt(&straight, s).join("student.ema.safetensors"));
    assert_eq!(e(1), w(1));
    assert_eq!(e(2), w(2));
    assert!(max_diff(&e(2), &w(1)) > 0.0, "the weights move");
    for s in 3..=6 {
        let (prev, now, weights) = (e(s - 1), e(s), w(s));
        let d = now
            .iter()
            .flat_map(|(k, v)| {
                v.iter()
                    .enumerate()
                    .map(|(i, x)| (x - (DECAY * prev[k][i] + (1.0 - DECAY) * weights[k][i])).abs())
            })
            .fold(0.0f32, f32::max);
        assert!(d < 1e-6, "EMA update at step {s} off by {d}");
        assert!(
            max_diff(&now, &weights) > 0.0,
            "EMA differs from the weights at step {s}"
        );
    }

    // Resume: run to 5 (checkpoints at 4 and 5), resume from step 4 up to 6.
    let split = tmp.path().join("split");
    run(
        &load(
            CONFIG,
            &["training.max_steps=5", "training.checkpoint_every=4"],
        ),
        &split,
        None,
    );
    assert!(
        split.join("samples/step-5").is_dir(),
        "at_end validation of the first leg"
    );
    let resume_from = ckpt(&split, 4).display().to_string();
    run(
        &load(CONFIG, &["training.checkpoint_every=4"]),
        &split,
        Some(&resume_from),
    );
    for file in ["student.safetensors", "student.ema.safetensors"] {
        assert_eq!(
            tensors(&ckpt(&split, 6).join(file)),
            tensors(&ckpt(&straight, 6).join(file)),
            "{file} differs after resume"
        );
    }
    // metrics.jsonl: step 5 of the first leg (after the resumed checkpoint) is gone, moved
    // with its at_end validation to metrics.dropped.jsonl.
    let (train_lines, val_lines) = metrics(&split);
    assert_eq!(steps(&train_lines), [1, 2, 3, 4, 5, 6]);
    assert_eq!(steps(&val_lines), [2, 4, 6]);
    let dropped = read_metrics(&split.join("metrics.dropped.jsonl")).unwrap();
    assert_eq!(steps(&dropped), [5, 5]);
    assert!(is_validation(&dropped[1]), "{dropped:?}");
    // Its samples too are kept aside, not replaced.
    let aside = split.join("samples/dropped-after-step-4/step-5");
    assert!(aside.join("sheet.png").is_file() && aside.join("scores.json").is_file());
    assert!(!split.join("samples/step-5").exists());
    // TensorBoard: a second file that starts with a restart marker at step 5.
    let files = event_files(&split);
    assert_eq!(files.len(), 2, "{files:?}");
    let second: Vec<Event> = files
        .iter()
        .map(|f| read_events(f).unwrap())
        .find(|ev| ev.iter().any(|e| e.session_start))
        .unwrap();
    assert_eq!(second[0].file_version.as_deref(), Some(FILE_VERSION));
    assert!(second[1].session_start && second[1].step == 5);
    assert_eq!(
        scalars(&second)["train/loss"]
            .iter()
            .map(|p| p.0)
            .collect::<Vec<_>>(),
        [5, 6]
    );
    assert!(split.join("loss.png").is_file());
    // A resume at the run's end ends it again: the plot (lost here) is drawn anew.
    std::fs::remove_file(split.join("loss.png")).unwrap();
    run(
        &load(CONFIG, &["training.checkpoint_every=4"]),
        &split,
        Some("latest"),
    );
    assert_eq!(png_size(&split.join("loss.png")), (800, 480));
}

/// A fresh run in a folder holding an earlier run's event files (one that died before its
/// first checkpoint) marks a restart at step 1, so TensorBoard shows the new run's curves only.
#[test]
fn a_fresh_run_over_old_event_files_marks_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    let one = ["training.max_steps=1", "callbacks[1].every_steps=5"];
    run(&load(CONFIG, &one), &dir, None);
    assert_eq!(event_files(&dir).len(), 1);
    let first = read_events(&event_files(&dir)[0]).unwrap();
    assert!(
        !first.iter().any(|e| e.session_start),
        "a first run marks nothing"
    );
    for gone in ["checkpoints", "final"] {
        std::fs::remove_dir_all(dir.join(gone)).unwrap();
    }
    run(&load(CONFIG, &one), &dir, None);
    let files = event_files(&dir);
    assert_eq!(files.len(), 2, "{files:?}");
    let marked: Vec<Vec<Event>> = (files.iter())
        .map(|f| read_events(f).unwrap())
        .filter(|ev| ev.iter().any(|e| e.session_start))
        .collect();
    assert_eq!(marked.len(), 1, "{files:?}");
    assert!(marked[0][1].session_start && marked[0][1].step == 1);
}

/// A validation that cannot write its samples fails the run (after saving the step), but the
/// callbacks after it still see the step: its metrics line is written.
#[test]
fn a_failed_validation_keeps_the_steps_metrics_line() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("run");
    std::fs::create_dir_all(&dir).unwrap();
    // `samples` a folder holding the file `step-2`, where the validation at step 2 writes
    // its folder.
    std::fs::create_dir_all(dir.join("samples")).unwrap();
    std::fs::write(dir.join("samples/step-2"), "not a folder").unwrap();
    let loaded = load(CONFIG, &["training.checkpoint_every=10"]);
    let opts = reel_core::trainer::TrainOptions {
        resume: None,
        output_dir: Some(dir.clone()),
        interrupt: None,
        processes: None,
    };
    let err = reel_core::trainer::train::<TestBackend>(&loaded, &opts)
        .expect_err("the validation at step 2 fails")
        .to_string();
    assert!(
        err.contains("the state after step 2 was saved first"),
        "{err}"
    );
    let (train_lines, val_lines) = metrics(&dir);
    assert_eq!(steps(&train_lines), [1, 2], "{err}");
    assert!(val_lines.is_empty(), "{val_lines:?}");
    assert!(ckpt(&dir, 2).join("manifest.json").is_file());
}

#[test]
fn callback_config_errors_name_the_key_or_role() {
    let err = |overrides: &[&str]| {
        let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        parse_run_config(CONFIG, Path::new("cb.toml"), &o)
            .unwrap_err()
            .to_string()
    };
    assert!(err(&["callbacks.0.decay=1.0"]).contains("callbacks[0].decay"));
    let e = err(&["callbacks.1.every_steps=0"]);
    assert!(e.contains("callbacks[1].every_steps"), "{e}");
    let e = err(&["callbacks.2.tensorbord=false"]);
    assert!(e.contains("tensorbord"), "{e}");

    // A role the config does not train fails when the config is read, naming it.
    let text = CONFIG.replace("start_step = 3", "roles = [\"critic\"]");
    let e = parse_run_config(&text, Path::new("test.toml"), &[])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("callbacks[0]") && e.contains("`critic`") && e.contains("not a trainable role"),
        "{e}"
    );
}
