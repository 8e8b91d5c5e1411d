//! `reel sample`: generate clips for given prompts from a checkpoint and write them as
//! latents (safetensors) and animated GIFs.

use std::path::PathBuf;

use anyhow::Context;
use burn::tensor::TensorData;
use reel_core::backend::ReelBackend;
use reel_core::data::negative_or_zeros;
use reel_core::method::SampleRequest;
use reel_plugins::data::clip_to_rgb;
use reel_plugins::media::{contact_sheet, write_gif, write_png};

use super::inference::{load, read_config, Source};
use reel_core::with_backend;

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
    /// Guidance scale (method default when omitted).
    #[arg(long)]
    guidance: Option<f64>,
    /// Noise seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output folder.
    #[arg(long, default_value = "samples")]
    out: PathBuf,
}

fn sample<B: ReelBackend>(
    args: &SampleArgs,
    loaded: &reel_core::config::LoadedConfig,
) -> anyhow::Result<()> {
    let mut l = load::<B>(&args.source, loaded)?;
    let spec = l.source.spec();
    let prompts = if args.prompts.is_empty() {
        l.source.prompts()
    } else {
        args.prompts
            .iter()
            .map(|c| {
                l.source
                    .prompt_for(c)
                    .with_context(|| format!("the data source cannot embed the prompt `{c}`"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    anyhow::ensure!(!prompts.is_empty(), "no prompts: pass --prompt");
    let req = SampleRequest {
        prompts: prompts.clone(),
        negative: Some(negative_or_zeros(&*l.source)),
        steps: args.steps,
        guidance: args.guidance,
        seed: args.seed,
        spec,
    };
    let clips = l.method.sample(&req)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    for (i, (clip, p)) in clips.iter().zip(&prompts).enumerate() {
        let stem = format!("{i:02}-{}", p.caption.replace(' ', "_"));
        let data = TensorData::new(
            clip.clone(),
            [spec.channels, spec.frames, spec.height, spec.width],
        );
        let st = args.out.join(format!("{stem}.safetensors"));
        reel_core::io::write_safetensors(&st, &[("latents".to_string(), data)], None)?;
        if spec.channels == 4 {
            let gif = args.out.join(format!("{stem}.gif"));
            write_gif(
                &gif,
                &clip_to_rgb(clip, &spec),
                spec.width,
                spec.height,
                8,
                12,
            )?;
        }
        println!("{}", args.out.join(&stem).display());
    }
    if spec.channels == 4 {
        let rgb: Vec<_> = clips.iter().map(|c| clip_to_rgb(c, &spec)).collect();
        let labels: Vec<String> = prompts.iter().map(|p| p.caption.clone()).collect();
        let (sheet, w, h) = contact_sheet(&rgb, &labels, spec.width, spec.height, 8);
        let path = args.out.join("sheet.png");
        write_png(&path, &sheet, w, h)?;
        println!("{}", path.display());
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
