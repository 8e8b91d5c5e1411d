//! `reel sample`: generate clips for given prompts from a checkpoint and write them as
//! latents (safetensors) and pictures: with `--vae`, decoded videos (GIF, MP4 when FFmpeg
//! is installed); prompts are encoded with `--text-encoder` when given. The outputs are the
//! validation callback's, made by the same code.

use std::path::{Path, PathBuf};

use anyhow::Context;
use burn::tensor::TensorData;
use reel_core::backend::ReelBackend;
use reel_core::callback::{CallbackConfig as _, CallbackError};
use reel_core::method::{SampleProgress, SampleRequest};
use reel_plugins::callbacks::validation::output::{check_clips, write_clips, SHEET_FILE};
use reel_plugins::callbacks::validation::{check_data, clip_file_name, MediaModels};
use reel_plugins::callbacks::ValidationConfig;

use super::inference::{load, read_config, Source, StandIn};
use super::progress;
use reel_core::with_backend;
use size::{ClipSize, SizeRequest};

mod size;

/// `reel sample` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct SampleArgs {
    #[command(flatten)]
    source: Source,
    /// A caption to generate (repeatable); defaults to the data's validation prompts.
    #[arg(long = "prompt")]
    prompts: Vec<String>,
    /// Sampling steps (method default when omitted).
    #[arg(long)]
    steps: Option<usize>,
    /// Guidance scale (omitted: the method's sampling guidance; 1, no CFG, for dmd2).
    #[arg(long)]
    guidance: Option<f64>,
    /// Noise seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The clips' size in latents, FRAMESxHEIGHTxWIDTH (e.g. 21x60x104); default: the run's
    /// data's.
    #[arg(long, value_name = "FxHxW", conflicts_with = "video_size")]
    latent_size: Option<ClipSize>,
    /// The clips' size as videos, FRAMESxHEIGHTxWIDTH in frames and pixels (e.g. 81x480x832),
    /// turned into latents by the `--vae`'s compression; default: the run's data's.
    #[arg(long, value_name = "FxHxW")]
    video_size: Option<ClipSize>,
    /// Output folder. Files an earlier sample wrote there (same clip names, the contact
    /// sheet) are replaced only with `--force`.
    #[arg(long, default_value = "samples")]
    out: PathBuf,
    /// Replace an earlier sample's files in `--out`.
    #[arg(long)]
    force: bool,
    /// A diffusers Wan VAE folder (`vae/`): decode the clips to videos (GIF, MP4 with
    /// FFmpeg) and a labelled contact sheet.
    #[arg(long)]
    vae: Option<PathBuf>,
    /// The latents are raw VAE latents (not normalised with `latents_mean`/`latents_std`).
    #[arg(long)]
    raw_latents: bool,
    /// Decode in spatial tiles of this many pixels (large frames on small GPUs).
    #[arg(long)]
    vae_tile: Option<usize>,
    /// Frame rate of the written videos.
    #[arg(long, default_value_t = 16.0)]
    fps: f64,
    /// A diffusers UMT5 folder (`text_encoder/`): encode `--prompt` and `--negative`.
    #[arg(long)]
    text_encoder: Option<PathBuf>,
    /// The tokenizer (`tokenizer.json` or its folder) for `--text-encoder` (default: the one in
    /// the text encoder's folder, else in the `tokenizer/` folder beside it).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Negative prompt for classifier-free guidance (needs `--text-encoder`).
    #[arg(long)]
    negative: Option<String>,
}

/// The validation settings `reel sample` shares with the `validation` callback: the same
/// prompt encoding, VAE decoding and outputs.
fn media_config(args: &SampleArgs) -> anyhow::Result<ValidationConfig> {
    if args.vae.is_none() {
        for (flag, set) in [
            ("--vae-tile", args.vae_tile.is_some()),
            ("--raw-latents", args.raw_latents),
        ] {
            anyhow::ensure!(
                !set,
                "{flag}: it is for decoding with --vae, and none is given"
            );
        }
    }
    let cfg = ValidationConfig {
        every_steps: 1,
        sampling_steps: args.steps,
        guidance_scale: args.guidance,
        num_prompts: Some(usize::MAX),
        seed: args.seed,
        use_ema: false,
        at_end: false,
        vae: args.vae.clone(),
        denormalize: !args.raw_latents,
        vae_tile: args.vae_tile,
        fps: args.fps,
        text_encoder: args.text_encoder.clone(),
        tokenizer: args.tokenizer.clone(),
        prompts: if args.text_encoder.is_some() {
            args.prompts.clone()
        } else {
            Vec::new()
        },
        negative_prompt: args.negative.clone(),
    };
    cfg.validate().map_err(flag_error)?;
    Ok(cfg)
}

