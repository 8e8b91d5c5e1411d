//! `reel bench`: time the Wan forward pass and the full training step (forward, backward,
//! AdamW) on a backend, after warm-up, and print a table (or JSON).
//!
//! FLOP count (multiply-add = 2 FLOP), per forward pass, with `N` video tokens, `L` text
//! tokens, width `d`, FFN width `f`, `n` blocks and batch `B`:
//! `B·n·[N·(12d² + 4df + 4Nd + 4Ld) + L·4d²]`; a training step counts 3× the forward.
//!
//! `--breakdown` runs real trainer steps instead and splits them into phases
//! (`breakdown.rs`); it benches `--method finetune` or `dmd2`, or any run config (`--config`).
//!
//! `--devices N` trains the same run on 1 and on N data-parallel workers and reports the
//! scaling efficiency (`scaling.rs`).
//!
//! `--vae` / `--text-encoder` time the Wan VAE's decode and encode and UMT5's encoding
//! instead (`encoders.rs`); `--attention-only` the blocks' self-attention alone, every
//! attention kernel side by side (`attention.rs`); `--matmul-only` the blocks' matrix products
//! alone, on Burn's matmul and every cubek kernel `REEL_MATMUL` can pin (`matmul.rs`).
//!
//! `--lora-rank r` rows train a LoRA adapter instead of every weight: the table shows the
//! trainable parameters and their gradient + AdamW state (exact), beside the times. Peak RSS
//! is the process's high-water mark, so compare it between separate runs.

mod attention;
mod breakdown;
mod encoders;
mod limits;
mod matmul;
mod matmul_summary;
mod progress;
mod scaling;

use std::path::PathBuf;

use anyhow::Context;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
use reel_core::backend::{BackendName, ReelBackend};
use reel_core::config::Precision;
use reel_core::flow::{add_noise, timesteps_from_sigmas};
use reel_core::optim::OptimizerConfig;
use reel_core::rng::StreamRng;
use reel_core::role::{RoleHandle, RoleModule, TrainableRole};
use reel_core::with_backend;
use reel_methods::{flow_matching_loss, loss_of_prediction};
use reel_models::lora::{apply_lora, LoraSpec};
use reel_models::{AttentionMode, WanConfig};
use serde::Serialize;

use progress::time;

