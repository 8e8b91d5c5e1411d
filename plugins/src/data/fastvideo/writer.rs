//! Writing parquet files in FastVideo's preprocessed text-to-video schema (what
//! `pyarrow_schema_t2v` describes), for tests, fixtures and data conversion.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

/// FastVideo's text-to-video schema as pyarrow writes it (nullable fields, 3-level lists).
pub const FASTVIDEO_T2V_SCHEMA: &str = "
message schema {
  optional binary id (STRING);
  optional binary vae_latent_bytes;
  optional group vae_latent_shape (LIST) { repeated group list { optional int64 element; } }
  optional binary vae_latent_dtype (STRING);
  optional binary text_embedding_bytes;
  optional group text_embedding_shape (LIST) { repeated group list { optional int64 element; } }
  optional binary text_embedding_dtype (STRING);
  optional binary file_name (STRING);
  optional binary caption (STRING);
  optional binary media_type (STRING);
  optional int64 width;
  optional int64 height;
  optional int64 num_frames;
  optional double duration_sec;
  optional double fps;
}";

/// A tensor as FastVideo stores it: raw little-endian bytes, shape and dtype name.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredTensor {
    /// Raw bytes.
    pub bytes: Vec<u8>,
    /// Shape.
    pub shape: Vec<i64>,
    /// Dtype name, e.g. `float32`.
    pub dtype: String,
}

impl StoredTensor {
    /// A float32 tensor.
    pub fn f32(values: &[f32], shape: &[usize]) -> Self {
        StoredTensor {
            bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            shape: shape.iter().map(|&d| d as i64).collect(),
            dtype: "float32".into(),
        }
    }
}

/// One row of a FastVideo parquet file.
#[derive(Debug, Clone, PartialEq)]
pub struct FastVideoRecord {
    /// Sample id.
    pub id: String,
    /// VAE latent `[C, F, H, W]`.
    pub latent: StoredTensor,
    /// Text embedding `[L, D]` (unpadded).
    pub text_embedding: StoredTensor,
    /// Caption.
    pub caption: String,
    /// The source media's description; `None` writes the id as `file_name`, `video` as
    /// `media_type`, the latent's size as `width`/`height`/`num_frames` and zero rates.
    pub media: Option<MediaInfo>,
}

/// FastVideo's per-row description of the source clip.
#[derive(Debug, Clone, PartialEq)]
pub struct MediaInfo {
    /// The source file's name.
    pub file_name: String,
    /// `video` or `image`.
    pub media_type: String,
    /// Width of the processed frames in pixels.
    pub width: i64,
    /// Height of the processed frames in pixels.
    pub height: i64,
    /// Number of processed frames.
    pub num_frames: i64,
    /// Duration of the processed frames in seconds (0 when the rate is unknown).
    pub duration_sec: f64,
    /// Frame rate of the processed frames (0 when unknown).
    pub fps: f64,
}

/// Write `records` to `path` in FastVideo's schema, `rows_per_group` rows per row group
/// (at least 1), snappy-compressed as pyarrow does by default. The file is written whole
/// ([`reel_core::io::replace_file_with`]): a crash leaves no cut shard for a reader to take.
pub fn write_fastvideo_parquet(
    path: &Path,
    records: &[FastVideoRecord],
    rows_per_group: usize,
) -> Result<(), parquet::errors::ParquetError> {
    let external = |e: std::io::Error| parquet::errors::ParquetError::External(e.into());
    reel_core::io::replace_file_with(
        path,
        |tmp| write_file(tmp, records, rows_per_group),
        external,
    )
}

fn write_file(
    path: &Path,
    records: &[FastVideoRecord],
    rows_per_group: usize,
) -> Result<(), parquet::errors::ParquetError> {
    let schema = Arc::new(parse_message_type(FASTVIDEO_T2V_SCHEMA)?);
    let props = Arc::new(
        WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .build(),
    );
    let file = File::create(path).map_err(|e| parquet::errors::ParquetError::External(e.into()))?;
    let mut writer = SerializedFileWriter::new(file, schema, props)?;
    for group in records.chunks(rows_per_group.max(1)) {
        let mut rg = writer.next_row_group()?;
        let mut index = 0;
        while let Some(mut col) = rg.next_column()? {
            write_column(&mut col, index, group)?;
            col.close()?;
            index += 1;
        }
        rg.close()?;
    }
    writer.close()?;
    Ok(())
}

