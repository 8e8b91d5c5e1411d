//! Command-line rough edges a new user meets: `reel check` reads the weight headers a config
//! names and reports what `reel train` would (naming `models.<role>.weights`), and
//! `reel export` accepts `<run>/checkpoints/latest`, the name `--resume` uses; `reel train`
//! names the kernels chosen by the environment.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use burn::tensor::TensorData;
use common::*;
use reel_core::io::{read_safetensors, write_safetensors};
use reel_models::WanConfig;

type Cpu = <TestBackend as burn::tensor::backend::AutodiffBackend>::InnerBackend;

fn reel(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_reel"))
        .current_dir(dir)
        .args(args)
        .env_remove("REEL_FAULT")
        .output()
        .expect("reel runs")
}

/// `reel check run.toml --set models.student.weights=<weights>`: its stderr when it fails,
/// `None` when it says ok.
fn check_with_weights(dir: &Path, weights: &str) -> Option<String> {
    let set = format!("models.student.weights={weights}");
    let out = reel(dir, &["check", "run.toml", "--set", &set]);
    if out.status.success() {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.starts_with("ok:"), "{stdout}");
        return None;
    }
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert!(!err.contains("panicked"), "no panic: {err}");
    Some(err)
}

/// A diffusers `transformer/` folder of the `wan-tiny` preset (`config.json` + weights).
fn write_transformer(dir: &Path) {
    WanConfig::preset("wan-tiny")
        .unwrap()
        .init_seeded::<Cpu>(&Default::default(), 4)
        .save_pretrained(dir)
        .unwrap();
}

