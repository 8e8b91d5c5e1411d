//! Residual block, per-frame attention block and middle block of the Wan VAE.
//!
//! Upstream: diffusers `autoencoder_kl_wan.py` — `WanResidualBlock`, `WanAttentionBlock`
//! and `WanMidBlock` (with `num_layers=1`, as `WanEncoder3d` / `WanDecoder3d` build it).

use burn::module::Module;
use burn::tensor::activation::{silu, softmax};
use burn::tensor::{backend::Backend, Tensor};

use super::cache::FeatCache;
use super::conv::{CausalConv3d, Conv1x1};
use super::norm::{ImageRmsNorm, RmsNorm};
use crate::wan::init::{join, ParamInit};

/// `WanResidualBlock`: `conv2(silu(norm2(conv1(silu(norm1(x)))))) + shortcut(x)`, the
/// shortcut a 1x1x1 convolution when the width changes. Dropout is omitted (inference).
#[derive(Module, Debug)]
pub struct ResidualBlock<B: Backend> {
    /// Norm before `conv1` (`in_dim`).
    pub norm1: RmsNorm<B>,
    /// Causal 3x3x3 convolution `in_dim -> out_dim`.
    pub conv1: CausalConv3d<B>,
    /// Norm before `conv2` (`out_dim`).
    pub norm2: RmsNorm<B>,
    /// Causal 3x3x3 convolution `out_dim -> out_dim`.
    pub conv2: CausalConv3d<B>,
    /// 1x1x1 convolution `in_dim -> out_dim` when the widths differ.
    pub conv_shortcut: Option<CausalConv3d<B>>,
}

impl<B: Backend> ResidualBlock<B> {
    /// A block at `path` from `in_dim` to `out_dim` channels.
    pub fn init(init: &ParamInit<B>, path: &str, in_dim: usize, out_dim: usize) -> Self {
        let p = |name: &str| join(path, name);
        Self {
            norm1: RmsNorm::init(init, &p("norm1"), in_dim),
            conv1: CausalConv3d::cube(init, &p("conv1"), in_dim, out_dim),
            norm2: RmsNorm::init(init, &p("norm2"), out_dim),
            conv2: CausalConv3d::cube(init, &p("conv2"), out_dim, out_dim),
            conv_shortcut: (in_dim != out_dim)
                .then(|| CausalConv3d::pointwise(init, &p("conv_shortcut"), in_dim, out_dim)),
        }
    }

    /// One chunk `[B, in_dim, t, H, W] -> [B, out_dim, t, H, W]` (two cache slots).
    pub fn forward(&self, x: Tensor<B, 5>, cache: &mut FeatCache<B>) -> Tensor<B, 5> {
        let norms = [&self.norm1, &self.norm2];
        let convs = [&self.conv1, &self.conv2];
        Self::forward_parts(norms, convs, self.conv_shortcut.as_ref(), x, cache)
    }

    /// [`Self::forward`] on borrowed modules (`[norm1, norm2]`, `[conv1, conv2]`,
    /// `conv_shortcut`), for the encoder's flat entries, which hold them as their own fields.
    /// Borrowing matters: a clone of a not yet initialized parameter gets its own lazy value,
    /// so a block built from clones for every chunk would draw and upload its random weights
    /// again each time.
    pub fn forward_parts(
        [norm1, norm2]: [&RmsNorm<B>; 2],
        [conv1, conv2]: [&CausalConv3d<B>; 2],
        conv_shortcut: Option<&CausalConv3d<B>>,
        x: Tensor<B, 5>,
        cache: &mut FeatCache<B>,
    ) -> Tensor<B, 5> {
        let h = match conv_shortcut {
            Some(conv) => conv.forward(x.clone(), None, cache.conv()),
            None => x.clone(),
        };
        let x = conv1.forward_cached(silu(norm1.forward(x)), cache);
        let x = conv2.forward_cached(silu(norm2.forward(x)), cache);
        x + h
    }
}

