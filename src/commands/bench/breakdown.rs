//! `reel bench --breakdown`: real trainer steps split into phases (data, each role's forward
//! and backward, the host sync, clipping + optimizer, callbacks such as EMA, checkpointing).
//!
//! Without `--config`, each preset (× LoRA rank) becomes a run config in memory: the chosen
//! method (`finetune`, or `dmd2` with its student, critic and frozen teacher, the generator
//! updating every step), random weights of the preset's shapes, the `random` data source at
//! `--shape`, and an EMA of the trained roles. With `--config`, that run config is benched as
//! it stands (`--random-weights` drops every `weights` key). `--set` overrides keys of either.
//!
//! Each phase is timed with a device sync on both sides ([`reel_core::profile`]). The syncs
//! stall the launch queue, so the phases add up to the *profiled* step; the unprofiled step
//! (timed steps without phase syncs, one sync at the end of each) is printed beside it.

use std::path::Path;
use std::time::Instant;

use reel_core::backend::ReelBackend;
use reel_core::config::{parse_run_config, LoadedConfig};
use reel_core::data::DataSpec;
use reel_core::memory::allocator::pool_usage;
use reel_core::parallel::Seat;
use reel_core::profile;
use reel_core::trainer::{open_data, TrainOptions, Trainer};
use reel_core::with_backend;
use reel_models::wan::WanArch;
use reel_models::WanConfig;
use serde::Serialize;

use super::progress::Progress;
use super::{stats, BenchArgs, Stats};

/// One phase's time per step.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseRow {
    /// Phase name (see [`reel_core::profile`]).
    pub phase: String,
    /// Milliseconds per step over the timed steps.
    pub ms: Stats,
    /// Of those, the milliseconds until the phase's code returned, before its closing sync
    /// (close to `ms`: the GPU kept up with the host; well below: the GPU set the pace).
    pub host_ms: Stats,
    /// Share of the profiled step's mean (the phases' means add up to it).
    pub share: f64,
}

/// The breakdown of one benchmarked run.
#[derive(Debug, Clone, Serialize)]
pub struct Breakdown {
    /// What ran: `<preset> <method>` or the config path.
    pub label: String,
    /// Backend, with `+fusion` / `+autotune` when built with them.
    pub backend: String,
    /// Samples per optimizer step (micro-batch × accumulation).
    pub samples_per_step: usize,
    /// Video tokens per sample.
    pub tokens: usize,
    /// Phases in the order they first ran.
    pub phases: Vec<PhaseRow>,
    /// The step with a sync around every phase (the phases add up to it).
    pub profiled_step_ms: Stats,
    /// The step without phase syncs (one sync at its end).
    pub step_ms: Stats,
    /// The roles' memory floor per device, MiB ([`reel_core::memory::MemoryFloor`]): what
    /// the run holds at least, beside the peak a GPU session samples.
    pub floor_mib: f64,
    /// CubeCL's pools on the main device after the timed steps (`cuda`, `wgpu`; `null`
    /// elsewhere): MiB of live tensors then, and MiB the pools hold, which is the run's peak
    /// (the pools give nothing back). `REEL_GPU_MEMORY` chooses how they hand memory out.
    pub pools_mib: Option<PoolsMib>,
}

/// [`reel_core::memory::allocator::PoolUsage`] in MiB.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PoolsMib {
    /// MiB of live tensors after the timed steps.
    pub in_use: f64,
    /// MiB the pools hold from the device.
    pub reserved: f64,
}

/// Run the breakdown for every preset × LoRA rank (or the `--config`), print it.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let runs = match &args.config {
        Some(path) => vec![(path.display().to_string(), config_run(args, path)?)],
        None => preset_runs(args)?,
    };
    let mut out = vec![];
    for (label, loaded) in runs {
        let backend = loaded.config.runtime.backend;
        let row = with_backend!(backend, |B| bench_run::<B>(args, &label, &loaded))?;
        out.push(row);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for b in &out {
            print_table(b);
        }
    }
    Ok(())
}

/// The user's run config, with `--random-weights` and the bench's step count applied.
pub(super) fn config_run(args: &BenchArgs, path: &Path) -> anyhow::Result<LoadedConfig> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("{}: cannot read: {e}", path.display()))?;
    let mut root: toml::Table =
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if args.random_weights {
        drop_weight_files(&mut root);
    }
    if let Some(toml::Value::Table(training)) = root.get_mut("training") {
        training.remove("checkpoint_every");
    }
    let mut sets = args.set.clone();
    sets.push(format!("training.max_steps={}", total_steps(args) + 1));
    Ok(parse_run_config(&toml::to_string(&root)?, path, &sets)?)
}

