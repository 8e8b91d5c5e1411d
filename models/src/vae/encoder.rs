//! The causal video encoder of the Wan2.1 VAE.
//!
//! Upstream: diffusers `autoencoder_kl_wan.py`, `WanEncoder3d` with `is_residual=False`:
//! `conv_in`, a flat list `down_blocks` (per level: `num_res_blocks` residual blocks, each
//! followed by an attention block when the level's scale is in `attn_scales`, then a
//! `downsample2d` / `downsample3d` resampler except after the last level), `mid_block`,
//! `norm_out` + SiLU and `conv_out` to `2 * z_dim` channels.

use burn::module::Module;
use burn::tensor::activation::silu;
use burn::tensor::{backend::Backend, Tensor};

use super::blocks::{AttentionBlock, MidBlock, ResidualBlock};
use super::cache::FeatCache;
use super::config::WanVaeConfig;
use super::conv::{CausalConv3d, Conv1x1, FrameConv2d};
use super::norm::{ImageRmsNorm, RmsNorm};
use super::resample::{Resample, ResampleMode};
use crate::wan::init::{join, ParamInit};

/// What an entry of `down_blocks` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DownKind {
    /// A `WanResidualBlock`.
    Residual,
    /// A `WanAttentionBlock`.
    Attention,
    /// A `WanResample` (`downsample2d` or `downsample3d`).
    Resample(ResampleMode),
}

/// One entry of diffusers' flat `encoder.down_blocks` list. diffusers keeps residual
/// blocks, attention blocks and resamplers in one `nn.ModuleList`, so their parameters sit
/// directly under the entry index (`down_blocks.0.conv1.weight`,
/// `down_blocks.1.resample.1.weight`). This entry therefore carries the fields of all three
/// kinds, exactly the set of [`DownLayer::kind`] present, and [`DownLayer::forward`] runs
/// the matching block.
#[derive(Module, Debug)]
pub struct DownLayer<B: Backend> {
    /// Residual block: norm before `conv1`.
    pub norm1: Option<RmsNorm<B>>,
    /// Residual block: first causal convolution.
    pub conv1: Option<CausalConv3d<B>>,
    /// Residual block: norm before `conv2`.
    pub norm2: Option<RmsNorm<B>>,
    /// Residual block: second causal convolution.
    pub conv2: Option<CausalConv3d<B>>,
    /// Residual block: 1x1x1 shortcut when the width changes.
    pub conv_shortcut: Option<CausalConv3d<B>>,
    /// Attention block: per-frame norm.
    pub norm: Option<ImageRmsNorm<B>>,
    /// Attention block: query/key/value projection.
    pub to_qkv: Option<Conv1x1<B>>,
    /// Attention block: output projection.
    pub proj: Option<Conv1x1<B>>,
    /// Resampler: `(parameter-free zero padding, strided 3x3 convolution)`.
    pub resample: Option<(std::marker::PhantomData<B>, FrameConv2d<B>)>,
    /// Resampler: temporal convolution of `downsample3d`.
    pub time_conv: Option<CausalConv3d<B>>,
    /// Which block this entry is.
    pub kind: DownKind,
}

impl<B: Backend> DownLayer<B> {
    fn empty(kind: DownKind) -> Self {
        Self {
            norm1: None,
            conv1: None,
            norm2: None,
            conv2: None,
            conv_shortcut: None,
            norm: None,
            to_qkv: None,
            proj: None,
            resample: None,
            time_conv: None,
            kind,
        }
    }

    /// An entry holding a residual block.
    pub fn residual(block: ResidualBlock<B>) -> Self {
        Self {
            norm1: Some(block.norm1),
            conv1: Some(block.conv1),
            norm2: Some(block.norm2),
            conv2: Some(block.conv2),
            conv_shortcut: block.conv_shortcut,
            ..Self::empty(DownKind::Residual)
        }
    }

    /// An entry holding an attention block.
    pub fn attention(block: AttentionBlock<B>) -> Self {
        Self {
            norm: Some(block.norm),
            to_qkv: Some(block.to_qkv),
            proj: Some(block.proj),
            ..Self::empty(DownKind::Attention)
        }
    }

    /// An entry holding a resampler.
    pub fn resampler(block: Resample<B>) -> Self {
        Self {
            resample: Some(block.resample),
            time_conv: block.time_conv,
            ..Self::empty(DownKind::Resample(block.mode))
        }
    }

