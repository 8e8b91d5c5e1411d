//! [`Umt5Encoder`]: the UMT5 encoder stack (transformers `UMT5EncoderModel`) and its
//! weight loading.
//!
//! Upstream: transformers `modeling_umt5.py` — `UMT5EncoderModel` (`shared` embedding,
//! `encoder` stack), `UMT5Stack.forward` (embeddings, blocks, `final_layer_norm`,
//! `output_hidden_states`) and `UMT5Block` (`layer.0` self-attention, `layer.1` FFN).
//! `encoder.embed_tokens.weight` is tied to `shared.weight`; a checkpoint may hold either
//! or both.

use std::path::Path;

use burn::module::Module;
use burn::tensor::{backend::Backend, ElementConversion, Int, Tensor};
use reel_core::io::WeightError;

use super::attention::{AttentionContext, LayerSelfAttention, SelfAttention};
use super::config::{Umt5Config, Umt5ConfigError};
use super::layers::{DenseReluDense, Embedding, LayerFF, T5LayerNorm};
use crate::checkpoint;
use crate::wan::init::{join, ParamInit};
use crate::wan::weights::WeightSource;

/// Weight file names tried, in order, in a text-encoder folder.
pub const WEIGHT_FILES: [&str; 2] = ["model.safetensors.index.json", "model.safetensors"];
/// The key of the embedding table.
pub const SHARED_KEY: &str = "shared.weight";
/// The tied alias of [`SHARED_KEY`] some checkpoints store instead (or as well).
pub const EMBED_TOKENS_KEY: &str = "encoder.embed_tokens.weight";

