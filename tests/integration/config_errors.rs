//! `reel check`-level validation: every shipped config is accepted, and a catalogue of bad
//! configs is rejected with a one-line error naming the key (and the file), never a panic.

use std::path::Path;

use reel_core::config::{load_run_config, parse_run_config};

use reel_methods as _;
use reel_plugins as _;

const BASE: &str = include_str!("../../configs/quickstart.toml");

enum Edit {
    /// `--set` overrides.
    Set(&'static [&'static str]),
    /// Replace text in the base config.
    Replace(&'static str, &'static str),
    /// Append text to the base config.
    Append(&'static str),
}

/// (what, edit, substrings the error must contain).
fn catalogue() -> Vec<(&'static str, Edit, &'static [&'static str])> {
    use Edit::*;
    vec![
        (
            "unknown method kind",
            Set(&["method.kind=nope"]),
            &["method", "nope", "finetune"],
        ),
        (
            "unknown data kind",
            Set(&["data.kind=nope"]),
            &["data", "nope", "synthetic"],
        ),
        (
            "unknown callback kind",
            Append("[[callbacks]]\nkind = \"nope\"\n"),
            &["callbacks", "nope"],
        ),
        (
            "unknown adapter kind",
            Append("[models.student.adapter]\nkind = \"nope\"\n"),
            &["models.student.adapter", "nope"],
        ),
        (
            "a callback table without its kind",
            Append("[[callbacks]]\nevery_steps = 3\n"),
            &[
                "callbacks[",
                "missing field `kind`: one of",
                "`ema`",
                "`validation`",
            ],
        ),
        (
            "no [data] table",
            Replace(
                "[data]\nkind = \"synthetic\"\nbatch_size = 8\nnum_samples = 1024\nframes = 4\n\
                 height = 12\nwidth = 12\nobject_size = 6\n",
                "",
            ),
            &["bad.toml: `data`: missing field `data`"],
        ),
        (
            "an adapter table without its kind",
            Set(&["models.student.adapter={rank=4}"]),
            &[
                "models.student.adapter",
                "missing field `kind`: one of",
                "`lora`",
            ],
        ),
        (
            "a timestep density without its kind",
            Set(&["method.sigma_density={}"]),
            &[
                "method.sigma_density",
                "one of",
                "`uniform`",
                "`logit_normal`",
            ],
        ),
        (
            "a frame rate no video has",
            Set(&["callbacks[2].fps=1e9"]),
            &["callbacks[2].fps", "[0, 1000]"],
        ),
        (
            "two logging callbacks (the second would replace the first's metrics.jsonl)",
            Append("[[callbacks]]\nkind = \"logging\"\nevery_steps = 5\n"),
            &["callbacks[3]", "metrics.jsonl", "callbacks[1]"],
        ),
        (
            "a VAE tile size without a VAE",
            Set(&["callbacks[2].vae_tile=256"]),
            &["callbacks[2].vae_tile", "`vae`"],
        ),
        (
            "unknown architecture",
            Set(&["models.student.arch=resnet"]),
            &["models.student.arch", "resnet", "wan"],
        ),
        (
            "unknown preset",
            Set(&["models.student.preset=wan-huge"]),
            &["models.student.preset", "wan-huge", "wan-tiny"],
        ),
        (
            "unknown backend",
            Set(&["runtime.backend=tpu"]),
            &["runtime.backend", "tpu", "cpu"],
        ),
        (
            "backend not compiled",
            Set(&["runtime.backend=cuda"]),
            &["runtime.backend", "--features cuda"],
        ),
        (
            "bf16 on a backend without bfloat16 kernels",
            Set(&["runtime.dtype=bf16"]),
            &["runtime.dtype", "cuda", "flex"],
        ),
        (
            "unknown attention implementation",
            Set(&["models.student.attention=flash3"]),
            &["models.student.attention", "flash3", "memory_efficient"],
        ),
        (
            "negative learning rate in a role's optimizer table",
            Set(&["models.student.optimizer.lr=-1.0"]),
            &["models.student.optimizer.lr", "positive"],
        ),
        (
            "beta of 1 in a role's optimizer table",
            Set(&["models.student.optimizer.betas=[0.9, 1.0]"]),
            &["models.student.optimizer.betas[1]"],
        ),
        (
            "unknown key in a role table",
            Set(&["models.student.bogus=1"]),
            &["`models.student.bogus`", "unknown field"],
        ),
        (
            "a mistyped key every role takes: listed with the architecture's",
            Replace("trainable = true", "trainabel = true"),
            &[
                "`models.student.trainabel`",
                "`trainable`",
                "`gradient_checkpointing`",
                "`preset`",
                "`arch`",
            ],
        ),
        (
            "bad value in a callback, set with the key form errors use",
            Set(&["callbacks[2].num_prompts=-1"]),
            &["`callbacks[2].num_prompts`", "-1"],
        ),
        (
            "bad value inside a plugin table nested in a plugin table",
            Set(&["method.sigma_density.logit_std=x"]),
            &["`method.sigma_density.logit_std`", "expected f64"],
        ),
        (
            "an EMA of a role that is not there",
            Set(&["callbacks[0].roles=[\"teacher\"]"]),
            &[
                "callbacks[0]",
                "`teacher`",
                "not a trainable role",
                "[\"student\"]",
            ],
        ),
        (
            "two EMAs of one role",
            Append("[[callbacks]]\nkind = \"ema\"\ndecay = 0.9\n"),
            &["callbacks[3]", "already averaged by callbacks[0]"],
        ),
        (
            "unknown dtype",
            Set(&["runtime.dtype=f8"]),
            &["runtime.dtype", "f8"],
        ),
        (
            "unknown top-level table",
            Append("[extra]\nx = 1\n"),
            &["extra"],
        ),
        (
            "unknown key in runtime",
            Set(&["runtime.sede=3"]),
            &["runtime", "sede"],
        ),
        (
            "unknown key in method",
            Set(&["method.learning_rate=3"]),
            &["method", "learning_rate"],
        ),
        (
            "unknown key in data",
            Set(&["data.colour=3"]),
            &["data", "colour"],
        ),
        (
            "unknown key in optimizer",
            Set(&["optimizer.momentum=0.9"]),
            &["optimizer", "momentum"],
        ),
        (
            "unknown key in training",
            Set(&["training.epochs=3"]),
            &["training", "epochs"],
        ),
        (
            "unknown key in a role",
            Set(&["models.student.frozen=true"]),
            &["models.student", "frozen"],
        ),
        (
            "wrong type: max_steps string",
            Set(&["training.max_steps=\"ten\""]),
            &["training.max_steps"],
        ),
        (
            "wrong type: lr string",
            Set(&["optimizer.lr=\"fast\""]),
            &["optimizer.lr"],
        ),
        (
            "wrong type: betas scalar",
            Set(&["optimizer.betas=0.9"]),
            &["optimizer.betas"],
        ),
        (
            "wrong type: trainable string",
            Set(&["models.student.trainable=\"yes\""]),
            &["models.student.trainable"],
        ),
        (
            "wrong type: batch_size float",
            Set(&["data.batch_size=2.5"]),
            &["data.batch_size"],
        ),
        (
            "wrong type: seed negative",
            Set(&["runtime.seed=-1"]),
            &["runtime.seed"],
        ),
        (
            "empty output folder",
            Replace("output_dir = \"runs/quickstart\"", "output_dir = \"\""),
            &["runtime.output_dir", "empty"],
        ),
        (
            "out of range: max_steps 0",
            Set(&["training.max_steps=0"]),
            &["training.max_steps", ">= 1"],
        ),
        (
            "out of range: lr negative",
            Set(&["optimizer.lr=-1e-4"]),
            &["optimizer.lr", "positive"],
        ),
        (
            "out of range: lr zero",
            Set(&["optimizer.lr=0.0"]),
            &["optimizer.lr"],
        ),
        (
            "out of range: beta1 = 1",
            Set(&["optimizer.betas=[1.0, 0.999]"]),
            &["optimizer.betas[0]"],
        ),
        (
            "out of range: beta2 negative",
            Set(&["optimizer.betas=[0.9, -0.1]"]),
            &["optimizer.betas[1]"],
        ),
        (
            "out of range: eps 0",
            Set(&["optimizer.eps=0.0"]),
            &["optimizer.eps"],
        ),
        (
            "out of range: weight decay 2",
            Set(&["optimizer.weight_decay=2.0"]),
            &["optimizer.weight_decay"],
        ),
        (
            "out of range: min_lr_ratio",
            Set(&["optimizer.min_lr_ratio=1.5"]),
            &["optimizer.min_lr_ratio"],
        ),
        (
            "unknown schedule",
            Set(&["optimizer.schedule=step"]),
            &["optimizer.schedule", "cosine"],
        ),
        (
            "out of range: grad accumulation 0",
            Set(&["training.grad_accumulation=0"]),
            &["training.grad_accumulation"],
        ),
        (
            "out of range: max_grad_norm 0",
            Set(&["training.max_grad_norm=0.0"]),
            &["training.max_grad_norm"],
        ),
        (
            "out of range: checkpoint_every 0",
            Set(&["training.checkpoint_every=0"]),
            &["training.checkpoint_every"],
        ),
        (
            "out of range: keep_last 0",
            Set(&["training.keep_last=0"]),
            &["training.keep_last"],
        ),
        (
            "unknown non-finite policy",
            Set(&["training.non_finite=ignore"]),
            &["training.non_finite", "skip"],
        ),
        (
            "out of range: shift 0",
            Set(&["method.shift=0.0"]),
            &["method.shift"],
        ),
        (
            "out of range: cfg_dropout 1",
            Set(&["method.cfg_dropout=1.0"]),
            &["method.cfg_dropout"],
        ),
        (
            "out of range: sample_steps 0",
            Set(&["method.sample_steps=0"]),
            &["method.sample_steps"],
        ),
        (
            "unknown sigma density",
            Set(&["method.sigma_density.kind=gamma"]),
            &["method.sigma_density", "gamma"],
        ),
        (
            "out of range: logit_std",
            Set(&["method.sigma_density.logit_std=-1.0"]),
            &["method.sigma_density.logit_std"],
        ),
        (
            "out of range: data batch_size 0",
            Set(&["data.batch_size=0"]),
            &["data.batch_size"],
        ),
        (
            "out of range: data height",
            Set(&["data.height=4"]),
            &["data.height"],
        ),
        (
            "missing role",
            Replace("[models.student]", "[models.teacher]"),
            &["models.student", "missing role"],
        ),
        (
            "unexpected role",
            Append("[models.critic]\narch = \"wan\"\npreset = \"wan-tiny\"\n"),
            &["models.critic", "unexpected role"],
        ),
        (
            "frozen role where training needs it",
            Set(&["models.student.trainable=false"]),
            &["models.student.trainable"],
        ),
        (
            "preset and config both",
            Set(&["models.student.config=x.json"]),
            &["models.student.config", "not both"],
        ),
        (
            "optimizer on a frozen role",
            Replace(
                "trainable = true",
                "trainable = true\n[models.student.optimizer]\nmomentum = 1",
            ),
            &["models.student.optimizer", "momentum"],
        ),
        (
            "missing method table",
            Replace(
                "[method]\nkind = \"finetune\"",
                "[methodx]\nkind = \"finetune\"",
            ),
            &["method"],
        ),
        (
            "missing training.max_steps",
            Replace("max_steps = 2400", ""),
            &["training", "max_steps"],
        ),
        (
            "invalid TOML",
            Append("this is not toml\n"),
            &["invalid TOML"],
        ),
        (
            "bad --set syntax",
            Set(&["training.max_steps"]),
            &["--set", "key.path=value"],
        ),
    ]
}

#[test]
fn every_shipped_config_is_accepted() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            // GPU recipes name the cuda backend, which the default build does not compile in;
            // Flex (always built) also has their bf16 compute.
            let text = std::fs::read_to_string(&p).unwrap();
            let set: Vec<String> = if text.contains("backend = \"cuda\"") && !cfg!(feature = "cuda")
            {
                vec!["runtime.backend=flex".into()]
            } else {
                vec![]
            };
            load_run_config(&p, &set)
                .unwrap_or_else(|e| panic!("{} should be valid: {e}", p.display()));
            if text.contains("backend = \"cuda\"") {
                gpu_roles_run_flash_attention(&p, &text);
            }
            n += 1;
        }
    }
    assert!(n >= 1, "no configs found in {}", dir.display());
}

