//! The Wan transformer block (diffusers `WanTransformerBlock`) and its feed-forward network.

use burn::module::{Module, Param};
use burn::tensor::{backend::Backend, Tensor};

use super::attention::WanAttention;
use super::gate::gated_residual;
use super::gelu::gelu_tanh;
use super::init::{join, ParamInit};
use super::linear::Linear;
use super::norm::{layer_norm_affine, LayerNorm};
use super::rope::RopeTables;

/// The tanh-approximate GELU as a parameter-free module (slot `net.1` of the FFN, which
/// applies it together with `net.2`: [`Linear::forward_gelu`]).
#[derive(Module, Clone, Debug, Default)]
pub struct GeluTanh;

impl GeluTanh {
    /// Element-wise `GELU_tanh(x)`.
    pub fn forward<B: Backend, const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        gelu_tanh(x)
    }
}

/// diffusers `GELU(dim, inner, approximate="tanh")`: a projection followed by GELU; its
/// projection is the key `proj`.
#[derive(Module, Debug)]
pub struct GeluProj<B: Backend> {
    /// `dim -> ffn_dim`.
    pub proj: Linear<B>,
}

/// diffusers `FeedForward(dim, inner_dim=ffn_dim, activation_fn="gelu-approximate")`.
///
/// `net` is a tuple so that Burn names its entries `net.0`, `net.1`, `net.2`, giving exactly
/// the diffusers keys `ffn.net.0.proj.{weight,bias}` and `ffn.net.2.{weight,bias}` (`net.1`
/// is the dropout slot in diffusers and holds the activation here; it has no parameters).
#[derive(Module, Debug)]
pub struct FeedForward<B: Backend> {
    /// `(proj + GELU, activation marker, output Linear)`.
    pub net: (GeluProj<B>, GeluTanh, Linear<B>),
}

impl<B: Backend> FeedForward<B> {
    /// Parameters at `path` (`path.net.0.proj`, `path.net.2`).
    pub fn init(init: &ParamInit<B>, path: &str, dim: usize, ffn_dim: usize) -> Self {
        Self {
            net: (
                GeluProj {
                    proj: Linear::init(init, &join(path, "net.0.proj"), dim, ffn_dim, true),
                },
                GeluTanh,
                Linear::init(init, &join(path, "net.2"), ffn_dim, dim, true),
            ),
        }
    }

    /// `[B, S, dim] -> [B, S, dim]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        // `net.2(net.1(..))` of the `net.0` output, as one operation that keeps only that
        // output (and the weight) for the backward pass.
        self.net.2.forward_gelu(self.net.0.proj.forward(x))
    }
}

/// Everything a block computes, for hooks and parity checks.
#[derive(Debug, Clone)]
pub struct BlockOutput<B: Backend> {
    /// Output hidden states `[B, N, dim]`.
    pub hidden_states: Tensor<B, 3>,
    /// Raw self-attention output (before the gate) `[B, N, dim]`.
    pub attn1_out: Tensor<B, 3>,
    /// Raw cross-attention output `[B, N, dim]`.
    pub attn2_out: Tensor<B, 3>,
    /// Raw feed-forward output (before the gate) `[B, N, dim]`.
    pub ffn_out: Tensor<B, 3>,
}

/// diffusers `WanTransformerBlock`: modulated self-attention with RoPE, cross-attention to
/// the text (no modulation, no gate), modulated feed-forward.
#[derive(Module, Debug)]
pub struct WanBlock<B: Backend> {
    /// Self-attention.
    pub attn1: WanAttention<B>,
    /// Affine LayerNorm before cross-attention (`None` = identity, `cross_attn_norm=false`).
    pub norm2: Option<LayerNorm<B>>,
    /// Cross-attention to the text tokens.
    pub attn2: WanAttention<B>,
    /// Feed-forward network.
    pub ffn: FeedForward<B>,
    /// Learned modulation offsets `[1, 6, dim]` (shift, scale, gate for attention, then
    /// for the FFN).
    pub scale_shift_table: Param<Tensor<B, 3>>,
    /// Epsilon of the parameter-free LayerNorms `norm1` / `norm3`.
    pub eps: f64,
}