fn strings<'a>(values: impl Iterator<Item = &'a [u8]>) -> Vec<ByteArray> {
    values.map(|v| ByteArray::from(v.to_vec())).collect()
}

fn write_column(
    col: &mut parquet::file::writer::SerializedColumnWriter<'_>,
    index: usize,
    group: &[FastVideoRecord],
) -> Result<(), parquet::errors::ParquetError> {
    let n = group.len();
    let present = vec![1i16; n];
    let bytes = |values: Vec<ByteArray>,
                 col: &mut parquet::file::writer::SerializedColumnWriter<'_>| {
        col.typed::<ByteArrayType>()
            .write_batch(&values, Some(&present), None)
            .map(|_| ())
    };
    let shapes = |shapes: Vec<&[i64]>,
                  col: &mut parquet::file::writer::SerializedColumnWriter<'_>| {
        let (mut values, mut defs, mut reps) = (Vec::new(), Vec::new(), Vec::new());
        for shape in shapes {
            for (i, &d) in shape.iter().enumerate() {
                values.push(d);
                defs.push(3);
                reps.push(if i == 0 { 0 } else { 1 });
            }
        }
        col.typed::<Int64Type>()
            .write_batch(&values, Some(&defs), Some(&reps))
            .map(|_| ())
    };
    match index {
        0 => bytes(strings(group.iter().map(|r| r.id.as_bytes())), col),
        1 => bytes(strings(group.iter().map(|r| &r.latent.bytes[..])), col),
        2 => shapes(group.iter().map(|r| &r.latent.shape[..]).collect(), col),
        3 => bytes(
            strings(group.iter().map(|r| r.latent.dtype.as_bytes())),
            col,
        ),
        4 => bytes(
            strings(group.iter().map(|r| &r.text_embedding.bytes[..])),
            col,
        ),
        5 => shapes(
            group.iter().map(|r| &r.text_embedding.shape[..]).collect(),
            col,
        ),
        6 => bytes(
            strings(group.iter().map(|r| r.text_embedding.dtype.as_bytes())),
            col,
        ),
        7 => bytes(
            strings(group.iter().map(|r| match &r.media {
                Some(m) => m.file_name.as_bytes(),
                None => r.id.as_bytes(),
            })),
            col,
        ),
        8 => bytes(strings(group.iter().map(|r| r.caption.as_bytes())), col),
        9 => bytes(
            strings(group.iter().map(|r| match &r.media {
                Some(m) => m.media_type.as_bytes(),
                None => &b"video"[..],
            })),
            col,
        ),
        10..=12 => {
            // width, height, num_frames: the media's, else the latent's size.
            let values: Vec<i64> = group
                .iter()
                .map(|r| {
                    let s = &r.latent.shape;
                    let at = |k: usize| s.get(s.len().wrapping_sub(k)).copied().unwrap_or(0);
                    match (&r.media, index) {
                        (Some(m), 10) => m.width,
                        (Some(m), 11) => m.height,
                        (Some(m), _) => m.num_frames,
                        (None, 10) => at(1),
                        (None, 11) => at(2),
                        (None, _) => at(3),
                    }
                })
                .collect();
            col.typed::<Int64Type>()
                .write_batch(&values, Some(&present), None)
                .map(|_| ())
        }
        _ => {
            // duration_sec (13), fps (14).
            let values: Vec<f64> = group
                .iter()
                .map(|r| match (&r.media, index) {
                    (Some(m), 13) => m.duration_sec,
                    (Some(m), _) => m.fps,
                    (None, _) => 0.0,
                })
                .collect();
            col.typed::<DoubleType>()
                .write_batch(&values, Some(&present), None)
                .map(|_| ())
        }
    }
}