/// An error of the UMT5 encoder: config, weights, tokenizer or input.
#[derive(Debug, thiserror::Error)]
pub enum Umt5Error {
    /// The config is unreadable or invalid.
    #[error(transparent)]
    Config(#[from] Umt5ConfigError),
    /// The weights are unreadable or do not match the config.
    #[error(transparent)]
    Weights(#[from] WeightError),
    /// The tokenizer could not be loaded or failed on a prompt.
    #[error("tokenizer `{path}`: {message}")]
    Tokenizer {
        /// The `tokenizer.json` file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// Token ids or mask the encoder cannot take.
    #[error("UMT5 input: {0}")]
    Input(String),
}

impl Umt5Config {
    /// The config of a transformers `text_encoder/` folder, or of a weights file with
    /// `config.json` beside it (the config [`Umt5Encoder::load`] builds from); no weights are
    /// read.
    pub fn of_pretrained(path: impl AsRef<Path>) -> Result<Self, Umt5Error> {
        let dir = checkpoint::config_dir(path.as_ref())?;
        Ok(Self::from_json_file(dir.join("config.json"))?)
    }
}

/// `UMT5Block`: `layer.0` self-attention, `layer.1` feed-forward.
#[derive(Module, Debug)]
pub struct Umt5Block<B: Backend> {
    /// `(self-attention, feed-forward)`, keyed `layer.0` and `layer.1`.
    pub layer: (LayerSelfAttention<B>, LayerFF<B>),
}

impl<B: Backend> Umt5Block<B> {
    /// `[B, L, d_model] -> [B, L, d_model]`.
    pub fn forward(&self, x: Tensor<B, 3>, ctx: &AttentionContext<B>) -> Tensor<B, 3> {
        self.layer.1.forward(self.layer.0.forward(x, ctx))
    }
}

/// `UMT5Stack` of the encoder.
#[derive(Module, Debug)]
pub struct Umt5Stack<B: Backend> {
    /// The blocks.
    pub block: Vec<Umt5Block<B>>,
    /// Norm after the last block.
    pub final_layer_norm: T5LayerNorm<B>,
}

/// Encoder outputs with every hidden state.
#[derive(Debug, Clone)]
pub struct Umt5Output<B: Backend> {
    /// `final_layer_norm` of the last block's output `[B, L, d_model]`.
    pub last_hidden_state: Tensor<B, 3>,
    /// transformers' `hidden_states`: the embeddings, the output of each block but the last,
    /// then `last_hidden_state` (`num_layers + 1` tensors `[B, L, d_model]`).
    pub hidden_states: Vec<Tensor<B, 3>>,
}

/// `UMT5EncoderModel`; field names are transformers' keys.
#[derive(Module, Debug)]
pub struct Umt5Encoder<B: Backend> {
    /// Token embedding `[vocab, d_model]` (also `encoder.embed_tokens`).
    pub shared: Embedding<B>,
    /// The encoder stack.
    pub encoder: Umt5Stack<B>,
    /// The configuration the model was built from.
    pub config: Umt5Config,
}

impl<B: Backend> Umt5Encoder<B> {
    /// A model of `config` whose parameters are a function of `seed` and their keys
    /// (created lazily, so loading weights afterwards never generates them).
    pub fn init(config: &Umt5Config, device: &B::Device, seed: u64) -> Result<Self, Umt5Error> {
        config.validate()?;
        let (gated, act) = config.ffn().map_err(|e| Umt5Error::Input(e.to_string()))?;
        let init = ParamInit::new(seed, device);
        let eps = config.layer_norm_epsilon;
        let dims = [config.d_model, config.d_ff];
        let block = (0..config.num_layers)
            .map(|i| {
                let p = |s: &str| format!("encoder.block.{i}.layer.{s}");
                Umt5Block {
                    layer: (
                        LayerSelfAttention {
                            SelfAttention: SelfAttention::init(
                                &init,
                                &p("0.SelfAttention"),
                                config,
                            ),
                            layer_norm: T5LayerNorm::init(&init, &p("0.layer_norm"), dims[0], eps),
                        },
                        LayerFF {
                            DenseReluDense: DenseReluDense::init(
                                &init,
                                &p("1.DenseReluDense"),
                                dims,
                                gated,
                                act,
                            ),
                            layer_norm: T5LayerNorm::init(&init, &p("1.layer_norm"), dims[0], eps),
                        },
                    ),
                }
            })
            .collect();
        let final_norm = join("encoder", "final_layer_norm");
        Ok(Self {
            shared: Embedding::init(&init, "shared", config.vocab_size, config.d_model),
            encoder: Umt5Stack {
                block,
                final_layer_norm: T5LayerNorm::init(&init, &final_norm, config.d_model, eps),
            },
            config: config.clone(),
        })
    }

    /// Load a transformers `text_encoder/` folder (`config.json` and the weights, see
    /// [`WEIGHT_FILES`]), or a weights file with `config.json` beside it.
    pub fn load(path: impl AsRef<Path>, device: &B::Device) -> Result<Self, Umt5Error> {
        let path = path.as_ref();
        let config = Umt5Config::of_pretrained(path)?;
        Self::init(&config, device, 0)?.load_weights(path)
    }

    /// Load weights (a folder, a `.safetensors` file or a shard index), strictly except for
    /// the tie: `encoder.embed_tokens.weight` fills `shared.weight` when that key is absent
    /// and is ignored when both are present.
    pub fn load_weights(self, path: impl AsRef<Path>) -> Result<Self, Umt5Error> {
        let (source, rename) = tied_source(path.as_ref())?;
        Ok(checkpoint::load(self, &source, rename)?)
    }

    /// Check an encoder [`Self::load`] would load, from `config.json` and the weight headers
    /// only (no tensor is read or allocated): the config is valid and the weights hold
    /// exactly its keys and shapes (the tie allowed as in [`Self::load_weights`]), every
    /// difference named with the file. Returns the config.
    pub fn check_pretrained(path: impl AsRef<Path>) -> Result<Umt5Config, Umt5Error> {
        let path = path.as_ref();
        let config = Umt5Config::of_pretrained(path)?;
        let model = Self::init(&config, &Default::default(), 0)?;
        let (source, rename) = tied_source(path)?;
        checkpoint::check(&model, &source, rename)?;
        Ok(config)
    }

    /// `ids [B, L]` (each below `vocab_size`) and `mask [B, L]` (1 for tokens, 0 for
    /// padding) `-> last_hidden_state [B, L, d_model]`.
    pub fn forward(
        &self,
        ids: Tensor<B, 2, Int>,
        mask: Tensor<B, 2>,
    ) -> Result<Tensor<B, 3>, Umt5Error> {
        Ok(self.run(ids, mask, false)?.last_hidden_state)
    }

    /// [`Self::forward`] with every hidden state (transformers `output_hidden_states`).
    pub fn forward_with_hidden_states(
        &self,
        ids: Tensor<B, 2, Int>,
        mask: Tensor<B, 2>,
    ) -> Result<Umt5Output<B>, Umt5Error> {
        self.run(ids, mask, true)
    }

    fn run(
        &self,
        ids: Tensor<B, 2, Int>,
        mask: Tensor<B, 2>,
        keep: bool,
    ) -> Result<Umt5Output<B>, Umt5Error> {
        self.check_inputs(&ids, &mask)?;
        let ctx = AttentionContext::new(mask, &self.config);
        let mut x = self.shared.forward(ids);
        let mut hidden_states = Vec::new();
        for block in &self.encoder.block {
            if keep {
                hidden_states.push(x.clone());
            }
            x = block.forward(x, &ctx);
        }
        let last_hidden_state = self.encoder.final_layer_norm.forward(x);
        if keep {
            hidden_states.push(last_hidden_state.clone());
        }
        Ok(Umt5Output {
            last_hidden_state,
            hidden_states,
        })
    }

    fn check_inputs(&self, ids: &Tensor<B, 2, Int>, mask: &Tensor<B, 2>) -> Result<(), Umt5Error> {
        let [b, l] = ids.dims();
        if mask.dims() != [b, l] || b * l == 0 {
            return Err(Umt5Error::Input(format!(
                "ids {:?} and mask {:?} must be the same non-empty [B, L]",
                ids.dims(),
                mask.dims()
            )));
        }
        let lo: i64 = ids.clone().min().into_scalar().elem();
        let hi: i64 = ids.clone().max().into_scalar().elem();
        let vocab = self.config.vocab_size as i64;
        if lo < 0 || hi >= vocab {
            return Err(Umt5Error::Input(format!(
                "token ids span [{lo}, {hi}], outside the vocabulary [0, {vocab})"
            )));
        }
        Ok(())
    }
}

/// The checkpoint at `path` and the map from its keys to the model's: the tied
/// `encoder.embed_tokens.weight` fills `shared.weight` when that key is absent and is skipped
/// when both are stored.
fn tied_source(
    path: &Path,
) -> Result<(WeightSource, impl Fn(&str) -> Option<String>), WeightError> {
    let source = checkpoint::resolve(path, &WEIGHT_FILES)?;
    let has_shared = checkpoint::stored_shapes(&source)?.contains_key(SHARED_KEY);
    let rename = move |k: &str| match k {
        EMBED_TOKENS_KEY if has_shared => None,
        EMBED_TOKENS_KEY => Some(SHARED_KEY.to_string()),
        other => Some(other.to_string()),
    };
    Ok((source, rename))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;
    use reel_core::io::{module_to_safetensors, read_safetensors, write_safetensors};

    type TestBackend = burn::backend::NdArray;

    fn config() -> Umt5Config {
        Umt5Config::from_json_str(
            r#"{"vocab_size": 11, "d_model": 8, "d_kv": 2, "d_ff": 12, "num_layers": 3,
                "num_heads": 2, "relative_attention_num_buckets": 8,
                "relative_attention_max_distance": 16, "feed_forward_proj": "relu"}"#,
        )
        .unwrap()
    }

    #[test]
    fn hidden_states_and_masking() {
        let dev = Default::default();
        let enc = Umt5Encoder::<TestBackend>::init(&config(), &dev, 2).unwrap();
        let ids = Tensor::<TestBackend, 2, Int>::from_data(
            TensorData::new(vec![3i64, 5, 1, 0], [1, 4]),
            &dev,
        );
        let mask = Tensor::<TestBackend, 2>::from_floats([[1.0, 1.0, 1.0, 0.0]], &dev);
        let out = enc
            .forward_with_hidden_states(ids.clone(), mask.clone())
            .unwrap();
        assert_eq!(out.hidden_states.len(), 4);
        // Changing a masked token changes nothing at the unmasked positions.
        let other = Tensor::<TestBackend, 2, Int>::from_data(
            TensorData::new(vec![3i64, 5, 1, 7], [1, 4]),
            &dev,
        );
        let again = enc.forward(other, mask).unwrap();
        let diff: f32 = (again - out.last_hidden_state)
            .narrow(1, 0, 3)
            .abs()
            .max()
            .into_scalar();
        assert!(diff < 1e-6, "{diff}");
        let bad =
            Tensor::<TestBackend, 2, Int>::from_data(TensorData::new(vec![3i64, 11], [1, 2]), &dev);
        let msg = enc
            .forward(bad, Tensor::ones([1, 2], &dev))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("outside the vocabulary"), "{msg}");
    }

    #[test]
    fn missing_and_misshaped_weights_name_the_file_and_the_keys() {
        let dev = Default::default();
        let enc = Umt5Encoder::<TestBackend>::init(&config(), &dev, 2).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("model.safetensors");
        module_to_safetensors(&enc, &file, None).unwrap();
        let (mut tensors, _) = read_safetensors(&file).unwrap();
        tensors.remove("encoder.block.2.layer.0.SelfAttention.relative_attention_bias.weight");
        tensors.insert(
            "encoder.final_layer_norm.weight".into(),
            TensorData::new(vec![1f32; 9], [9]),
        );
        let list: Vec<_> = tensors.into_iter().collect();
        write_safetensors(&file, &list, None).unwrap();
        let msg = enc.load_weights(&file).unwrap_err().to_string();
        for needle in [
            file.display().to_string(),
            "encoder.block.2.layer.0.SelfAttention.relative_attention_bias.weight".into(),
            "encoder.final_layer_norm.weight".into(),
        ] {
            assert!(msg.contains(&needle), "`{needle}` not in: {msg}");
        }
    }
}