/// The weight files a run config names: every role's `weights`, and the validation callbacks'
/// VAE and text encoder with the keys that need them (so a bench of a shipped config runs
/// where its checkpoint is not).
fn drop_weight_files(root: &mut toml::Table) {
    if let Some(toml::Value::Table(models)) = root.get_mut("models") {
        for role in models.iter_mut().filter_map(|(_, v)| v.as_table_mut()) {
            role.remove("weights");
        }
    }
    if let Some(toml::Value::Array(callbacks)) = root.get_mut("callbacks") {
        let validation =
            |t: &toml::Table| t.get("kind").and_then(|k| k.as_str()) == Some("validation");
        for cb in callbacks.iter_mut().filter_map(toml::Value::as_table_mut) {
            if validation(cb) {
                for key in [
                    "vae",
                    "vae_tile",
                    "text_encoder",
                    "tokenizer",
                    "prompts",
                    "negative_prompt",
                ] {
                    cb.remove(key);
                }
            }
        }
    }
}

/// Every step the bench runs: the warm-up, then with `--breakdown` the profiled steps and as
/// many unprofiled ones, with `--devices` just the `--steps` timed ones (it ran twice as many).
pub(super) fn total_steps(args: &BenchArgs) -> usize {
    let timed = if args.breakdown { 2 } else { 1 } * args.steps;
    args.warmup + timed
}

/// One generated run config per preset × LoRA rank.
pub(super) fn preset_runs(args: &BenchArgs) -> anyhow::Result<Vec<(String, LoadedConfig)>> {
    let mut runs = vec![];
    for preset in &args.presets {
        let cfg = WanConfig::preset(preset).ok_or_else(|| {
            anyhow::anyhow!(
                "unknown preset `{preset}`, expected one of {:?}",
                WanConfig::preset_names()
            )
        })?;
        for &rank in &args.lora_ranks {
            let text = preset_toml(args, preset, &cfg, rank);
            let mut label = format!("{preset} {}", args.method);
            if rank > 0 {
                label.push_str(&format!(" lora{rank}"));
            }
            let loaded = parse_run_config(&text, Path::new("<bench>"), &args.set)?;
            runs.push((label, loaded));
        }
    }
    Ok(runs)
}

/// The run config of one preset row (see the module docs).
fn preset_toml(args: &BenchArgs, preset: &str, cfg: &WanConfig, rank: usize) -> String {
    let [f, h, w] = [args.shape[0], args.shape[1], args.shape[2]];
    let dtype = serde_json::to_value(args.dtype).expect("dtype serializes");
    let attention = serde_json::to_value(args.attention).expect("attention serializes");
    let role = |name: &str, trainable: bool| {
        let mut t = format!(
            "[models.{name}]\narch = \"wan\"\npreset = \"{preset}\"\nattention = {attention}\n\
             trainable = {trainable}\n"
        );
        if trainable {
            t.push_str(&format!(
                "gradient_checkpointing = {}\n",
                args.gradient_checkpointing
            ));
        }
        if trainable && rank > 0 {
            let targets: Vec<String> = args.lora_targets.iter().map(|m| format!("{m:?}")).collect();
            t.push_str(&format!(
                "adapter = {{ kind = \"lora\", rank = {rank}, alpha = {rank}.0, target_modules = [{}] }}\n",
                targets.join(", ")
            ));
        }
        t
    };
    let mut text = format!(
        "[runtime]\nbackend = \"{}\"\ndtype = {dtype}\nseed = 0\n\n",
        args.backend.as_str()
    );
    let trained = match args.method.as_str() {
        "dmd2" => {
            for (name, trainable) in [("student", true), ("critic", true), ("teacher", false)] {
                text.push_str(&role(name, trainable));
            }
            text.push_str("[method]\nkind = \"dmd2\"\ngenerator_update_interval = 1\n");
            "\"student\", \"critic\""
        }
        _ => {
            text.push_str(&role("student", true));
            text.push_str("[method]\nkind = \"finetune\"\n");
            "\"student\""
        }
    };
    text.push_str(&format!(
        "[data]\nkind = \"random\"\nbatch_size = {b}\nnum_samples = {n}\nchannels = {c}\n\
         frames = {f}\nheight = {h}\nwidth = {w}\ntext_len = {l}\ntext_dim = {d}\n\n\
         [training]\nmax_steps = {max}\nmax_grad_norm = 1.0\n\n\
         [[callbacks]]\nkind = \"ema\"\ndecay = 0.99\nroles = [{trained}]\n",
        b = args.batch,
        n = args.batch * total_steps(args),
        c = cfg.in_channels,
        l = args.text_len,
        d = cfg.text_dim,
        max = total_steps(args) + 1,
    ));
    text
}

