//! The UMT5 text encoder (transformers `UMT5EncoderModel`) and the Wan prompt embeddings.
//!
//! One concern per file: [`config`] (transformers `config.json`), [`layers`] (embedding,
//! T5 layer norm, feed-forward), [`attention`] (per-layer relative-position buckets and
//! self-attention), [`model`] ([`Umt5Encoder`]: load, forward, hidden states) and [`text`]
//! (the `tokenizer.json` tokenizer and [`Umt5TextEncoder::encode_prompts`], the Wan
//! pipeline's `prompt_embeds`). Module field names equal the transformers state-dict keys.
//!
//! ```no_run
//! # fn main() -> Result<(), reel_models::umt5::Umt5Error> {
//! type B = burn::backend::NdArray;
//! let device = Default::default();
//! let text = reel_models::umt5::Umt5TextEncoder::<B>::load(
//!     "Wan2.1-T2V-1.3B-Diffusers/tokenizer",
//!     "Wan2.1-T2V-1.3B-Diffusers/text_encoder",
//!     &device,
//! )?;
//! let (embeds, lengths) = text.encode_prompts(&["a red circle moving left"], 512)?;
//! assert_eq!(embeds.dims(), [1, 512, 4096]);
//! # Ok(()) }
//! ```

pub mod attention;
pub mod config;
pub mod layers;
pub mod model;
pub mod text;

pub use attention::relative_position_bucket;
pub use config::{Activation, Umt5Config, Umt5ConfigError};
pub use model::{Umt5Encoder, Umt5Error, Umt5Output};
pub use text::{
    load_tokenizer, prompt_embeds, tokenize, tokenizer_for, TokenBatch, Umt5TextEncoder,
    MAX_TEXT_LEN,
};
