//! The `fastvideo_parquet` data source: FastVideo's preprocessed datasets, read as they are.
//!
//! FastVideo's preprocessing writes parquet files (usually many, in nested folders) with one
//! row per clip: `vae_latent_{bytes,shape,dtype}` (the VAE latent `[C, F, H, W]`, raw bytes),
//! `text_embedding_{bytes,shape,dtype}` (the text encoder output `[L, D]`, unpadded) and
//! metadata such as `caption`. Reel reads those columns directly:
//!
//! - latents are decoded to float32 (float32, float16, bfloat16 and float64 are accepted)
//!   and, with `normalize = "wan"` (the default), normalised per channel with the Wan2.1 VAE
//!   statistics, as FastVideo does at train time;
//! - text embeddings are padded with zeros or cropped to `text_len` tokens (default 512, Wan's
//!   text length) with a mask of the real tokens;
//! - every sample must have the latent shape of the first one (FastVideo datasets are
//!   preprocessed at one resolution); a sample that differs is an error naming its file and
//!   record.
//!
//! ```toml
//! [data]
//! kind = "fastvideo_parquet"
//! path = "data/Wan-Syn_77x448x832/combined_parquet_dataset"
//! batch_size = 1
//! ```
//!
//! Files are found recursively under `path` (or `path` is one `.parquet` file) and ordered
//! by path, so sample indices are stable across runs and resumes. `negative_embedding`
//! names a negative-prompt file ([`negative`](super::negative)) for CFG's unconditional
//! branch.

pub mod reader;
pub mod writer;

use std::path::{Path, PathBuf};

use reel_core::config::{check, ConfigError};
use reel_core::data::{DataConfig, DataError, DataSource, DataSpec, Prompt, Sample, TextCondition};
use serde::{Deserialize, Serialize};

use super::files::{find_files, first_prompts};
use super::negative::read_negative;
use super::tensors::StoredDtype;
use super::tensors::{
    all_finite, decode_floats, latent_dims, numel, pad_text, text_dims, LatentNorm,
};
use reader::{Columns, ParquetFile, RawRecord};
pub use writer::{
    write_fastvideo_parquet, FastVideoRecord, MediaInfo, StoredTensor, FASTVIDEO_T2V_SCHEMA,
};

fn default_batch_size() -> usize {
    1
}
fn default_text_len() -> usize {
    512
}
fn default_normalize() -> LatentNorm {
    LatentNorm::Wan
}
fn default_true() -> bool {
    true
}

/// Configuration of the `fastvideo_parquet` source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FastVideoParquetConfig {
    /// A folder searched recursively for `*.parquet`, or one parquet file. Relative paths
    /// are resolved against the working directory, like every path in a run config.
    pub path: PathBuf,
    /// Samples per micro-batch (default 1).
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Text tokens after padding / cropping (default 512).
    #[serde(default = "default_text_len")]
    pub text_len: usize,
    /// Latent normalisation: `"wan"` (default) or `"none"` (latents already normalised).
    #[serde(default = "default_normalize")]
    pub normalize: LatentNorm,
    /// Seeded reshuffle every epoch (default true).
    #[serde(default = "default_true")]
    pub shuffle: bool,
    /// Keep only the first N latent frames of each clip (FastVideo's `num_latent_t`);
    /// default: all stored frames.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_latent_t: Option<usize>,
    /// A negative-prompt embedding file for CFG's unconditional branch (see
    /// [`negative`](crate::data::negative); `reel preprocess` writes one); default none: zeros.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub negative_embedding: Option<PathBuf>,
}

#[reel_core::plugin(
    name = "fastvideo_parquet",
    summary = "FastVideo's preprocessed parquet datasets (vae_latent_* / text_embedding_* columns)"
)]
impl DataConfig for FastVideoParquetConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.path.as_os_str().is_empty() {
            return Err(ConfigError::new(
                "path",
                "expected a folder of parquet files or a .parquet file",
            ));
        }
        check::positive_usize("batch_size", self.batch_size)?;
        if let Some(t) = self.num_latent_t {
            check::positive_usize("num_latent_t", t)?;
        }
        super::tensors::check_text_len(self.text_len)
    }

    fn batch_size(&self) -> usize {
        self.batch_size
    }

    fn shuffle(&self) -> bool {
        self.shuffle
    }

    fn build(&self, base_dir: &Path) -> Result<Box<dyn DataSource>, DataError> {
        Ok(Box::new(
            FastVideoParquetSource::open(
                &base_dir.join(&self.path),
                self.text_len,
                self.normalize,
            )?
            .with_num_latent_t(self.num_latent_t)?
            .with_negative(self.negative_embedding.as_deref(), base_dir)?,
        ))
    }
}