/// bf16 on `wgpu` is refused by key whether or not this build has `wgpu`: its WGSL kernels
/// have no bfloat16 (the check `reel check` makes of a config for another build).
#[test]
fn bf16_on_wgpu_is_refused_by_key() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("q.toml");
    std::fs::write(&path, BASE).unwrap();
    let sets = ["runtime.backend=\"wgpu\"", "runtime.dtype=\"bf16\""].map(String::from);
    let err = reel_core::config::load_run_config_any_backend(&path, &sets).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("runtime.dtype") && msg.contains("WGSL"),
        "{msg}"
    );
}

/// A shipped GPU recipe runs every Wan role's attention on tensor cores (`flash`, the
/// measured fastest on `cuda`), not the default `auto`'s blocked kernel of tensor operations.
fn gpu_roles_run_flash_attention(path: &Path, text: &str) {
    let doc: toml::Value = toml::from_str(text).unwrap();
    let roles = doc["models"].as_table().unwrap();
    for (name, role) in roles {
        if role.get("arch").and_then(|a| a.as_str()) == Some("wan") {
            let attention = role.get("attention").and_then(|a| a.as_str());
            assert_eq!(
                attention,
                Some("flash"),
                "{}: models.{name}.attention",
                path.display()
            );
        }
    }
}

