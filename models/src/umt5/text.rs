//! Prompts to Wan text embeddings: the Hugging Face tokenizer (`tokenizer.json`, loaded
//! through the `tokenizers` crate) and the UMT5 encoder, in the Wan pipeline's form.
//!
//! Upstream: diffusers `pipelines/wan/pipeline_wan.py`, `WanPipeline._get_t5_prompt_embeds`:
//! prompts are tokenized with `</s>` appended, padded with id 0 to `max_sequence_length`
//! (512), encoded with the attention mask, and each prompt's states are kept up to its own
//! token count with zeros after. (diffusers first cleans prompts with `ftfy` and collapses
//! whitespace; prompts here are tokenized as given.)

use std::path::{Path, PathBuf};

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use tokenizers::Tokenizer;

use super::model::{Umt5Encoder, Umt5Error};

/// Token ids and attention mask of a batch of prompts, padded to one length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBatch {
    /// Ids `[B * max_length]`, row-major, padded with 0.
    pub input_ids: Vec<u32>,
    /// 1 for a token, 0 for padding, `[B * max_length]`.
    pub attention_mask: Vec<u32>,
    /// Tokens per prompt (including `</s>`), at most `max_length`.
    pub lengths: Vec<usize>,
    /// The padded length.
    pub max_length: usize,
}

impl TokenBatch {
    /// Number of prompts.
    pub fn batch(&self) -> usize {
        self.lengths.len()
    }

    /// `input_ids` as `[B, max_length]`.
    pub fn ids_tensor<B: Backend>(&self, device: &B::Device) -> Tensor<B, 2, Int> {
        let ids: Vec<i64> = self.input_ids.iter().map(|&i| i as i64).collect();
        Tensor::from_data(
            TensorData::new(ids, [self.batch(), self.max_length]),
            device,
        )
    }

    /// `attention_mask` as a float `[B, max_length]`.
    pub fn mask_tensor<B: Backend>(&self, device: &B::Device) -> Tensor<B, 2> {
        let mask: Vec<f32> = self.attention_mask.iter().map(|&m| m as f32).collect();
        Tensor::from_data(
            TensorData::new(mask, [self.batch(), self.max_length]),
            device,
        )
    }
}

/// Load a `tokenizer.json` (or a folder holding one) for offline use, with any truncation
/// or padding it configures switched off ([`tokenize`] does both).
pub fn load_tokenizer(path: impl AsRef<Path>) -> Result<Tokenizer, Umt5Error> {
    let path = path.as_ref();
    let file: PathBuf = if path.is_dir() {
        path.join("tokenizer.json")
    } else {
        path.to_path_buf()
    };
    let err = |message: String| Umt5Error::Tokenizer {
        path: file.display().to_string(),
        message,
    };
    let mut tok = Tokenizer::from_file(&file).map_err(|e| err(e.to_string()))?;
    tok.with_truncation(None).map_err(|e| err(e.to_string()))?;
    tok.with_padding(None);
    Ok(tok)
}

/// The tokenizer of the text encoder folder `text_encoder` (or of the folder of its weights
/// file): `given`, else its own
/// `tokenizer.json`, else the `tokenizer/` folder beside it, as a diffusers pipeline lays
/// them out (`<model>/text_encoder`, `<model>/tokenizer/tokenizer.json`). An error names
/// both places when none is given and neither holds one.
pub fn tokenizer_for(
    given: Option<&Path>,
    text_encoder: impl AsRef<Path>,
) -> Result<PathBuf, Umt5Error> {
    if let Some(t) = given {
        return Ok(t.to_path_buf());
    }
    // The encoder may be named by its weights file (`text_encoder/model.safetensors`).
    let given_encoder = text_encoder.as_ref();
    let dir = match given_encoder.is_file() {
        true => given_encoder.parent().unwrap_or(Path::new(".")),
        false => given_encoder,
    };
    let own = dir.join("tokenizer.json");
    let sibling = dir
        .parent()
        .map(|p| p.join("tokenizer").join("tokenizer.json"));
    let found = std::iter::once(own.clone())
        .chain(sibling.clone())
        .find(|p| p.is_file());
    found.ok_or_else(|| Umt5Error::Tokenizer {
        path: match &sibling {
            Some(s) => format!("{}` or `{}", own.display(), s.display()),
            None => own.display().to_string(),
        },
        message: "no tokenizer given, and neither file beside the text encoder exists: give \
                  the tokenizer (`tokenizer.json` or its folder)"
            .into(),
    })
}

/// Tokenize `prompts` with special tokens (`</s>` appended by the tokenizer's
/// post-processor), cut each to `max_length` ids and pad with id 0 to `max_length`.
///
/// The cut comes after `</s>` is appended, as the golden fixture was made, so a prompt
/// longer than `max_length` ends without `</s>`. (The `tokenizers` crate's own truncation,
/// which transformers' `truncation=True` uses, keeps `</s>` as the last id instead; prompts
/// that fit are tokenized identically either way.)
pub fn tokenize(
    tokenizer: &Tokenizer,
    prompts: &[&str],
    max_length: usize,
) -> Result<TokenBatch, Umt5Error> {
    let mut batch = TokenBatch {
        input_ids: Vec::with_capacity(prompts.len() * max_length),
        attention_mask: Vec::with_capacity(prompts.len() * max_length),
        lengths: Vec::with_capacity(prompts.len()),
        max_length,
    };
    for prompt in prompts {
        let encoding = tokenizer
            .encode(*prompt, true)
            .map_err(|e| Umt5Error::Tokenizer {
                path: "<tokenizer>".into(),
                message: format!("cannot encode {prompt:?}: {e}"),
            })?;
        let ids = encoding.get_ids();
        let n = ids.len().min(max_length);
        batch.input_ids.extend_from_slice(&ids[..n]);
        batch
            .input_ids
            .extend(std::iter::repeat_n(0, max_length - n));
        batch.attention_mask.extend(std::iter::repeat_n(1, n));
        batch
            .attention_mask
            .extend(std::iter::repeat_n(0, max_length - n));
        batch.lengths.push(n);
    }
    Ok(batch)
}

