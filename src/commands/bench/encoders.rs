//! `reel bench --vae …` / `--text-encoder …`: time the Wan VAE's decode and encode of a
//! video and UMT5's encoding of a batch of prompts, on any backend, after warm-up.
//!
//! `--vae` takes a diffusers `vae/` folder (its weights), a `config.json` (random weights of
//! that shape) or `wan2.1` (random weights of the Wan2.1 VAE). `--text-encoder` takes a
//! `text_encoder/` folder, a `config.json`, or `umt5-xxl` (random weights of Wan's UMT5-XXL:
//! 24 layers, width 4096, 5.7 B parameters). Timing does not depend on the weights' values.
//! Peak memory is the process's high-water mark on the host; `bench/gpu.sh` samples GPU memory.

use std::path::Path;

use anyhow::Context;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use reel_core::backend::ReelBackend;
use reel_core::rng::StreamRng;
use reel_core::with_backend;
use reel_models::umt5::{Umt5Config, Umt5Encoder};
use reel_models::vae::conv_gemm::ConvImpl;
use reel_models::vae::{Tiling, WanVae, WanVaeConfig};
use reel_models::wan::matmul::pin;
use serde::Serialize;

use super::progress::time;
use super::{peak_rss_mib, BenchArgs, Stats};

/// One timed operation.
#[derive(Debug, Clone, Serialize)]
pub struct EncoderRow {
    /// `vae decode`, `vae encode` or `umt5 encode`.
    pub op: String,
    /// Input shape: latents `[1, C, f, h, w]`, video `[1, 3, F, H, W]` or ids `[B, L]`.
    pub input: Vec<usize>,
    /// Output shape.
    pub output: Vec<usize>,
    /// Milliseconds over the timed repetitions.
    pub ms: Stats,
    /// Process peak RSS after the row (MiB).
    pub peak_rss_mib: f64,
    /// The kernels it ran on: the VAE's convolutions (`REEL_VAE_CONV`) and the matmul pin
    /// (`REEL_MATMUL`).
    pub kernels: String,
}

/// Which of the VAE's passes `reel bench --vae` times (`--vae-op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum VaeOp {
    /// The decode of random latents, then the encode of the decoded video.
    Both,
    /// The decode alone.
    Decode,
    /// The encode alone, of a random video in [-1, 1] with the frames the decode would give.
    Encode,
}

/// Wan's text encoder (`google/umt5-xxl`, as in `Wan2.1-T2V-*/text_encoder/config.json`).
const UMT5_XXL: &str = r#"{"vocab_size": 256384, "d_model": 4096, "d_kv": 64, "d_ff": 10240,
  "num_layers": 24, "num_heads": 64, "feed_forward_proj": "gated-gelu"}"#;

/// Run the encoder benchmarks asked for and print their table (or JSON).
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let rows = with_backend!(args.backend, |B| rows::<B>(args))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{:<12} {:<24} {:<24} | {:>10} {:>10} {:>10} | {:>9} | kernels",
        "op", "input", "output", "median ms", "min ms", "max ms", "peak MiB"
    );
    for r in rows {
        println!(
            "{:<12} {:<24} {:<24} | {:>10.1} {:>10.1} {:>10.1} | {:>9.0} | {}",
            r.op,
            format!("{:?}", r.input),
            format!("{:?}", r.output),
            r.ms.median,
            r.ms.min,
            r.ms.max,
            r.peak_rss_mib,
            r.kernels
        );
    }
    Ok(())
}

fn rows<B: ReelBackend>(args: &BenchArgs) -> anyhow::Result<Vec<EncoderRow>> {
    let device = crate::commands::device::<B>(0, "--backend")?;
    let mut rows = vec![];
    if let Some(spec) = &args.vae {
        rows.extend(vae_rows::<B::InnerBackend>(args, spec, &device)?);
    }
    if let Some(spec) = &args.text_encoder {
        rows.push(umt5_row::<B::InnerBackend>(args, spec, &device)?);
    }
    Ok(rows)
}

