//! `reel preprocess`: a folder of clips and captions to a FastVideo-format parquet data set
//! (`kind = "fastvideo_parquet"` reads it, and so does FastVideo), with the Wan VAE and the
//! UMT5 text encoder in Rust.
//!
//! Items (see [`inputs`]) are sorted by path and written in shards of `--rows-per-file`
//! items, `data_<k>.parquet`, each under a temporary name and renamed when complete. A run
//! that stops resumes by skipping the finished shards ([`resume`]: the settings and the clip
//! list must be those of the run that wrote them). An item that cannot be read or encoded is
//! reported on one line naming the file and left out; the run goes on, and a later run
//! redoes its shard when a clip or caption of it changed, or with `--retry-failed`. The
//! negative prompt (`--negative`, default Wan2.1's) is encoded into
//! `negative.safetensors` beside the shards, for `[data] negative_embedding`.

pub mod encode;
pub mod inputs;
pub mod resume;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use burn::tensor::backend::AutodiffBackend;
use indicatif::ProgressBar;
use reel_core::backend::{BackendName, ReelBackend};
use reel_core::with_backend;
use reel_models::umt5::{tokenizer_for, Umt5Config, Umt5TextEncoder, MAX_TEXT_LEN};
use reel_models::vae::{Tiling, WanVae, WanVaeConfig};
use reel_plugins::data::fastvideo::FastVideoRecord;
use reel_plugins::data::negative::{self, WAN_NEGATIVE_PROMPT};
use reel_plugins::media::decode::MAX_CLIP_BYTES;

use super::progress::{self, say};
use crate::cli::error_line;
use encode::{Encoders, Target};
use inputs::Item;
use resume::{Shard, ShardState};

/// `reel preprocess` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct PreprocessArgs {
    /// Folder of clips: videos (with FFmpeg installed), GIFs, PNG and JPEG images, folders of
    /// PNG/JPEG frames; captions in sidecar `.txt` files or `--captions`.
    pub input: PathBuf,
    /// Output folder for the parquet shards.
    #[arg(long)]
    pub out: PathBuf,
    /// The Wan VAE: a diffusers `vae/` folder (config.json + weights).
    #[arg(long)]
    pub vae: PathBuf,
    /// The UMT5 encoder: a diffusers `text_encoder/` folder (config.json + weights).
    #[arg(long)]
    pub text_encoder: PathBuf,
    /// The tokenizer: `tokenizer.json` or its folder (default: the `tokenizer.json` in the
    /// text encoder's folder, else in the `tokenizer/` folder beside it, as diffusers lays
    /// a model out).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Caption list (JSON or CSV with `path` and `caption`), instead of sidecar files.
    #[arg(long)]
    pub captions: Option<PathBuf>,
    /// Frames per video clip: `1 + 4k` (Wan: 81; FastVideo's recipes: 77).
    #[arg(long, default_value_t = 81)]
    pub frames: usize,
    /// Frame height in pixels (a multiple of the VAE's spatial compression, 8).
    #[arg(long, default_value_t = 480)]
    pub height: usize,
    /// Frame width in pixels.
    #[arg(long, default_value_t = 832)]
    pub width: usize,
    /// Sample frames at this rate (frames per second); 0 keeps every frame.
    #[arg(long, default_value_t = 16.0)]
    pub fps: f64,
    /// Text tokens per prompt (Wan: 512).
    #[arg(long, default_value_t = 512)]
    pub text_len: usize,
    /// Clips per parquet file.
    #[arg(long, default_value_t = 64)]
    pub rows_per_file: usize,
    /// Encode the VAE in spatial tiles of this many pixels (for large frames on small GPUs).
    #[arg(long)]
    pub tile: Option<usize>,
    /// The negative prompt of classifier-free guidance, encoded into `<out>/negative.safetensors`
    /// for `[data] negative_embedding` (default: Wan2.1's, as FastVideo and diffusers use it).
    #[arg(long, default_value = WAN_NEGATIVE_PROMPT, hide_default_value = true)]
    pub negative: String,
    /// Backend the encoders run on: `flex` by default (on a CPU, the VAE ran 6x and UMT5 1.4x
    /// faster there than on `cpu`'s ndarray; docs/performance.md), `cuda` on a GPU.
    #[arg(long, default_value = "flex")]
    pub backend: BackendName,
    /// Device index (CUDA).
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// Try again the clips an earlier run left out with an error (listed in
    /// `data_*.failed.txt`), though neither they nor their captions changed: for failures
    /// that may pass now (FFmpeg installed since, say). Without it, a shard is redone only
    /// when one of its clips or captions changed.
    #[arg(long)]
    pub retry_failed: bool,
}

