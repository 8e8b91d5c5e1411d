//! The `safetensors` data source: a folder of per-sample safetensors files.
//!
//! Each file holds one sample:
//! - `latents`: `[C, F, H, W]` (or `[C, H, W]`, or `[1, C, F, H, W]`), float32 / float16 /
//!   bfloat16 / float64;
//! - `text_embedding`: `[L, D]` (or `[1, L, D]`), padded or cropped to `text_len` tokens;
//! - optionally `text_attention_mask`: `[L]` (or `[1, L]`), any numeric or bool dtype: its
//!   leading non-zero entries mark the real tokens, which come first (right padding; a
//!   non-zero entry after a zero is refused); otherwise all `L` stored tokens are real;
//! - optionally the caption in the header metadata (`__metadata__.caption`).
//!
//! Files are found recursively and ordered by path; sample `i` is the `i`-th file. Every
//! sample must have the first one's latent shape and text width.
//!
//! `negative_embedding` names a negative-prompt file ([`negative`](super::negative)) for
//! CFG's unconditional branch; lying under `path`, it is not taken for a sample. A negative
//! file under `path` that the key does not name is refused as a sample, with the key to set.
//!
//! ```toml
//! [data]
//! kind = "safetensors"
//! path = "data/latents"
//! batch_size = 2
//! text_len = 512
//! ```

use std::path::{Path, PathBuf};

use reel_core::config::{check, ConfigError};
use reel_core::data::{DataConfig, DataError, DataSource, DataSpec, Prompt, Sample, TextCondition};
use reel_core::io::WeightError;
use safetensors::{Dtype, SafeTensors};
use serde::{Deserialize, Serialize};

use super::fastvideo::decode_tensor;
use super::files::{find_files, first_prompts};
use super::negative::{read_negative, FILE_NAME};
use super::tensors::{all_finite, latent_dims, pad_text, text_dims, LatentNorm};

fn default_batch_size() -> usize {
    1
}
fn default_text_len() -> usize {
    512
}
fn default_true() -> bool {
    true
}

/// Configuration of the `safetensors` source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SafetensorsDirConfig {
    /// A folder searched recursively for `*.safetensors`. Relative paths are resolved against
    /// the working directory, like every path in a run config.
    pub path: PathBuf,
    /// Samples per micro-batch (default 1).
    #[serde(default = "default_batch_size")]
    pub batch_size: usize,
    /// Text tokens after padding / cropping (default 512).
    #[serde(default = "default_text_len")]
    pub text_len: usize,
    /// Latent normalisation: `"none"` (default: latents are stored normalised) or `"wan"`.
    #[serde(default)]
    pub normalize: LatentNorm,
    /// Seeded reshuffle every epoch (default true).
    #[serde(default = "default_true")]
    pub shuffle: bool,
    /// A negative-prompt embedding file for CFG's unconditional branch (see
    /// [`negative`](crate::data::negative); `reel preprocess` writes one); default none: zeros.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub negative_embedding: Option<PathBuf>,
}

#[reel_core::plugin(
    name = "safetensors",
    summary = "A folder of per-sample safetensors files (`latents`, `text_embedding`)"
)]
impl DataConfig for SafetensorsDirConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.path.as_os_str().is_empty() {
            return Err(ConfigError::new(
                "path",
                "expected a folder of .safetensors files",
            ));
        }
        check::positive_usize("batch_size", self.batch_size)?;
        super::tensors::check_text_len(self.text_len)
    }

    fn batch_size(&self) -> usize {
        self.batch_size
    }

    fn shuffle(&self) -> bool {
        self.shuffle
    }

    fn read_from(&self) -> Option<&Path> {
        Some(&self.path)
    }

    fn build(&self, base_dir: &Path) -> Result<Box<dyn DataSource>, DataError> {
        let negative = self.negative_embedding.as_ref().map(|p| base_dir.join(p));
        let path = base_dir.join(&self.path);
        let source =
            SafetensorsDirSource::open(&path, self.text_len, self.normalize, negative.as_deref())?;
        let negative = negative
            .map(|p| read_negative(&p, &source.spec))
            .transpose()?;
        Ok(Box::new(SafetensorsDirSource { negative, ..source }))
    }
}

