//! Tests of the `fastvideo_parquet` source on files written in FastVideo's schema.

use std::path::Path;
use std::sync::Arc;

use reel_core::data::{DataConfig, DataError, DataSource, Loader};

use super::*;
use crate::data::tensors::{WAN_LATENTS_MEAN, WAN_LATENTS_STD};

/// Deterministic values for record `i` (distinct per record and position).
fn values(i: usize, n: usize, salt: f32) -> Vec<f32> {
    (0..n)
        .map(|k| ((i * 7919 + k * 31) % 101) as f32 / 50.0 - 1.0 + salt)
        .collect()
}

fn record(i: usize, latent: [usize; 4], seq: usize, dim: usize) -> FastVideoRecord {
    let n: usize = latent.iter().product();
    FastVideoRecord {
        id: format!("clip-{i}"),
        latent: StoredTensor::f32(&values(i, n, 0.0), &latent),
        text_embedding: StoredTensor::f32(&values(i, seq * dim, 0.5), &[seq, dim]),
        caption: format!("caption {i}"),
        media: None,
    }
}

/// Two files (one nested) with 7 records in row groups of 3: records 0..4 and 4..7.
fn dataset(root: &Path, latent: [usize; 4]) -> Vec<FastVideoRecord> {
    let records: Vec<_> = (0..7).map(|i| record(i, latent, 3 + i % 3, 6)).collect();
    std::fs::create_dir_all(root.join("worker_1")).unwrap();
    write_fastvideo_parquet(&root.join("a.parquet"), &records[..4], 3).unwrap();
    write_fastvideo_parquet(&root.join("worker_1/b.parquet"), &records[4..], 3).unwrap();
    records
}

fn config(path: &Path, text_len: usize, normalize: LatentNorm) -> FastVideoParquetConfig {
    FastVideoParquetConfig {
        path: path.to_path_buf(),
        batch_size: 2,
        text_len,
        normalize,
        shuffle: true,
        negative_embedding: None,
        num_latent_t: None,
    }
}

#[test]
fn reads_every_record_across_files_and_row_groups() {
    let dir = tempfile::tempdir().unwrap();
    let records = dataset(dir.path(), [4, 2, 3, 5]);
    let source = config(Path::new("."), 4, LatentNorm::None)
        .build(dir.path())
        .unwrap();
    assert_eq!(source.len(), 7);
    let spec = source.spec();
    assert_eq!(
        (spec.channels, spec.frames, spec.height, spec.width),
        (4, 2, 3, 5)
    );
    assert_eq!((spec.text_len, spec.text_dim), (4, 6));
    for (i, r) in records.iter().enumerate() {
        let s = source.get(i).unwrap();
        assert_eq!(s.caption, r.caption);
        assert_eq!(s.latents, values(i, 4 * 2 * 3 * 5, 0.0));
        let seq = r.text_embedding.shape[0] as usize;
        let text = values(i, seq * 6, 0.5);
        let keep = seq.min(4);
        assert_eq!(&s.text.embedding[..keep * 6], &text[..keep * 6]);
        assert!(s.text.embedding[keep * 6..].iter().all(|&v| v == 0.0));
        let mask: Vec<bool> = (0..4).map(|t| t < keep).collect();
        assert_eq!(s.text.mask, mask, "record {i}");
    }
    assert!(matches!(
        source.get(7),
        Err(DataError::OutOfRange { index: 7, len: 7 })
    ));
    assert_eq!(source.prompts().len(), 4);
    assert_eq!(source.prompts()[1].caption, "caption 1");
}