/// What to benchmark.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Wan preset(s) (an unknown name lists them; docs/config.md); repeat for several.
    #[arg(long = "preset", default_values_t = vec!["wan-quickstart".to_string()])]
    pub presets: Vec<String>,
    /// Latent frames / height / width (token count = F/pt · H/ph · W/pw).
    #[arg(long, num_args = 3, value_names = ["F", "H", "W"], default_values_t = vec![8, 16, 16])]
    pub shape: Vec<usize>,
    /// Batch size.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Text tokens.
    #[arg(long, default_value_t = 8)]
    pub text_len: usize,
    /// Timed repetitions.
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    /// Untimed warm-up repetitions. With `--breakdown` and an EMA, keep two or more: an EMA's
    /// first update only copies the weights, so its kernel first compiles in the second step.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Backend: `cpu` (ndarray, the default), `flex`, `cuda` (build with `--features cuda`),
    /// `wgpu` (Vulkan/Metal/DX12 GPUs, or Mesa's software Vulkan; build with `--features wgpu`).
    #[arg(long, default_value = "cpu")]
    pub backend: BackendName,
    /// LoRA rank(s) to benchmark; 0 = full fine-tuning (every weight trainable). Repeat for
    /// side-by-side rows, e.g. `--lora-rank 0 --lora-rank 16`.
    #[arg(long = "lora-rank", default_values_t = vec![0usize])]
    pub lora_ranks: Vec<usize>,
    /// Modules the LoRA rows adapt (comma-separated PEFT-style names).
    #[arg(
        long,
        default_value = "to_q,to_k,to_v,to_out.0,ffn.net.0.proj,ffn.net.2",
        value_delimiter = ','
    )]
    pub lora_targets: Vec<String>,
    /// Attention implementation: `auto` (memory-efficient from 1024 tokens), `naive`,
    /// `memory_efficient`, `fused` (CubeCL kernels on `cuda` / `wgpu`) or `flash` (`fused`,
    /// with the tensor-core flash kernel for forwards without gradients).
    #[arg(long, default_value = "auto", value_parser = parse_attention)]
    pub attention: AttentionMode,
    /// Compute precision: `f32`, or `bf16` (bfloat16 matrix products and activations with
    /// float32 master weights, as `runtime.dtype = "bf16"`; needs `--backend cuda` or `flex`).
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    pub dtype: Precision,
    /// Train with block-level activation checkpointing (each block recomputed in the
    /// backward pass), as `models.<role>.gradient_checkpointing = true` does.
    #[arg(long)]
    pub gradient_checkpointing: bool,
    /// Split real trainer steps into phases (data, each role's forward and backward, host
    /// sync, clip + optimizer, callbacks, checkpoint), a device sync around each.
    #[arg(long)]
    pub breakdown: bool,
    /// Data-parallel scaling: train the generated run (or `--config`) for real on 1 worker and
    /// on N workers (`runtime.num_devices`), each worker with `--batch` samples (or the
    /// config's batch), and print step time, throughput and scaling efficiency.
    #[arg(long, value_name = "N", conflicts_with = "breakdown")]
    pub devices: Option<usize>,
    /// With `--breakdown`: the method of the generated run, `finetune` or `dmd2` (student,
    /// critic and frozen teacher from the preset; the generator updates every step).
    #[arg(long, default_value = "finetune", value_parser = ["finetune", "dmd2"])]
    pub method: String,
    /// With `--breakdown`: bench this run config instead of a preset (its backend, shapes and
    /// data; `--backend`, `--shape`, `--method` and friends do not apply).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// With `--breakdown` or `--devices`: override a key of the run config (`--config`, or the
    /// one generated from the preset), as `reel train --set` does (repeatable), e.g.
    /// `optimizer.fused=false`.
    #[arg(long, value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// With `--config`: drop every role's `weights` (random weights of the same shapes) and the
    /// validation callbacks' VAE and text encoder (they sample latents of the data's prompts).
    #[arg(long, requires = "config")]
    pub random_weights: bool,
    /// Time the Wan VAE's decode and encode of a `--video` instead of the DiT: a diffusers
    /// `vae/` folder, a `config.json` (random weights), or `wan2.1` (random Wan2.1 VAE).
    #[arg(long, value_name = "DIR|config.json|wan2.1")]
    pub vae: Option<String>,
    /// With `--vae`: the video's frames, height and width in pixels.
    #[arg(long, num_args = 3, value_names = ["F", "H", "W"], default_values_t = vec![81, 480, 832], requires = "vae")]
    pub video: Vec<usize>,
    /// With `--vae`: decode and encode in overlapping square tiles of this many pixels.
    #[arg(long, requires = "vae")]
    pub vae_tile: Option<usize>,
    /// With `--vae`: the passes to time: `both` (the decode, then the encode of the decoded
    /// video), `decode`, or `encode` (of a random video).
    #[arg(long, value_enum, default_value = "both", requires = "vae")]
    pub vae_op: encoders::VaeOp,
    /// Time UMT5's encoding of `--batch` prompts of `--text-len` tokens instead of the DiT: a
    /// `text_encoder/` folder, a `config.json` (random weights), or `umt5-xxl` (random weights
    /// of Wan's text encoder).
    #[arg(long, value_name = "DIR|config.json|umt5-xxl")]
    pub text_encoder: Option<String>,
    /// Time the preset's self-attention alone at the tokens of `--shape` (q, k, v in
    /// `--dtype`): forward and forward + backward of every attention mode, and cubek's
    /// tensor-core flash forward, side by side.
    #[arg(long, conflicts_with_all = ["breakdown", "devices", "vae", "text_encoder"])]
    pub attention_only: bool,
    /// With `--attention-only`: one more `flash` row per spec, the tiled tensor-core kernels
    /// launched with these shapes (`RxC[xU]`: rows per cube, rows per streamed tile, units;
    /// or `forward=RxC[xU],backward_q=...,backward_kv=...`), as `REEL_TILED_TILES` sets them
    /// for a training; repeatable. Needs a `cuda` or `wgpu` build.
    #[arg(long = "tiles", value_name = "SPEC", requires = "attention_only")]
    pub tiles: Vec<String>,
    /// Time the matrix products of the preset's blocks alone at the tokens of `--shape`
    /// (operands in `--dtype`): the forward and both gradients' layouts of the attention and
    /// FFN projections, on Burn's matmul and on each cubek kernel that `REEL_MATMUL` can pin,
    /// with the fastest correct kernel over a block.
    #[arg(long, conflicts_with_all = ["breakdown", "devices", "vae", "text_encoder", "attention_only"])]
    pub matmul_only: bool,
    /// With `--matmul-only`: time this kernel (repeatable; default: every kernel).
    #[arg(long = "matmul-kernel", value_name = "NAME", requires = "matmul_only")]
    pub matmul_kernels: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn parse_attention(s: &str) -> Result<AttentionMode, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| format!("`{s}`: expected auto, naive, memory_efficient, fused or flash"))
}