/// The `safetensors` source (see the [module docs](self)).
#[derive(Debug)]
pub struct SafetensorsDirSource {
    files: Vec<PathBuf>,
    spec: DataSpec,
    normalize: LatentNorm,
    negative: Option<TextCondition>,
}

/// One decoded file, before shape checks against the data set.
struct Decoded {
    latent_dims: [usize; 4],
    latents: Vec<f32>,
    text: Vec<f32>,
    text_dims: [usize; 2],
    valid_tokens: Option<usize>,
    caption: String,
}

fn tensor<'a>(
    st: &'a SafeTensors<'a>,
    name: &str,
) -> Result<safetensors::tensor::TensorView<'a>, String> {
    st.tensor(name).map_err(|_| {
        let mut names = st.names();
        names.sort();
        format!("no tensor `{name}` (found: {names:?})")
    })
}

fn dtype_name(dtype: Dtype) -> String {
    format!("{dtype:?}")
}

/// A text condition as a file stores it.
pub(crate) struct StoredText {
    /// `text_embedding` as floats, `L·D`.
    pub values: Vec<f32>,
    /// `[L, D]`.
    pub dims: [usize; 2],
    /// The real-token count of `text_attention_mask`, when the file has one.
    pub valid: Option<usize>,
}

/// Read `text_embedding` `[L, D]` (or `[1, L, D]`) and the optional `text_attention_mask`.
pub(crate) fn decode_text(st: &SafeTensors<'_>) -> Result<StoredText, String> {
    let shape_i64 = |s: &[usize]| s.iter().map(|&d| d as i64).collect::<Vec<_>>();
    let txt = tensor(st, "text_embedding")?;
    let text_shape = shape_i64(txt.shape());
    let text_dims = text_dims(&text_shape)?;
    let text = decode_tensor(txt.data(), &text_shape, &dtype_name(txt.dtype()))
        .map_err(|e| format!("text_embedding: {e}"))?;
    let valid_tokens = match st.tensor("text_attention_mask") {
        Ok(mask) => {
            let n: usize = mask.shape().iter().product();
            if n != text_dims[0] {
                return Err(format!(
                    "text_attention_mask has {n} entries, text_embedding has {} tokens",
                    text_dims[0]
                ));
            }
            let width = mask.dtype().bitsize().div_ceil(8);
            let real: Vec<bool> = mask
                .data()
                .chunks_exact(width.max(1))
                .map(|c| c.iter().any(|&b| b != 0))
                .collect();
            // The real tokens come first (right padding), as the pipelines encode them.
            let leading = real.iter().take_while(|&&r| r).count();
            if let Some(after) = real[leading..].iter().position(|&r| r) {
                return Err(format!(
                    "text_attention_mask marks token {} real after padding token {leading}: \
                     the real tokens must come first (right padding)",
                    leading + after
                ));
            }
            Some(leading)
        }
        Err(_) => None,
    };
    Ok(StoredText {
        values: text,
        dims: text_dims,
        valid: valid_tokens,
    })
}

/// Why a negative-prompt file ([`negative`](super::negative)) is refused as a sample.
const NEGATIVE_HINT: &str = "a negative-prompt file, not a sample: name it in \
    `data.negative_embedding` (the source then skips it) or move it out of the folder";

/// Whether the safetensors `bytes` are a negative-prompt file: a `prompt` in the metadata and
/// no `latents`.
fn is_negative_file(bytes: &[u8]) -> bool {
    SafeTensors::read_metadata(bytes).is_ok_and(|(_, meta)| {
        meta.info("latents").is_none()
            && meta
                .metadata()
                .as_ref()
                .is_some_and(|m| m.contains_key("prompt"))
    })
}

