//! `reel data export`: write a config's data set to files in one of the formats Reel reads
//! (FastVideo parquet or a folder of per-sample safetensors). Turns the built-in synthetic
//! data into a file data set (to try the file sources, or as test data), or converts one
//! format into the other. `reel data negative` is in [`super::negative`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use reel_core::config::load_run_config;
use reel_core::data::{DataSource, Sample};
use reel_core::io::replace_file_with;
use reel_plugins::data::fastvideo::{write_fastvideo_parquet, FastVideoRecord, StoredTensor};
use safetensors::tensor::TensorView;
use safetensors::Dtype;

/// `reel data` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum DataCommand {
    /// Write the config's data set (as its source yields it: normalised latents, unpadded
    /// text) to files. Read them back with `normalize = "none"`.
    Export(ExportDataArgs),
    /// Encode a negative prompt (default: Wan2.1's) with the UMT5 text encoder into the
    /// file `[data] negative_embedding` names, for CFG's unconditional branch.
    Negative(super::negative::NegativeArgs),
}

/// File formats `reel data export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// FastVideo's preprocessed parquet schema (`kind = "fastvideo_parquet"`).
    Parquet,
    /// One safetensors file per sample (`kind = "safetensors"`).
    Safetensors,
}

/// `reel data export` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ExportDataArgs {
    /// The run config whose `[data]` section is exported.
    pub config: PathBuf,
    /// Output folder (created; must not already hold files of the chosen format).
    #[arg(long)]
    pub to: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Parquet)]
    pub format: Format,
    /// Export only the first N samples (default: all).
    #[arg(long)]
    pub samples: Option<usize>,
    /// Parquet: samples per file (each file one row group).
    #[arg(long, default_value_t = 256)]
    pub rows_per_file: usize,
    /// Override a config value (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
}

/// Run a `reel data` subcommand.
pub fn run(cmd: &DataCommand) -> anyhow::Result<()> {
    match cmd {
        DataCommand::Export(args) => export(args),
        DataCommand::Negative(args) => super::negative::run(args),
    }
}

/// The real tokens of a sample's text (the mask's `true` count, from the start).
fn real_tokens(s: &Sample) -> usize {
    s.text.mask.iter().filter(|&&m| m).count()
}

fn export(args: &ExportDataArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.rows_per_file > 0, "--rows-per-file must be at least 1");
    anyhow::ensure!(args.samples != Some(0), "--samples must be at least 1");
    let loaded = load_run_config(&args.config, &args.set)?;
    let source = loaded
        .config
        .data
        .build(&loaded.base_dir)
        .with_context(|| format!("opening the data of {}", args.config.display()))?;
    let n = args.samples.unwrap_or(source.len()).min(source.len());
    // A parquet file's rows are held until it is written (a safetensors file's one sample):
    // they must fit, or reading them would abort the process.
    let held = match args.format {
        Format::Parquet => n.min(args.rows_per_file).max(1),
        Format::Safetensors => 1,
    };
    let memory = reel_core::memory::host_memory_available();
    let advice = "check the data's sizes, or pass a smaller --rows-per-file (the rows of one \
                  parquet file are held until it is written)";
    if let Err(why) = reel_core::memory::samples_fit(&source.spec(), held, memory, advice) {
        anyhow::bail!("{}: the export holds {why}", args.config.display());
    }
    let ext = match args.format {
        Format::Parquet => "parquet",
        Format::Safetensors => "safetensors",
    };
    let existed = args.to.exists();
    std::fs::create_dir_all(&args.to).with_context(|| format!("creating {}", args.to.display()))?;
    let clash = std::fs::read_dir(&args.to)?
        .filter_map(Result::ok)
        .any(|e| e.path().extension().is_some_and(|x| x == ext));
    anyhow::ensure!(
        !clash,
        "{} already holds .{ext} files: choose an empty folder",
        args.to.display()
    );
    let start = Instant::now();
    let mut written = Vec::new();
    let result = match args.format {
        Format::Parquet => write_parquet(
            source.as_ref(),
            n,
            args.rows_per_file,
            &args.to,
            &mut written,
        ),
        Format::Safetensors => write_safetensors(source.as_ref(), n, &args.to, &mut written),
    };
    if let Err(e) = result {
        // A part of the data set would read as a whole one, and block the next try.
        let removed = written
            .iter()
            .filter(|f| std::fs::remove_file(f).is_ok())
            .count();
        if !existed {
            let _ = std::fs::remove_dir(&args.to);
        }
        return Err(e.context(format!(
            "the export stopped; the {removed} file(s) it had written to {} were removed",
            args.to.display()
        )));
    }
    let spec = source.spec();
    eprintln!(
        "reel: wrote {n} samples ([{}, {}, {}, {}] latents, text width {}) as {ext} to {} in {:.1} s",
        spec.channels,
        spec.frames,
        spec.height,
        spec.width,
        spec.text_dim,
        args.to.display(),
        start.elapsed().as_secs_f64()
    );
    // `fastvideo_parquet` normalises with the Wan statistics by default: these latents are
    // the source's output, normalised already where it normalises.
    let kind = match args.format {
        Format::Parquet => "fastvideo_parquet",
        Format::Safetensors => "safetensors",
    };
    eprintln!(
        "reel: read them with `[data] kind = \"{kind}\"`, `path = \"{}\"` and \
         `normalize = \"none\"` (the latents are as the source yields them)",
        args.to.display()
    );
    Ok(())
}

fn write_parquet(
    source: &dyn DataSource,
    n: usize,
    per_file: usize,
    to: &Path,
    written: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    let spec = source.spec();
    let shape = [spec.channels, spec.frames, spec.height, spec.width];
    for (file_index, first) in (0..n).step_by(per_file).enumerate() {
        let records = (first..(first + per_file).min(n))
            .map(|i| {
                let s = source.get(i)?;
                let tokens = real_tokens(&s);
                Ok(FastVideoRecord {
                    id: format!("{i:08}"),
                    latent: StoredTensor::f32(&s.latents, &shape),
                    text_embedding: StoredTensor::f32(
                        &s.text.embedding[..tokens * spec.text_dim],
                        &[tokens, spec.text_dim],
                    ),
                    caption: s.caption,
                    media: None,
                })
            })
            .collect::<Result<Vec<_>, reel_core::data::DataError>>()?;
        // Written whole, so a crash leaves no half file that the reader would pick up.
        let path = to.join(format!("data_{file_index:05}.parquet"));
        write_fastvideo_parquet(&path, &records, per_file)
            .with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(())
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn write_safetensors(
    source: &dyn DataSource,
    n: usize,
    to: &Path,
    written: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    let spec = source.spec();
    for i in 0..n {
        let s = source.get(i)?;
        let tokens = real_tokens(&s);
        let latents = f32_bytes(&s.latents);
        let text = f32_bytes(&s.text.embedding[..tokens * spec.text_dim]);
        let shape = vec![spec.channels, spec.frames, spec.height, spec.width];
        let tensors = vec![
            ("latents", TensorView::new(Dtype::F32, shape, &latents)?),
            (
                "text_embedding",
                TensorView::new(Dtype::F32, vec![tokens, spec.text_dim], &text)?,
            ),
        ];
        let meta = HashMap::from([("caption".to_string(), s.caption.clone())]);
        let path = to.join(format!("{i:08}.safetensors"));
        replace_file_with(
            &path,
            |tmp| safetensors::serialize_to_file(tensors, Some(meta), tmp),
            safetensors::SafeTensorError::IoError,
        )
        .with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(())
}