#[test]
fn check_reads_the_weight_headers_a_role_names() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("run.toml"), TINY_WAN_RUN).unwrap();
    write_transformer(&dir.join("good"));
    assert_eq!(check_with_weights(dir, "good"), None, "a good folder");
    let file = "good/diffusion_pytorch_model.safetensors";
    assert_eq!(check_with_weights(dir, file), None, "a good file");

    let expect = |weights: &str, what: &[&str]| {
        let err = check_with_weights(dir, weights)
            .unwrap_or_else(|| panic!("`reel check` accepted weights = {weights:?}"));
        for w in ["run.toml", "models.student.weights"].iter().chain(what) {
            assert!(err.contains(w), "{weights}: `{w}` not in: {err}");
        }
    };
    expect("nowhere", &["nowhere", "no such file"]);
    std::fs::create_dir(dir.join("empty")).unwrap();
    expect("empty", &["empty", "diffusion_pytorch_model.safetensors"]);
    std::fs::write(dir.join("notes.safetensors"), "not a safetensors file").unwrap();
    expect("notes.safetensors", &["notes.safetensors"]);
    // An interrupted download: the check reads only the header, and still sees the file is short.
    let bytes = std::fs::read(dir.join(file)).unwrap();
    std::fs::write(dir.join("cut.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    expect("cut.safetensors", &["cut.safetensors", "truncated"]);

    // One key dropped, one reshaped, one added: all three named in one error.
    let (tensors, _) = read_safetensors(dir.join(file)).unwrap();
    let keys: Vec<&String> = tensors.keys().collect();
    let (dropped, reshaped) = (keys[0].clone(), keys[1].clone());
    let mut edited: Vec<(String, TensorData)> = tensors
        .iter()
        .filter(|(k, _)| **k != dropped)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (k, v) in edited.iter_mut() {
        if *k == reshaped {
            let n = v.shape.iter().product::<usize>();
            *v = TensorData::new(vec![0.0f32; n + 1], [n + 1]);
        }
    }
    edited.push((
        "blocks.99.extra.weight".into(),
        TensorData::new(vec![1.0f32], [1]),
    ));
    write_safetensors(dir.join("edited.safetensors"), &edited, None).unwrap();
    expect(
        "edited.safetensors",
        &[
            "edited.safetensors",
            &dropped,
            &reshaped,
            "blocks.99.extra.weight",
        ],
    );

    // `reel train` reports the same problem.
    let out = reel(
        dir,
        &[
            "train",
            "run.toml",
            "--output",
            "out",
            "--set",
            "models.student.weights=edited.safetensors",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(&dropped), "{err}");

    // A missing architecture config.json is named with its key.
    let text = TINY_WAN_RUN.replace("preset = \"wan-tiny\"", "config = \"missing/config.json\"");
    std::fs::write(dir.join("json.toml"), text).unwrap();
    let out = reel(dir, &["check", "json.toml"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a missing config.json is an error");
    assert!(
        err.contains("models.student.config") && err.contains("missing/config.json"),
        "{err}"
    );
    assert_eq!(err.matches("config.json").count(), 1, "named once: {err}");

    // A config.json whose values are wrong: the key is `config` and the file is named.
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("good/config.json")).unwrap())
            .unwrap();
    cfg["num_attention_heads"] = 0.into();
    std::fs::create_dir(dir.join("zero")).unwrap();
    std::fs::write(dir.join("zero/config.json"), cfg.to_string()).unwrap();
    std::fs::write(
        dir.join("zero.toml"),
        TINY_WAN_RUN.replace("preset = \"wan-tiny\"", "config = \"zero/config.json\""),
    )
    .unwrap();
    let out = reel(dir, &["check", "zero.toml"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "zero heads passed the check");
    for w in [
        "models.student.config",
        "zero/config.json",
        "num_attention_heads",
    ] {
        assert!(err.contains(w), "`{w}` not in: {err}");
    }
}

/// `reel check` opens the data and checks each role's model against it, as building the
/// roles in `reel train` does: a clip the patch cannot tile and a missing data folder are
/// errors naming the file and the key, before anything is trained.
#[test]
fn check_opens_the_data_and_fits_each_model_to_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("run.toml"), TINY_WAN_RUN).unwrap();
    let out = reel(dir, &["check", "run.toml"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `num_samples = 16` and `height = 12`, `width = 12` in TINY_WAN_RUN.
    assert!(
        stdout.contains("data: 16 samples of ") && stdout.contains("×12×12 latents"),
        "{stdout}"
    );

    // wan-tiny's spatial patch is 2: an odd height cannot be tiled.
    let args = ["run.toml", "--set", "data.height=13"];
    let out = reel(dir, &[&["check"][..], &args].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an odd height passed the check");
    for want in [
        "run.toml",
        "`models.student`",
        "`data.height` = 13",
        "patch size 2",
    ] {
        assert!(err.contains(want), "missing {want:?} in: {err}");
    }
    // `reel train` gives the same error before any step.
    let out = reel(dir, &[&["train"][..], &args, &["--output", "out"]].concat());
    let train_err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{train_err}");
    assert!(train_err.contains(err.trim()), "{train_err} against {err}");
    assert!(!dir.join("out/checkpoints").exists(), "no step was taken");

    // wan-tiny's RoPE tables cover 32 positions per axis: 66 / 2 = 33 patches is one too
    // many (the forward would have panicked mid-run).
    let args = ["run.toml", "--set", "data.height=66"];
    let out = reel(dir, &[&["check"][..], &args].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a too long height passed the check");
    for want in [
        "`models.student`",
        "`data.height` = 66",
        "33 patches",
        "at most 64",
    ] {
        assert!(err.contains(want), "missing {want:?} in: {err}");
    }
    let out = reel(dir, &[&["train"][..], &args, &["--output", "out"]].concat());
    assert!(!out.status.success());
    assert!(!dir.join("out/checkpoints").exists(), "no step was taken");

    // A parquet data set that is not there.
    let parquet = "[data]\nkind = \"fastvideo_parquet\"\npath = \"no/such/set\"\nbatch_size = 2\n";
    let text = TINY_WAN_RUN.replace(
        "[data]\nkind = \"synthetic\"\nbatch_size = 2\nnum_samples = 16\nframes = 2\nheight = 12\nwidth = 12\n",
        parquet,
    );
    assert!(text.contains("no/such/set"), "the data table was replaced");
    std::fs::write(dir.join("parquet.toml"), text).unwrap();
    let out = reel(dir, &["check", "parquet.toml"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a missing data set passed the check");
    assert!(
        err.contains("no/such/set") && !err.contains("panicked"),
        "{err}"
    );

    // `reel train` refuses a missing data set or mistyped weights before making its run folder.
    let weights = ["run.toml", "--set", "models.student.weights=nowhere"];
    for (args, why) in [
        (&["parquet.toml"][..], "no/such/set"),
        (&weights[..], "nowhere"),
    ] {
        let out = reel(
            dir,
            &[&["train"][..], args, &["--output", "fresh"]].concat(),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(why),
            "{args:?}: {err}"
        );
        assert!(
            !dir.join("fresh").exists(),
            "{args:?} left a run folder: {err}"
        );
    }
}

/// `reel check` of a shipped real config on a machine without its files lists every problem
/// at once, one line each (each role's weights, the validation's VAE, the data set and, on a
/// build without it, the backend), then how many there were; the values stay checked first.
#[test]
fn check_lists_every_problem_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/dmd2_wan.toml");
    let table: toml::Table = std::fs::read_to_string(&shipped).unwrap().parse().unwrap();
    let mut wants: Vec<String> = table["models"]
        .as_table()
        .unwrap()
        .iter()
        .filter(|(_, role)| role.get("weights").is_some())
        .map(|(name, _)| format!("`models.{name}.weights`"))
        .collect();
    for (i, cb) in table["callbacks"].as_array().unwrap().iter().enumerate() {
        if cb.get("vae").is_some() {
            wants.push(format!("`callbacks[{i}].vae`"));
        }
    }
    wants.push("`data`".into());
    if !cfg!(feature = "cuda") {
        wants.push("`runtime.backend`".into());
    }
    let out = reel(dir, &["check", shipped.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines.len(),
        wants.len() + 1,
        "one line per problem and a count: {err}"
    );
    for want in &wants {
        let line = lines.iter().find(|l| l.contains(want.as_str()));
        let line = line.unwrap_or_else(|| panic!("{want} not in: {err}"));
        assert!(
            line.starts_with("error: ") && line.contains("dmd2_wan.toml"),
            "{line}"
        );
    }
    let count = format!("{} problems", wants.len());
    assert!(lines.last().unwrap().contains(&count), "{err}");

    // A bad value still stops the check at once: later keys may depend on it.
    let out = reel(
        dir,
        &[
            "check",
            shipped.to_str().unwrap(),
            "--set",
            "optimizer.lr=-1",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("optimizer.lr"), "{err}");
}

/// Data sizes no machine can hold (a mistyped `height`), or that no machine can even count,
/// are an error keyed `data` from `reel check` and from `reel train` before its run folder,
/// not an aborted process at the first batch.
#[test]
fn a_batch_larger_than_any_memory_is_refused_before_training() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("run.toml"), TINY_WAN_RUN).unwrap();
    let cfg = WanConfig::preset("wan-tiny").unwrap();
    let [pt, ph, pw] = cfg.patch_size;
    let data = |batch: usize, [f, h, w]: [usize; 3]| {
        format!(
            "data={{kind=\"random\",batch_size={batch},channels={},frames={f},height={h},\
             width={w},text_len=8,text_dim={}}}",
            cfg.in_channels, cfg.text_dim
        )
    };
    // A batch of 2^20 samples of about 2^22 values each (petabytes): the memory check.
    let petabytes = data(1 << 20, [pt << 4, ph << 8, pw << 8]);
    let wants = ["run.toml", "`data`", "latents", "GiB"];
    check_and_train_refuse(dir, &["--set", &petabytes], &wants);
    // Sizes far beyond any model (2^60 a side): refused by key before anything is counted.
    let uncountable = data(1, [pt << 60, ph << 60, pw << 60]);
    let wants = ["run.toml", "`data.frames`", "[1, 65536]"];
    check_and_train_refuse(dir, &["--set", &uncountable], &wants);
}

/// Data that cannot be opened (a mistyped folder) is blamed on the config file and its
/// `data` table by `reel train` as by `reel check`, with the folder named.
#[test]
fn data_that_cannot_be_opened_names_the_config_and_the_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("run.toml"), TINY_WAN_RUN).unwrap();
    let set = "data={kind=\"fastvideo_parquet\",path=\"no/such/folder\",text_len=8}";
    let wants = ["run.toml", "`data`", "no/such/folder"];
    check_and_train_refuse(dir, &["--set", set], &wants);
}

/// `reel check run.toml` and `reel train run.toml --output fresh`, each with `extra`
/// arguments, both refuse the config in `dir`: each error names all of `wants`, neither
/// panics nor fails an allocation, and `train` makes no run folder.
fn check_and_train_refuse(dir: &Path, extra: &[&str], wants: &[&str]) {
    let check = [&["check", "run.toml"], extra].concat();
    let train = [&["train", "run.toml"], extra, &["--output", "fresh"]].concat();
    for (what, args) in [("check", check), ("train", train)] {
        let out = reel(dir, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what} passed {extra:?}");
        for want in wants {
            assert!(err.contains(want), "{what}: missing {want:?} in: {err}");
        }
        assert!(
            !err.contains("panicked") && !err.contains("allocation"),
            "{err}"
        );
    }
    assert!(!dir.join("fresh").exists(), "train made its run folder");
}

/// A model no memory here holds (a `config.json` whose hidden width makes each block
/// terabytes) is refused by `reel check` and `reel train` from its config, before any weight
/// is made, with the roles' memory floor by part; a model that fits gets its floor printed.
#[test]
fn roles_larger_than_the_memory_are_refused_before_any_weight_is_made() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut cfg = WanConfig::preset("wan-tiny").unwrap();
    // The widest model the config's size limits allow: each block is over a terabyte.
    cfg.num_attention_heads = (1 << 17) / cfg.attention_head_dim;
    cfg.ffn_dim = cfg.num_attention_heads * cfg.attention_head_dim * 4;
    std::fs::write(dir.join("huge.json"), cfg.to_json_string()).unwrap();
    let huge = TINY_WAN_RUN.replace("preset = \"wan-tiny\"", "config = \"huge.json\"");
    std::fs::write(dir.join("run.toml"), huge).unwrap();
    let wants = [
        "run.toml",
        "`models`",
        "GiB per device",
        "AdamW moments",
        "`student`'s backward",
        "memory this machine has available",
        "LoRA",
    ];
    check_and_train_refuse(dir, &[], &wants);

    std::fs::write(dir.join("tiny.toml"), TINY_WAN_RUN).unwrap();
    let out = reel(dir, &["check", "tiny.toml"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("\nmemory: the roles hold at least ")
            && stdout.contains("per device (weights "),
        "{stdout}"
    );
}

/// A run folder that cannot be made (here a file of that name) is an error naming where its
/// path came from, `runtime.output_dir` in the config (or the default it replaces) or
/// `--output`, and the file is kept; `reel check` reports it before training.
#[test]
fn train_names_the_key_of_an_output_folder_it_cannot_make() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("run.toml"), TINY_WAN_RUN).unwrap();
    std::fs::write(dir.join("taken"), "keep me").unwrap();
    let from_config = ["train", "run.toml", "--set", "runtime.output_dir=taken"];
    let from_flag = ["train", "run.toml", "--output", "taken"];
    // The default `runs/run` under a file `runs`: the key that replaces it is named.
    let by_default = ["train", "run.toml"];
    std::fs::write(dir.join("runs"), "keep me").unwrap();
    for (args, wants) in [
        (
            &from_config[..],
            &["run.toml", "`runtime.output_dir`", "taken"][..],
        ),
        (&from_flag[..], &["`--output`", "taken"][..]),
        (
            &by_default[..],
            &["run.toml", "`runtime.output_dir`", "runs"][..],
        ),
    ] {
        let out = reel(dir, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} trained into a file");
        for want in wants {
            assert!(err.contains(want), "missing {want:?} in: {err}");
        }
        assert!(!err.contains("panicked"), "{err}");
        for kept in ["taken", "runs"] {
            assert_eq!(std::fs::read_to_string(dir.join(kept)).unwrap(), "keep me");
        }
    }
    // `reel check` finds it first, for the folder and for a folder inside it.
    for output_dir in ["taken", "taken/run"] {
        let set = format!("runtime.output_dir={output_dir}");
        let out = reel(dir, &["check", "run.toml", "--set", &set]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "check passed {output_dir}");
        for want in ["run.toml", "`runtime.output_dir`", "is a file"] {
            assert!(err.contains(want), "missing {want:?} in: {err}");
        }
    }
}

/// An entry the run writes, there as the wrong kind in the run folder (a file named `samples`
/// where validations make a folder, a folder named `metrics.jsonl`, a file named
/// `checkpoints`), is refused by `reel check` and by `reel train` before anything is written,
/// naming the callback that writes it; they used to fail at the first validation or save,
/// losing the steps before. A folder that holds a run gets a note from `reel check`.
#[test]
fn run_folder_entries_of_the_wrong_kind_are_refused_before_training() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // Its callbacks: EMA, logging, and a validation added here.
    let run = format!(
        "{TINY_WAN_RUN}\n[[callbacks]]\nkind = \"validation\"\nevery_steps = 2\n\
         sampling_steps = 1\n"
    );
    std::fs::write(
        dir.join("run.toml"),
        run.replace("max_steps = 5", "max_steps = 1"),
    )
    .unwrap();
    let out = dir.join("out");
    for (entry, folder, key) in [
        ("samples", false, "`callbacks[2]`"),
        ("metrics.jsonl", true, "`callbacks[1]`"),
        ("checkpoints", false, "`runtime.output_dir`"),
    ] {
        std::fs::create_dir_all(&out).unwrap();
        let path = out.join(entry);
        match folder {
            true => std::fs::create_dir(&path).unwrap(),
            false => std::fs::write(&path, "keep me").unwrap(),
        }
        let check = ["check", "run.toml", "--set", "runtime.output_dir=out"];
        let train = ["train", "run.toml", "--output", "out"];
        for args in [&check[..], &train[..]] {
            let o = reel(dir, args);
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(!o.status.success(), "{entry}: {args:?} passed");
            for want in [key, entry, if folder { "is a folder" } else { "is a file" }] {
                assert!(err.contains(want), "{entry}: missing {want:?} in: {err}");
            }
        }
        assert!(
            !out.join("config.resolved.toml").exists(),
            "{entry}: train began"
        );
        std::fs::remove_dir_all(&out).unwrap();
    }
    let o = reel(dir, &["train", "run.toml", "--output", "out"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = reel(
        dir,
        &["check", "run.toml", "--set", "runtime.output_dir=out"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success()
            && err.contains("already holds a run")
            && err.contains("--resume latest"),
        "{err}"
    );
    // `reel check --output` checks the folder `reel train --output` would use.
    let o = reel(dir, &["check", "run.toml", "--output", "out"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success() && err.contains("`out` already holds a run"),
        "{err}"
    );
    std::fs::write(dir.join("taken"), "keep me").unwrap();
    let o = reel(dir, &["check", "run.toml", "--output", "taken/run"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("is a file") && err.contains("`--output`"),
        "{err}"
    );
}

#[test]
fn export_accepts_checkpoints_latest() {
    let tmp = tiny_run_with_clean(&[]);
    let dir = tmp.path();
    let mut exported = Vec::new();
    let step5 = format!(
        "clean/checkpoints/{}",
        reel_core::checkpoint::step_dir_name(5)
    );
    for (src, out) in [
        ("clean", "from_run"),
        ("clean/checkpoints/latest", "from_latest"),
        (step5.as_str(), "from_step"),
    ] {
        let o = reel(dir, &["export", src, "--out", out]);
        assert!(
            o.status.success(),
            "export {src}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let file = dir.join(out).join("diffusion_pytorch_model.safetensors");
        exported.push(std::fs::read(&file).unwrap());
    }
    assert_eq!(
        exported[0], exported[1],
        "latest = the run's last checkpoint"
    );
    assert_eq!(exported[0], exported[2], "the last checkpoint is step 5");

    // A mistyped folder is called that, once, by every reading command; a run folder
    // without checkpoints names the folder searched.
    std::fs::create_dir(dir.join("empty_run")).unwrap();
    let cases: [(&[&str], &str); 4] = [
        (
            &["export", "clean/checkpoints/nowhere", "--out", "x"],
            "nowhere",
        ),
        (
            &["sample", "nowhere", "--prompt", "a", "--out", "x"],
            "nowhere",
        ),
        (&["eval", "nowhere"], "nowhere"),
        (&["export", "empty_run", "--out", "x"], "empty_run"),
    ];
    for (args, name) in cases {
        let o = reel(dir, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        let want = if name == "nowhere" {
            "no such run or checkpoint folder"
        } else {
            "no intact checkpoint found under empty_run"
        };
        assert!(err.contains(want), "{args:?}: `{want}` not in: {err}");
        assert_eq!(
            err.matches(name).count(),
            1,
            "{args:?} names it once: {err}"
        );
        assert!(!dir.join("x").exists(), "{args:?} wrote its output");
    }

    // A mistyped role, or an adapter export of a run without one: said before any weights
    // load, the roles named.
    for (args, want) in [
        (
            &["--role", "studnet", "--format", "lora"][..],
            "the config has no role `studnet` (roles: [\"student\"])",
        ),
        (
            &["--format", "comfyui"][..],
            "role `student` has no LoRA adapter",
        ),
    ] {
        let o = reel(
            dir,
            &[&["export", "clean/final", "--out", "x"][..], args].concat(),
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(want), "{args:?}: {err}");
        assert!(!dir.join("x").exists(), "{args:?} wrote its output");
    }

    // The run's `final/` folder exports with the run's config.
    let o = reel(dir, &["export", "clean/final", "--out", "from_final"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "export clean/final: {err}");
    assert!(dir
        .join("from_final/diffusion_pytorch_model.safetensors")
        .is_file());

    // A checkpoint folder named directly is verified like one found in a run: a weights file
    // with a changed byte (same size) is refused by every reading command.
    let weights = dir.join(&step5).join("student.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let mid = bytes.len() - 8;
    bytes[mid] ^= 0x40;
    std::fs::write(&weights, &bytes).unwrap();
    let sample = [
        &["sample", step5.as_str(), "--prompt", "a"][..],
        &["--out", "x"],
    ]
    .concat();
    let export = ["export", step5.as_str(), "--out", "x"];
    let eval = ["eval", step5.as_str(), "--clips", "1"];
    for args in [&sample[..], &export[..], &eval[..]] {
        let o = reel(dir, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} read a damaged checkpoint");
        assert!(
            err.contains("student.safetensors") && err.contains("checksum"),
            "{args:?}: {err}"
        );
        assert!(!dir.join("x").exists(), "{args:?} wrote its output");
    }

    // Named by its run, the damaged newest checkpoint is passed over with a warning for the
    // newest intact one, whatever fingerprint stamped it (here a forged one).
    let listed = reel_core::checkpoint::CheckpointStore::new(&dir.join("clean"), 1).list();
    let (older_step, older) = listed[1].clone();
    let manifest = older.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    m["config_fingerprint"] = "stamped-by-another-config".into();
    std::fs::write(&manifest, m.to_string()).unwrap();
    let o = reel(dir, &["export", "clean", "--out", "fallback"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("skipped, falling back"), "{err}");
    let o = reel(dir, &["export", older.to_str().unwrap(), "--out", "older"]);
    assert!(o.status.success(), "export step {older_step}");
    let file = "diffusion_pytorch_model.safetensors";
    assert_eq!(
        std::fs::read(dir.join("fallback").join(file)).unwrap(),
        std::fs::read(dir.join("older").join(file)).unwrap(),
        "the fallback exports step {older_step}"
    );
}

/// A kernel pinned by `REEL_MATMUL` is named in `reel train`'s first lines (a run config does
/// not record it); where it cannot run (the CPU backend) the run says so and trains on.
#[test]
fn train_names_the_kernels_chosen_by_the_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("run.toml"), TINY_WAN_RUN).unwrap();
    let args = [
        "train",
        "run.toml",
        "--output",
        "out",
        "--set",
        "training.max_steps=1",
    ];
    let out = Command::new(env!("CARGO_BIN_EXE_reel"))
        .current_dir(dir)
        .args(args)
        .env_remove("REEL_FAULT")
        .env("REEL_MATMUL", "double-mma")
        .output()
        .expect("reel runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("reel: kernels chosen by the environment: REEL_MATMUL=double-mma"),
        "{err}"
    );
    assert!(
        err.contains("matmul kernel double-mma") && err.contains("Burn's matmul runs"),
        "{err}"
    );
    // Without the variable, no such line.
    let out = reel(
        dir,
        &[
            "train",
            "run.toml",
            "--output",
            "out2",
            "--set",
            "training.max_steps=1",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("kernels chosen by the environment"), "{err}");
}

/// Settings that need the models' shapes are checked by `reel check` from the configs, as
/// `reel train` would report them when building: discriminator heads on a block the critic
/// does not have.
#[test]
fn check_reports_head_blocks_the_feature_network_lacks() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(
        dir.join("gan.toml"),
        distill_config(DMD2_GAN_METHOD, true, 2),
    )
    .unwrap();
    let out = reel(dir, &["check", "gan.toml"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = reel(
        dir,
        &[
            "check",
            "gan.toml",
            "--set",
            "method.gan_heads.blocks=[0, 9]",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "block 9 of a 2-block critic passed: {err}"
    );
    for want in [
        "gan.toml",
        "`method.gan_heads.blocks`",
        "block 9 does not exist",
        "2 blocks",
    ] {
        assert!(err.contains(want), "missing {want:?} in: {err}");
    }
    let out = reel(
        dir,
        &[
            "train",
            "gan.toml",
            "--set",
            "method.gan_heads.blocks=[0, 9]",
            "--output",
            "out",
        ],
    );
    assert!(!out.status.success());
    assert!(!dir.join("out/checkpoints").exists(), "no step was taken");
}

#[test]
fn an_output_that_cannot_be_written_is_an_error_line_not_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let full = std::fs::File::create("/dev/full");
    let Ok(full) = full else {
        eprintln!("skipped: no /dev/full here");
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_reel"))
        .current_dir(tmp.path())
        .arg("list")
        .stdout(full)
        .output()
        .expect("reel runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(
        err.trim(),
        "error: cannot write to stdout: No space left on device (os error 28)"
    );
}
