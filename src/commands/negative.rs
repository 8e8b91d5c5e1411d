//! `reel data negative`: encode a negative prompt with the UMT5 text encoder into the file
//! `[data] negative_embedding` reads ([`reel_plugins::data::negative`]), for a data set made
//! elsewhere (FastVideo's preprocessed sets hold no negative; `reel preprocess` writes one
//! beside its shards). Without it, CFG's unconditional branch runs on zeros.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use burn::tensor::backend::AutodiffBackend;
use reel_core::backend::{BackendName, ReelBackend};
use reel_core::with_backend;
use reel_models::umt5::{tokenizer_for, Umt5TextEncoder};
use reel_plugins::data::negative::{encode_negative, WAN_NEGATIVE_PROMPT};

/// `reel data negative` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct NegativeArgs {
    /// The UMT5 encoder: a diffusers `text_encoder/` folder (config.json + weights).
    #[arg(long)]
    pub text_encoder: PathBuf,
    /// The tokenizer: `tokenizer.json` or its folder (default: the `tokenizer.json` in the
    /// text encoder's folder, else in the `tokenizer/` folder beside it).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The file to write (e.g. `data/my_set/negative.safetensors`).
    #[arg(long)]
    pub out: PathBuf,
    /// The negative prompt (default: Wan2.1's, as FastVideo and diffusers use it).
    #[arg(long, default_value = WAN_NEGATIVE_PROMPT, hide_default_value = true)]
    pub prompt: String,
    /// Text tokens (Wan: 512; the data's `text_len` pads or crops it on reading).
    #[arg(long, default_value_t = 512)]
    pub text_len: usize,
    /// Backend the encoder runs on: `flex` by default, as `reel preprocess` (UMT5 ran 1.4x
    /// faster there than on `cpu`'s ndarray), `cuda` on a GPU.
    #[arg(long, default_value = "flex")]
    pub backend: BackendName,
    /// Device index (CUDA).
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

/// Run `reel data negative`.
pub fn run(args: &NegativeArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.text_len > 0, "--text-len must be >= 1");
    with_backend!(args.backend, |B| encode::<B>(args))
}

fn encode<B: ReelBackend + AutodiffBackend>(args: &NegativeArgs) -> anyhow::Result<()> {
    let start = Instant::now();
    let device = B::device_for(args.device);
    let tokenizer =
        tokenizer_for(args.tokenizer.as_deref(), &args.text_encoder).context("--tokenizer")?;
    let encoder = Umt5TextEncoder::<B::InnerBackend>::load(tokenizer, &args.text_encoder, &device)
        .context("loading the text encoder")?;
    write(&encoder, &args.prompt, args.text_len, &args.out)?;
    eprintln!(
        "reel: wrote the negative prompt's embedding to {} in {:.1} s; name it in the config: \
         [data] negative_embedding = {:?}",
        args.out.display(),
        start.elapsed().as_secs_f64(),
        args.out.display().to_string()
    );
    Ok(())
}

/// Encode `prompt` and write it to `out` (also used by `reel preprocess`).
pub fn write<B: burn::tensor::backend::Backend>(
    encoder: &Umt5TextEncoder<B>,
    prompt: &str,
    text_len: usize,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    encode_negative(encoder, prompt, text_len, out).with_context(|| {
        format!(
            "writing the negative prompt's embedding to {}",
            out.display()
        )
    })
}