#[test]
fn num_latent_t_keeps_the_first_frames() {
    let dir = tempfile::tempdir().unwrap();
    dataset(dir.path(), [4, 3, 2, 2]);
    let cfg = FastVideoParquetConfig {
        num_latent_t: Some(2),
        ..config(dir.path(), 4, LatentNorm::None)
    };
    let source = cfg.build(Path::new("/")).unwrap();
    assert_eq!(source.spec().frames, 2);
    let full = values(6, 4 * 3 * 4, 0.0);
    let want: Vec<f32> = full.chunks(12).flat_map(|c| c[..8].to_vec()).collect();
    assert_eq!(source.get(6).unwrap().latents, want);
    let too_many = FastVideoParquetConfig {
        num_latent_t: Some(4),
        ..config(dir.path(), 4, LatentNorm::None)
    };
    let err = too_many.build(Path::new("/")).unwrap_err();
    assert!(err.to_string().contains("num_latent_t = 4"), "{err}");
}

#[test]
fn wan_normalisation_is_applied_at_load_time() {
    let dir = tempfile::tempdir().unwrap();
    dataset(dir.path(), [16, 1, 2, 2]);
    let raw = config(dir.path(), 8, LatentNorm::None)
        .build(Path::new("/"))
        .unwrap();
    let norm = config(dir.path(), 8, LatentNorm::Wan)
        .build(Path::new("/"))
        .unwrap();
    let (a, b) = (raw.get(5).unwrap().latents, norm.get(5).unwrap().latents);
    for (k, (x, y)) in a.iter().zip(&b).enumerate() {
        let c = k / 4;
        let want = (x - WAN_LATENTS_MEAN[c]) / WAN_LATENTS_STD[c];
        assert!((y - want).abs() < 1e-5, "value {k}: {y} vs {want}");
    }
    // Wan statistics on 4-channel latents: a clear error at build time.
    let dir4 = tempfile::tempdir().unwrap();
    dataset(dir4.path(), [4, 1, 2, 2]);
    let err = config(dir4.path(), 8, LatentNorm::Wan)
        .build(Path::new("/"))
        .unwrap_err();
    assert!(err.to_string().contains("normalize"), "{err}");
}

#[test]
fn the_loader_batches_and_resumes_parquet_data() {
    let dir = tempfile::tempdir().unwrap();
    dataset(dir.path(), [4, 2, 2, 2]);
    let source: Arc<dyn DataSource> = config(dir.path(), 4, LatentNorm::None)
        .build(Path::new("/"))
        .unwrap()
        .into();
    let mut straight = Loader::new(source.clone(), 3, true, 11).unwrap();
    let order: Vec<Vec<usize>> = (0..5)
        .map(|_| straight.next_batch().unwrap().indices)
        .collect();
    let mut seen: Vec<usize> = order[..2].concat();
    seen.extend(&order[2][..1]);
    seen.sort();
    assert_eq!(
        seen,
        (0..7).collect::<Vec<_>>(),
        "one epoch covers every record"
    );
    let mut resumed = Loader::new(source, 3, true, 11).unwrap();
    resumed.set_cursor(6);
    assert_eq!(resumed.next_batch().unwrap().indices, order[2]);
}

#[test]
fn config_parses_from_toml_and_names_bad_keys() {
    let toml = r#"
        kind = "fastvideo_parquet"
        path = "data/combined_parquet_dataset"
        batch_size = 2
    "#;
    let cfg: Box<dyn DataConfig> = toml::from_str(toml).unwrap();
    cfg.validate().unwrap();
    assert_eq!(cfg.batch_size(), 2);
    let bad: Result<Box<dyn DataConfig>, _> =
        toml::from_str("kind = \"fastvideo_parquet\"\npath = \"x\"\nnormalise = \"wan\"");
    assert!(bad.unwrap_err().to_string().contains("normalise"));
    let bad: Result<Box<dyn DataConfig>, _> =
        toml::from_str("kind = \"fastvideo_parquet\"\npath = \"x\"\nnormalize = \"sd\"");
    assert!(bad.unwrap_err().to_string().contains("wan"));
    let zero = FastVideoParquetConfig {
        text_len: 0,
        ..config(Path::new("x"), 1, LatentNorm::Wan)
    };
    assert!(zero
        .validate()
        .unwrap_err()
        .to_string()
        .contains("text_len"));
}