/// The most frames a clip is sampled to (`--frames`): 4 minutes at 16 fps.
pub const MAX_FRAMES: usize = 4097;

/// The largest `--height` / `--width` in pixels (8K video is 7680 wide).
pub const MAX_SIDE: usize = 8192;

/// `--text-len` (here and in `reel data negative`): at least 1, at most [`MAX_TEXT_LEN`].
pub fn check_text_len(text_len: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=MAX_TEXT_LEN).contains(&text_len),
        "--text-len {text_len}: text tokens per prompt, from 1 to {MAX_TEXT_LEN} (Wan: 512)"
    );
    Ok(())
}

/// The tokenizer for the text encoder folder `encoder`: `given`, else the one beside it. The
/// folder is checked first (its `config.json` is a UMT5's), so that a wrong `--text-encoder`
/// is blamed, not the tokenizer it has none of.
pub fn tokenizer_for_encoder(given: Option<&Path>, encoder: &Path) -> anyhow::Result<PathBuf> {
    Umt5Config::from_json_file(encoder.join("config.json")).with_context(|| {
        format!(
            "--text-encoder {}: not a diffusers `text_encoder/` folder",
            encoder.display()
        )
    })?;
    tokenizer_for(given, encoder).context("--tokenizer")
}

impl PreprocessArgs {
    fn target(&self) -> anyhow::Result<Target> {
        anyhow::ensure!(
            self.frames % 4 == 1 && self.frames <= MAX_FRAMES,
            "--frames {}: the Wan VAE encodes 1 + 4k frames (e.g. 81), at most {MAX_FRAMES}",
            self.frames
        );
        for (flag, side) in [("--height", self.height), ("--width", self.width)] {
            anyhow::ensure!(
                (1..=MAX_SIDE).contains(&side),
                "{flag} {side}: pixels, from 1 to {MAX_SIDE}"
            );
        }
        anyhow::ensure!(
            self.fps.is_finite() && self.fps >= 0.0,
            "--fps {}: a rate in frames per second, or 0 for every frame",
            self.fps
        );
        anyhow::ensure!(self.rows_per_file > 0, "--rows-per-file must be >= 1");
        check_text_len(self.text_len)?;
        let bytes = (self.frames * self.height * self.width).saturating_mul(3);
        anyhow::ensure!(
            bytes <= MAX_CLIP_BYTES,
            "--frames {} --height {} --width {}: a clip of that size is {:.1} GiB of pixels, \
             more than the {} GiB one clip may take",
            self.frames,
            self.height,
            self.width,
            bytes as f64 / (1u64 << 30) as f64,
            MAX_CLIP_BYTES >> 30
        );
        Ok(Target {
            frames: self.frames,
            height: self.height,
            width: self.width,
            fps: (self.fps > 0.0).then_some(self.fps),
            text_len: self.text_len,
        })
    }

    /// `--tokenizer`, else the tokenizer beside `--text-encoder` ([`tokenizer_for`]).
    fn tokenizer(&self) -> anyhow::Result<PathBuf> {
        tokenizer_for_encoder(self.tokenizer.as_deref(), &self.text_encoder)
    }

    /// What a resumed run must share with the run that wrote the folder: the settings (paths
    /// as absolute paths where they exist, so that a resume from another folder matches) and
    /// the clips' names in shard order. `run` has filled in the tokenizer it found.
    fn settings(&self, items: &[Item]) -> serde_json::Value {
        let abs = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        let names: Vec<String> = items.iter().map(Item::name).collect();
        serde_json::json!({
            "input": abs(&self.input), "captions": self.captions.as_deref().map(abs),
            "vae": abs(&self.vae), "text_encoder": abs(&self.text_encoder),
            "tokenizer": self.tokenizer.as_deref().map(abs), "frames": self.frames,
            "height": self.height,
            "width": self.width, "fps": self.fps, "text_len": self.text_len,
            "rows_per_file": self.rows_per_file, "items": names,
        })
    }
}

