//! Exact resume of a real `finetune` run through the `reel` binary (EMA and gradient
//! accumulation on, `max_steps` raised on resume), and resume from damaged checkpoints: a
//! truncated weights file, a bit flip in the optimizer state, a missing manifest. Each time
//! `--resume latest` says which checkpoint it skipped, falls back to the newest intact one,
//! and ends with exactly the uninterrupted run's weights, optimizer state and EMA, down to
//! the files' bytes. A run started again without `--resume` in a folder with checkpoints is
//! refused and leaves them as they were.

use crate::common;

use std::path::Path;
use std::process::Output;

use common::{ckpt, reel_train, tensors, tiny_run_with_clean};

const ACC: [&str; 2] = ["--set", "training.grad_accumulation=2"];

/// `reel train` with accumulation 2 and `extra`.
fn reel(dir: &Path, out: &str, extra: &[&str]) -> Output {
    reel_train(dir, out, &[&ACC[..], extra].concat(), None)
}

fn ok(o: Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    err
}

const FILES: [&str; 4] = [
    "student.safetensors",
    "student.optim.safetensors",
    "student.ema.safetensors",
    "state.json",
];

fn same_as_clean(dir: &Path, run: &str, why: &str) {
    for file in FILES {
        let (a, b) = (ckpt(&dir.join(run), 5), ckpt(&dir.join("clean"), 5));
        if file.ends_with(".json") {
            assert_eq!(
                std::fs::read_to_string(a.join(file)).unwrap(),
                std::fs::read_to_string(b.join(file)).unwrap(),
                "{why}: {file}"
            );
        } else {
            assert_eq!(
                tensors(&a.join(file)),
                tensors(&b.join(file)),
                "{why}: {file}"
            );
            // The whole file too: its header (metadata sorted by key) is reproducible.
            let bytes = |p: &Path| std::fs::read(p.join(file)).unwrap();
            assert!(bytes(&a) == bytes(&b), "{why}: {file}'s bytes differ");
        }
    }
}

#[test]
fn finetune_resume_with_ema_accumulation_and_a_new_max_steps_is_exact() {
    let tmp = tiny_run_with_clean(&ACC);
    let dir = tmp.path();
    ok(reel(dir, "split", &["--set", "training.max_steps=2"]));
    ok(reel(dir, "split", &["--resume", "latest"]));
    same_as_clean(dir, "split", "2 + 3 steps");
}

/// A resume over a data set that is not the checkpoint's (samples added) says so: the data
/// cursor then maps to other samples; the same data set says nothing.
#[test]
fn a_resume_over_another_data_set_size_warns() {
    let tmp = tiny_run_with_clean(&ACC);
    let dir = tmp.path();
    let same = ok(reel(dir, "clean", &["--resume", "latest"]));
    assert!(!same.contains("data set has"), "{same}");
    let more = ["--resume", "latest", "--set", "data.num_samples=20"];
    let err = ok(reel(dir, "clean", &more));
    assert!(
        err.contains("the data set has 20 samples, the checkpoint's had 16"),
        "{err}"
    );
}

#[test]
fn damaged_checkpoints_fall_back_to_the_newest_intact_one() {
    type Damage = fn(&Path);
    let damages: [(&str, Damage); 3] = [
        ("truncated weights", |d| {
            let f = d.join("student.safetensors");
            let bytes = std::fs::read(&f).unwrap();
            std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
        }),
        ("bit flip in the optimizer state", |d| {
            let f = d.join("student.optim.safetensors");
            let mut bytes = std::fs::read(&f).unwrap();
            let i = bytes.len() - 5;
            bytes[i] ^= 0x10;
            std::fs::write(&f, bytes).unwrap();
        }),
        ("missing manifest", |d| {
            std::fs::remove_file(d.join("manifest.json")).unwrap();
        }),
    ];
    let tmp = tiny_run_with_clean(&ACC);
    let dir = tmp.path();
    for (i, (what, damage)) in damages.iter().enumerate() {
        let run = format!("damaged-{i}");
        ok(reel(dir, &run, &["--set", "training.max_steps=3"]));
        damage(&ckpt(&dir.join(&run), 3));
        let err = ok(reel(dir, &run, &["--resume", "latest"]));
        assert!(
            err.contains("step-00000003") && err.contains("step-00000002"),
            "{what}: the fallback is not reported: {err}"
        );
        same_as_clean(dir, &run, what);
    }
}