/// Build the trainer, warm up, run the profiled then the unprofiled steps.
fn bench_run<B: ReelBackend>(
    args: &BenchArgs,
    label: &str,
    loaded: &LoadedConfig,
) -> anyhow::Result<Breakdown> {
    let dir = tempfile::tempdir()?;
    let opts = TrainOptions {
        output_dir: Some(dir.path().to_path_buf()),
        ..Default::default()
    };
    let source = open_data(loaded)?;
    let main = loaded.config.runtime.main_device();
    // Before the trainer makes the device: a missing GPU is an error, not a backend panic.
    let device = crate::commands::device::<B>(main, crate::commands::inference::RUN_DEVICE)?;
    let mut trainer = Trainer::<B>::in_seat(loaded, &opts, Seat::single(main), source.clone())?;
    let mut progress = Progress::new(label, total_steps(args));
    // One trainer step, synced, and its line on stderr; its time in ms.
    let mut step = |trainer: &mut Trainer<B>, kind: &str| -> anyhow::Result<f64> {
        let t0 = Instant::now();
        trainer.train_step()?;
        let _ = B::sync(&device);
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        progress.step(kind, ms);
        Ok(ms)
    };
    for _ in 0..args.warmup {
        step(&mut trainer, "warm-up")?;
    }
    profile::start();
    for _ in 0..args.steps {
        step(&mut trainer, "profiled")?;
        profile::end_step();
    }
    let steps = profile::finish();
    let mut plain = vec![];
    for _ in 0..args.steps {
        plain.push(step(&mut trainer, "timed")?);
    }
    let spec = trainer_spec(loaded, &source.spec());
    let mut b = summarize(label, loaded, spec, &steps, plain);
    b.pools_mib = pool_usage::<B>(&device).map(|u| PoolsMib {
        in_use: mib(u.in_use.into()),
        reserved: mib(u.reserved.into()),
    });
    Ok(b)
}

/// Samples per step, tokens per sample (of the run's data `s` and first Wan-like role) and
/// the memory floor in MiB.
fn trainer_spec(loaded: &LoadedConfig, s: &DataSpec) -> (usize, usize, f64) {
    let cfg = &loaded.config;
    let floor = mib(loaded.memory_floor(s).total());
    let patch = cfg
        .models
        .values()
        .filter_map(|r| r.model.as_any().downcast_ref::<WanArch>())
        .find_map(|a| a.wan_config(|p| loaded.resolve(p)).ok())
        .map_or([1, 1, 1], |c| c.patch_size);
    let tokens = (s.frames / patch[0]) * (s.height / patch[1]) * (s.width / patch[2]);
    (
        cfg.data.batch_size() * cfg.training.grad_accumulation,
        tokens,
        floor,
    )
}

/// `bytes` in MiB.
fn mib(bytes: u128) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

fn summarize(
    label: &str,
    loaded: &LoadedConfig,
    (samples_per_step, tokens, floor_mib): (usize, usize, f64),
    steps: &[profile::StepPhases],
    plain: Vec<f64>,
) -> Breakdown {
    let mut names: Vec<String> = vec![];
    for step in steps {
        for p in step {
            if !names.contains(&p.name) {
                names.push(p.name.clone());
            }
        }
    }
    let totals: Vec<f64> = steps.iter().map(|s| s.iter().map(|p| p.ms).sum()).collect();
    let profiled = stats(totals);
    // The phase's time per step by `field` (0 in a step where it did not run).
    let per_step = |name: &str, field: fn(&profile::PhaseTime) -> f64| {
        let times = steps
            .iter()
            .map(|s| s.iter().find(|p| p.name == name).map_or(0.0, field))
            .collect();
        stats(times)
    };
    let phases = names
        .into_iter()
        .map(|name| {
            let ms = per_step(&name, |p| p.ms);
            PhaseRow {
                share: ms.mean / profiled.mean.max(1e-9),
                host_ms: per_step(&name, |p| p.host_ms),
                phase: name,
                ms,
            }
        })
        .collect();
    Breakdown {
        label: label.to_string(),
        backend: super::backend_label(loaded.config.runtime.backend),
        samples_per_step,
        tokens,
        phases,
        profiled_step_ms: profiled,
        step_ms: stats(plain),
        floor_mib,
        pools_mib: None,
    }
}

fn print_table(b: &Breakdown) {
    println!(
        "{} on {}: {} sample(s) x {} tokens per step, memory floor {:.0} MiB",
        b.label, b.backend, b.samples_per_step, b.tokens, b.floor_mib
    );
    println!(
        "  {:<44} {:>10} {:>10} {:>10} {:>10} {:>7} {:>12}",
        "phase", "mean ms", "median ms", "min ms", "max ms", "share", "host med ms"
    );
    let row = |name: &str, ms: &Stats| {
        format!(
            "  {:<44} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
            name, ms.mean, ms.median, ms.min, ms.max
        )
    };
    for p in &b.phases {
        println!(
            "{} {:>6.1}% {:>12.1}",
            row(&p.phase, &p.ms),
            100.0 * p.share,
            p.host_ms.median
        );
    }
    println!(
        "{}",
        row("step, profiled (sum of the phases)", &b.profiled_step_ms)
    );
    println!("{}", row("step, unprofiled", &b.step_ms));
    if let Some(p) = b.pools_mib {
        println!(
            "  device memory (CubeCL's pools, after the timed steps): {:.0} MiB in use, {:.0} \
             MiB reserved",
            p.in_use, p.reserved
        );
    }
}