/// Build the data set from `records` in one file (row groups of 2) and return the error of
/// opening it, or of reading every record.
fn first_error(dir: &Path, records: &[FastVideoRecord]) -> DataError {
    let path = dir.join("bad.parquet");
    write_fastvideo_parquet(&path, records, 2).unwrap();
    let source = match FastVideoParquetSource::open(&path, 4, LatentNorm::None) {
        Ok(s) => s,
        Err(e) => return e,
    };
    (0..source.len())
        .find_map(|i| source.get(i).err())
        .expect("some record is bad")
}

#[test]
fn bad_records_name_the_file_and_record() {
    let dir = tempfile::tempdir().unwrap();
    let good: Vec<_> = (0..5).map(|i| record(i, [4, 2, 2, 2], 3, 6)).collect();
    type Edit = Box<dyn Fn(&mut FastVideoRecord)>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "vae_latent_bytes: 124 bytes, expected 128",
            Box::new(|r| r.latent.bytes.truncate(124)),
        ),
        ("dtype `int8`", Box::new(|r| r.latent.dtype = "int8".into())),
        (
            "differs from the data set's [4, 2, 2, 2]",
            Box::new(|r| r.latent.shape = vec![4, 2, 4, 1]),
        ),
        (
            "text embedding width 3",
            Box::new(|r| r.text_embedding.shape = vec![6, 3]),
        ),
        (
            "expected [L, D]",
            Box::new(|r| r.text_embedding.shape = vec![18]),
        ),
        (
            "text_embedding_bytes",
            Box::new(|r| r.text_embedding.bytes.push(0)),
        ),
        (
            "vae_latent_bytes: value 5 is inf",
            Box::new(|r| r.latent.bytes[20..24].copy_from_slice(&f32::INFINITY.to_le_bytes())),
        ),
        (
            "text_embedding_bytes: value 0 is NaN",
            Box::new(|r| r.text_embedding.bytes[..4].copy_from_slice(&f32::NAN.to_le_bytes())),
        ),
    ];
    for (want, edit) in cases {
        let mut records = good.clone();
        edit(&mut records[3]);
        let err = first_error(dir.path(), &records);
        let msg = err.to_string();
        assert!(
            matches!(err, DataError::Record { record: 3, .. }),
            "{want}: {msg}"
        );
        assert!(
            msg.contains("bad.parquet") && msg.contains(want),
            "{want}: {msg}"
        );
    }
    // The first record defines the shapes: a bad one fails at open, naming record 0.
    let mut records = good.clone();
    records[0].latent.shape = vec![4, 2];
    let err = first_error(dir.path(), &records);
    assert!(matches!(err, DataError::Record { record: 0, .. }), "{err}");
}