fn parse_dtype(s: &str) -> Result<Precision, String> {
    serde_json::from_value(serde_json::Value::String(s.to_string()))
        .map_err(|_| format!("`{s}`: expected f32 or bf16"))
}

/// One benchmark row.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRow {
    preset: String,
    /// LoRA rank (0 = full fine-tuning).
    lora_rank: usize,
    /// Trainable parameters.
    trainable_params: usize,
    /// Gradients plus AdamW moments of the trainable parameters (3 float32 per parameter).
    grad_optim_mib: f64,
    backend: String,
    /// Compute precision.
    dtype: Precision,
    /// Attention implementation used (`naive` / `memory_efficient`).
    attention: String,
    /// The linear layers' matmul kernels (`REEL_MATMUL`'s form: `burn`, `cublas`, ...), as
    /// set or by default on this backend.
    matmul: String,
    /// Block-level activation checkpointing in the training step.
    gradient_checkpointing: bool,
    batch: usize,
    tokens: usize,
    forward_ms: Stats,
    train_step_ms: Stats,
    train_tokens_per_s: f64,
    train_gflops: f64,
    forward_gflops: f64,
    peak_rss_mib: f64,
}

/// Mean, median, min and max of timed repetitions.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    /// Mean: the figure for runs whose steps differ by design (a DMD2 run that updates the
    /// generator every fifth step).
    pub mean: f64,
    /// Median: the middle time, or the mean of the two middle ones of an even count (as
    /// Python's `statistics.median` takes PyTorch's side by side). Taking the upper one made
    /// a two-step run report its slower step.
    pub median: f64,
    /// Fastest.
    pub min: f64,
    /// Slowest.
    pub max: f64,
}

fn stats(mut v: Vec<f64>) -> Stats {
    v.sort_by(|a, b| a.partial_cmp(b).expect("finite times"));
    let mid = v.len() / 2;
    Stats {
        mean: v.iter().sum::<f64>() / v.len() as f64,
        median: if v.len().is_multiple_of(2) {
            (v[mid - 1] + v[mid]) / 2.0
        } else {
            v[mid]
        },
        min: v[0],
        max: v[v.len() - 1],
    }
}

/// Peak resident memory of this process in MiB (Linux `VmHWM`), 0 when unknown.
pub fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// Forward FLOPs of one batch (see module docs).
pub fn forward_flops(c: &WanConfig, batch: usize, tokens: usize, text_len: usize) -> f64 {
    let d = c.inner_dim() as f64;
    let f = c.ffn_dim as f64;
    let (n, l) = (tokens as f64, text_len as f64);
    batch as f64
        * c.num_layers as f64
        * (n * (12.0 * d * d + 4.0 * d * f + 4.0 * n * d + 4.0 * l * d) + l * 4.0 * d * d)
}

/// The Wan preset `preset` and the video tokens of `--shape` under its patch.
fn preset_tokens(args: &BenchArgs, preset: &str) -> anyhow::Result<(WanConfig, usize)> {
    let cfg = WanConfig::preset(preset).ok_or_else(|| {
        anyhow::anyhow!(
            "unknown preset `{preset}`, expected one of {:?}",
            WanConfig::preset_names()
        )
    })?;
    let [f, h, w] = [args.shape[0], args.shape[1], args.shape[2]];
    let [pt, ph, pw] = cfg.patch_size;
    let info = cfg.model_info();
    for (axis, name) in ["frame count", "height", "width"].into_iter().enumerate() {
        let n = args.shape[axis];
        (info.check_extent(axis, n)).map_err(|problem| {
            let what = format!("--shape {f} {h} {w}: the {name} {n}");
            anyhow::anyhow!("{} (preset {preset})", problem.in_terms_of(&what))
        })?;
    }
    let tokens = (f / pt)
        .checked_mul(h / ph)
        .and_then(|n| n.checked_mul(w / pw))
        .ok_or_else(|| anyhow::anyhow!("shape {f}x{h}x{w} has more tokens than fit a count"))?;
    Ok((cfg, tokens))
}