fn decode_file(path: &Path) -> Result<Decoded, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    let st =
        SafeTensors::deserialize(&bytes).map_err(|e| format!("not a safetensors file: {e}"))?;
    let shape_i64 = |s: &[usize]| s.iter().map(|&d| d as i64).collect::<Vec<_>>();
    let lat = tensor(&st, "latents").map_err(|e| match is_negative_file(&bytes) {
        true => format!("{e}; {NEGATIVE_HINT}"),
        false => e,
    })?;
    let latent_shape = shape_i64(lat.shape());
    let latent_dims = latent_dims(&latent_shape)?;
    let latents = decode_tensor(lat.data(), &latent_shape, &dtype_name(lat.dtype()))
        .map_err(|e| format!("latents: {e}"))?;
    let StoredText {
        values: text,
        dims: text_dims,
        valid: valid_tokens,
    } = decode_text(&st)?;
    let caption = SafeTensors::read_metadata(&bytes)
        .ok()
        .and_then(|(_, m)| m.metadata().as_ref()?.get("caption").cloned())
        .unwrap_or_default();
    Ok(Decoded {
        latent_dims,
        latents,
        text,
        text_dims,
        valid_tokens,
        caption,
    })
}

impl SafetensorsDirSource {
    /// Find the files under `path`, but `skip` (the data set's negative-prompt file, which
    /// may lie among the samples), and read the first one for the data set's shapes.
    pub fn open(
        path: &Path,
        text_len: usize,
        normalize: LatentNorm,
        skip: Option<&Path>,
    ) -> Result<Self, DataError> {
        let mut files = find_files(path, "safetensors")?;
        if let Some(skip) = skip {
            // Names first: only a file of the same name is resolved to compare paths.
            let resolved = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
            let target = resolved(skip);
            files.retain(|f| f.file_name() != skip.file_name() || resolved(f) != target);
            if files.is_empty() {
                return Err(DataError::Empty {
                    source_name: format!("safetensors {}", path.display()),
                    reason: "no sample file besides the negative-prompt file".into(),
                });
            }
        } else {
            refuse_unnamed_negative(&files)?;
        }
        let first = decode_file(&files[0]).map_err(|reason| DataError::Record {
            file: files[0].clone(),
            record: 0,
            reason,
        })?;
        check_headers(&files[1..], first.latent_dims, first.text_dims[1])?;
        let [channels, frames, height, width] = first.latent_dims;
        normalize
            .check_channels(channels)
            .map_err(|reason| DataError::Record {
                file: files[0].clone(),
                record: 0,
                reason,
            })?;
        Ok(SafetensorsDirSource {
            spec: DataSpec {
                channels,
                frames,
                height,
                width,
                text_len,
                text_dim: first.text_dims[1],
            },
            files,
            normalize,
            negative: None,
        })
    }
}

/// Every sample file past the first, from its header alone (no tensor is read): a whole
/// safetensors file whose latents have the first file's shape and whose text embeddings are
/// as wide, so that `reel check` and the start of training name a bad file, not the batch
/// that reaches it hours later. The values themselves are checked when a file is read.
fn check_headers(files: &[PathBuf], latents: [usize; 4], text_dim: usize) -> Result<(), DataError> {
    for file in files {
        let bad = |reason: String| DataError::Record {
            file: file.clone(),
            record: 0,
            reason,
        };
        let header = reel_core::io::read_safetensors_header(file).map_err(|e| match e {
            WeightError::Format { message, .. } => bad(format!("unreadable header: {message}")),
            e => bad(e.to_string()),
        })?;
        let shape = |key: &str| match header.get(key) {
            // A dtype no reader converts fails here, not at its turn mid-run.
            Some(t) if !reel_core::io::is_supported_dtype(&t.dtype) => Err(bad(format!(
                "`{key}`: dtype `{}` is not supported (F32, BF16, F16 or F64)",
                t.dtype
            ))),
            Some(t) => Ok(t.shape.iter().map(|&d| d as i64).collect::<Vec<_>>()),
            // A negative-prompt file among the samples is told where it belongs (only this
            // error path reads the whole file).
            None if std::fs::read(file).is_ok_and(|b| is_negative_file(&b)) => {
                Err(bad(format!("no tensor `{key}`; {NEGATIVE_HINT}")))
            }
            None => Err(bad(format!("no tensor `{key}`"))),
        };
        let dims = latent_dims(&shape("latents")?).map_err(bad)?;
        if dims != latents {
            return Err(bad(format!(
                "latents shape {dims:?} differs from the data set's {latents:?} (the first file's)"
            )));
        }
        let [_, width] = text_dims(&shape("text_embedding")?).map_err(bad)?;
        if width != text_dim {
            return Err(bad(format!(
                "text embedding width {width} differs from the data set's {text_dim} (the first \
                 file's)"
            )));
        }
    }
    Ok(())
}