/// A validation-config error as the `reel sample` flag that set the key.
fn flag_error(e: reel_core::config::ConfigError) -> anyhow::Error {
    let flag = match e.key.as_str() {
        "sampling_steps" => "steps",
        "guidance_scale" => "guidance",
        "negative_prompt" => "negative",
        "prompts" => "prompt",
        key => key,
    };
    anyhow::anyhow!("--{}: {}", flag.replace('_', "-"), e.message)
}

/// The size flag given, if any.
fn size_request(args: &SampleArgs) -> Option<SizeRequest> {
    (args.latent_size.map(SizeRequest::Latent)).or(args.video_size.map(SizeRequest::Video))
}

/// The sampling steps' progress: a bar on a terminal; elsewhere a line at every tenth of the
/// steps (a log of a 50-step sample gets 10 lines, not 50).
fn step_progress(clips: usize) -> SampleProgress {
    let bar = std::sync::OnceLock::new();
    SampleProgress::new(move |done, total| {
        let bar = bar.get_or_init(|| progress::bar(total as u64, "sampling steps"));
        bar.set_position(done as u64);
        let tenth = |k: usize| k * 10 / total.max(1);
        if bar.is_hidden() && (done == total || tenth(done) != tenth(done.saturating_sub(1))) {
            eprintln!("reel: sampling {clips} clip(s): step {done}/{total}");
        }
        if done == total {
            bar.finish_and_clear();
        }
    })
}

/// The error for a `--prompt` the data source cannot embed without a text encoder: the
/// prompts it can (its own, a few of them), and the flags that embed any text.
fn unknown_prompt(source: &dyn reel_core::data::DataSource, caption: &str) -> anyhow::Error {
    let known: Vec<String> = source
        .prompts()
        .into_iter()
        .take(3)
        .map(|p| format!("`{}`", p.caption))
        .collect();
    let own = if known.is_empty() {
        "it has no prompts of its own".to_string()
    } else {
        format!(
            "it embeds only its own captions, such as {}",
            known.join(", ")
        )
    };
    anyhow::anyhow!(
        "the data source cannot embed the prompt `{caption}`: {own}; any text needs a text \
         encoder (--text-encoder, a UMT5 folder; --tokenizer where its tokenizer is not beside it)"
    )
}