/// A run of rows: one row group of one file.
#[derive(Debug, Clone)]
struct Group {
    file: usize,
    row_group: usize,
    /// Index of the group's first row inside its file.
    first_in_file: usize,
    /// Index of the group's first row in the whole data set.
    start: usize,
}

/// The `fastvideo_parquet` source (see the [module docs](self)).
#[derive(Debug)]
pub struct FastVideoParquetSource {
    /// The parquet files (their columns are located again at each read: a file rewritten
    /// during a run may hold them elsewhere).
    files: Vec<PathBuf>,
    groups: Vec<Group>,
    len: usize,
    spec: DataSpec,
    /// Latent frames as stored (`spec.frames` may be fewer: `num_latent_t`).
    stored_frames: usize,
    normalize: LatentNorm,
    negative: Option<TextCondition>,
}

impl FastVideoParquetSource {
    /// Keep only the first `frames` latent frames (`None`: all). Fails when the data has fewer.
    pub fn with_num_latent_t(mut self, frames: Option<usize>) -> Result<Self, DataError> {
        if let Some(t) = frames {
            if t == 0 || t > self.stored_frames {
                return Err(DataError::Record {
                    file: self.files[0].clone(),
                    record: 0,
                    reason: format!(
                        "num_latent_t = {t}, but the stored latents have {} frames",
                        self.stored_frames
                    ),
                });
            }
            self.spec.frames = t;
        }
        Ok(self)
    }

    /// Read the negative-prompt file `path` (relative to `base_dir`; `None`: none) as the
    /// source's negative text ([`read_negative`]).
    pub fn with_negative(
        mut self,
        path: Option<&Path>,
        base_dir: &Path,
    ) -> Result<Self, DataError> {
        self.negative = path
            .map(|p| read_negative(&base_dir.join(p), &self.spec))
            .transpose()?;
        Ok(self)
    }

    /// Index every parquet file under `path` (footers only) and read the first record for the
    /// data set's shapes.
    pub fn open(path: &Path, text_len: usize, normalize: LatentNorm) -> Result<Self, DataError> {
        let paths = find_files(path, "parquet")?;
        let (mut files, mut groups, mut len) = (Vec::new(), Vec::new(), 0usize);
        for file_path in paths {
            let file_err = |reason: String| DataError::File {
                file: file_path.clone(),
                reason,
            };
            let file = ParquetFile::open(&file_path).map_err(file_err)?;
            Columns::find(file.schema()).map_err(file_err)?;
            let mut first_in_file = 0;
            let row_groups = file.row_group_rows().map_err(file_err)?;
            for (row_group, rows) in row_groups.into_iter().enumerate() {
                if rows > 0 {
                    groups.push(Group {
                        file: files.len(),
                        row_group,
                        first_in_file,
                        start: len,
                    });
                }
                len = len.checked_add(rows).ok_or_else(|| {
                    file_err(format!(
                        "row group {row_group}: more rows in all than can be counted"
                    ))
                })?;
                first_in_file += rows;
            }
            files.push(file_path);
        }
        if len == 0 {
            return Err(DataError::Empty {
                source_name: format!("fastvideo_parquet {}", path.display()),
                reason: format!("{} parquet file(s) with no rows", files.len()),
            });
        }
        let mut source = FastVideoParquetSource {
            files,
            groups,
            len,
            // Placeholder until the first record is read.
            spec: DataSpec {
                channels: 0,
                frames: 0,
                height: 0,
                width: 0,
                text_len,
                text_dim: 0,
            },
            stored_frames: 0,
            normalize,
            negative: None,
        };
        let (file, record, raw) = source.raw(0)?;
        let bad = |reason: String| DataError::Record {
            file: file.clone(),
            record,
            reason,
        };
        let [c, f, h, w] = latent_dims(&raw.latent.1).map_err(bad)?;
        let [_, d] = text_dims(&raw.text.1).map_err(bad)?;
        normalize.check_channels(c).map_err(bad)?;
        source.stored_frames = f;
        source.spec = DataSpec {
            channels: c,
            frames: f,
            height: h,
            width: w,
            text_len,
            text_dim: d,
        };
        Ok(source)
    }