fn run_one<B: AutodiffBackend>(
    args: &BenchArgs,
    preset: &str,
    lora_rank: usize,
    device: &B::Device,
) -> anyhow::Result<BenchRow> {
    let (cfg, tokens) = preset_tokens(args, preset)?;
    let [f, h, w] = [args.shape[0], args.shape[1], args.shape[2]];
    let b = args.batch;
    let built = std::time::Instant::now();
    let mut rng = StreamRng::from_seed(0);
    let x0: Tensor<B, 5> = rng.normal_tensor([b, cfg.in_channels, f, h, w], device);
    let noise: Tensor<B, 5> = rng.normal_tensor([b, cfg.in_channels, f, h, w], device);
    let text: Tensor<B, 3> = rng.normal_tensor([b, args.text_len, cfg.text_dim], device);
    let sigma = Tensor::<B, 1>::full([b], 0.5, device);
    let mut model = cfg
        .try_init::<B>(device, 0)?
        .with_attention(args.attention)
        .with_precision(args.dtype);
    if lora_rank > 0 {
        model = apply_lora(model, &lora_spec(args, lora_rank), 0)?;
    }
    let mut role = TrainableRole::new(
        "student",
        model,
        OptimizerConfig::default(),
        Some(1.0),
        1000,
    );

    let what = |phase: &str| format!("{preset} {tokens} tokens x{b}, {phase}");
    // Wan's parameters are drawn when first read: here, for the forward's model.
    let m = role.model_valid();
    // What a GPU session spends before the first step (the device's start and the random
    // weights), apart from the steps' own lines.
    let _ = B::sync(device);
    eprintln!(
        "bench: {}: inputs and random weights on the device in {:.1} s",
        what("setup"),
        built.elapsed().as_secs_f64()
    );
    let (fwd, ()) = time::<B, _>(args, &what("forward"), device, || {
        let out = m.forward(
            x0.clone().inner(),
            sigma.clone().inner().mul_scalar(1000.0),
            text.clone().inner(),
        );
        let _ = out.sum().into_scalar();
        Ok(())
    })?;
    drop(m);
    let mut step = 0u64;
    let (train, ()) = time::<B, _>(args, &what("training"), device, || {
        if args.gradient_checkpointing {
            let x_t = add_noise(x0.clone(), noise.clone(), sigma.clone());
            let mut stages = Vec::new();
            role.model().backward_checkpointed(
                x_t.clone(),
                timesteps_from_sigmas(sigma.clone()),
                text.clone(),
                |pred| {
                    loss_of_prediction(pred, x_t, x0.clone(), noise.clone(), sigma.clone(), false)
                },
                |g| stages.push(role.collect_grads(g)),
            );
            for g in stages {
                role.add_grads(g, 1.0);
            }
        } else {
            let (loss, _) = flow_matching_loss(
                role.model(),
                x0.clone(),
                noise.clone(),
                sigma.clone(),
                text.clone(),
                false,
            );
            let grads = loss.backward();
            role.accumulate(&grads, 1.0);
        }
        let n2 = role.grad_norm_sq().expect("gradients").into_scalar();
        let n: f64 = burn::tensor::ElementConversion::elem::<f64>(n2).sqrt();
        // `time` syncs the device, so the (asynchronous) update is inside the step's time.
        role.apply_update(step, if n > 1.0 { 1.0 / n } else { 1.0 });
        step += 1;
        Ok(())
    })?;
    // Counted from the shapes: reading the values back would copy every weight to the host.
    let trainable_params: usize = role
        .model()
        .trainable_params()
        .iter()
        .map(|p| p.shape.iter().product::<usize>())
        .sum();
    let ffl = forward_flops(&cfg, b, tokens, args.text_len);
    Ok(BenchRow {
        preset: preset.to_string(),
        lora_rank,
        trainable_params,
        grad_optim_mib: (trainable_params * 3 * 4) as f64 / (1024.0 * 1024.0),
        backend: backend_label(args.backend),
        dtype: args.dtype,
        attention: if matches!(args.attention, AttentionMode::Fused | AttentionMode::Flash)
            && reel_models::wan::mem_attention::fused_kernels_apply::<B>(device)
        {
            let flash = args.attention == AttentionMode::Flash;
            (if flash {
                flash_label(args.dtype)
            } else {
                "fused"
            })
            .into()
        } else if args.attention.use_memory_efficient(tokens) {
            "mem_eff".into()
        } else {
            "naive".into()
        },
        matmul: reel_models::wan::matmul::pin::<B>().to_string(),
        gradient_checkpointing: args.gradient_checkpointing,
        batch: b,
        tokens,
        train_tokens_per_s: (b * tokens) as f64 / (train.median / 1e3),
        train_gflops: 3.0 * ffl / (train.median / 1e3) / 1e9,
        forward_gflops: ffl / (fwd.median / 1e3) / 1e9,
        forward_ms: fwd,
        train_step_ms: train,
        peak_rss_mib: peak_rss_mib(),
    })
}

