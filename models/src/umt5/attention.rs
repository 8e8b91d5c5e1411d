//! UMT5 self-attention with its own relative-position bias in every layer.
//!
//! Upstream: transformers `modeling_umt5.py`, `UMT5Attention` (`_relative_position_bucket`,
//! `compute_bias`, `forward`) and `UMT5LayerSelfAttention`. As in T5 there is no `1/sqrt(d)`
//! scaling of the scores (it is folded into the initialisation); unlike T5 every layer has a
//! `relative_attention_bias` table `[num_buckets, num_heads]`. The encoder's buckets are
//! bidirectional. The padding mask is added as `(1 - mask) * f32::MIN`.
// `SelfAttention` is a field name because Burn names parameters after fields, and it is
// transformers' key name.
#![allow(non_snake_case)]

use burn::module::{Module, Param};
use burn::tensor::activation::softmax;
use burn::tensor::{backend::Backend, Int, Tensor, TensorData};

use super::config::Umt5Config;
use super::layers::T5LayerNorm;
use crate::wan::init::{join, InitKind, ParamInit};
use crate::wan::Linear;

/// The bucket of `relative_position = key_pos - query_pos` (transformers
/// `_relative_position_bucket`): with `bidirectional`, half the buckets are for positive
/// offsets; of each half, offsets below `n / 2` get their own bucket and larger ones share
/// logarithmically wider buckets up to `max_distance`, beyond which all share the last one.
/// Computed in float32 like the reference, so bucket edges fall where PyTorch's do.
pub fn relative_position_bucket(
    relative_position: i64,
    bidirectional: bool,
    num_buckets: usize,
    max_distance: usize,
) -> usize {
    let mut n = num_buckets as i64;
    let mut bucket = 0;
    let distance = if bidirectional {
        n /= 2;
        if relative_position > 0 {
            bucket += n;
        }
        relative_position.abs()
    } else {
        -relative_position.min(0)
    };
    let max_exact = n / 2;
    if distance < max_exact {
        return (bucket + distance) as usize;
    }
    let log_ratio = (distance as f32 / max_exact as f32).ln()
        / ((max_distance as f64 / max_exact as f64).ln() as f32);
    let large = max_exact + (log_ratio * (n - max_exact) as f32) as i64;
    (bucket + large.min(n - 1)) as usize
}

/// `UMT5Attention` of an encoder layer.
#[derive(Module, Debug)]
pub struct SelfAttention<B: Backend> {
    /// Query projection `d_model -> heads * d_kv`.
    pub q: Linear<B>,
    /// Key projection.
    pub k: Linear<B>,
    /// Value projection.
    pub v: Linear<B>,
    /// Output projection `heads * d_kv -> d_model`.
    pub o: Linear<B>,
    /// Bias per bucket and head `[num_buckets, num_heads]`.
    pub relative_attention_bias: Bias<B>,
    /// Attention heads.
    pub num_heads: usize,
}

/// The `nn.Embedding` holding the relative-position bias (`relative_attention_bias.weight`).
#[derive(Module, Debug)]
pub struct Bias<B: Backend> {
    /// `[num_buckets, num_heads]`.
    pub weight: Param<Tensor<B, 2>>,
}

impl<B: Backend> SelfAttention<B> {
    /// The attention of one layer at `path`.
    pub fn init(init: &ParamInit<B>, path: &str, c: &Umt5Config) -> Self {
        let (d, inner) = (c.d_model, c.inner_dim());
        let lin =
            |name: &str, i: usize, o: usize| Linear::init(init, &join(path, name), i, o, false);
        let std = (d as f64).powf(-0.5);
        Self {
            q: lin("q", d, inner),
            k: lin("k", d, inner),
            v: lin("v", d, inner),
            o: lin("o", inner, d),
            relative_attention_bias: Bias {
                weight: init.param(
                    &join(path, "relative_attention_bias.weight"),
                    [c.relative_attention_num_buckets, c.num_heads],
                    InitKind::Normal { std },
                ),
            },
            num_heads: c.num_heads,
        }
    }

    /// The position bias `[1, heads, L, L]` (transformers `compute_bias`) from the
    /// buckets of the context.
    pub fn position_bias(&self, ctx: &AttentionContext<B>) -> Tensor<B, 4> {
        let (len, heads) = (ctx.len, self.num_heads);
        self.relative_attention_bias
            .weight
            .val()
            .select(0, ctx.buckets.clone())
            .reshape([len, len, heads])
            .permute([2, 0, 1])
            .unsqueeze::<4>()
    }

