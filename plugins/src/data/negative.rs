//! The negative prompt of classifier-free guidance as a file, for the file data sources.
//!
//! CFG's unconditional branch (DMD2's real-score guidance, consistency's `distill_cfg`,
//! `finetune`'s `cfg_dropout`, sampling and validation) runs on the data source's negative
//! text. FastVideo and the Wan pipelines encode Wan's negative prompt
//! ([`WAN_NEGATIVE_PROMPT`]) with UMT5 for it; a parquet or safetensors data set holds only
//! its clips' captions, so without a negative file the branch runs on zeros.
//!
//! The file is a safetensors file like one sample of the `safetensors` source without its
//! latents: `text_embedding` `[L, D]` float32, `text_attention_mask` `[L]` (1 for the prompt's
//! tokens), and the prompt in the header metadata (`prompt`). `reel preprocess` writes one
//! beside its shards ([`FILE_NAME`]); `reel data negative` writes one for a data set made
//! elsewhere; `[data] negative_embedding = "<file>"` reads it.

use std::collections::HashMap;
use std::path::Path;

use burn::tensor::backend::Backend;
use reel_core::data::{DataError, DataSpec, TextCondition};
use reel_models::umt5::{Umt5Error, Umt5TextEncoder};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use super::prompts::encode_text;
use super::safetensors_dir::decode_text;
use super::tensors::{all_finite, pad_text};

/// The name `reel preprocess` gives the negative file in its output folder.
pub const FILE_NAME: &str = "negative.safetensors";

/// Wan2.1's default negative prompt (`sample_neg_prompt` of the Wan2.1 release; FastVideo's
/// and diffusers' Wan examples use it too).
pub const WAN_NEGATIVE_PROMPT: &str = "色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，JPEG压缩残留，丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，手指融合，静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走";

/// Read the negative file at `path` for a data set of `spec`: padded or cropped to
/// `spec.text_len` tokens; its width must be the data's text width. Errors name the file.
pub fn read_negative(path: &Path, spec: &DataSpec) -> Result<TextCondition, DataError> {
    let bad = |reason: String| DataError::File {
        file: path.to_path_buf(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|e| {
        bad(format!(
            "cannot read the negative embedding ({e}); `reel data negative` writes one"
        ))
    })?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| bad(format!("not a safetensors file: {e}")))?;
    let stored = decode_text(&st).map_err(bad)?;
    all_finite("text_embedding", &stored.values).map_err(bad)?;
    let [seq, dim] = stored.dims;
    if dim != spec.text_dim {
        return Err(bad(format!(
            "negative embedding width {dim} differs from the data set's text width {}",
            spec.text_dim
        )));
    }
    Ok(pad_text(
        &stored.values,
        seq,
        dim,
        spec.text_len,
        stored.valid,
    ))
}

/// Write `text` (`L·D` values of width `dim`, with its mask) and the `prompt` it encodes to
/// `path`, whole or not at all ([`reel_core::io::replace_file_with`]).
pub fn write_negative(
    path: &Path,
    text: &TextCondition,
    dim: usize,
    prompt: &str,
) -> Result<(), DataError> {
    let bad = |reason: String| DataError::File {
        file: path.to_path_buf(),
        reason,
    };
    let len = text.mask.len();
    if dim == 0 || text.embedding.len() != len * dim {
        return Err(bad(format!(
            "an embedding of {} values is not {len} tokens of width {dim}",
            text.embedding.len()
        )));
    }
    // Every read would refuse it (see `read_negative`).
    all_finite("text_embedding", &text.embedding).map_err(bad)?;
    let values: Vec<u8> = text
        .embedding
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mask: Vec<u8> = text.mask.iter().map(|&m| u8::from(m)).collect();
    let view =
        |dtype, shape, data| TensorView::new(dtype, shape, data).map_err(|e| bad(e.to_string()));
    let tensors = [
        ("text_embedding", view(Dtype::F32, vec![len, dim], &values)?),
        ("text_attention_mask", view(Dtype::U8, vec![len], &mask)?),
    ];
    let meta = HashMap::from([("prompt".to_string(), prompt.to_string())]);
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| bad(format!("cannot make its folder: {e}")))?;
    }
    // Whole or not at all: a failed write leaves `path` as it was and nothing beside it.
    let write = |tmp: &Path| {
        safetensors::serialize_to_file(tensors, Some(meta), tmp).map_err(|e| e.to_string())
    };
    reel_core::io::replace_file_with(path, write, |e| e.to_string())
        .map_err(|e| bad(format!("cannot write: {e}")))
}

/// The prompt and token count of the negative file at `path`, from its header (`None` when
/// it is missing or unreadable): `reel preprocess` keeps a file that already holds its prompt.
pub fn stored_prompt(path: &Path) -> Option<(String, usize)> {
    let bytes = std::fs::read(path).ok()?;
    let (_, meta) = SafeTensors::read_metadata(&bytes).ok()?;
    // A sample (it holds latents) is no negative file, whatever its metadata says.
    if meta.info("latents").is_some() {
        return None;
    }
    let tokens = *meta.info("text_embedding")?.shape.first()?;
    let prompt = meta.metadata().as_ref()?.get("prompt")?.clone();
    Some((prompt, tokens))
}

/// Encode `prompt` to `text_len` tokens with `encoder` (the Wan prompt form: the prompt's
/// states, zeros after) and write it to `path`.
pub fn encode_negative<B: Backend>(
    encoder: &Umt5TextEncoder<B>,
    prompt: &str,
    text_len: usize,
    path: &Path,
) -> Result<(), NegativeError> {
    let text = encode_text(encoder, prompt, text_len)?;
    let dim = text.embedding.len() / text_len.max(1);
    Ok(write_negative(path, &text, dim, prompt)?)
}