#[test]
fn a_new_run_in_a_folder_with_checkpoints_is_refused_and_touches_nothing() {
    let tmp = tiny_run_with_clean(&ACC);
    let dir = tmp.path();
    let listing = || {
        let mut names: Vec<_> = std::fs::read_dir(dir.join("clean/checkpoints"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        names
    };
    let folders = listing();
    let before: Vec<_> = FILES
        .iter()
        .map(|f| std::fs::read(ckpt(&dir.join("clean"), 5).join(f)).unwrap())
        .collect();
    let o = reel(dir, "clean", &["--set", "training.max_steps=2"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("`--output`: `clean` already holds a run (checkpoints up to step 5)"),
        "{err}"
    );
    assert!(err.contains("`--resume latest` continues it"), "{err}");
    assert_eq!(listing(), folders, "no checkpoint was written or removed");
    for (f, bytes) in FILES.iter().zip(&before) {
        let now = std::fs::read(ckpt(&dir.join("clean"), 5).join(f)).unwrap();
        assert!(&now == bytes, "{f} changed");
    }
    // Resumed at its `max_steps`, the run says there is nothing to train.
    let err = ok(reel(dir, "clean", &["--resume", "latest"]));
    assert!(
        err.contains("nothing to train: the run is at step 5 and `training.max_steps` is 5"),
        "{err}"
    );
    same_as_clean(dir, "clean", "resumed at its end");
}

/// A run folder whose checkpoints were deleted (to free disk) still holds the `final/`
/// weights other configs name (a teacher, a LoRA base): a new run there is refused, and the
/// weights stay as they were.
#[test]
fn a_new_run_over_final_weights_is_refused_and_keeps_them() {
    let tmp = tiny_run_with_clean(&ACC);
    let dir = tmp.path();
    std::fs::remove_dir_all(dir.join("clean/checkpoints")).unwrap();
    let weights = |d: &std::path::Path| -> Vec<_> {
        let mut files: Vec<_> = std::fs::read_dir(d.join("clean/final"))
            .unwrap()
            .map(|e| {
                let p = e.unwrap().path();
                (p.clone(), std::fs::read(p).unwrap())
            })
            .collect();
        files.sort();
        files
    };
    let before = weights(dir);
    assert!(!before.is_empty(), "the run published no final weights");
    let o = reel(dir, "clean", &["--set", "training.max_steps=2"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("`clean` already holds a run (final weights in `final/`, no checkpoint)")
            && err.contains("another folder (`--output`)"),
        "{err}"
    );
    assert!(weights(dir) == before, "the final weights changed");
    assert!(
        !dir.join("clean/checkpoints").exists(),
        "a checkpoint was written"
    );
}

/// Resuming from an older checkpoint of a run whose folder holds newer ones starts a new
/// timeline: the newer checkpoints are moved, intact, into `abandoned-after-step-<n>/` (out of
/// reach of pruning and `--resume latest`), and the run ends where the clean run ended.
#[test]
fn a_branch_from_an_older_checkpoint_sets_the_newer_ones_aside() {
    let tmp = tiny_run_with_clean(&ACC);
    let dir = tmp.path();
    let clean = dir.join("clean");
    let before: Vec<_> = FILES
        .iter()
        .map(|f| std::fs::read(ckpt(&clean, 5).join(f)).unwrap())
        .collect();
    let step2 = ckpt(&clean, 2).to_str().unwrap().to_string();
    let err = ok(reel(dir, "clean", &["--resume", &step2]));
    let aside = clean.join("checkpoints/abandoned-after-step-00000002");
    assert!(
        err.contains("moved step-00000003, step-00000004, step-00000005")
            && err.contains("abandoned-after-step-00000002"),
        "{err}"
    );
    for (f, bytes) in FILES.iter().zip(&before) {
        let kept = std::fs::read(aside.join("step-00000005").join(f)).unwrap();
        assert!(&kept == bytes, "{f} of the set-aside step 5 changed");
    }
    same_as_clean(dir, "clean", "branch from step 2 in the run's own folder");
}

/// `--resume` with nothing to resume from fails before the run folder is made, and says what
/// was wrong; a run folder resumes from its newest checkpoint.
#[test]
fn resume_paths_a_run_folder_and_nothing_to_resume() {
    let tmp = tiny_run_with_clean(&ACC);
    let dir = tmp.path();
    let o = reel(dir, "fresh", &["--resume", "latest"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("no intact checkpoint found under"), "{err}");
    assert!(
        !dir.join("fresh").exists(),
        "the run folder was made: {err}"
    );
    let o = reel(dir, "fresh", &["--resume", "nope/step-00000002"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("nope/step-00000002 does not exist"), "{err}");
    assert!(!err.contains("damaged"), "{err}");
    assert!(!dir.join("fresh").exists());
    // Another [method]: refused, naming the key and both values, before anything is written.
    let o = reel(
        dir,
        "clean",
        &["--resume", "latest", "--set", "method.shift=5.0"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    for want in [
        "run.toml",
        "`method.shift`",
        "trained with absent",
        "the config says 5.0",
    ] {
        assert!(err.contains(want), "missing {want:?} in: {err}");
    }
    // The clean run's folder: its step 5, and at its max_steps nothing is left to train.
    let err = ok(reel(
        dir,
        "fresh",
        &["--resume", "clean", "--set", "training.max_steps=6"],
    ));
    assert!(err.contains("step-00000005 at step 5"), "{err}");
    assert!(ckpt(&dir.join("fresh"), 6).join("manifest.json").is_file());
    // `fresh` now holds a run of its own: another run's checkpoint resumed into it is refused,
    // and its checkpoints stay as they were; its own checkpoint, named by path, resumes.
    let listing = || {
        std::fs::read_dir(dir.join("fresh/checkpoints"))
            .unwrap()
            .count()
    };
    let before = listing();
    let step2 = ckpt(&dir.join("clean"), 2).to_str().unwrap().to_string();
    let o = reel(dir, "fresh", &["--resume", &step2]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    for want in [
        "`fresh` already holds a run (checkpoints up to step 6)",
        "is not one of its checkpoints",
        "(`--output`)",
    ] {
        assert!(err.contains(want), "missing {want:?} in: {err}");
    }
    assert_eq!(listing(), before, "a checkpoint was set aside or written");
    let own = ckpt(&dir.join("fresh"), 6).to_str().unwrap().to_string();
    // A default written out (weight decay 0.01) changes nothing: no warning.
    let err = ok(reel(
        dir,
        "fresh",
        &[
            "--resume",
            &own,
            "--set",
            "training.max_steps=6",
            "--set",
            "optimizer.weight_decay=0.01",
        ],
    ));
    assert!(err.contains("nothing to train"), "{err}");
    assert!(!err.contains("the checkpoint trained with"), "{err}");
    // A learning rate changed since the checkpoint: allowed, and said.
    let lr = [
        "--set",
        "training.max_steps=6",
        "--set",
        "optimizer.lr=0.002",
    ];
    let err = ok(reel(
        dir,
        "fresh",
        &[&["--resume", "latest"][..], &lr].concat(),
    ));
    assert!(
        err.contains("`optimizer.lr` is 0.002 now, the checkpoint trained with 0.001"),
        "{err}"
    );
    // Gradient checkpointing switched on (to fit a device): the checkpoint resumes, with no
    // warning about it (the gradients are the same; step 6 was trained with lr 0.001).
    let lr = ["--set", "optimizer.lr=0.002"];
    let gc = ["--set", "models.student.gradient_checkpointing=true"];
    let more = |max: &'static str| [&["--resume", "latest", "--set", max][..], &lr, &gc].concat();
    let err = ok(reel(dir, "fresh", &more("training.max_steps=7")));
    assert!(
        err.contains("resumed from") && !err.contains("gradient_checkpointing"),
        "{err}"
    );
    // A checkpoint stamped as before resumable keys were left out of fingerprints (every
    // key counted) resumes too, even with a resumable key changed at the same time
    // (gradient checkpointing switched off again).
    let overrides = [
        "training.grad_accumulation=2",
        "optimizer.lr=0.002",
        "models.student.gradient_checkpointing=true",
    ];
    let loaded = common::load(common::TINY_WAN_RUN, &overrides);
    let old_stamp = reel_core::config::config_fingerprint(&loaded.resolved_toml, &[]).unwrap();
    assert_ne!(loaded.fingerprint, old_stamp);
    let manifest = ckpt(&dir.join("fresh"), 7).join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    assert_eq!(m["config_fingerprint"], loaded.fingerprint.as_str());
    m["config_fingerprint"] = old_stamp.into();
    std::fs::write(&manifest, m.to_string()).unwrap();
    let no_gc = ["--set", "models.student.gradient_checkpointing=false"];
    let args = [
        &["--resume", "latest", "--set", "training.max_steps=8"][..],
        &lr,
        &no_gc,
    ];
    let err = ok(reel(dir, "fresh", &args.concat()));
    assert!(err.contains("step-00000007 at step 7"), "{err}");
    // A changed key that counts is still refused against an old stamp, naming it.
    let step8 = ckpt(&dir.join("fresh"), 8);
    let text = std::fs::read_to_string(step8.join("config.toml")).unwrap();
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(step8.join("manifest.json")).unwrap())
            .unwrap();
    m["config_fingerprint"] = reel_core::config::config_fingerprint(&text, &[])
        .unwrap()
        .into();
    std::fs::write(step8.join("manifest.json"), m.to_string()).unwrap();
    let seed = ["--set", "models.student.init_seed=3"];
    let args = [
        &["--resume", "latest", "--set", "training.max_steps=9"][..],
        &lr,
        &seed,
    ];
    let o = reel(dir, "fresh", &args.concat());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("models.student.init_seed") && err.contains("was trained with 2"),
        "{err}"
    );
}

/// A run folder another process is training (it holds `<run>/.lock`) is refused, naming the
/// holder, and nothing is written; once the lock is released the run resumes.
#[test]
fn a_run_folder_in_use_is_refused_until_released() {
    let tmp = tiny_run_with_clean(&ACC);
    let dir = tmp.path();
    let lock = std::fs::File::options()
        .write(true)
        .open(dir.join("clean/.lock"))
        .expect("the run wrote its lock file");
    lock.lock().unwrap();
    // The run wrote its process id and machine (`<pid> on <host>`).
    let holder = std::fs::read_to_string(dir.join("clean/.lock")).unwrap();
    let (pid, host) = holder.split_once(" on ").expect("a pid and a host");
    assert!(pid.parse::<u32>().is_ok() && !host.is_empty(), "{holder}");
    std::fs::write(dir.join("clean/.lock"), "4242").unwrap();
    let more = ["--resume", "latest", "--set", "training.max_steps=6"];
    let o = reel(dir, "clean", &more);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("`clean` is being trained by process 4242"),
        "{err}"
    );
    assert!(!ckpt(&dir.join("clean"), 6).exists(), "{err}");
    drop(lock);
    ok(reel(dir, "clean", &more));
    assert!(ckpt(&dir.join("clean"), 6).join("manifest.json").is_file());
}

/// A checkpoint with an EMA shadow resumed by a config without the `ema` callback: the
/// shadow, which nothing would update, is left out with a warning, so later checkpoints and
/// `final/` hold none rather than the resumed step's copy.
#[test]
fn an_ema_no_callback_keeps_is_left_out_on_resume() {
    let tmp = tiny_run_with_clean(&ACC);
    let dir = tmp.path();
    let ema = "[[callbacks]]\nkind = \"ema\"\ndecay = 0.9\n";
    assert!(common::TINY_WAN_RUN.contains(ema));
    std::fs::write(dir.join("run.toml"), common::TINY_WAN_RUN.replace(ema, "")).unwrap();
    let run = dir.join("clean");
    assert!(ckpt(&run, 5).join("student.ema.safetensors").is_file());
    let err = ok(reel(
        dir,
        "clean",
        &["--resume", "latest", "--set", "training.max_steps=6"],
    ));
    assert!(
        err.contains("keeps an EMA of role `student`, but no `ema` callback"),
        "{err}"
    );
    for folder in [ckpt(&run, 6), run.join("final")] {
        assert!(folder.join("student.safetensors").is_file());
        assert!(
            !folder.join("student.ema.safetensors").exists(),
            "{folder:?}"
        );
    }
}

/// A LoRA role's base `weights` file replaced under the same path between two legs of a run
/// (the config, and so its fingerprint, unchanged) is reported on resume; an unchanged one is
/// not. (A role trained in full gets every value from the checkpoint; a frozen role's file
/// is stamped the same way.)
#[test]
fn a_weights_file_changed_under_the_run_is_reported_on_resume() {
    let tmp = tiny_run_with_clean(&ACC);
    let dir = tmp.path();
    let weights = dir.join("w.safetensors");
    let from = |step| ckpt(&dir.join("clean"), step).join("student.safetensors");
    std::fs::copy(from(1), &weights).unwrap();
    let leg = |max: &str, resume: bool| {
        let set = format!("training.max_steps={max}");
        let mut args = vec![
            "--set",
            "models.student.weights=w.safetensors",
            "--set",
            "models.student.adapter={kind=\"lora\",rank=2}",
            "--set",
            &set,
        ];
        if resume {
            args.extend(["--resume", "latest"]);
        }
        ok(reel(dir, "from-file", &args))
    };
    leg("2", false);
    let err = leg("3", true);
    assert!(!err.contains("is not the file"), "{err}");
    std::fs::copy(from(2), &weights).unwrap();
    let err = leg("4", true);
    assert!(
        err.contains("`models.student.weights` is not the file the checkpoint was trained with"),
        "{err}"
    );
}
