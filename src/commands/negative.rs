//! `reel data negative`: encode a negative prompt with the UMT5 text encoder into the file
//! `[data] negative_embedding` reads ([`reel_plugins::data::negative`]), for a data set made
//! elsewhere (FastVideo's preprocessed sets hold no negative; `reel preprocess` writes one
//! beside its shards). Without it, CFG's unconditional branch runs on zeros.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use burn::tensor::backend::AutodiffBackend;
use reel_core::backend::{BackendName, ReelBackend};
use reel_core::with_backend;
use reel_models::umt5::Umt5TextEncoder;
use reel_plugins::data::negative::{self, encode_negative, WAN_NEGATIVE_PROMPT};

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
    /// The file to write (e.g. `data/my_set/negative.safetensors`). An earlier negative file
    /// there is replaced; any other existing file only with `--force`.
    #[arg(long)]
    pub out: PathBuf,
    /// Replace `--out` even when it is not a negative file.
    #[arg(long)]
    pub force: bool,
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
    super::preprocess::check_text_len(args.text_len)?;
    check_out(&args.out, args.force)?;
    with_backend!(args.backend, |B| encode::<B>(args))
}

/// Refuse an `--out` that exists and is not a negative file (a data shard, a config),
/// unless `force`: it would be replaced. An earlier negative file is replaced, and said so.
fn check_out(out: &Path, force: bool) -> anyhow::Result<()> {
    if out.is_dir() {
        anyhow::bail!(
            "--out {}: is a folder; name the file to write (e.g. {}/{})",
            out.display(),
            out.display(),
            negative::FILE_NAME
        );
    }
    if !out.exists() {
        return Ok(());
    }
    match negative::stored_prompt(out) {
        Some((prompt, tokens)) => {
            let short: String = prompt.chars().take(40).collect();
            eprintln!(
                "reel: replacing the negative file {} (prompt {short:?}{}, {tokens} tokens)",
                out.display(),
                if short.len() < prompt.len() {
                    "..."
                } else {
                    ""
                }
            );
            Ok(())
        }
        None if force => Ok(()),
        None => anyhow::bail!(
            "--out {}: the file exists and is not a negative-prompt file; choose another \
             file, or pass --force to replace it",
            out.display()
        ),
    }
}

fn encode<B: ReelBackend + AutodiffBackend>(args: &NegativeArgs) -> anyhow::Result<()> {
    let start = Instant::now();
    let device = super::device::<B>(args.device, "--device")?;
    let tokenizer =
        super::preprocess::tokenizer_for_encoder(args.tokenizer.as_deref(), &args.text_encoder)?;
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