/// The `flash` attention's label: `flash cudnn` (or `flash cudnn-queued`) where its bf16/f16
/// calls go to cuDNN (a `cuda` build, `REEL_FLASH` not `reel`; calls cuDNN refuses fall back
/// alone), else `flash`.
fn flash_label(dtype: Precision) -> &'static str {
    #[cfg(feature = "cuda")]
    {
        use reel_models::wan::fused_attention::cudnn::{flash, Flash};
        match flash() {
            Flash::Cudnn if dtype == Precision::Bf16 => return "flash cudnn",
            Flash::CudnnQueued if dtype == Precision::Bf16 => return "flash cudnn-queued",
            _ => {}
        }
    }
    let _ = dtype;
    "flash"
}

/// `name`, with `+fusion` / `+autotune` for the CubeCL backends (`cuda`, `wgpu`) when the
/// binary was built with Burn's fusion layer or kernel autotuning.
fn backend_label(name: BackendName) -> String {
    let mut label = name.as_str().to_string();
    if matches!(name, BackendName::Cuda | BackendName::Wgpu) {
        if cfg!(feature = "fusion") {
            label.push_str("+fusion");
        }
        if cfg!(feature = "autotune") {
            label.push_str("+autotune");
        }
        let memory = reel_core::memory::allocator::GpuMemory::of_process();
        if memory != Default::default() {
            label.push_str(&format!("+{memory}-memory"));
        }
    }
    label
}

fn run_backend<B: ReelBackend>(args: &BenchArgs) -> anyhow::Result<Vec<BenchRow>> {
    let device = &crate::commands::device::<B>(0, "--backend")?;
    let mut rows = vec![];
    for p in &args.presets {
        for &r in &args.lora_ranks {
            rows.push(run_one::<B>(args, p, r, device)?);
        }
    }
    Ok(rows)
}

/// The flags' errors that need no backend: counts and sizes of zero (a zero batch or shape
/// panicked deep in the model), an unknown preset (named before any setup, not after the
/// first preset's rows), bf16 on the CPU.
fn check_args(args: &BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.shape.len() == 3, "--shape takes three numbers: F H W");
    anyhow::ensure!(args.video.len() == 3, "--video takes three numbers: F H W");
    let at_least_one = [
        ("--batch", args.batch),
        ("--text-len", args.text_len),
        ("--steps", args.steps),
    ];
    for (flag, n) in at_least_one {
        anyhow::ensure!(n >= 1, "{flag} must be at least 1, got {n}");
    }
    for (flag, dims) in [("--shape", &args.shape), ("--video", &args.video)] {
        anyhow::ensure!(
            dims.iter().all(|&n| n >= 1),
            "{flag} takes three sizes of at least 1 (F H W), got {dims:?}"
        );
    }
    // Every preset's rows need it known and the shape divisible by its patch (`--config`
    // and the encoders' runs use no preset; the kernel benches build no model).
    if args.config.is_none() && args.vae.is_none() && args.text_encoder.is_none() {
        for p in &args.presets {
            let (cfg, tokens) = preset_tokens(args, p)?;
            if args.attention_only {
                limits::check_attention_memory(args, p, &cfg, tokens)?;
            } else if !args.matmul_only {
                for &rank in &args.lora_ranks {
                    limits::check_bench_memory(args, p, &cfg, tokens, rank)?;
                }
            }
        }
    }
    if args.vae.is_some() {
        limits::check_video_memory(args)?;
    }
    if let Some(spec) = &args.text_encoder {
        let config =
            encoders::umt5_config(spec).with_context(|| format!("--text-encoder {spec}"))?;
        limits::check_text_encoder_memory(args, spec, &config)?;
    }
    check_flags_apply(args)?;
    let no_bf16 = matches!(args.backend, BackendName::Cpu | BackendName::Wgpu);
    if args.dtype == Precision::Bf16 && no_bf16 && args.config.is_none() {
        anyhow::bail!(
            "--dtype bf16 needs bfloat16 kernels, which --backend {} lacks: use --backend cuda \
             or --backend flex",
            args.backend
        );
    }
    Ok(())
}