/// `reel preprocess`'s negative file ([`FILE_NAME`]) among the samples without
/// `negative_embedding` naming it: refused when the source opens, not at its turn in training.
fn refuse_unnamed_negative(files: &[PathBuf]) -> Result<(), DataError> {
    let named = |f: &&PathBuf| f.file_name().is_some_and(|n| n == FILE_NAME);
    match files
        .iter()
        .filter(named)
        .find(|f| std::fs::read(f).is_ok_and(|bytes| is_negative_file(&bytes)))
    {
        Some(file) => Err(DataError::Record {
            file: file.clone(),
            record: 0,
            reason: NEGATIVE_HINT.into(),
        }),
        None => Ok(()),
    }
}

impl DataSource for SafetensorsDirSource {
    fn spec(&self) -> DataSpec {
        self.spec
    }

    fn negative_text(&self) -> Option<TextCondition> {
        self.negative.clone()
    }

    fn len(&self) -> usize {
        self.files.len()
    }

    fn get(&self, index: usize) -> Result<Sample, DataError> {
        let file = self.files.get(index).ok_or(DataError::OutOfRange {
            index,
            len: self.files.len(),
        })?;
        // One sample per file: the record index inside the file is 0.
        let bad = |reason: String| DataError::Record {
            file: file.clone(),
            record: 0,
            reason,
        };
        let d = decode_file(file).map_err(bad)?;
        all_finite("latents", &d.latents).map_err(bad)?;
        all_finite("text_embedding", &d.text).map_err(bad)?;
        let spec = self.spec;
        let want = [spec.channels, spec.frames, spec.height, spec.width];
        if d.latent_dims != want {
            return Err(bad(format!(
                "latents shape {:?} differs from the data set's {want:?}",
                d.latent_dims
            )));
        }
        let [seq, dim] = d.text_dims;
        if dim != spec.text_dim {
            return Err(bad(format!(
                "text embedding width {dim} differs from the data set's {}",
                spec.text_dim
            )));
        }
        let mut latents = d.latents;
        self.normalize.apply(&mut latents, spec.channels);
        Ok(Sample {
            latents,
            text: pad_text(&d.text, seq, dim, spec.text_len, d.valid_tokens),
            caption: d.caption,
        })
    }