/// An error of [`encode_negative`].
#[derive(Debug, thiserror::Error)]
pub enum NegativeError {
    /// The text encoder failed.
    #[error(transparent)]
    Encode(#[from] Umt5Error),
    /// The file could not be written.
    #[error(transparent)]
    Write(#[from] DataError),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample file (it holds latents) is no negative file, even with a `prompt` entry in
    /// its metadata: `reel data negative --out` does not take it for one to replace.
    #[test]
    fn a_sample_with_a_prompt_is_no_stored_negative() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sample.safetensors");
        let bytes = vec![0u8; 4 * 6];
        let view = |shape: Vec<usize>| TensorView::new(Dtype::F32, shape, &bytes).unwrap();
        let tensors = [
            ("latents", view(vec![6])),
            ("text_embedding", view(vec![2, 3])),
        ];
        let meta = [("prompt".to_string(), "a cat".to_string())].into();
        safetensors::serialize_to_file(tensors, Some(meta), &path).unwrap();
        assert_eq!(stored_prompt(&path), None);
    }

    fn spec(text_len: usize, text_dim: usize) -> DataSpec {
        DataSpec {
            channels: 4,
            frames: 1,
            height: 2,
            width: 2,
            text_len,
            text_dim,
        }
    }

    /// Written, read back padded or cropped to the data's text length with the prompt's
    /// tokens marked; a width that is not the data's is refused naming the file.
    #[test]
    fn a_written_negative_reads_back_at_the_data_text_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let (len, dim, real) = (4usize, 3usize, 2usize);
        let text = TextCondition {
            embedding: (0..len * dim).map(|i| i as f32 * 0.5 - 1.0).collect(),
            mask: (0..len).map(|t| t < real).collect(),
        };
        write_negative(&path, &text, dim, "blurry").unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
        assert_eq!(stored_prompt(&path), Some(("blurry".to_string(), len)));
        assert_eq!(stored_prompt(&dir.path().join("none")), None);

        // The real tokens' states as written, zeros past them (Wan's prompt form).
        let zeroed = TextCondition {
            embedding: (text.embedding.iter().enumerate())
                .map(|(i, &v)| if i < real * dim { v } else { 0.0 })
                .collect(),
            mask: text.mask.clone(),
        };
        assert_eq!(read_negative(&path, &spec(len, dim)).unwrap(), zeroed);
        let longer = read_negative(&path, &spec(len + 2, dim)).unwrap();
        assert_eq!(&longer.embedding[..len * dim], &zeroed.embedding[..]);
        assert!(longer.embedding[len * dim..].iter().all(|&v| v == 0.0));
        assert_eq!(longer.mask.iter().filter(|&&m| m).count(), real);
        let shorter = read_negative(&path, &spec(1, dim)).unwrap();
        assert_eq!(shorter.embedding, text.embedding[..dim].to_vec());
        assert_eq!(shorter.mask, vec![true]);

        let err = read_negative(&path, &spec(len, dim + 1))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(FILE_NAME) && err.contains(&format!("width {dim}")),
            "{err}"
        );
        let missing = dir.path().join("none.safetensors");
        let err = read_negative(&missing, &spec(len, dim))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("none.safetensors") && err.contains("reel data negative"),
            "{err}"
        );
        std::fs::write(&missing, b"not safetensors").unwrap();
        let err = read_negative(&missing, &spec(len, dim))
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a safetensors file"), "{err}");

        // A NaN in the file is refused here, naming the file and the value, rather than
        // turning guidance's unconditional branch into a non-finite loss.
        let mut nan = text.clone();
        nan.embedding[5] = f32::NAN;
        let bad_file = dir.path().join("nan.safetensors");
        let err = write_negative(&bad_file, &nan, dim, "blurry")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("value 5 is NaN") && !bad_file.exists(),
            "{err}"
        );
        // A file made elsewhere: the good file with one value replaced in place.
        let mut bytes = std::fs::read(&path).unwrap();
        let one = (0.5f32 * 5.0 - 1.0).to_le_bytes();
        let at = bytes.windows(4).position(|w| w == one).unwrap();
        bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        std::fs::write(&bad_file, bytes).unwrap();
        let err = read_negative(&bad_file, &spec(len, dim))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("nan.safetensors") && err.contains("text_embedding: value 5 is NaN"),
            "{err}"
        );
    }

    /// A mask whose length does not divide the values is refused, and nothing is written; a
    /// write that fails leaves nothing behind.
    #[test]
    fn a_malformed_condition_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let text = TextCondition {
            embedding: vec![0.0; 7],
            mask: vec![true; 2],
        };
        assert!(write_negative(&path, &text, 3, "x").is_err());
        assert!(!path.exists());
        // A path that is a folder: refused, and no temporary file is left beside it.
        let folder = dir.path().join("set.safetensors");
        std::fs::create_dir(&folder).unwrap();
        let good = TextCondition {
            embedding: vec![0.0; 6],
            mask: vec![true; 2],
        };
        let err = write_negative(&folder, &good, 3, "x")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("set.safetensors") && err.contains("cannot write"),
            "{err}"
        );
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "only the folder: {left:?}");
        // A folder that does not exist yet is made.
        let nested = dir.path().join("new/negative.safetensors");
        write_negative(&nested, &good, 3, "x").unwrap();
        assert!(nested.is_file());
    }
}