/// Refuse flags that the chosen bench would ignore: a table that looks like it measured them
/// would not have.
fn check_flags_apply(args: &BenchArgs) -> anyhow::Result<()> {
    let trains = args.breakdown || args.devices.is_some();
    let encoders = args.vae.is_some() || args.text_encoder.is_some();
    if !args.set.is_empty() && !trains {
        anyhow::bail!("--set changes the run of --breakdown or --devices; give one of them");
    }
    if args.method != "finetune" && !trains {
        anyhow::bail!(
            "--method {} is the method of --breakdown or --devices; give one of them",
            args.method
        );
    }
    if encoders && args.dtype != Precision::F32 {
        anyhow::bail!("--vae and --text-encoder time the encoders in float32: drop --dtype");
    }
    let one_preset = [
        ("--attention-only", args.attention_only),
        ("--matmul-only", args.matmul_only),
        ("--devices", args.devices.is_some() && args.config.is_none()),
    ];
    for (flag, _) in one_preset.into_iter().filter(|(_, on)| *on) {
        anyhow::ensure!(
            args.presets.len() == 1,
            "{flag} benches one --preset, {} were given",
            args.presets.len()
        );
    }
    if args.devices.is_some() && args.lora_ranks.len() > 1 {
        anyhow::bail!(
            "--devices benches one --lora-rank, {} were given",
            args.lora_ranks.len()
        );
    }
    Ok(())
}

/// The LoRA adapter of `rank` that `--lora-rank` rows train.
pub(super) fn lora_spec(args: &BenchArgs, rank: usize) -> LoraSpec {
    LoraSpec {
        rank,
        alpha: rank as f64,
        target_modules: args.lora_targets.clone(),
        dropout: 0.0,
        init_seed: Some(0),
    }
}

/// Run the benchmark and print the table.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    check_args(args)?;
    if args.breakdown {
        return breakdown::run(args);
    }
    if let Some(n) = args.devices {
        anyhow::ensure!(n >= 1, "--devices must be at least 1");
        return scaling::run(args, n);
    }
    anyhow::ensure!(
        args.config.is_none(),
        "--config applies to --breakdown and --devices"
    );
    if args.attention_only {
        return attention::run(args);
    }
    if args.matmul_only {
        return matmul::run(args);
    }
    if args.vae.is_some() || args.text_encoder.is_some() {
        return encoders::run(args);
    }
    let rows = with_backend!(args.backend, |B| run_backend::<B>(args))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{:<18} {:>4} {:>12} {:>9} {:<8} {:<5} {:<8} {:>4} {:>5} {:>6} | {:>26} | {:>26} | {:>10} {:>9} {:>9} {:>9}",
        "preset",
        "lora",
        "trainable",
        "grad+opt",
        "backend",
        "dtype",
        "attn",
        "ckpt",
        "batch",
        "tokens",
        "forward ms (med/min/max)",
        "train step ms (med/min/max)",
        "tok/s",
        "fwd GF/s",
        "trn GF/s",
        "peak MiB"
    );
    for r in rows {
        println!(
            "{:<18} {:>4} {:>12} {:>8.1}M {:<8} {:<5} {:<8} {:>4} {:>5} {:>6} | {:>8.1} {:>8.1} {:>8.1} | {:>8.1} {:>8.1} {:>8.1} | {:>10.0} {:>9.2} {:>9.2} {:>9.0}",
            r.preset, if r.lora_rank == 0 { "-".to_string() } else { r.lora_rank.to_string() },
            r.trainable_params, r.grad_optim_mib, r.backend, if r.dtype == Precision::Bf16 { "bf16" } else { "f32" }, r.attention, if r.gradient_checkpointing { "yes" } else { "no" }, r.batch, r.tokens, r.forward_ms.median, r.forward_ms.min, r.forward_ms.max,
            r.train_step_ms.median, r.train_step_ms.min, r.train_step_ms.max, r.train_tokens_per_s, r.forward_gflops, r.train_gflops, r.peak_rss_mib
        );
    }
    Ok(())
}