/// `WanAttentionBlock`: single-head self-attention over the pixels of each frame, with an
/// RMS norm in front and a residual connection (no temporal mixing, so no cache slot).
#[derive(Module, Debug)]
pub struct AttentionBlock<B: Backend> {
    /// Per-frame RMS norm (`gamma [C, 1, 1]`).
    pub norm: ImageRmsNorm<B>,
    /// 1x1 convolution `C -> 3C` giving query, key and value.
    pub to_qkv: Conv1x1<B>,
    /// 1x1 output projection `C -> C`.
    pub proj: Conv1x1<B>,
}

impl<B: Backend> AttentionBlock<B> {
    /// A block at `path` over `dim` channels.
    pub fn init(init: &ParamInit<B>, path: &str, dim: usize) -> Self {
        Self {
            norm: ImageRmsNorm::init(init, &join(path, "norm"), dim),
            to_qkv: Conv1x1::init(init, &join(path, "to_qkv"), dim, 3 * dim),
            proj: Conv1x1::init(init, &join(path, "proj"), dim, dim),
        }
    }

    /// `[B, C, T, H, W] -> [B, C, T, H, W]`: every frame attends over its `H * W` pixels
    /// with scale `1 / sqrt(C)` (`F.scaled_dot_product_attention` with one head).
    pub fn forward(&self, x: Tensor<B, 5>) -> Tensor<B, 5> {
        Self::forward_parts(&self.norm, [&self.to_qkv, &self.proj], x)
    }

    /// [`Self::forward`] on borrowed modules (`norm`, `[to_qkv, proj]`), for the encoder's
    /// flat entries (see [`ResidualBlock::forward_parts`]).
    pub fn forward_parts(
        norm: &ImageRmsNorm<B>,
        [to_qkv, proj]: [&Conv1x1<B>; 2],
        x: Tensor<B, 5>,
    ) -> Tensor<B, 5> {
        let [b, c, t, h, w] = x.dims();
        let tokens = norm
            .forward(x.clone())
            .permute([0, 2, 3, 4, 1])
            .reshape([b * t, h * w, c]);
        let qkv = to_qkv.forward(tokens);
        let q = qkv.clone().narrow(2, 0, c);
        let k = qkv.clone().narrow(2, c, c);
        let v = qkv.narrow(2, 2 * c, c);
        let scores = q.matmul(k.transpose()).mul_scalar(1.0 / (c as f64).sqrt());
        let out = proj.forward(softmax(scores, 2).matmul(v));
        let out = out.reshape([b, t, h, w, c]).permute([0, 4, 1, 2, 3]);
        out + x
    }
}

/// `WanMidBlock(num_layers=1)`: `resnets.0`, then `attentions.i` and `resnets.(i+1)` for
/// each attention layer.
#[derive(Module, Debug)]
pub struct MidBlock<B: Backend> {
    /// Per-frame attention blocks.
    pub attentions: Vec<AttentionBlock<B>>,
    /// Residual blocks (one more than attention blocks).
    pub resnets: Vec<ResidualBlock<B>>,
}

impl<B: Backend> MidBlock<B> {
    /// The middle block at `path` over `dim` channels with one attention layer.
    pub fn init(init: &ParamInit<B>, path: &str, dim: usize) -> Self {
        let layers = 1;
        Self {
            attentions: (0..layers)
                .map(|i| AttentionBlock::init(init, &join(path, &format!("attentions.{i}")), dim))
                .collect(),
            resnets: (0..=layers)
                .map(|i| ResidualBlock::init(init, &join(path, &format!("resnets.{i}")), dim, dim))
                .collect(),
        }
    }

    /// One chunk `[B, C, t, H, W] -> [B, C, t, H, W]`.
    pub fn forward(&self, x: Tensor<B, 5>, cache: &mut FeatCache<B>) -> Tensor<B, 5> {
        let mut resnets = self.resnets.iter();
        let mut x = match resnets.next() {
            Some(first) => first.forward(x, cache),
            None => x,
        };
        for (attn, resnet) in self.attentions.iter().zip(resnets) {
            x = resnet.forward(attn.forward(x), cache);
        }
        x
    }
}