impl<B: Backend> WanBlock<B> {
    /// Parameters at `path` (`blocks.<i>`).
    #[allow(clippy::too_many_arguments)]
    pub fn init(
        init: &ParamInit<B>,
        path: &str,
        heads: usize,
        head_dim: usize,
        ffn_dim: usize,
        cross_attn_norm: bool,
        eps: f64,
    ) -> Self {
        let dim = heads * head_dim;
        let table_std = 1.0 / (dim as f64).sqrt();
        Self {
            attn1: WanAttention::init(init, &join(path, "attn1"), heads, head_dim, eps),
            norm2: cross_attn_norm.then(|| LayerNorm::init(init, &join(path, "norm2"), dim, eps)),
            attn2: WanAttention::init(init, &join(path, "attn2"), heads, head_dim, eps),
            ffn: FeedForward::init(init, &join(path, "ffn"), dim, ffn_dim),
            scale_shift_table: init.param(
                &join(path, "scale_shift_table"),
                [1, 6, dim],
                super::init::InitKind::Normal { std: table_std },
            ),
            eps,
        }
    }

    /// Hidden states after the block, `[B, N, dim]`.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        modulation: Tensor<B, 3>,
        context: Tensor<B, 3>,
        rope: &RopeTables<B>,
    ) -> Tensor<B, 3> {
        self.forward_detailed(x, modulation, context, rope)
            .hidden_states
    }

    /// The block with its sub-module outputs.
    ///
    /// `x [B, N, dim]` (float32, or bfloat16 in a bf16 run: the outputs have its dtype);
    /// `modulation [B, 6, dim]` (`timestep_proj` unflattened, float32); `context [B, L, dim]`
    /// (projected text); `rope` tables for the `N` tokens.
    pub fn forward_detailed(
        &self,
        x: Tensor<B, 3>,
        modulation: Tensor<B, 3>,
        context: Tensor<B, 3>,
        rope: &RopeTables<B>,
    ) -> BlockOutput<B> {
        // (table + modulation).chunk(6, dim=1): each [B, 1, dim], broadcast over tokens.
        let m = (self.scale_shift_table.val() + modulation).chunk(6, 1);
        let [shift_msa, scale_msa, gate_msa, c_shift, c_scale, c_gate]: [Tensor<B, 3>; 6] =
            m.try_into().expect("six modulation chunks");

        // The hidden states keep their dtype (bfloat16 activations in a bf16 run); norms,
        // modulation and the gated residuals compute in float32, as diffusers'
        // `FP32LayerNorm` and `.float()` do.
        let modulate = |x: Tensor<B, 3>, scale: Tensor<B, 3>, shift: Tensor<B, 3>| {
            layer_norm_affine(x, scale + 1.0, shift, self.eps)
        };

        // 1. self-attention: LN(x) * (1 + scale) + shift, residual gated.
        let h = modulate(x.clone(), scale_msa, shift_msa);
        let attn1_out = self.attn1.forward(h, None, Some(rope));
        let x = gated_residual(x, attn1_out.clone(), gate_msa);

        // 2. cross-attention: affine LN (or identity), no modulation, no gate.
        let h = match &self.norm2 {
            Some(norm) => norm.forward(x.clone()),
            None => x.clone(),
        };
        let attn2_out = self.attn2.forward(h, Some(context), None);
        let x = x + attn2_out.clone();

        // 3. feed-forward: LN(x) * (1 + c_scale) + c_shift, residual gated.
        let h = modulate(x.clone(), c_scale, c_shift);
        let ffn_out = self.ffn.forward(h);
        let x = gated_residual(x, ffn_out.clone(), c_gate);

        BlockOutput {
            hidden_states: x,
            attn1_out,
            attn2_out,
            ffn_out,
        }
    }
}
