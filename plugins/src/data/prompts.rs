//! Prompts written as text, encoded for the DiT with the UMT5 text encoder in the Wan
//! pipeline's form (each prompt's own tokens, zeros after, `text_len` tokens).

use burn::tensor::backend::Backend;
use reel_core::data::{Prompt, TextCondition};
use reel_models::umt5::{Umt5Error, Umt5TextEncoder};

/// The text condition of `caption`: UMT5 states of its tokens, zero-padded to `text_len`,
/// with a mask of the real tokens.
pub fn encode_text<B: Backend>(
    encoder: &Umt5TextEncoder<B>,
    caption: &str,
    text_len: usize,
) -> Result<TextCondition, Umt5Error> {
    let (embeds, lengths) = encoder.encode_prompts(&[caption], text_len)?;
    let embedding = embeds
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .map_err(|e| Umt5Error::Input(format!("reading back the embedding: {e:?}")))?;
    Ok(TextCondition {
        embedding,
        mask: (0..text_len).map(|t| t < lengths[0]).collect(),
    })
}

/// [`encode_text`] of each caption, as prompts.
pub fn encode_prompts<B: Backend>(
    encoder: &Umt5TextEncoder<B>,
    captions: &[String],
    text_len: usize,
) -> Result<Vec<Prompt>, Umt5Error> {
    captions
        .iter()
        .map(|c| {
            Ok(Prompt {
                caption: c.clone(),
                text: encode_text(encoder, c, text_len)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    type Cpu = burn::backend::NdArray;

    #[test]
    fn prompts_are_the_pipeline_embeddings_with_a_mask() {
        let dir = reel_core::fixtures::UMT5.require(&["config.json", "tokenizer.json"]);
        let dev = Default::default();
        let enc = Umt5TextEncoder::<Cpu>::load(dir.join("tokenizer.json"), &dir, &dev).unwrap();
        let captions = vec![
            "a red circle".to_string(),
            "a much longer caption here".into(),
        ];
        let prompts = encode_prompts(&enc, &captions, 16).unwrap();
        let d = enc.encoder.config.d_model;
        for (p, c) in prompts.iter().zip(&captions) {
            let (embeds, lengths) = enc.encode_prompts(&[c.as_str()], 16).unwrap();
            assert_eq!(
                p.text.embedding,
                embeds.into_data().to_vec::<f32>().unwrap()
            );
            assert_eq!(p.text.embedding.len(), 16 * d);
            let real = p.text.mask.iter().filter(|m| **m).count();
            assert_eq!(real, lengths[0]);
            assert!(p.text.mask[..real].iter().all(|m| *m));
        }
        assert_ne!(prompts[0].text.mask, prompts[1].text.mask);
    }
}