    /// File, record-in-file and raw values of sample `index`.
    fn raw(&self, index: usize) -> Result<(PathBuf, usize, RawRecord), DataError> {
        if index >= self.len {
            return Err(DataError::OutOfRange {
                index,
                len: self.len,
            });
        }
        let g = &self.groups[self.groups.partition_point(|g| g.start <= index) - 1];
        let path = &self.files[g.file];
        let row = index - g.start;
        let record = g.first_in_file + row;
        let raw = ParquetFile::open(path)
            .and_then(|f| f.read(&Columns::find(f.schema())?, g.row_group, row))
            .map_err(|reason| DataError::Record {
                file: path.clone(),
                record,
                reason,
            })?;
        Ok((path.clone(), record, raw))
    }

    /// Number of parquet files found.
    pub fn num_files(&self) -> usize {
        self.files.len()
    }
}

/// Decode one stored tensor, checking its dtype name and byte count.
pub(crate) fn decode_tensor(bytes: &[u8], shape: &[i64], dtype: &str) -> Result<Vec<f32>, String> {
    let stored = StoredDtype::parse(dtype).ok_or_else(|| {
        format!("dtype `{dtype}` is not supported (expected float32, float16, bfloat16 or float64)")
    })?;
    decode_floats(bytes, stored, numel(shape)?)
}

impl DataSource for FastVideoParquetSource {
    fn spec(&self) -> DataSpec {
        self.spec
    }

    fn negative_text(&self) -> Option<TextCondition> {
        self.negative.clone()
    }

    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> Result<Sample, DataError> {
        let (file, record, raw) = self.raw(index)?;
        let bad = |reason: String| DataError::Record {
            file: file.clone(),
            record,
            reason,
        };
        let spec = self.spec;
        let dims = latent_dims(&raw.latent.1).map_err(bad)?;
        let want = [spec.channels, self.stored_frames, spec.height, spec.width];
        if dims != want {
            return Err(bad(format!(
                "vae_latent_shape {:?} differs from the data set's {want:?} (all samples must \
                 share one latent shape)",
                raw.latent.1
            )));
        }
        let mut latents = decode_tensor(&raw.latent.0, &raw.latent.1, &raw.latent.2)
            .map_err(|e| bad(format!("vae_latent_bytes: {e}")))?;
        if spec.frames < self.stored_frames {
            // Keep frames 0..spec.frames of every channel.
            let plane = spec.height * spec.width;
            let (keep, stored) = (spec.frames * plane, self.stored_frames * plane);
            latents = latents
                .chunks(stored)
                .flat_map(|c| c[..keep].iter().copied())
                .collect();
        }
        all_finite("vae_latent_bytes", &latents).map_err(bad)?;
        self.normalize.apply(&mut latents, spec.channels);
        let [seq, dim] = text_dims(&raw.text.1).map_err(bad)?;
        if dim != spec.text_dim {
            return Err(bad(format!(
                "text embedding width {dim} differs from the data set's {}",
                spec.text_dim
            )));
        }
        let text = decode_tensor(&raw.text.0, &raw.text.1, &raw.text.2)
            .map_err(|e| bad(format!("text_embedding_bytes: {e}")))?;
        all_finite("text_embedding_bytes", &text).map_err(bad)?;
        Ok(Sample {
            latents,
            text: pad_text(&text, seq, dim, spec.text_len, None),
            caption: raw.caption,
        })
    }

    /// The first (up to) 4 samples' captions and embeddings.
    fn prompts(&self) -> Vec<Prompt> {
        first_prompts(self, 4)
    }
}

#[cfg(test)]
mod tests;
