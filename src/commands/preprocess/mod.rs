//! `reel preprocess`: a folder of clips and captions to a FastVideo-format parquet data set
//! (`kind = "fastvideo_parquet"` reads it, and so does FastVideo), with the Wan VAE and the
//! UMT5 text encoder in Rust.
//!
//! Items (see [`inputs`]) are sorted by path and written in shards of `--rows-per-file`
//! items, `data_<k>.parquet`, each under a temporary name and renamed when complete. A run
//! that stops resumes by skipping the shards already there; `preprocess.json` records the
//! settings, and a resume with other settings is refused. An item that cannot be read or
//! encoded is reported on one line naming the file and left out; the run goes on.

pub mod encode;
pub mod inputs;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use burn::tensor::backend::AutodiffBackend;
use indicatif::{ProgressBar, ProgressStyle};
use reel_core::backend::{BackendName, ReelBackend};
use reel_core::with_backend;
use reel_models::umt5::Umt5TextEncoder;
use reel_models::vae::{Tiling, WanVae};
use reel_plugins::data::fastvideo::write_fastvideo_parquet;

use encode::{Encoders, Target};

/// File recording a preprocessing run's settings, in the output folder.
pub const SETTINGS_FILE: &str = "preprocess.json";

/// `reel preprocess` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct PreprocessArgs {
    /// Folder of clips: videos (with FFmpeg installed), GIFs, PNG images, folders of PNG
    /// frames; captions in sidecar `.txt` files or `--captions`.
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
    /// The tokenizer: `tokenizer.json` or its folder (`tokenizer/`).
    #[arg(long)]
    pub tokenizer: PathBuf,
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
    /// Backend the encoders run on.
    #[arg(long, default_value = "cpu")]
    pub backend: BackendName,
    /// Device index (CUDA).
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

impl PreprocessArgs {
    fn target(&self) -> anyhow::Result<Target> {
        anyhow::ensure!(
            self.frames % 4 == 1,
            "--frames {}: the Wan VAE encodes 1 + 4k frames (e.g. 81)",
            self.frames
        );
        anyhow::ensure!(
            self.height > 0 && self.width > 0,
            "--height and --width must be >= 1"
        );
        anyhow::ensure!(self.rows_per_file > 0, "--rows-per-file must be >= 1");
        anyhow::ensure!(self.text_len > 0, "--text-len must be >= 1");
        if let Some(t) = self.tile {
            anyhow::ensure!(
                t >= 16 && t % 8 == 0,
                "--tile {t}: a multiple of 8, at least 16"
            );
        }
        Ok(Target {
            frames: self.frames,
            height: self.height,
            width: self.width,
            fps: (self.fps > 0.0).then_some(self.fps),
            text_len: self.text_len,
        })
    }

    /// What a resumed run must share with the run that wrote the folder.
    fn settings(&self) -> serde_json::Value {
        serde_json::json!({
            "input": self.input, "captions": self.captions, "vae": self.vae,
            "text_encoder": self.text_encoder, "tokenizer": self.tokenizer,
            "frames": self.frames, "height": self.height, "width": self.width,
            "fps": self.fps, "text_len": self.text_len, "rows_per_file": self.rows_per_file,
        })
    }
}

/// Run `reel preprocess`.
pub fn run(args: &PreprocessArgs) -> anyhow::Result<()> {
    let target = args.target()?;
    let items = inputs::discover(&args.input, args.captions.as_deref())?;
    check_settings(&args.out, &args.settings())?;
    with_backend!(args.backend, |B| preprocess::<B>(args, &target, &items))
}

/// Create `out` and record the settings, or check them against a previous run's.
fn check_settings(out: &Path, settings: &serde_json::Value) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let path = out.join(SETTINGS_FILE);
    if let Ok(text) = std::fs::read_to_string(&path) {
        let before: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
        anyhow::ensure!(
            &before == settings,
            "{} was written with other settings ({before}); use another --out folder",
            path.display()
        );
        return Ok(());
    }
    std::fs::write(&path, serde_json::to_string_pretty(settings)?)
        .with_context(|| format!("cannot write {}", path.display()))
}

fn load<B: ReelBackend>(args: &PreprocessArgs) -> anyhow::Result<Encoders<B::InnerBackend>> {
    let device = B::device_for(args.device);
    let vae = WanVae::load(&args.vae, &device).context("loading the VAE")?;
    let text = Umt5TextEncoder::load(&args.tokenizer, &args.text_encoder, &device)
        .context("loading the text encoder")?;
    let tiling = args.tile.map(Tiling::overlapping);
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
    items: &[inputs::Item],
) -> anyhow::Result<()> {
    let enc = load::<B>(args)?;
    let start = Instant::now();
    let bar = progress_bar(items.len() as u64);
    let (mut written, mut skipped, mut failed) = (0, 0, 0);
    for (k, shard) in items.chunks(args.rows_per_file).enumerate() {
        let path = args.out.join(format!("data_{k:05}.parquet"));
        if path.is_file() {
            skipped += shard.len();
            bar.inc(shard.len() as u64);
            continue;
        }
        let mut records = Vec::with_capacity(shard.len());
        for (i, item) in shard.iter().enumerate() {
            match enc.record(item, k * args.rows_per_file + i, target) {
                Ok(r) => records.push(r),
                Err(e) => {
                    failed += 1;
                    let line = format!("reel: skipped {}: {e:#}", item.path.display());
                    if bar.is_hidden() {
                        eprintln!("{line}");
                    } else {
                        bar.println(line);
                    }
                }
            }
            bar.inc(1);
        }
        if records.is_empty() {
            continue;
        }
        let tmp = args.out.join(format!(".data_{k:05}.parquet.tmp"));
        write_fastvideo_parquet(&tmp, &records, records.len())
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
        written += records.len();
    }
    bar.finish_and_clear();
    eprintln!(
        "reel: preprocessed {written} clips into {} in {:.1} s ({skipped} already there, \
         {failed} skipped with errors)",
        args.out.display(),
        start.elapsed().as_secs_f64()
    );
    anyhow::ensure!(
        written + skipped > 0,
        "no clip could be preprocessed ({failed} failed)"
    );
    Ok(())
}

/// A progress bar on a terminal, hidden otherwise (errors still print, one per line).
fn progress_bar(n: u64) -> ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template("{bar:30} {pos}/{len} clips, {elapsed} (ETA {eta})")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    ProgressBar::new(n).with_style(style)
}