/// Run `reel preprocess`.
pub fn run(args: &PreprocessArgs) -> anyhow::Result<()> {
    let target = args.target()?;
    // Before the models load (UMT5-XXL alone is tens of GB): a size the VAE cannot encode
    // exactly is refused from its config.
    let vae = WanVaeConfig::of_pretrained(&args.vae).context("loading the VAE")?;
    let s = vae.spatial_factor();
    anyhow::ensure!(
        target.height.is_multiple_of(s) && target.width.is_multiple_of(s),
        "--height {} and --width {} must be multiples of the VAE's spatial compression, {s} \
         ({})",
        target.height,
        target.width,
        args.vae.display()
    );
    // The tokenizer found once, for the resume check's settings and the encoder.
    let args = &PreprocessArgs {
        tokenizer: Some(args.tokenizer()?),
        ..args.clone()
    };
    let items = inputs::discover(&args.input, args.captions.as_deref(), &args.out)?;
    inputs::one_shape(&args.input, &items, target.frames)?;
    let settings = args.settings(&items);
    resume::check(&args.out, &settings)?;
    with_backend!(args.backend, |B| preprocess::<B>(
        args, &target, &items, &settings
    ))
}

fn load<B: ReelBackend>(args: &PreprocessArgs) -> anyhow::Result<Encoders<B::InnerBackend>> {
    let device = super::device::<B>(args.device, "--device")?;
    let vae = WanVae::load(&args.vae, &device).context("loading the VAE")?;
    let text = Umt5TextEncoder::load(args.tokenizer()?, &args.text_encoder, &device)
        .context("loading the text encoder")?;
    let s = vae.config.spatial_factor();
    let tiling = (args.tile.map(|t| Tiling::overlapping(t, s)).transpose()).context("--tile")?;
    Ok(Encoders {
        vae,
        text,
        tiling,
        device,
    })
}