    /// One chunk through the block this entry holds, run on its fields as borrowed (cloning
    /// them into a typed block would re-draw not yet initialized random weights every chunk:
    /// [`ResidualBlock::forward_parts`]).
    pub fn forward(&self, x: Tensor<B, 5>, cache: &mut FeatCache<B>) -> Tensor<B, 5> {
        match self.kind {
            DownKind::Residual => match (&self.norm1, &self.conv1, &self.norm2, &self.conv2) {
                (Some(norm1), Some(conv1), Some(norm2), Some(conv2)) => {
                    let shortcut = self.conv_shortcut.as_ref();
                    ResidualBlock::forward_parts([norm1, norm2], [conv1, conv2], shortcut, x, cache)
                }
                _ => x,
            },
            DownKind::Attention => match (&self.norm, &self.to_qkv, &self.proj) {
                (Some(norm), Some(to_qkv), Some(proj)) => {
                    AttentionBlock::forward_parts(norm, [to_qkv, proj], x)
                }
                _ => x,
            },
            DownKind::Resample(mode) => match &self.resample {
                Some((_, conv)) => {
                    Resample::forward_parts((conv, self.time_conv.as_ref()), mode, x, cache)
                }
                None => x,
            },
        }
    }
}

/// `WanEncoder3d` (Wan2.1 layout).
#[derive(Module, Debug)]
pub struct Encoder3d<B: Backend> {
    /// Causal 3x3x3 convolution `in_channels -> base_dim`.
    pub conv_in: CausalConv3d<B>,
    /// Residual, attention and downsampling blocks in diffusers' order.
    pub down_blocks: Vec<DownLayer<B>>,
    /// Middle block at the lowest resolution.
    pub mid_block: MidBlock<B>,
    /// Output norm (followed by SiLU).
    pub norm_out: RmsNorm<B>,
    /// Causal 3x3x3 convolution to `2 * z_dim` channels (mean and log-variance).
    pub conv_out: CausalConv3d<B>,
}

impl<B: Backend> Encoder3d<B> {
    /// The encoder of `config` at `path` (`"encoder"` in the VAE).
    pub fn init(init: &ParamInit<B>, path: &str, config: &WanVaeConfig) -> Self {
        let dims = config.encoder_dims();
        let levels = config.dim_mult.len();
        let mut down_blocks = Vec::new();
        let entry = |i: usize| join(path, &format!("down_blocks.{i}"));
        let mut scale = 1.0;
        for (level, pair) in dims.windows(2).enumerate() {
            let (mut in_dim, out_dim) = (pair[0], pair[1]);
            for _ in 0..config.num_res_blocks {
                let block = ResidualBlock::init(init, &entry(down_blocks.len()), in_dim, out_dim);
                down_blocks.push(DownLayer::residual(block));
                if config.has_attention_at(scale) {
                    let block = AttentionBlock::init(init, &entry(down_blocks.len()), out_dim);
                    down_blocks.push(DownLayer::attention(block));
                }
                in_dim = out_dim;
            }
            if level + 1 < levels {
                let mode = match config.temperal_downsample.get(level) {
                    Some(true) => ResampleMode::Downsample3d,
                    _ => ResampleMode::Downsample2d,
                };
                let block = Resample::init(init, &entry(down_blocks.len()), out_dim, mode);
                down_blocks.push(DownLayer::resampler(block));
                scale /= 2.0;
            }
        }
        let top = *dims.last().unwrap_or(&config.base_dim);
        Self {
            conv_in: CausalConv3d::cube(init, &join(path, "conv_in"), config.in_channels, dims[0]),
            down_blocks,
            mid_block: MidBlock::init(init, &join(path, "mid_block"), top),
            norm_out: RmsNorm::init(init, &join(path, "norm_out"), top),
            conv_out: CausalConv3d::cube(init, &join(path, "conv_out"), top, 2 * config.z_dim),
        }
    }

    /// One causal chunk `[B, in_channels, t, H, W] -> [B, 2 z_dim, t', H / s, W / s]`,
    /// recording `encoder.conv_in`, `encoder.down_blocks.<i>`, `encoder.mid_block` and
    /// `encoder.conv_out` when `cache` captures.
    pub fn forward(&self, x: Tensor<B, 5>, cache: &mut FeatCache<B>) -> Tensor<B, 5> {
        let mut x = self.conv_in.forward_cached(x, cache);
        cache.record("encoder.conv_in", &x);
        for (i, layer) in self.down_blocks.iter().enumerate() {
            x = layer.forward(x, cache);
            cache.record(&format!("encoder.down_blocks.{i}"), &x);
        }
        x = self.mid_block.forward(x, cache);
        cache.record("encoder.mid_block", &x);
        let x = self
            .conv_out
            .forward_cached(silu(self.norm_out.forward(x)), cache);
        cache.record("encoder.conv_out", &x);
        x
    }
}