fn vae_rows<B: Backend>(
    args: &BenchArgs,
    spec: &str,
    device: &B::Device,
) -> anyhow::Result<Vec<EncoderRow>> {
    let vae = load_vae::<B>(spec, device)?;
    let [f, h, w] = [args.video[0], args.video[1], args.video[2]];
    let c = &vae.config;
    let (s, lf) = (c.spatial_factor(), c.latent_frames(f));
    anyhow::ensure!(
        h % s == 0 && w % s == 0,
        "--video {f} {h} {w}: height and width must be multiples of the VAE's {s}"
    );
    let tiling =
        (args.vae_tile.map(|t| Tiling::overlapping(t, s)).transpose()).context("--vae-tile")?;
    let mut rng = StreamRng::from_seed(0);
    let kernels = format!("conv {}, matmul {}", ConvImpl::of::<B>().name(), pin::<B>());
    let row = |op: &str, input: Vec<usize>, output: Vec<usize>, ms| EncoderRow {
        op: op.into(),
        input,
        output,
        ms,
        peak_rss_mib: peak_rss_mib(),
        kernels: kernels.clone(),
    };
    let mut rows = vec![];
    let mut video = None;
    if args.vae_op != VaeOp::Encode {
        let z: Tensor<B, 5> = rng.normal_tensor([1, c.z_dim, lf, h / s, w / s], device);
        let (ms, out) = time::<B, _>(args, "vae decode", device, || {
            Ok(match &tiling {
                Some(t) => vae.tiled_decode(z.clone(), t)?,
                None => vae.decode(z.clone())?,
            })
        })?;
        rows.push(row(
            "vae decode",
            z.dims().to_vec(),
            out.dims().to_vec(),
            ms,
        ));
        video = Some(out);
    }
    if args.vae_op != VaeOp::Decode {
        // The frames the decode would give (what `both` encodes): whole encoder chunks.
        let frames = 1 + lf.saturating_sub(1) * c.temporal_factor();
        let video = video.unwrap_or_else(|| {
            let v: Tensor<B, 5> = rng.normal_tensor([1, c.in_channels, frames, h, w], device);
            v.clamp(-1.0, 1.0)
        });
        let (ms, mean) = time::<B, _>(args, "vae encode", device, || {
            Ok(match &tiling {
                Some(t) => vae.tiled_encode(video.clone(), t)?.mean,
                None => vae.encode(video.clone())?.mean,
            })
        })?;
        rows.push(row(
            "vae encode",
            video.dims().to_vec(),
            mean.dims().to_vec(),
            ms,
        ));
    }
    Ok(rows)
}

fn load_vae<B: Backend>(spec: &str, device: &B::Device) -> anyhow::Result<WanVae<B>> {
    let path = Path::new(spec);
    let vae = if spec == "wan2.1" {
        WanVae::init(&WanVaeConfig::from_json_str("{}")?, device, 0)?
    } else if path.extension().is_some_and(|e| e == "json") {
        WanVae::init(&WanVaeConfig::from_json_file(path)?, device, 0)?
    } else {
        WanVae::load(path, device).with_context(|| format!("--vae {spec}"))?
    };
    Ok(vae)
}

fn umt5_row<B: Backend>(
    args: &BenchArgs,
    spec: &str,
    device: &B::Device,
) -> anyhow::Result<EncoderRow> {
    let model = Umt5Encoder::<B>::init(&umt5_config(spec)?, device, 0)?;
    let model = match is_folder_or_weights(spec) {
        true => (model.load_weights(spec)).with_context(|| format!("--text-encoder {spec}"))?,
        false => model,
    };
    let [b, l] = [args.batch, args.text_len];
    let vocab = model.config.vocab_size as u64;
    let mut rng = StreamRng::from_seed(0);
    let ids: Vec<i64> = (0..b * l).map(|_| rng.below(vocab) as i64).collect();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [b, l]), device);
    let mask = Tensor::<B, 2>::ones([b, l], device);
    let (ms, out) = time::<B, _>(args, "umt5 encode", device, || {
        Ok(model.forward(ids.clone(), mask.clone())?)
    })?;
    Ok(EncoderRow {
        op: "umt5 encode".into(),
        input: vec![b, l],
        output: out.dims().to_vec(),
        ms,
        peak_rss_mib: peak_rss_mib(),
        kernels: format!("matmul {}", pin::<B>()),
    })
}

/// Whether `--text-encoder spec` names weights to load (a `text_encoder/` folder or a weights
/// file), not a config of random weights (`umt5-xxl`, a `.json`).
fn is_folder_or_weights(spec: &str) -> bool {
    spec != "umt5-xxl" && Path::new(spec).extension().is_none_or(|e| e != "json")
}

/// The UMT5 configuration `--text-encoder spec` names: Wan's UMT5-XXL, a `config.json`, or
/// that of a `text_encoder/` folder (or of a weights file beside its `config.json`).
pub(super) fn umt5_config(spec: &str) -> anyhow::Result<Umt5Config> {
    let config = if spec == "umt5-xxl" {
        Umt5Config::from_json_str(UMT5_XXL)?
    } else if is_folder_or_weights(spec) {
        Umt5Config::of_pretrained(spec)?
    } else {
        Umt5Config::from_json_file(spec)?
    };
    Ok(config)
}