fn sample<B: ReelBackend>(
    args: &SampleArgs,
    loaded: &reel_core::config::LoadedConfig,
) -> anyhow::Result<()> {
    let cfg = media_config(args)?;
    // The VAE, text encoder and tokenizer open (headers only) before any weights load.
    cfg.check_files(&|p| loaded.resolve(p))
        .map_err(flag_error)?;
    super::inference::check_steps(args.steps, loaded)?;
    // Checked before the weights are loaded, which can take minutes. With a text encoder the
    // prompts need not come from the data: its shapes suffice, and with a size the models'
    // own (an untrained model, no data at hand).
    let (size, stand_in) = match (size_request(args), &args.text_encoder) {
        (None, None) => (None, StandIn::Nothing),
        (None, Some(_)) => (None, StandIn::Recorded),
        (Some(request), encoder) => {
            let infos = size::model_infos(loaded)?;
            let latents = size::latent_size(request, args.vae.as_deref(), &infos)?;
            let stand_in = match encoder {
                None => StandIn::Nothing,
                Some(_) => StandIn::RecordedOr(size::stand_in(&infos, latents)),
            };
            (Some(latents), stand_in)
        }
    };
    let mut l = load::<B>(&args.source, loaded, stand_in)?;
    let spec = match size {
        Some(latents) => size::with_size(l.source.spec(), latents),
        None => l.source.spec(),
    };
    // The clip drawn fits the host (shapes recorded in a file stand in for the data's).
    let clip = ClipSize {
        frames: spec.frames,
        height: spec.height,
        width: spec.width,
    };
    size::fits_in_memory(
        spec.channels,
        clip,
        reel_core::memory::host_memory_available(),
    )
    .map_err(anyhow::Error::msg)?;
    if let Some(why) = &l.stand_in {
        eprintln!(
            "reel: {why}: latents {}x{}x{}x{}, text {}x{}",
            spec.channels, spec.frames, spec.height, spec.width, spec.text_len, spec.text_dim
        );
        if args.negative.is_none() {
            eprintln!(
                "reel: without the run's data, guidance's unconditional branch gets zero text \
                 embeddings; --negative \"...\" encodes a negative prompt for it"
            );
        }
    }
    // `load` has checked that the device exists.
    let device = B::device_for(loaded.config.runtime.main_device());
    check_data(&cfg, &spec, &|p| loaded.resolve(p)).map_err(flag_error)?;
    let models = MediaModels::<B::InnerBackend>::load(&cfg, &device).map_err(flag_error)?;
    let prompts = if args.prompts.is_empty() || models.text.is_some() {
        (models.prompts(&cfg, &*l.source, &spec)).map_err(flag_error)?
    } else {
        args.prompts
            .iter()
            .map(|c| {
                l.source
                    .prompt_for(c)
                    .ok_or_else(|| unknown_prompt(&*l.source, c))
            })
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    anyhow::ensure!(!prompts.is_empty(), "no prompts: pass --prompt");
    let captions: Vec<String> = prompts.iter().map(|p| p.caption.clone()).collect();
    if !args.force {
        check_out(&args.out, &captions)?;
    }
    // Made before sampling, so that an --out that cannot be a folder fails in a moment, not
    // after the sampling's minutes.
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("--out: cannot create the folder {}", args.out.display()))?;
    let req = SampleRequest {
        prompts,
        negative: Some((models.negative(&cfg, &*l.source, &spec)).map_err(flag_error)?),
        steps: args.steps,
        guidance: args.guidance,
        seed: args.seed,
        first_index: 0,
        spec,
        progress: Some(step_progress(captions.len())),
    };
    let clips = l.method.sample(&req)?;
    check_clips(&clips, captions.len(), &spec).map_err(anyhow::Error::msg)?;
    let shape = [spec.channels, spec.frames, spec.height, spec.width];
    for (i, (clip, caption)) in clips.iter().zip(&captions).enumerate() {
        let st = args
            .out
            .join(clip_file_name(i, caption))
            .with_extension("safetensors");
        let data = TensorData::new(clip.clone(), shape);
        reel_core::io::write_safetensors(&st, &[("latents".to_string(), data)], None)?;
        println!("{}", st.display());
    }
    if models.decoder.is_none() && spec.channels != 4 {
        eprintln!("reel: wrote latents only: pass --vae <vae folder> to decode them to videos");
        return Ok(());
    }
    if models.decoder.is_some() {
        eprintln!("reel: decoding {} clip(s) with the VAE", clips.len());
    }
    let style = models.style(&spec, &cfg);
    let as_flag = |e| CallbackError::Other(flag_error(e).to_string());
    let frames = (models.frames(&clips, &spec)).map(|f| f.map_err(as_flag));
    for file in write_clips(&args.out, frames, &captions, &captions, &style)? {
        println!("{}", file.display());
    }
    Ok(())
}

/// Refuse an `--out` holding files this sample would write (before the sampling, which
/// takes the time): an earlier sample's, or a run's validation folder.
fn check_out(out: &Path, captions: &[String]) -> anyhow::Result<()> {
    let mut names = vec![SHEET_FILE.to_string()];
    for (i, caption) in captions.iter().enumerate() {
        let gif = PathBuf::from(clip_file_name(i, caption));
        for ext in ["gif", "mp4", "safetensors"] {
            names.push(gif.with_extension(ext).display().to_string());
        }
    }
    let present: Vec<_> = names.iter().filter(|n| out.join(n).exists()).collect();
    if let Some(first) = present.first() {
        anyhow::bail!(
            "--out {} already holds {first}{}, from an earlier sample: pass --force to replace \
             them, or choose another folder",
            out.display(),
            match present.len() {
                1 => String::new(),
                n => format!(" and {} more of this sample's files", n - 1),
            }
        );
    }
    Ok(())
}

/// Run `reel sample`.
pub fn run(args: &SampleArgs) -> anyhow::Result<()> {
    let loaded = read_config(&args.source)?;
    with_backend!(loaded.config.runtime.backend, |B| sample::<B>(
        args, &loaded
    ))
}