/// The most text tokens a prompt is cut or padded to (Wan uses 512): a larger count is a
/// typo, and `[B, text_len, d_model]` of it would not fit in memory.
pub const MAX_TEXT_LEN: usize = 8192;

/// The Wan form of encoder states `[B, L, d]`: row `i` kept for its first `lengths[i]`
/// tokens and zero after, cut or zero-padded to `text_len` tokens `-> [B, text_len, d]`.
pub fn prompt_embeds<B: Backend>(
    states: Tensor<B, 3>,
    lengths: &[usize],
    text_len: usize,
) -> Tensor<B, 3> {
    let [b, l, d] = states.dims();
    let device = states.device();
    let keep: Vec<f32> = lengths
        .iter()
        .flat_map(|&n| (0..text_len).map(move |t| if t < n { 1.0 } else { 0.0 }))
        .collect();
    let keep = Tensor::<B, 3>::from_data(TensorData::new(keep, [b, text_len, 1]), &device);
    let states = if l >= text_len {
        states.narrow(1, 0, text_len)
    } else {
        Tensor::cat(
            vec![states, Tensor::zeros([b, text_len - l, d], &device)],
            1,
        )
    };
    states * keep
}

/// The text side of Wan: a tokenizer and the UMT5 encoder.
#[derive(Debug)]
pub struct Umt5TextEncoder<B: Backend> {
    /// The Hugging Face tokenizer (`tokenizer.json`).
    pub tokenizer: Tokenizer,
    /// The encoder.
    pub encoder: Umt5Encoder<B>,
}

impl<B: Backend> Umt5TextEncoder<B> {
    /// Load the tokenizer (`tokenizer.json` or its folder, e.g. a Wan checkpoint's
    /// `tokenizer/`) and the encoder (`text_encoder/`).
    pub fn load(
        tokenizer: impl AsRef<Path>,
        encoder: impl AsRef<Path>,
        device: &B::Device,
    ) -> Result<Self, Umt5Error> {
        Ok(Self {
            tokenizer: load_tokenizer(tokenizer)?,
            encoder: Umt5Encoder::load(encoder, device)?,
        })
    }

    /// Tokenize `prompts` to `max_length` tokens (see [`tokenize`]).
    pub fn tokenize(&self, prompts: &[&str], max_length: usize) -> Result<TokenBatch, Umt5Error> {
        tokenize(&self.tokenizer, prompts, max_length)
    }

    /// Wan's `prompt_embeds [B, text_len, d_model]` (zeros after each prompt's tokens) and
    /// the token count of each prompt. Wan uses `text_len = 512`.
    pub fn encode_prompts(
        &self,
        prompts: &[&str],
        text_len: usize,
    ) -> Result<(Tensor<B, 3>, Vec<usize>), Umt5Error> {
        if prompts.is_empty() || text_len == 0 {
            return Err(Umt5Error::Input("no prompt or text_len = 0".into()));
        }
        let tokens = self.tokenize(prompts, text_len)?;
        let device = self.encoder.shared.weight.lazy_device();
        let states = self
            .encoder
            .forward(tokens.ids_tensor(&device), tokens.mask_tensor(&device))?;
        Ok((
            prompt_embeds(states, &tokens.lengths, text_len),
            tokens.lengths,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tokenizer_is_found_beside_the_text_encoder() {
        let tmp = tempfile::tempdir().unwrap();
        let model = tmp.path().join("model");
        let (enc, tok) = (model.join("text_encoder"), model.join("tokenizer"));
        std::fs::create_dir_all(&enc).unwrap();
        std::fs::create_dir_all(&tok).unwrap();
        // Neither place holds one: the error names both.
        let err = tokenizer_for(None, &enc).unwrap_err().to_string();
        for want in [enc.join("tokenizer.json"), tok.join("tokenizer.json")] {
            assert!(err.contains(&*want.to_string_lossy()), "{err}");
        }
        // The diffusers layout: `tokenizer/` beside `text_encoder/`.
        std::fs::write(tok.join("tokenizer.json"), "{}").unwrap();
        assert_eq!(
            tokenizer_for(None, &enc).unwrap(),
            tok.join("tokenizer.json")
        );
        // The encoder's own folder comes first; a given path wins over both.
        std::fs::write(enc.join("tokenizer.json"), "{}").unwrap();
        assert_eq!(
            tokenizer_for(None, &enc).unwrap(),
            enc.join("tokenizer.json")
        );
        // The encoder named by its weights file: the same places, from its folder.
        let weights = enc.join("model.safetensors");
        std::fs::write(&weights, "").unwrap();
        assert_eq!(
            tokenizer_for(None, &weights).unwrap(),
            enc.join("tokenizer.json")
        );
        let given = Path::new("elsewhere/tokenizer.json");
        assert_eq!(tokenizer_for(Some(given), &enc).unwrap(), given);
    }
}