/// The width of a table's `kernel` column: its longest name, and at least the header's.
fn kernel_width<'a>(names: impl Iterator<Item = &'a str>) -> usize {
    names.map(str::len).max().unwrap_or(0).max("kernel".len())
}

#[cfg(test)]
mod tests {
    use super::{check_args, stats, BenchArgs, WanConfig};
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    /// `check_args`'s error for `reel bench` with these flags.
    fn refusal(flags: &[&str]) -> String {
        let cli = Cli::try_parse_from(std::iter::once("bench").chain(flags.iter().copied()))
            .expect("flags parse");
        format!("{:#}", check_args(&cli.bench).expect_err("refused"))
    }

    #[test]
    fn zero_counts_and_sizes_are_refused_by_their_flags() {
        assert!(refusal(&["--batch", "0"]).contains("--batch must be at least 1"));
        assert!(refusal(&["--text-len", "0"]).contains("--text-len must be at least 1"));
        assert!(refusal(&["--steps", "0"]).contains("--steps must be at least 1"));
        let shape = refusal(&["--shape", "0", "16", "16"]);
        assert!(
            shape.contains("--shape") && shape.contains("[0, 16, 16]"),
            "{shape}"
        );
        let video = refusal(&["--vae", "wan2.1", "--video", "81", "0", "832"]);
        assert!(
            video.contains("--video") && video.contains("[81, 0, 832]"),
            "{video}"
        );
    }

    #[test]
    fn flags_the_chosen_bench_would_ignore_are_refused() {
        for (flags, want) in [
            (
                &["--set", "optimizer.fused=false"][..],
                "--set changes the run",
            ),
            (&["--method", "dmd2"][..], "--method dmd2 is the method"),
            (&["--vae", "wan2.1", "--dtype", "bf16"][..], "in float32"),
            (
                &[
                    "--attention-only",
                    "--preset",
                    "wan-quickstart",
                    "--preset",
                    "wan-tiny",
                ][..],
                "--attention-only benches one --preset, 2 were given",
            ),
            (
                &["--devices", "2", "--lora-rank", "0", "--lora-rank", "4"][..],
                "--devices benches one --lora-rank",
            ),
        ] {
            let e = refusal(flags);
            assert!(e.contains(want), "{flags:?}: {e}");
        }
        let cli = Cli::try_parse_from(["bench", "--video", "9", "64", "64"]);
        assert!(cli.is_err(), "--video without --vae parses");
    }

    #[test]
    fn an_unknown_preset_is_named_before_any_run() {
        let e = refusal(&["--preset", "wan-quickstart", "--preset", "wan-1.3"]);
        assert!(e.contains("unknown preset `wan-1.3`"), "{e}");
        let e = refusal(&["--preset", "wan-quickstart", "--shape", "8", "15", "16"]);
        assert!(
            e.contains("the height 15") && e.contains("patch size"),
            "{e}"
        );
        // A side more patches long than the position encoding covers: refused, where the
        // model would stop on its internal check.
        let quick = WanConfig::preset("wan-quickstart").unwrap();
        let long = ((quick.rope_max_seq_len + 1) * quick.patch_size[1]).to_string();
        let e = refusal(&["--preset", "wan-quickstart", "--shape", "8", &long, "16"]);
        assert!(
            e.contains(&format!("the height {long}")) && e.contains("rope_max_seq_len"),
            "{e}"
        );
        // A batch far beyond any machine's memory, where it can be told.
        let cpu = reel_core::memory::available_for(super::BackendName::Cpu, &[0]);
        if cpu.is_some() {
            let e = refusal(&["--batch", "100000000"]);
            assert!(
                e.contains("needs at least") && e.contains("smaller --shape"),
                "{e}"
            );
            assert!(
                e.contains("wan-quickstart"),
                "the error lists the presets: {e}"
            );
        }
        // The weights and their AdamW state count too: an absurd LoRA rank, a shape for the
        // attention alone, a video for the VAE, each refused before anything is built.
        if cpu.is_some() {
            let e = refusal(&["--batch", "1", "--lora-rank", "1000000000"]);
            assert!(e.contains("--lora-rank 1000000000 needs at least"), "{e}");
            let preset = ["--preset", "wan2.1-t2v-1.3b"];
            let e = refusal(
                &[
                    &preset[..],
                    &["--attention-only", "--shape", "1024", "1024", "1024"],
                ]
                .concat(),
            );
            assert!(
                e.contains("--attention-only") && e.contains("needs at least"),
                "{e}"
            );
            let e = refusal(&["--vae", "wan2.1", "--video", "100001", "100000", "100000"]);
            assert!(e.contains("--video") && e.contains("needs at least"), "{e}");
        }
        let ok = Cli::try_parse_from(["bench"]).expect("defaults parse");
        check_args(&ok.bench).expect("the defaults are valid");
    }