#[test]
fn bad_configs_fail_with_a_one_line_error_naming_the_key() {
    let cases = catalogue();
    assert!(cases.len() >= 40, "the catalogue has {} cases", cases.len());
    let mut seen = std::collections::BTreeSet::new();
    for (what, edit, expect) in cases {
        let (text, sets) = match edit {
            Edit::Set(s) => (
                BASE.to_string(),
                s.iter().map(|x| x.to_string()).collect::<Vec<_>>(),
            ),
            Edit::Replace(a, b) => {
                assert!(BASE.contains(a), "{what}: base config lacks `{a}`");
                (BASE.replacen(a, b, 1), vec![])
            }
            Edit::Append(a) => (format!("{BASE}\n{a}"), vec![]),
        };
        let err = match parse_run_config(&text, Path::new("bad.toml"), &sets) {
            Ok(_) => panic!("{what}: the config was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(!err.contains('\n'), "{what}: error is not one line: {err}");
        assert!(
            err.starts_with("bad.toml: "),
            "{what}: error does not name the file: {err}"
        );
        for s in expect {
            assert!(err.contains(s), "{what}: error lacks `{s}`: {err}");
        }
        assert!(
            seen.insert(err.clone()),
            "{what}: same error as another case: {err}"
        );
    }
}

/// Block-level activation checkpointing: accepted by every built-in method on a trainable
/// role; a clear error naming the key for a method that cannot (a third-party method that
/// does not opt in) and on a frozen role.
#[test]
fn gradient_checkpointing_is_checked_per_method_and_role() {
    let on = vec!["models.student.gradient_checkpointing=true".to_string()];
    let cfg = parse_run_config(BASE, Path::new("quickstart.toml"), &on)
        .expect("finetune accepts gradient_checkpointing");
    assert!(cfg.config.models["student"].gradient_checkpointing);

    let dmd2 = include_str!("../../configs/dmd2_quickstart.toml");
    let mut both = on.clone();
    both.push("models.critic.gradient_checkpointing=true".into());
    parse_run_config(dmd2, Path::new("dmd2.toml"), &both).expect("dmd2 checkpoints");

    // `fixed_sigma` (examples/custom-method) does not opt in.
    let custom = BASE.replace("kind = \"finetune\"", "kind = \"fixed_sigma\"\nsigma = 0.5");
    let custom: String = custom
        .lines()
        .filter(|l| {
            ![
                "shift",
                "sigma_density",
                "cfg_dropout",
                "sample_steps",
                "guidance_scale",
            ]
            .iter()
            .any(|k| l.starts_with(k))
        })
        .collect::<Vec<_>>()
        .join("\n");
    let err = parse_run_config(&custom, Path::new("custom.toml"), &on)
        .expect_err("fixed_sigma does not checkpoint")
        .to_string();
    for want in [
        "custom.toml",
        "models.student.gradient_checkpointing",
        "finetune",
    ] {
        assert!(err.contains(want), "missing {want:?} in: {err}");
    }

    let frozen = vec!["models.teacher.gradient_checkpointing=true".to_string()];
    let err = parse_run_config(dmd2, Path::new("dmd2.toml"), &frozen)
        .expect_err("a frozen role has no backward")
        .to_string();
    assert!(
        err.contains("models.teacher.gradient_checkpointing"),
        "names the key: {err}"
    );
}

/// Adversarial options in the shipped configs: bad values name the key under `method`.
#[test]
fn distillation_options_name_their_keys() {
    let adv = include_str!("../../configs/adversarial_quickstart.toml");
    let gan = include_str!("../../configs/dmd2_gan_quickstart.toml");
    let cons = include_str!("../../configs/consistency_quickstart.toml");
    for (text, file, set, wants) in [
        (
            adv,
            "adv.toml",
            "method.gan_loss=wasserstein",
            &["method.gan_loss", "wasserstein", "hinge", "non_saturating"][..],
        ),
        (
            adv,
            "adv.toml",
            "method.heads.hidden=0",
            &["method.heads.hidden"][..],
        ),
        (
            gan,
            "gan.toml",
            "method.denoising_steps=[1000,500]",
            &[
                "callbacks[1].sampling_steps",
                "`method.denoising_steps` (2)",
                "got 4",
            ][..],
        ),
        (
            cons,
            "cons.toml",
            "callbacks[1].sampling_steps=100",
            &[
                "callbacks[1].sampling_steps",
                "`method.num_euler_timesteps`",
            ][..],
        ),
        (
            adv,
            "adv.toml",
            "method.heads.hidden=100000000",
            &["method.heads.hidden", "from 1 to 65536"][..],
        ),
        (
            adv,
            "adv.toml",
            "method.discriminator_interval=0",
            &["method.discriminator_interval"][..],
        ),
        (
            adv,
            "adv.toml",
            "method.r1_weight=-1.0",
            &["method.r1_weight"][..],
        ),
        (
            gan,
            "gan.toml",
            "method.gan_discriminator_weight=0.0",
            &["method.gan_discriminator_weight", "gan_generator_weight"][..],
        ),
        (
            gan,
            "gan.toml",
            "method.gan_heads.hidden=0",
            &["method.gan_heads.hidden"][..],
        ),
        (
            adv,
            "adv.toml",
            "method.heads.stride=0",
            &["method.heads.stride", "at least 1"][..],
        ),
        (
            gan,
            "gan.toml",
            "method.gan_heads.blocks=[]",
            &["method.gan_heads.blocks", "empty list"][..],
        ),
        (
            cons,
            "cons.toml",
            "method.multi_phased_distill_schedule=400-4,200-8",
            &[
                "method.multi_phased_distill_schedule",
                "steps must increase, 200 follows 400",
            ][..],
        ),
        (
            cons,
            "cons.toml",
            "method.num_euler_timesteps=6",
            &[
                "method.multi_phased_distill_schedule",
                "exceeds num_euler_timesteps = 6",
            ][..],
        ),
        (
            cons,
            "cons.toml",
            "method.target=teacher",
            &["method.target", "ema", "student"][..],
        ),
        (
            cons,
            "cons.toml",
            "method.loss=l1",
            &["method.loss", "huber", "l2"][..],
        ),
        (
            cons,
            "cons.toml",
            "method.ema_decay=1.0",
            &["method.ema_decay", "[0, 1)"][..],
        ),
        // Values whose float32 form breaks the loss.
        (
            cons,
            "cons.toml",
            "method.huber_c=1e20",
            &["method.huber_c", "[0.000000000001, 1000]"][..],
        ),
        (
            adv,
            "adv.toml",
            "method.r1_epsilon=1e-24",
            &["method.r1_epsilon", "[0.0001, 10]"][..],
        ),
        (
            gan,
            "gan.toml",
            "method.max_timestep_ratio=0.0",
            &["method.max_timestep_ratio", "must be above 0"][..],
        ),
        (
            adv,
            "adv.toml",
            "method.sigma_density={kind=\"mode\",mode_scale=1.8}",
            &["method.sigma_density.mode_scale", "no longer monotone"][..],
        ),
    ] {
        let err = parse_run_config(text, Path::new(file), &[set.to_string()])
            .expect_err(set)
            .to_string();
        for want in std::iter::once(&file).chain(wants) {
            assert!(err.contains(want), "{set}: missing {want:?} in: {err}");
        }
    }
}
