//! The file data sources end to end: `reel data export` writes the synthetic data as FastVideo
//! parquet and as a safetensors folder, and training on either file set follows exactly the
//! same losses as training on the synthetic source itself. Bad data stops training with an
//! error naming the file and record.

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_reel");

/// A tiny finetune run whose `[data]` table is `data` (no CFG dropout: the synthetic source
/// has its own negative prompt, the file sources fall back to zeros).
fn config(data: &str) -> String {
    format!(
        r#"
[runtime]
backend = "cpu"
seed = 7

[models.student]
arch = "wan"
preset = "wan-tiny"
init_seed = 3
trainable = true

[method]
kind = "finetune"
cfg_dropout = 0.0

[data]
{data}

[optimizer]
lr = 1e-3

[training]
max_steps = 4
checkpoint_every = 4

[[callbacks]]
kind = "logging"
every_steps = 1
"#
    )
}

const SYNTHETIC: &str =
    "kind = \"synthetic\"\nbatch_size = 2\nnum_samples = 12\nframes = 2\nheight = 12\nwidth = 12";

fn reel(args: &[&str], cwd: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

fn train(dir: &Path, name: &str, data: &str) -> Output {
    let cfg = dir.join(format!("{name}.toml"));
    std::fs::write(&cfg, config(data)).unwrap();
    let out = dir.join(name);
    reel(
        &[
            "train",
            cfg.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
        ],
        dir,
    )
}

/// The logged loss of every step.
fn losses(run: &Path) -> Vec<f64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("loss")?.as_f64())
        .collect()
}

