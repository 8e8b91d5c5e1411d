//! What a bench needs in memory at least, checked against the bench device's before
//! anything is built: a shape, batch, LoRA rank or video far beyond it is an error naming
//! the flags, not an allocation failure that aborts the process (or a host that swaps).

use reel_core::backend::CpuBackend;
use reel_core::config::Precision;
use reel_core::memory::{available_for, gib};
use reel_core::params::num_param_values;
use reel_models::umt5::{Umt5Config, Umt5Encoder};
use reel_models::WanConfig;

use super::{lora_spec, BenchArgs};

/// Parameters of `cfg`'s model, all and trained (every weight, or the LoRA adapter's for a
/// rank above 0), counted from their shapes: nothing is allocated.
fn param_counts(args: &BenchArgs, cfg: &WanConfig, rank: usize) -> anyhow::Result<(u128, u128)> {
    let base = cfg.num_params()? as u128;
    if rank == 0 {
        return Ok((base, base));
    }
    let adapter = cfg.num_lora_params(&lora_spec(args, rank))? as u128;
    Ok((base + adapter, adapter))
}

/// A preset's bench holds at least its weights (float32), the trained parameters' gradients
/// and AdamW moments, its inputs (latents, noise, text; float32) and, for the backward, one
/// activation of `d` values per video token in every block (in `--dtype`): a shape, batch or
/// LoRA rank far beyond the bench device's memory (where it can be told) is an error, not an
/// allocation failure that aborts the process.
pub(super) fn check_bench_memory(
    args: &BenchArgs,
    preset: &str,
    cfg: &WanConfig,
    tokens: usize,
    rank: usize,
) -> anyhow::Result<()> {
    let b = args.batch as u128;
    let latents: u128 = args.shape.iter().map(|&n| n as u128).product();
    let text = args.text_len as u128 * cfg.text_dim as u128;
    let inputs = b * (2 * cfg.in_channels as u128 * latents + text);
    let kept = b * tokens as u128 * cfg.inner_dim() as u128 * cfg.num_layers as u128;
    let (params, trained) = param_counts(args, cfg, rank)?;
    let bytes = 4 * (inputs + params + 3 * trained) + activation_bytes(args) * kept;
    let lora = if rank > 0 {
        format!(" and --lora-rank {rank}")
    } else {
        String::new()
    };
    let what = format!(
        "{preset} at --shape {:?} with --batch {}{lora}",
        args.shape, args.batch
    );
    within_device(
        args,
        bytes,
        &what,
        "weights, gradients and AdamW state, inputs and one activation per block",
        "use a smaller --shape, --batch or --lora-rank, or a smaller preset",
    )
}

/// Bytes per activation value in `--dtype`.
fn activation_bytes(args: &BenchArgs) -> u128 {
    match args.dtype {
        Precision::Bf16 => 2,
        _ => 4,
    }
}

/// `--attention-only` holds at least q, k, v, the output and their four gradients, each
/// `[B, tokens, d]` in `--dtype`: a shape beyond the device's memory is refused before any
/// tensor is drawn.
pub(super) fn check_attention_memory(
    args: &BenchArgs,
    preset: &str,
    cfg: &WanConfig,
    tokens: usize,
) -> anyhow::Result<()> {
    let one = args.batch as u128 * tokens as u128 * cfg.inner_dim() as u128;
    let what = format!(
        "--attention-only: {preset} at --shape {:?} with --batch {}",
        args.shape, args.batch
    );
    within_device(
        args,
        8 * one * activation_bytes(args),
        &what,
        "q, k, v, the output and their gradients",
        "use a smaller --shape or --batch",
    )
}

/// `--vae` holds at least the decoded video and the video it encodes, each `3 × F × H × W`
/// float32: a `--video` beyond the device's memory is refused before the VAE is built.
pub(super) fn check_video_memory(args: &BenchArgs) -> anyhow::Result<()> {
    let pixels: u128 = args.video.iter().map(|&n| n as u128).product();
    within_device(
        args,
        2 * 3 * 4 * pixels,
        &format!("--video {:?}", args.video),
        "the decoded video and the video encoded, float32",
        "use a smaller --video",
    )
}

/// `--text-encoder` holds at least the encoder's weights (float32, counted on a lazily built
/// model: nothing is allocated) and one layer's attention scores `[B, heads, L, L]` twice
/// (with the position bias): a model or batch beyond the bench device's memory (UMT5-XXL's
/// 5.7 B parameters on a small host) is refused before its weights are drawn.
pub(super) fn check_text_encoder_memory(
    args: &BenchArgs,
    spec: &str,
    config: &Umt5Config,
) -> anyhow::Result<()> {
    let model = Umt5Encoder::<CpuBackend>::init(config, &Default::default(), 0)?;
    let weights = num_param_values(&model) as u128;
    let [b, l] = [args.batch as u128, args.text_len as u128];
    let scores = 2 * b * config.num_heads as u128 * l * l;
    within_device(
        args,
        4 * (weights + scores),
        &format!(
            "--text-encoder {spec} with --batch {} --text-len {}",
            args.batch, args.text_len
        ),
        "its float32 weights and one layer's attention scores",
        "use a device with more memory, or a smaller --batch or --text-len",
    )
}

/// `bytes` (for `what`, made of `parts`) against the bench device's memory, where it can be
/// told: more is an error that ends with `advice`.
fn within_device(
    args: &BenchArgs,
    bytes: u128,
    what: &str,
    parts: &str,
    advice: &str,
) -> anyhow::Result<()> {
    let Some(available) = available_for(args.backend, &[0]) else {
        return Ok(());
    };
    anyhow::ensure!(
        bytes <= available.bytes as u128,
        "{what} needs at least {} ({parts}), more than the {} of {}: {advice}",
        gib(bytes),
        gib(available.bytes.into()),
        available.of
    );
    Ok(())
}