    /// The first (up to) 4 samples' captions and embeddings.
    fn prompts(&self) -> Vec<Prompt> {
        first_prompts(self, 4)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use safetensors::tensor::TensorView;

    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Write one sample file with the given tensors `(name, dtype, shape, bytes)`.
    fn write(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)], caption: &str) {
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        let meta = HashMap::from([("caption".to_string(), caption.to_string())]);
        safetensors::serialize_to_file(views, Some(meta), path).unwrap();
    }

    fn sample(path: &Path, seed: f32, seq: usize) {
        let latents: Vec<f32> = (0..16).map(|i| i as f32 + seed).collect();
        let text: Vec<f32> = (0..seq * 3).map(|i| -(i as f32) - seed).collect();
        write(
            path,
            &[
                ("latents", Dtype::F32, vec![4, 1, 2, 2], f32_bytes(&latents)),
                ("text_embedding", Dtype::F32, vec![seq, 3], f32_bytes(&text)),
            ],
            &format!("sample {seed}"),
        );
    }

    #[test]
    fn reads_samples_in_path_order_with_padding_and_captions() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("part2")).unwrap();
        sample(&dir.path().join("000.safetensors"), 0.0, 2);
        sample(&dir.path().join("part2/000.safetensors"), 2.0, 5);
        // bf16 latents and an explicit attention mask of 1 real token.
        let bf16: Vec<u8> = (0..16)
            .flat_map(|i| half::bf16::from_f32(i as f32 + 1.0).to_le_bytes())
            .collect();
        write(
            &dir.path().join("001.safetensors"),
            &[
                ("latents", Dtype::BF16, vec![1, 4, 1, 2, 2], bf16),
                (
                    "text_embedding",
                    Dtype::F32,
                    vec![1, 2, 3],
                    f32_bytes(&[9.0; 6]),
                ),
                (
                    "text_attention_mask",
                    Dtype::I64,
                    vec![2],
                    [1i64, 0].iter().flat_map(|v| v.to_le_bytes()).collect(),
                ),
            ],
            "sample 1",
        );
        let cfg = SafetensorsDirConfig {
            path: dir.path().to_path_buf(),
            batch_size: 1,
            text_len: 4,
            normalize: LatentNorm::None,
            shuffle: false,
            negative_embedding: None,
        };
        cfg.validate().unwrap();
        let source = cfg.build(Path::new("/")).unwrap();
        assert_eq!(source.len(), 3);
        let spec = source.spec();
        assert_eq!(
            (spec.channels, spec.frames, spec.text_len, spec.text_dim),
            (4, 1, 4, 3)
        );
        let captions: Vec<String> = (0..3).map(|i| source.get(i).unwrap().caption).collect();
        assert_eq!(captions, ["sample 0", "sample 1", "sample 2"]);
        let s1 = source.get(1).unwrap();
        assert_eq!(s1.latents[..3], [1.0, 2.0, 3.0]);
        assert_eq!(s1.text.mask, [true, false, false, false]);
        let s2 = source.get(2).unwrap();
        assert_eq!(s2.text.mask, [true; 4], "5 tokens cropped to 4");
        assert_eq!(s2.text.embedding[..3], [-2.0, -3.0, -4.0]);
        assert_eq!(source.prompts().len(), 3);
    }

    #[test]
    fn bad_files_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        sample(&dir.path().join("a.safetensors"), 0.0, 2);
        let bad = dir.path().join("b.safetensors");
        type Make<'a> = Box<dyn Fn() + 'a>;
        let cases: Vec<(&str, Make)> = vec![
            (
                "no tensor `latents`",
                Box::new(|| {
                    write(
                        &bad,
                        &[(
                            "text_embedding",
                            Dtype::F32,
                            vec![2, 3],
                            f32_bytes(&[0.0; 6]),
                        )],
                        "",
                    )
                }),
            ),
            (
                "differs from the data set's [4, 1, 2, 2]",
                Box::new(|| {
                    write(
                        &bad,
                        &[
                            (
                                "latents",
                                Dtype::F32,
                                vec![4, 2, 2, 1],
                                f32_bytes(&[0.0; 16]),
                            ),
                            (
                                "text_embedding",
                                Dtype::F32,
                                vec![2, 3],
                                f32_bytes(&[0.0; 6]),
                            ),
                        ],
                        "",
                    )
                }),
            ),
            (
                "dtype `I32` is not supported",
                Box::new(|| {
                    write(
                        &bad,
                        &[
                            ("latents", Dtype::I32, vec![4, 1, 2, 2], vec![0; 64]),
                            (
                                "text_embedding",
                                Dtype::F32,
                                vec![2, 3],
                                f32_bytes(&[0.0; 6]),
                            ),
                        ],
                        "",
                    )
                }),
            ),
            (
                "text embedding width 2",
                Box::new(|| {
                    write(
                        &bad,
                        &[
                            (
                                "latents",
                                Dtype::F32,
                                vec![4, 1, 2, 2],
                                f32_bytes(&[0.0; 16]),
                            ),
                            (
                                "text_embedding",
                                Dtype::F32,
                                vec![3, 2],
                                f32_bytes(&[0.0; 6]),
                            ),
                        ],
                        "",
                    )
                }),
            ),
            (
                "latents: value 0 is NaN",
                Box::new(|| sample(&bad, f32::NAN, 2)),
            ),
            (
                "marks token 1 real after padding token 0",
                Box::new(|| {
                    write(
                        &bad,
                        &[
                            (
                                "latents",
                                Dtype::F32,
                                vec![4, 1, 2, 2],
                                f32_bytes(&[0.0; 16]),
                            ),
                            (
                                "text_embedding",
                                Dtype::F32,
                                vec![2, 3],
                                f32_bytes(&[0.0; 6]),
                            ),
                            ("text_attention_mask", Dtype::U8, vec![2], vec![0, 1]),
                        ],
                        "",
                    )
                }),
            ),
            (
                "truncated",
                Box::new(|| {
                    let good = std::fs::read(dir.path().join("a.safetensors")).unwrap();
                    std::fs::write(&bad, &good[..good.len() - 10]).unwrap()
                }),
            ),
        ];
        // What a file's header shows is refused when the source opens (`reel check`, the
        // start of training); its values when the file is read.
        let in_header = [
            "no tensor `latents`",
            "differs from the data set's",
            "text embedding width 2",
            "truncated",
            "dtype `I32`",
        ];
        for (want, make) in cases {
            make();
            let opened = SafetensorsDirSource::open(dir.path(), 4, LatentNorm::None, None);
            let at_open = in_header.iter().any(|h| want.starts_with(h));
            let err = match opened {
                Err(e) if at_open => e,
                Ok(source) if !at_open => source.get(1).unwrap_err(),
                Err(e) => panic!("{want}: refused at open: {e}"),
                Ok(_) => panic!("{want}: not refused at open"),
            };
            let msg = err.to_string();
            assert!(
                matches!(&err, DataError::Record { file, .. } if file == &bad),
                "{want}: {msg}"
            );
            assert!(msg.contains(want), "{want}: {msg}");
        }
        std::fs::remove_file(&bad).unwrap();
        // Wan normalisation needs 16 channels; an empty folder is empty.
        let err = SafetensorsDirSource::open(dir.path(), 4, LatentNorm::Wan, None).unwrap_err();
        assert!(err.to_string().contains("16 latent channels"), "{err}");
        let empty = tempfile::tempdir().unwrap();
        let err = SafetensorsDirSource::open(empty.path(), 4, LatentNorm::None, None).unwrap_err();
        assert!(matches!(err, DataError::Empty { .. }), "{err}");
    }

    /// `negative_embedding` is the source's negative text, and lying among the samples it is
    /// not taken for one; a folder holding only it is empty.
    #[test]
    fn the_negative_file_may_lie_among_the_samples() {
        use crate::data::negative::write_negative;
        let dir = tempfile::tempdir().unwrap();
        sample(&dir.path().join("b.safetensors"), 0.0, 2);
        sample(&dir.path().join("c.safetensors"), 1.0, 3);
        let negative = TextCondition {
            embedding: vec![0.5; 2 * 3],
            mask: vec![true, false],
        };
        // "a…" sorts before the samples: it would be the first file read for the shapes.
        let name = format!("a_{FILE_NAME}");
        write_negative(&dir.path().join(&name), &negative, 3, "blurry").unwrap();
        let cfg = |path: &Path, negative: Option<&str>| SafetensorsDirConfig {
            path: path.to_path_buf(),
            batch_size: 1,
            text_len: 4,
            normalize: LatentNorm::None,
            shuffle: false,
            negative_embedding: negative.map(|n| dir.path().join(n)),
        };
        let source = cfg(dir.path(), Some(&name)).build(Path::new("/")).unwrap();
        assert_eq!(source.len(), 2);
        let text = source.negative_text().unwrap();
        assert_eq!(text.mask, vec![true, false, false, false]);
        // The real token's states; zeros past it, as Wan's prompt form has them.
        assert_eq!(&text.embedding[..3], &negative.embedding[..3]);
        assert!(text.embedding[3..].iter().all(|&v| v == 0.0));
        // Without the key it is read as a sample, and refused as one, with the key to set.
        let err = cfg(dir.path(), None).build(Path::new("/")).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&name) && text.contains("no tensor `latents`"),
            "{err}"
        );
        assert!(text.contains("data.negative_embedding"), "{err}");
        // Under `reel preprocess`'s name it is refused when the source opens, wherever it sorts.
        std::fs::rename(dir.path().join(&name), dir.path().join(FILE_NAME)).unwrap();
        let err = cfg(dir.path(), None)
            .build(Path::new("/"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(FILE_NAME) && err.contains("data.negative_embedding"),
            "{err}"
        );
        assert!(cfg(dir.path(), Some(FILE_NAME))
            .build(Path::new("/"))
            .is_ok());

        let only = tempfile::tempdir().unwrap();
        let lone = only.path().join(FILE_NAME);
        write_negative(&lone, &negative, 3, "blurry").unwrap();
        let err = cfg(only.path(), Some(lone.to_str().unwrap()))
            .build(Path::new("/"))
            .unwrap_err();
        assert!(matches!(err, DataError::Empty { .. }), "{err}");
    }
}