#[test]
fn training_on_exported_files_matches_the_synthetic_source() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("synthetic.toml"), config(SYNTHETIC)).unwrap();
    for (format, folder) in [("parquet", "pq"), ("safetensors", "st")] {
        let o = reel(
            &[
                "data",
                "export",
                "synthetic.toml",
                "--to",
                folder,
                "--format",
                format,
                "--rows-per-file",
                "5",
            ],
            dir,
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let parquet_files = std::fs::read_dir(dir.join("pq")).unwrap().count();
    assert_eq!(parquet_files, 3, "12 samples, 5 per file");
    assert_eq!(std::fs::read_dir(dir.join("st")).unwrap().count(), 12);

    let runs = [
        ("synthetic", SYNTHETIC.to_string()),
        (
            "parquet",
            "kind = \"fastvideo_parquet\"\npath = \"pq\"\nbatch_size = 2\ntext_len = 8\n\
             normalize = \"none\""
                .to_string(),
        ),
        (
            "safetensors",
            "kind = \"safetensors\"\npath = \"st\"\nbatch_size = 2\ntext_len = 8".to_string(),
        ),
    ];
    let mut curves = Vec::new();
    for (name, data) in &runs {
        let o = train(dir, name, data);
        assert!(
            o.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let l = losses(&dir.join(name));
        assert_eq!(l.len(), 4, "{name}: {l:?}");
        assert!(l.iter().all(|v| v.is_finite()), "{name}: {l:?}");
        curves.push(l);
    }
    for (i, (name, _)) in runs.iter().enumerate().skip(1) {
        for (a, b) in curves[0].iter().zip(&curves[i]) {
            assert!(
                (a - b).abs() <= 1e-6 * a.abs().max(1.0),
                "{name}: {:?} vs {:?}",
                curves[i],
                curves[0]
            );
        }
    }
    // A run folder in the data's folder would have its checkpoints read as samples: `reel
    // train` refuses it naming `--output` (here spelled through another folder), `reel
    // check` naming `runtime.output_dir`, and the data folder gains no file.
    let inside = dir.join("pq/../st/run");
    let o = reel(
        &[
            "train",
            "safetensors.toml",
            "--output",
            inside.to_str().unwrap(),
        ],
        dir,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("`--output`") && err.contains("lies in the data's"),
        "{err}"
    );
    let o = reel(
        &[
            "check",
            "safetensors.toml",
            "--set",
            "runtime.output_dir=st",
        ],
        dir,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("runtime.output_dir")
            && err.contains("lies in the data's"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(dir.join("st")).unwrap().count(), 12);
    // The data's search follows links: a run under a link in its folder that points out of
    // it is refused too, and nothing is written where the link points.
    #[cfg(unix)]
    {
        std::fs::create_dir(dir.join("scratch")).unwrap();
        std::os::unix::fs::symlink(dir.join("scratch"), dir.join("st/runs")).unwrap();
        let via_link = dir.join("st/runs/a");
        let o = reel(
            &[
                "train",
                "safetensors.toml",
                "--output",
                via_link.to_str().unwrap(),
            ],
            dir,
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains("lies in the data's"),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(dir.join("scratch")).unwrap().count(), 0);
        // The same folder named by its own path: the link that reaches it is named.
        let own = dir.join("scratch/a");
        let o = reel(
            &[
                "train",
                "safetensors.toml",
                "--output",
                own.to_str().unwrap(),
            ],
            dir,
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success()
                && err.contains("lies in the data's")
                && err.contains("through the link `")
                && err.contains("runs`"),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(dir.join("scratch")).unwrap().count(), 0);
        std::fs::remove_file(dir.join("st/runs")).unwrap();
    }
    // `reel sample` reads the run's data for the clips' shape: with the data moved away the
    // error says where that comes from and how to point it elsewhere.
    std::fs::rename(dir.join("st"), dir.join("st-moved")).unwrap();
    let run = dir.join("safetensors");
    let sample = |extra: &[&str]| {
        let out = dir.join("clips");
        let args = [
            &[
                "sample",
                run.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--steps",
                "2",
            ][..],
            extra,
        ]
        .concat();
        reel(&args, dir)
    };
    let o = sample(&[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    for want in ["the run's `[data]`", "--set data.path=", "st"] {
        assert!(err.contains(want), "missing {want:?} in: {err}");
    }
    let o = sample(&["--set", "data.path=st-moved"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// A safetensors file's bytes with its first `latents` value (float32) set to NaN; the
/// header is left whole.
fn nan_in_latents(mut bytes: Vec<u8>) -> Vec<u8> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(header["latents"]["dtype"], "F32", "{header}");
    let start = header["latents"]["data_offsets"][0].as_u64().unwrap() as usize;
    bytes[8 + n + start..][..4].copy_from_slice(&f32::NAN.to_le_bytes());
    bytes
}

#[test]
fn bad_data_stops_training_naming_file_and_record() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("synthetic.toml"), config(SYNTHETIC)).unwrap();
    let o = reel(
        &[
            "data",
            "export",
            "synthetic.toml",
            "--to",
            "st",
            "--format",
            "safetensors",
        ],
        dir,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Sample 7 cut short shows in its header: the run is refused when its data opens,
    // naming the file, before the run folder is made.
    let bad = dir.join("st/00000007.safetensors");
    let bytes = std::fs::read(&bad).unwrap();
    std::fs::write(&bad, &bytes[..bytes.len() / 2]).unwrap();
    let data = "kind = \"safetensors\"\npath = \"st\"\nbatch_size = 4\ntext_len = 8";
    let o = train(dir, "cut", data);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("00000007.safetensors: record 0") && err.contains("truncated"),
        "{err}"
    );
    assert!(!dir.join("cut").exists(), "the run folder was made");
    // Whole again but with a NaN among its latents, which only reading it shows: the run
    // fails when it reaches it, naming the file.
    std::fs::write(&bad, nan_in_latents(bytes)).unwrap();
    let o = train(dir, "bad", data);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("00000007.safetensors: record 0") && err.contains("NaN"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // The steps before it are kept: the state after the last completed step is checkpointed
    // (at the data before the bad batch) although `checkpoint_every` is not due.
    let done = losses(&dir.join("bad")).len();
    assert!(
        done >= 1,
        "with this seed, sample 7 comes after the first step: {err}"
    );
    assert!(
        err.contains(&format!("the state after step {done} was saved first")),
        "{err}"
    );
    let saved = dir.join(format!("bad/checkpoints/step-{done:08}"));
    assert!(saved.join("manifest.json").is_file(), "{err}");

    // Exporting that data stops at sample 7 and leaves no part of a data set behind (the
    // files written before it would read as a whole set): in both formats.
    for format in ["safetensors", "parquet"] {
        let args = [
            "data", "export", "bad.toml", "--to", "partial", "--format", format,
        ];
        let o = reel(&[&args[..], &["--rows-per-file", "4"]].concat(), dir);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{format}: {err}");
        assert!(
            err.contains("00000007.safetensors: record 0") && err.contains("were removed"),
            "{format}: {err}"
        );
        assert!(!dir.join("partial").exists(), "{format}: files left behind");
    }

    // With two data-parallel workers, whichever worker reads it, every worker stops at that
    // step and the steps before it are kept, as in one worker. The seeds put the record on
    // each worker in turn.
    let cfg = dir.join("bad.toml");
    let mut seen = [false; 2];
    for seed in 7..12 {
        let out = dir.join(format!("bad_group_{seed}"));
        let o = reel(
            &[
                "train",
                cfg.to_str().unwrap(),
                "--output",
                out.to_str().unwrap(),
                "--set",
                "runtime.num_devices=2",
                "--set",
                &format!("runtime.seed={seed}"),
            ],
            dir,
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "seed {seed}: {err}");
        assert!(
            err.contains("00000007.safetensors: record 0") && err.contains("NaN"),
            "seed {seed}: {err}"
        );
        for bad in ["panicked", "collective", "(device 0)"] {
            assert!(!err.contains(bad), "seed {seed}: {err}");
        }
        let on_worker_1 = err.contains("reel: worker 1 (device 1): ");
        seen[on_worker_1 as usize] = true;
        if on_worker_1 {
            assert!(err.contains("a data record failed on worker 1"), "{err}");
        }
        let done = losses(&out).len();
        if done > 0 {
            assert!(
                err.contains(&format!("the state after step {done} was saved first")),
                "seed {seed}: {err}"
            );
            let saved = out.join(format!("checkpoints/step-{done:08}"));
            assert!(saved.join("manifest.json").is_file(), "seed {seed}: {err}");
        }
    }
    assert_eq!(
        seen,
        [true, true],
        "these seeds put the record on both workers"
    );

    // A missing data folder is reported at start, with the path.
    let o = train(
        dir,
        "missing",
        "kind = \"fastvideo_parquet\"\npath = \"nowhere\"",
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("nowhere"), "{err}");
}
