//! The Wan2.1 video VAE (diffusers `AutoencoderKLWan`, `is_residual=False`).
//!
//! One concern per file: [`config`] (diffusers `config.json`) and [`validate`] (its
//! checks), [`cache`] (the causal frame-chunk feature cache), [`conv`] (causal 3D,
//! per-frame 2D and 1x1 convolutions) and [`conv_gemm`] (how they run), [`norm`] (`WanRMS_norm`), [`blocks`] (residual,
//! attention and middle blocks), [`resample`] (spatial / temporal up- and downsampling),
//! [`encoder`], [`decoder`], [`model`] ([`WanVae`]: load, encode, decode, latent
//! normalisation) and [`tiling`] (spatially tiled encode / decode). Module field names
//! equal the diffusers state-dict keys, so a parameter's dotted path is its key in
//! `diffusion_pytorch_model.safetensors`.
//!
//! ```no_run
//! # use burn::tensor::Tensor;
//! # fn main() -> Result<(), reel_models::vae::VaeError> {
//! type B = burn::backend::NdArray;
//! let device = Default::default();
//! let vae = reel_models::vae::WanVae::<B>::load("Wan2.1-T2V-1.3B-Diffusers/vae", &device)?;
//! let video = Tensor::<B, 5>::zeros([1, 3, 9, 64, 64], &device); // [-1, 1]
//! let latents = vae.normalize_latents(vae.encode(video)?.mean)?; // [1, 16, 3, 8, 8]
//! let back = vae.decode(vae.denormalize_latents(latents)?)?; // [1, 3, 9, 64, 64]
//! # Ok(()) }
//! ```

pub mod blocks;
pub mod cache;
pub mod config;
pub mod conv;
pub mod conv_gemm;
pub mod decoder;
pub mod encoder;
pub mod model;
pub mod norm;
pub mod resample;
pub mod tiling;
pub mod validate;

pub use cache::{Intermediates, CACHE_T, FIRST_CHUNK};
pub use config::{VaeConfigError, WanVaeConfig};
pub use model::{Posterior, VaeError, WanVae};
pub use tiling::Tiling;
