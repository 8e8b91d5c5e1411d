//! The causal video decoder of the Wan2.1 VAE.
//!
//! Upstream: diffusers `autoencoder_kl_wan.py`, `WanDecoder3d` with `is_residual=False`
//! and `WanUpBlock`: `conv_in` from `z_dim`, `mid_block`, then one `up_blocks.<i>` per
//! level (`num_res_blocks + 1` residual blocks, then an `upsample2d` / `upsample3d`
//! resampler except at the last level; after the first level a block's input width is
//! halved, since each upsampler outputs `dim / 2` channels), `norm_out` + SiLU and
//! `conv_out` to `out_channels`. diffusers' decoder has no attention outside the middle
//! block, whatever `attn_scales` says.

use burn::module::Module;
use burn::tensor::activation::silu;
use burn::tensor::{backend::Backend, Tensor};

use super::blocks::{MidBlock, ResidualBlock};
use super::cache::FeatCache;
use super::config::WanVaeConfig;
use super::conv::CausalConv3d;
use super::norm::RmsNorm;
use super::resample::{Resample, ResampleMode};
use crate::wan::init::{join, ParamInit};

/// `WanUpBlock`: residual blocks and an optional upsampler (`upsamplers.0`).
#[derive(Module, Debug)]
pub struct UpBlock<B: Backend> {
    /// `num_res_blocks + 1` residual blocks.
    pub resnets: Vec<ResidualBlock<B>>,
    /// The upsampler, when this level upsamples (empty at the last level).
    pub upsamplers: Vec<Resample<B>>,
}

impl<B: Backend> UpBlock<B> {
    /// An up block at `path`.
    pub fn init(
        init: &ParamInit<B>,
        path: &str,
        [in_dim, out_dim]: [usize; 2],
        num_resnets: usize,
        upsample: Option<ResampleMode>,
    ) -> Self {
        let resnets = (0..num_resnets)
            .map(|i| {
                let c_in = if i == 0 { in_dim } else { out_dim };
                ResidualBlock::init(init, &join(path, &format!("resnets.{i}")), c_in, out_dim)
            })
            .collect();
        let upsamplers = upsample
            .map(|mode| Resample::init(init, &join(path, "upsamplers.0"), out_dim, mode))
            .into_iter()
            .collect();
        Self {
            resnets,
            upsamplers,
        }
    }

    /// One chunk `[B, in_dim, t, H, W] -> [B, out_dim (or out_dim / 2), t', H', W']`.
    pub fn forward(&self, x: Tensor<B, 5>, cache: &mut FeatCache<B>) -> Tensor<B, 5> {
        let x = self.resnets.iter().fold(x, |x, r| r.forward(x, cache));
        self.upsamplers.iter().fold(x, |x, u| u.forward(x, cache))
    }
}

/// `WanDecoder3d` (Wan2.1 layout).
#[derive(Module, Debug)]
pub struct Decoder3d<B: Backend> {
    /// Causal 3x3x3 convolution `z_dim -> dims[0]`.
    pub conv_in: CausalConv3d<B>,
    /// Middle block at the lowest resolution.
    pub mid_block: MidBlock<B>,
    /// One block per level, lowest resolution first.
    pub up_blocks: Vec<UpBlock<B>>,
    /// Output norm (followed by SiLU).
    pub norm_out: RmsNorm<B>,
    /// Causal 3x3x3 convolution to `out_channels`.
    pub conv_out: CausalConv3d<B>,
}

impl<B: Backend> Decoder3d<B> {
    /// The decoder of `config` at `path` (`"decoder"` in the VAE).
    pub fn init(init: &ParamInit<B>, path: &str, config: &WanVaeConfig) -> Self {
        let dims = config.decoder_dims();
        let levels = config.dim_mult.len();
        // diffusers' temperal_upsample = temperal_downsample reversed.
        let temporal: Vec<bool> = config.temperal_downsample.iter().rev().copied().collect();
        let up_blocks = dims
            .windows(2)
            .enumerate()
            .map(|(i, pair)| {
                let in_dim = if i > 0 { pair[0] / 2 } else { pair[0] };
                let mode = (i + 1 < levels).then(|| match temporal.get(i) {
                    Some(true) => ResampleMode::Upsample3d,
                    _ => ResampleMode::Upsample2d,
                });
                let path = join(path, &format!("up_blocks.{i}"));
                UpBlock::init(
                    init,
                    &path,
                    [in_dim, pair[1]],
                    config.num_res_blocks + 1,
                    mode,
                )
            })
            .collect();
        let last = *dims.last().unwrap_or(&config.base_dim);
        Self {
            conv_in: CausalConv3d::cube(init, &join(path, "conv_in"), config.z_dim, dims[0]),
            mid_block: MidBlock::init(init, &join(path, "mid_block"), dims[0]),
            up_blocks,
            norm_out: RmsNorm::init(init, &join(path, "norm_out"), last),
            conv_out: CausalConv3d::cube(init, &join(path, "conv_out"), last, config.out_channels),
        }
    }

    /// One latent frame (or chunk) `[B, z_dim, t, h, w] -> [B, out_channels, t', h s, w s]`,
    /// recording `decoder.conv_in`, `decoder.mid_block`, `decoder.up_blocks.<i>` and
    /// `decoder.conv_out` when `cache` captures.
    pub fn forward(&self, x: Tensor<B, 5>, cache: &mut FeatCache<B>) -> Tensor<B, 5> {
        let x = self.conv_in.forward_cached(x, cache);
        cache.record("decoder.conv_in", &x);
        let mut x = self.mid_block.forward(x, cache);
        cache.record("decoder.mid_block", &x);
        for (i, block) in self.up_blocks.iter().enumerate() {
            x = block.forward(x, cache);
            cache.record(&format!("decoder.up_blocks.{i}"), &x);
        }
        let x = self
            .conv_out
            .forward_cached(silu(self.norm_out.forward(x)), cache);
        cache.record("decoder.conv_out", &x);
        x
    }
}