fn preprocess<B: ReelBackend + AutodiffBackend>(
    args: &PreprocessArgs,
    target: &Target,
    items: &[Item],
    settings: &serde_json::Value,
) -> anyhow::Result<()> {
    let enc = load::<B>(args)?;
    // A resumed run keeps the negative file it wrote; one made with another prompt, length or
    // text encoder (a run stopped before its first shard, resumed with other models) is
    // replaced.
    let same_models = resume::recorded_as(&args.out, settings);
    // Written before the new settings are recorded: a run stopped between the two must not
    // leave the old encoder's negative under the new settings, where it would be kept.
    let negative = args.out.join(negative::FILE_NAME);
    let stored = negative::stored_prompt(&negative);
    // A negative newer than the recorded settings was written by a run that stopped before
    // recording its own (its models may be other than those recorded): it is made again.
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let unrecorded = modified(&negative) > modified(&args.out.join(resume::SETTINGS_FILE));
    let same = stored.as_ref() == Some(&(args.negative.clone(), target.text_len));
    if !same_models || !same || unrecorded {
        let why = if same_models && same {
            // Also a copy of the folder that did not keep file times.
            "it is newer than the recorded settings (a run stopped before recording them)"
        } else {
            "it was made with another negative prompt, --text-len or text encoder"
        };
        if stored.is_some() {
            eprintln!("reel: replacing {}: {why}", negative.display());
        }
        super::negative::write(&enc.text, &args.negative, target.text_len, &negative)?;
    }
    // Only now, with the models loaded, is the folder taken over: the shards of clips or
    // captions changed since are marked for redoing before the new stamps are recorded.
    let stamps: Vec<Vec<(String, String)>> = items
        .chunks(args.rows_per_file)
        .map(|chunk| chunk.iter().map(|i| (i.name(), i.stamp())).collect())
        .collect();
    resume::redo_changed(&args.out, &stamps)?;
    let mut recorded = settings.clone();
    recorded[resume::STAMPS] = stamps.iter().flatten().cloned().collect();
    resume::record(&args.out, &recorded)?;
    let start = Instant::now();
    let bar = progress::bar(items.len() as u64, "clips");
    let mut count = Counts::default();
    for (k, chunk) in items.chunks(args.rows_per_file).enumerate() {
        let shard = Shard::new(&args.out, k);
        let why = match shard.state(chunk.len()) {
            ShardState::Done => {
                count.skipped += chunk.len();
                bar.inc(chunk.len() as u64);
                continue;
            }
            ShardState::Failed(n) if !args.retry_failed => {
                count.skipped += chunk.len() - n;
                count.left_out += n;
                bar.inc(chunk.len() as u64);
                continue;
            }
            ShardState::Failed(_) => "--retry-failed".to_string(),
            ShardState::Redo(why) => why,
        };
        if shard.path.exists() || shard.failed.exists() {
            say(
                &bar,
                format!("reel: redoing {}: {why}", shard.path.display()),
            );
        }
        let (records, failures) = encode_chunk(&enc, chunk, k * args.rows_per_file, target, &bar);
        shard.save(&records, &failures)?;
        count.failed += failures.len();
        count.written += records.len();
        if bar.is_hidden() {
            // A log file or a pipe shows no bar: a line per shard written says how far it is.
            let elapsed = start.elapsed().as_secs_f64();
            eprintln!(
                "reel: wrote {} ({}/{} clips, {elapsed:.0} s)",
                shard.path.display(),
                bar.position(),
                items.len()
            );
        }
    }
    bar.finish_and_clear();
    eprintln!(
        "reel: preprocessed {} clips into {} in {:.1} s ({}); the negative prompt's embedding \
         is {} ([data] negative_embedding)",
        count.written,
        args.out.display(),
        start.elapsed().as_secs_f64(),
        count.summary(&args.out),
        negative.display()
    );
    anyhow::ensure!(
        count.written + count.skipped > 0,
        "no clip could be preprocessed ({} failed, {} left out by earlier runs)",
        count.failed,
        count.left_out
    );
    Ok(())
}

/// What one run of `reel preprocess` did with the clips.
#[derive(Default)]
struct Counts {
    /// Clips encoded and written by this run.
    written: usize,
    /// Clips in shards an earlier run wrote, skipped.
    skipped: usize,
    /// Clips this run left out with an error.
    failed: usize,
    /// Clips an earlier run left out with an error, not tried again.
    left_out: usize,
}

impl Counts {
    /// "3 already there, 1 skipped with errors; ..." with where the failures are listed and
    /// when they are tried again.
    fn summary(&self, out: &Path) -> String {
        let mut s = format!(
            "{} already there, {} skipped with errors",
            self.skipped, self.failed
        );
        if self.left_out > 0 {
            s += &format!(", {} left out by an earlier run", self.left_out);
        }
        if self.failed + self.left_out > 0 {
            s += &format!(
                "; they are listed in {}/data_*.failed.txt, and a later run tries one again \
                 when it or its caption changes, or all with --retry-failed",
                out.display()
            );
        }
        s
    }
}

/// The rows of `chunk`'s items (the first one's index is `first`), and one line per item
/// that failed, each also said on stderr.
fn encode_chunk<B: burn::tensor::backend::Backend>(
    enc: &Encoders<B>,
    chunk: &[Item],
    first: usize,
    target: &Target,
    bar: &ProgressBar,
) -> (Vec<FastVideoRecord>, Vec<String>) {
    let mut records = Vec::with_capacity(chunk.len());
    let mut failures = Vec::new();
    for (i, item) in chunk.iter().enumerate() {
        match enc.record(item, first + i, target) {
            Ok(r) => records.push(r),
            Err(e) => {
                // Media errors name the file already.
                let (path, msg) = (item.path.display().to_string(), error_line(&e));
                let line = match msg.starts_with(&path) {
                    true => msg,
                    false => format!("{path}: {msg}"),
                };
                say(bar, format!("reel: skipped {line}"));
                failures.push(line);
            }
        }
        bar.inc(1);
    }
    (records, failures)
}