#[test]
fn damaged_files_and_empty_folders_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<_> = (0..4).map(|i| record(i, [4, 2, 2, 2], 3, 6)).collect();
    let path = dir.path().join("data.parquet");
    write_fastvideo_parquet(&path, &records, 2).unwrap();
    let bytes = std::fs::read(&path).unwrap();

    // Truncated: the footer is gone.
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = FastVideoParquetSource::open(dir.path(), 4, LatentNorm::None).unwrap_err();
    assert!(
        matches!(&err, DataError::File { file, .. } if file == &path),
        "{err}"
    );

    // Not parquet at all.
    std::fs::write(&path, b"PAR1 but not really").unwrap();
    let err = FastVideoParquetSource::open(dir.path(), 4, LatentNorm::None).unwrap_err();
    assert!(err.to_string().contains("data.parquet"), "{err}");

    // Parquet, but another schema.
    let other = "message m { optional int64 x; }";
    let schema = Arc::new(parquet::schema::parser::parse_message_type(other).unwrap());
    let file = std::fs::File::create(&path).unwrap();
    let w =
        parquet::file::writer::SerializedFileWriter::new(file, schema, Default::default()).unwrap();
    w.close().unwrap();
    let err = FastVideoParquetSource::open(dir.path(), 4, LatentNorm::None).unwrap_err();
    assert!(
        err.to_string()
            .contains("missing column(s) vae_latent_bytes"),
        "{err}"
    );

    // Valid files with no rows, and a folder with no parquet files.
    write_fastvideo_parquet(&path, &[], 2).unwrap();
    let err = FastVideoParquetSource::open(dir.path(), 4, LatentNorm::None).unwrap_err();
    assert!(matches!(err, DataError::Empty { .. }), "{err}");
    std::fs::remove_file(&path).unwrap();
    let err = FastVideoParquetSource::open(dir.path(), 4, LatentNorm::None).unwrap_err();
    assert!(matches!(err, DataError::Empty { .. }), "{err}");

    // A file cut short after indexing (e.g. a copy still in progress): reading fails with
    // the file and record, no panic.
    write_fastvideo_parquet(&path, &records, 2).unwrap();
    let source = FastVideoParquetSource::open(dir.path(), 4, LatentNorm::None).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 200]).unwrap();
    let err = source.get(3).unwrap_err();
    assert!(
        matches!(&err, DataError::Record { file, record: 3, .. } if file == &path),
        "{err}"
    );
    // Rewritten after indexing with fewer row groups: an error naming the record, no panic.
    write_fastvideo_parquet(&path, &records, 2).unwrap();
    let source = FastVideoParquetSource::open(dir.path(), 4, LatentNorm::None).unwrap();
    write_fastvideo_parquet(&path, &records[..2], 2).unwrap();
    let err = source.get(3).unwrap_err();
    assert!(
        matches!(&err, DataError::Record { record: 3, .. }) && err.to_string().contains("changed"),
        "{err}"
    );
}

/// `negative_embedding` (relative to the working directory like `path`) becomes the source's
/// negative text at the data's text length; without it there is none (the trainer uses
/// zeros); a file of another text width is refused at build, naming it.
#[test]
fn negative_embedding_is_the_sources_negative_text() {
    use crate::data::negative::{write_negative, FILE_NAME};
    let dir = tempfile::tempdir().unwrap();
    dataset(&dir.path().join("set"), [4, 1, 2, 2]);
    let plain = config(Path::new("set"), 5, LatentNorm::None);
    let dim = plain.build(dir.path()).unwrap().spec().text_dim;
    assert_eq!(plain.build(dir.path()).unwrap().negative_text(), None);

    let stored = TextCondition {
        embedding: values(99, 3 * dim, 0.25),
        mask: vec![true, true, false],
    };
    write_negative(&dir.path().join(FILE_NAME), &stored, dim, "blurry").unwrap();
    let cfg = FastVideoParquetConfig {
        negative_embedding: Some(FILE_NAME.into()),
        ..plain.clone()
    };
    let negative = cfg.build(dir.path()).unwrap().negative_text().unwrap();
    assert_eq!(negative.mask, vec![true, true, false, false, false]);
    // The two real tokens' states; zeros past them, as Wan's prompt form has them.
    assert_eq!(&negative.embedding[..2 * dim], &stored.embedding[..2 * dim]);
    assert!(negative.embedding[2 * dim..].iter().all(|&v| v == 0.0));

    let narrow = TextCondition {
        embedding: vec![1.0; 3 * (dim - 1)],
        mask: vec![true; 3],
    };
    write_negative(
        &dir.path().join("narrow.safetensors"),
        &narrow,
        dim - 1,
        "x",
    )
    .unwrap();
    let cfg = FastVideoParquetConfig {
        negative_embedding: Some("narrow.safetensors".into()),
        ..plain
    };
    let err = cfg.build(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("narrow.safetensors") && err.contains("text width"),
        "{err}"
    );
}
