//! Attention: the scaled-dot-product entry point and the Wan attention module (`attn1` /
//! `attn2`). The memory-efficient kernel lives in [`super::mem_attention`].

use burn::module::Module;
use burn::tensor::{activation, backend::Backend, Tensor};

use super::init::{join, ParamInit};
use super::linear::Linear;
use super::mem_attention::{self, to_dtype, AttentionMode};
use super::norm::RmsNorm;
use super::reshape::reshape;
use super::rope::RopeTables;
use reel_core::config::Precision;

/// Scaled dot-product attention `softmax(Q K^T / sqrt(D)) V`, no mask, no dropout.
///
/// `q [B, H, Sq, D]`, `k [B, H, Sk, D]`, `v [B, H, Sk, Dv]` -> `[B, H, Sq, Dv]`.
///
/// This is the plain formulation (it materializes the `[B, H, Sq, Sk]` score matrix, also in
/// the backward pass); the model calls [`mem_attention::attention`], which picks it or the
/// memory-efficient kernel.
pub fn scaled_dot_product_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let d = q.dims()[3];
    let scale = 1.0 / (d as f64).sqrt();
    let scores = q.matmul(k.swap_dims(2, 3)) * scale;
    activation::softmax(scores, 3).matmul(v)
}

/// diffusers `WanAttention` (text-to-video): q/k/v projections, RMSNorm of the full q and k
/// across all heads, optional RoPE on q and k, attention, output projection.
#[derive(Module, Debug)]
pub struct WanAttention<B: Backend> {
    /// Query projection `dim -> dim`.
    pub to_q: Linear<B>,
    /// Key projection `dim -> dim`.
    pub to_k: Linear<B>,
    /// Value projection `dim -> dim`.
    pub to_v: Linear<B>,
    /// Output projection; a one-element list so its keys are `to_out.0.*` as in diffusers
    /// (where `to_out = [Linear, Dropout]`).
    pub to_out: Vec<Linear<B>>,
    /// RMSNorm of the projected queries over all heads (`dim` wide).
    pub norm_q: RmsNorm<B>,
    /// RMSNorm of the projected keys over all heads (`dim` wide).
    pub norm_k: RmsNorm<B>,
    /// Number of heads.
    pub heads: usize,
    /// Attention implementation (not a parameter; set with `WanModel::with_attention`).
    pub mode: AttentionMode,
    /// Compute precision of the attention products (softmax statistics stay float32).
    pub precision: Precision,
}

impl<B: Backend> WanAttention<B> {
    /// Parameters at `path` for a `heads x head_dim` attention with norm epsilon `eps`.
    pub fn init(init: &ParamInit<B>, path: &str, heads: usize, head_dim: usize, eps: f64) -> Self {
        let dim = heads * head_dim;
        Self {
            to_q: Linear::init(init, &join(path, "to_q"), dim, dim, true),
            to_k: Linear::init(init, &join(path, "to_k"), dim, dim, true),
            to_v: Linear::init(init, &join(path, "to_v"), dim, dim, true),
            to_out: vec![Linear::init(init, &join(path, "to_out.0"), dim, dim, true)],
            norm_q: RmsNorm::init(init, &join(path, "norm_q"), dim, eps),
            norm_k: RmsNorm::init(init, &join(path, "norm_k"), dim, eps),
            heads,
            mode: AttentionMode::default(),
            precision: Precision::F32,
        }
    }

    /// Self-attention when `context` is `None`, cross-attention otherwise.
    ///
    /// `x [B, S, dim]`, `context [B, L, dim]`, `rope` tables for the `S` tokens (applied to q
    /// and k) -> `[B, S, dim]` in the dtype of `x`. The q/k RMSNorms and RoPE compute in
    /// float32 (as PyTorch's `RMSNorm` and diffusers' rotary embedding do for bf16 inputs);
    /// with `Bf16` the attention itself runs on bfloat16 q, k, v.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        context: Option<Tensor<B, 3>>,
        rope: Option<&RopeTables<B>>,
    ) -> Tensor<B, 3> {
        let [b, s, dim] = x.dims();
        let h = self.heads;
        let hd = dim / h;
        let kv = context.unwrap_or_else(|| x.clone());
        let l = kv.dims()[1];
        let dtype = x.dtype();
        let q = self.norm_q.forward(self.to_q.forward(x));
        let k = self.norm_k.forward(self.to_k.forward(kv.clone()));
        let v = self.to_v.forward(kv);
        let mut q = reshape(q, [b, s, h, hd]);
        let mut k = reshape(k, [b, l, h, hd]);
        let v = reshape(v, [b, l, h, hd]);
        // RoPE computes in float32 and writes the attention's dtype directly.
        if let Some(rope) = rope {
            q = rope.apply(q, self.precision.dtype());
            k = rope.apply(k, self.precision.dtype());
        }
        // Cast (where RoPE did not), then see `[B, S, H, hd]` as `[B, H, S, hd]`: the fused kernels
        // return the output (and the gradients) stored `[B, S, H, hd]` like their inputs, so
        // merging the heads below is a view, not a copy.
        let c = |t: Tensor<B, 4>| to_dtype(t, self.precision.dtype()).swap_dims(1, 2);
        let o = to_dtype(mem_attention::attention(c(q), c(k), c(v), self.mode), dtype);
        let o = reshape(o.swap_dims(1, 2), [b, s, dim]);
        self.to_out[0].forward(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type B = burn::backend::Flex;

    #[test]
    fn sdpa_matches_naive_loop() {
        let dev = Default::default();
        let mut rng = reel_core::rng::StreamRng::from_seed(1);
        let q: Tensor<B, 4> = rng.normal_tensor([1, 2, 3, 4], &dev);
        let k: Tensor<B, 4> = rng.normal_tensor([1, 2, 5, 4], &dev);
        let v: Tensor<B, 4> = rng.normal_tensor([1, 2, 5, 3], &dev);
        let o = scaled_dot_product_attention(q.clone(), k.clone(), v.clone());
        assert_eq!(o.dims(), [1, 2, 3, 3]);
        let (q, k, v, o): (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) = (
            q.into_data().to_vec().unwrap(),
            k.into_data().to_vec().unwrap(),
            v.into_data().to_vec().unwrap(),
            o.into_data().to_vec().unwrap(),
        );
        for h in 0..2 {
            for i in 0..3 {
                let s: Vec<f64> = (0..5)
                    .map(|j| {
                        (0..4)
                            .map(|c| (q[(h * 3 + i) * 4 + c] * k[(h * 5 + j) * 4 + c]) as f64)
                            .sum::<f64>()
                            / 2.0
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for c in 0..3 {
                    let want: f64 = (0..5)
                        .map(|j| e[j] / z * v[(h * 5 + j) * 3 + c] as f64)
                        .sum();
                    let got = o[(h * 3 + i) * 3 + c] as f64;
                    assert!((got - want).abs() < 1e-5, "{got} vs {want}");
                }
            }
        }
    }
}