    /// `x [B, L, d_model] -> [B, L, d_model]` with the mask and buckets of `ctx`.
    pub fn forward(&self, x: Tensor<B, 3>, ctx: &AttentionContext<B>) -> Tensor<B, 3> {
        let [b, l, _] = x.dims();
        let h = self.num_heads;
        let split = |t: Tensor<B, 3>| {
            let dk = t.dims()[2] / h;
            t.reshape([b, l, h, dk]).swap_dims(1, 2)
        };
        let q = split(self.q.forward(x.clone()));
        let k = split(self.k.forward(x.clone()));
        let v = split(self.v.forward(x.clone()));
        let bias = self.position_bias(ctx) + ctx.mask_bias.clone();
        let scores = q.matmul(k.swap_dims(2, 3)) + bias;
        let ctx = softmax(scores, 3).matmul(v).swap_dims(1, 2);
        let inner = ctx.dims()[2] * ctx.dims()[3];
        self.o.forward(ctx.reshape([b, l, inner]))
    }
}

/// `UMT5LayerSelfAttention`: `x + SelfAttention(layer_norm(x))`.
#[derive(Module, Debug)]
pub struct LayerSelfAttention<B: Backend> {
    /// The attention.
    pub SelfAttention: SelfAttention<B>,
    /// Pre-norm.
    pub layer_norm: T5LayerNorm<B>,
}

impl<B: Backend> LayerSelfAttention<B> {
    /// `[B, L, d_model] -> [B, L, d_model]`.
    pub fn forward(&self, x: Tensor<B, 3>, ctx: &AttentionContext<B>) -> Tensor<B, 3> {
        x.clone() + self.SelfAttention.forward(self.layer_norm.forward(x), ctx)
    }
}

/// What every layer's attention shares in one forward pass.
#[derive(Debug, Clone)]
pub struct AttentionContext<B: Backend> {
    /// The padding mask as an additive bias `(1 - mask) * f32::MIN`, `[B, 1, 1, L]`.
    pub mask_bias: Tensor<B, 4>,
    /// The bucket of every (query, key) pair, row-major `[L * L]` (the bias tables differ
    /// per layer, the buckets do not).
    pub buckets: Tensor<B, 1, Int>,
    /// Sequence length `L`.
    pub len: usize,
}

impl<B: Backend> AttentionContext<B> {
    /// The context of a `[B, L]` 0/1 `mask` with the bidirectional buckets of `config`.
    pub fn new(mask: Tensor<B, 2>, config: &Umt5Config) -> Self {
        let [b, len] = mask.dims();
        let (n, max) = (
            config.relative_attention_num_buckets,
            config.relative_attention_max_distance,
        );
        let buckets: Vec<i64> = (0..len as i64)
            .flat_map(|q| (0..len as i64).map(move |k| k - q))
            .map(|rel| relative_position_bucket(rel, true, n, max) as i64)
            .collect();
        let device = mask.device();
        Self {
            mask_bias: (mask.neg() + 1.0)
                .mul_scalar(f32::MIN)
                .reshape([b, 1, 1, len]),
            buckets: Tensor::from_data(TensorData::new(buckets, [len * len]), &device),
            len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values worked out by hand for 32 buckets, max distance 128 (16 per direction, 8
    /// exact): `8 + floor(ln(d / 8) / ln(16) * 8)` beyond, capped at 15.
    #[test]
    fn bidirectional_buckets_match_hand_computed_values() {
        let cases = [
            (0, 0),
            (-3, 3),
            (3, 19),
            (7, 23),
            (-8, 8),
            (-12, 9),  // ln(1.5) / ln(16) * 8 = 1.17
            (-17, 10), // ln(2.125) / ln(16) * 8 = 2.17
            (-20, 10), // 2.64
            (20, 26),
            (-127, 15), // 7.98
            (-1000, 15),
            (1000, 31),
        ];
        for (rel, want) in cases {
            assert_eq!(
                relative_position_bucket(rel, true, 32, 128),
                want,
                "offset {rel}"
            );
        }
    }

    #[test]
    fn unidirectional_buckets_ignore_the_future() {
        assert_eq!(relative_position_bucket(5, false, 32, 128), 0);
        assert_eq!(relative_position_bucket(-5, false, 32, 128), 5);
        // 16 exact buckets; ln(40 / 16) / ln(8) * 16 = 7.05 -> 23.
        assert_eq!(relative_position_bucket(-40, false, 32, 128), 23);
    }
}