    /// The text encoder's weights and attention scores are counted before any is drawn: a
    /// model or prompt length beyond memory is refused naming the flags, a small one passes,
    /// and an unreadable `--text-encoder` is named.
    #[test]
    fn a_text_encoder_beyond_memory_is_refused_before_it_is_built() {
        let dir = tempfile::tempdir().unwrap();
        let config = |vocab: u64, d_model: u64| {
            let path = dir.path().join(format!("umt5-{vocab}-{d_model}.json"));
            let json = format!(
                r#"{{"vocab_size": {vocab}, "d_model": {d_model}, "d_kv": 4, "d_ff": 16,
                    "num_layers": 1, "num_heads": 2}}"#
            );
            std::fs::write(&path, json).unwrap();
            path.to_string_lossy().into_owned()
        };
        let parse = |flags: &[&str]| {
            let flags = std::iter::once("bench").chain(flags.iter().copied());
            Cli::try_parse_from(flags).expect("flags parse").bench
        };
        check_args(&parse(&["--text-encoder", &config(300, 8)])).expect("a tiny encoder fits");
        let missing = dir.path().join("no_encoder").to_string_lossy().into_owned();
        let e = refusal(&["--text-encoder", &missing]);
        assert!(e.contains(&format!("--text-encoder {missing}")), "{e}");
        if reel_core::memory::available_for(super::BackendName::Cpu, &[0]).is_some() {
            // 2^22 × 2^16 embedding values: 1 TiB in float32, within the size limits.
            let huge = config(1 << 22, 1 << 16);
            let e = refusal(&["--text-encoder", &huge]);
            assert!(
                e.contains(&format!("--text-encoder {huge}")) && e.contains("needs at least"),
                "{e}"
            );
            let past_limit = config(1 << 40, 8);
            let e = refusal(&["--text-encoder", &past_limit]);
            assert!(
                e.contains("`vocab_size` = 1099511627776 is above the limit"),
                "{e}"
            );
            let e = refusal(&["--text-encoder", "umt5-xxl", "--text-len", "10000000"]);
            assert!(
                e.contains("--text-len 10000000") && e.contains("needs at least"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_scaling_bench_runs_the_steps_asked_and_a_breakdown_twice_as_many() {
        let steps = |flags: &[&str]| {
            let flags = ["bench", "--warmup", "1", "--steps", "3"]
                .iter()
                .chain(flags);
            super::breakdown::total_steps(&Cli::try_parse_from(flags).unwrap().bench)
        };
        assert_eq!(steps(&["--devices", "2"]), 1 + 3);
        assert_eq!(steps(&["--breakdown"]), 1 + 2 * 3);
    }

    #[test]
    fn median_of_an_even_count_is_the_mean_of_the_middle_two() {
        let s = stats(vec![1626.0, 1500.0]);
        assert_eq!(s.median, 1563.0);
        assert_eq!((s.min, s.max, s.mean), (1500.0, 1626.0, 1563.0));
        assert_eq!(stats(vec![4.0, 1.0, 3.0, 2.0]).median, 2.5);
    }

    #[test]
    fn median_of_an_odd_count_is_the_middle_time() {
        let s = stats(vec![9.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 9.0));
        assert_eq!(stats(vec![7.0]).median, 7.0);
    }
}
