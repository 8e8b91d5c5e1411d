//! Memory-efficient attention: a blocked forward with an online softmax that keeps only the
//! output and the per-row log-sum-exp, and its own backward that recomputes the scores block
//! by block (the FlashAttention-2 recurrences, written with Burn tensor operations).
//!
//! Burn 0.21's autodiff differentiates attention through the `[B, H, Sq, Sk]` probability
//! matrix, so the saved activations grow with the square of the token count. Here the saved
//! state is `q, k, v, o` and `lse [B, H, Sq, 1]`; the transient score block is at most
//! [`BLOCK_BUDGET`] elements. Peak memory therefore grows linearly with the sequence length.
//!
//! The custom backward runs on Reel's autodiff backends (`wan::custom_op`). On any other
//! autodiff backend [`attention`] falls back to the plain formulation (correct, quadratic
//! memory); on a backend without autodiff the blocked forward is used directly.

pub use super::attention_mode::{AttentionMode, AUTO_MIN_TOKENS};
use super::custom_op::{dispatch, first_input, next_input, output, tensor, CustomBackward};
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::NodeId;
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{activation, DType, Tensor};

/// Largest transient score block, in elements (`B·H·block_q·block_k`): 16 Mi floats = 64 MiB.
pub const BLOCK_BUDGET: usize = 1 << 24;

/// Largest key block; longer key sequences are processed with the online softmax.
pub const MAX_BLOCK_K: usize = 4096;

/// Block sizes of one attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    /// Query rows per block.
    pub q: usize,
    /// Key rows per block.
    pub k: usize,
}

impl BlockSizes {
    /// Blocks for `batch·heads` attention maps of `seq_q x seq_k` within [`BLOCK_BUDGET`].
    pub fn for_shape(batch_heads: usize, seq_q: usize, seq_k: usize) -> Self {
        let k = seq_k.clamp(1, MAX_BLOCK_K);
        let q = (BLOCK_BUDGET / (batch_heads.max(1) * k))
            .max(16)
            .min(seq_q.max(1));
        Self { q, k }
    }
}

/// Plain scaled dot-product attention, `q [B, H, Sq, D]`, `k [B, H, Sk, D]`,
/// `v [B, H, Sk, Dv]` -> `[B, H, Sq, Dv]`; differentiated op by op. With bfloat16 / float16
/// inputs the products run in that dtype and the softmax in float32.
pub fn naive_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
) -> Tensor<B, 4> {
    let scale = 1.0 / (q.dims()[3] as f64).sqrt();
    let dtype = v.dtype();
    let scores = to_f32(bmm(q, k.swap_dims(2, 3))) * scale;
    bmm(to_dtype(activation::softmax(scores, 3), dtype), v)
}

/// The attention's batched products `a [B, H, M, K] · b [B, H, K, N]`: on the ndarray
/// backend read from the operands' views without copying them
/// ([`reel_core::host::batched_matmul`]), elsewhere Burn's matmul. (Under autodiff, Burn's
/// matmul records the product for the backward pass.)
fn bmm<B: Backend>(a: Tensor<B, 4>, b: Tensor<B, 4>) -> Tensor<B, 4> {
    reel_core::host::batched_matmul(a, b)
}

/// `t` in float32 (a no-op for float32 tensors).
pub fn to_f32<B: Backend, const D: usize>(t: Tensor<B, D>) -> Tensor<B, D> {
    to_dtype(t, DType::F32)
}

/// `t` cast to the float dtype `dtype`, without an operation when it already has it.
pub fn to_dtype<B: Backend, const D: usize>(t: Tensor<B, D>, dtype: DType) -> Tensor<B, D> {
    if t.dtype() == dtype {
        t
    } else {
        t.cast(dtype)
    }
}

/// Blocked forward with the online softmax. Shapes as in [`naive_attention`]; returns the
/// output and the log-sum-exp of each query row `[B, H, Sq, 1]` (of the scaled scores).
pub fn blocked_forward<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    blocks: BlockSizes,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let scale = 1.0 / (q.dims()[3] as f64).sqrt();
    let dtype = v.dtype();
    let kt = k.swap_dims(2, 3);
    let k_blocks = kt.split(blocks.k, 3);
    let v_blocks = v.split(blocks.k, 2);
    let mut outs = Vec::new();
    let mut lses = Vec::new();
    for qi in q.split(blocks.q, 2) {
        let qi = qi * scale;
        let mut state: Option<(Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>)> = None;
        for (kj, vj) in k_blocks.iter().zip(&v_blocks) {
            let s = to_f32(bmm(qi.clone(), kj.clone()));
            let mj = s.clone().max_dim(3);
            state = Some(match state {
                None => {
                    let p = (s - mj.clone()).exp();
                    let acc = to_f32(bmm(to_dtype(p.clone(), dtype), vj.clone()));
                    (mj, p.sum_dim(3), acc)
                }
                Some((m, l, acc)) => {
                    let m_new = m.clone().max_pair(mj);
                    let corr = (m - m_new.clone()).exp();
                    let p = (s - m_new.clone()).exp();
                    let l = l * corr.clone() + p.clone().sum_dim(3);
                    let acc = acc * corr + to_f32(bmm(to_dtype(p, dtype), vj.clone()));
                    (m_new, l, acc)
                }
            });
        }
        let (m, l, acc) = state.expect("at least one key block");
        outs.push(to_dtype(acc / l.clone(), dtype));
        lses.push(m + l.log());
    }
    (Tensor::cat(outs, 2), Tensor::cat(lses, 2))
}

/// Gradients of the blocked attention given the saved `o`, `lse` and the output gradient
/// `d_o [B, H, Sq, Dv]`; returns `(dq, dk, dv)` shaped like `q`, `k`, `v`.
#[allow(clippy::too_many_arguments)]
pub fn blocked_backward<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    o: Tensor<B, 4>,
    lse: Tensor<B, 4>,
    d_o: Tensor<B, 4>,
    blocks: BlockSizes,
) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
    let scale = 1.0 / (q.dims()[3] as f64).sqrt();
    // Low-precision inputs: the backward runs in float32, the gradients return in the
    // inputs' dtypes.
    let dtypes = (q.dtype(), k.dtype(), v.dtype());
    let (q, k, v, o, d_o) = (to_f32(q), to_f32(k), to_f32(v), to_f32(o), to_f32(d_o));
    // D_i = Σ_c dO_ic · O_ic = Σ_j P_ij dP_ij.
    let delta = (d_o.clone() * o).sum_dim(3);
    let k_blocks = k.split(blocks.k, 2);
    let v_blocks = v.split(blocks.k, 2);
    let mut dk: Vec<Option<Tensor<B, 4>>> = vec![None; k_blocks.len()];
    let mut dv: Vec<Option<Tensor<B, 4>>> = vec![None; k_blocks.len()];
    let mut dq = Vec::new();
    let q_blocks = q.split(blocks.q, 2);
    let lse_blocks = lse.split(blocks.q, 2);
    let delta_blocks = delta.split(blocks.q, 2);
    let do_blocks = d_o.split(blocks.q, 2);
    for (((qi, lse_i), delta_i), do_i) in q_blocks
        .into_iter()
        .zip(lse_blocks)
        .zip(delta_blocks)
        .zip(do_blocks)
    {
        let qs = qi * scale;
        let mut dq_i: Option<Tensor<B, 4>> = None;
        for (j, (kj, vj)) in k_blocks.iter().zip(&v_blocks).enumerate() {
            let p = (bmm(qs.clone(), kj.clone().swap_dims(2, 3)) - lse_i.clone()).exp();
            let dv_j = bmm(p.clone().swap_dims(2, 3), do_i.clone());
            let dp = bmm(do_i.clone(), vj.clone().swap_dims(2, 3));
            let ds = p * (dp - delta_i.clone());
            let dq_c = bmm(ds.clone(), kj.clone());
            let dk_j = bmm(ds.swap_dims(2, 3), qs.clone());
            dq_i = Some(match dq_i {
                None => dq_c,
                Some(a) => a + dq_c,
            });
            dv[j] = Some(match dv[j].take() {
                None => dv_j,
                Some(a) => a + dv_j,
            });
            dk[j] = Some(match dk[j].take() {
                None => dk_j,
                Some(a) => a + dk_j,
            });
        }
        dq.push(dq_i.expect("at least one key block") * scale);
    }
    let collect = |v: Vec<Option<Tensor<B, 4>>>| {
        Tensor::cat(
            v.into_iter()
                .map(|t| t.expect("every key block visited"))
                .collect(),
            2,
        )
    };
    (
        to_dtype(Tensor::cat(dq, 2), dtypes.0),
        to_dtype(collect(dk), dtypes.1),
        to_dtype(collect(dv), dtypes.2),
    )
}

#[derive(Debug)]
struct MemoryEfficientBackward;

impl<B: Backend> Backward<B, 3> for MemoryEfficientBackward {
    // q, k, v, o, lse, block sizes.
    type State = (
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        (usize, usize),
    );

    fn backward(
        self,
        ops: Ops<Self::State, 3>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let d_o = grads.consume::<B>(&ops.node);
        let (q, k, v, o, lse, (bq, bk)) = ops.state;
        let t = tensor::<B, 4>;
        let (dq, dk, dv) = blocked_backward(
            t(q),
            t(k),
            t(v),
            t(o),
            t(lse),
            t(d_o),
            BlockSizes { q: bq, k: bk },
        );
        let grads_qkv = [dq, dk, dv].map(|g| g.into_primitive().tensor());
        register_qkv_grads::<B>(grads, ops.parents.map(|n| n.map(|n| n.id)), grads_qkv);
    }
}

/// Registers the gradients of an attention operation's parents `q, k, v` (node ids; `None`
/// for a parent that needs no gradient).
pub(crate) fn register_qkv_grads<B: Backend>(
    grads: &mut Gradients,
    parents: [Option<NodeId>; 3],
    values: [FloatTensor<B>; 3],
) {
    for (id, grad) in parents.into_iter().zip(values) {
        if let Some(id) = id {
            grads.register::<B>(id, grad);
        }
    }
}

/// The memory-efficient attention as one autodiff operation on `Autodiff<B, C>`, with block
/// sizes from [`BlockSizes::for_shape`].
pub fn autodiff_attention<B: Backend, C: CheckpointStrategy>(
    q: Tensor<Autodiff<B, C>, 4>,
    k: Tensor<Autodiff<B, C>, 4>,
    v: Tensor<Autodiff<B, C>, 4>,
) -> Tensor<Autodiff<B, C>, 4> {
    let [b, h, sq, _] = q.dims();
    let blocks = BlockSizes::for_shape(b * h, sq, k.dims()[2]);
    autodiff_attention_with(q, k, v, blocks)
}

/// [`autodiff_attention`] with explicit block sizes.
pub fn autodiff_attention_with<B: Backend, C: CheckpointStrategy>(
    q: Tensor<Autodiff<B, C>, 4>,
    k: Tensor<Autodiff<B, C>, 4>,
    v: Tensor<Autodiff<B, C>, 4>,
    blocks: BlockSizes,
) -> Tensor<Autodiff<B, C>, 4> {
    let q = q.into_primitive().tensor();
    let k = k.into_primitive().tensor();
    let v = v.into_primitive().tensor();
    let inner = |p: &FloatTensor<B>| tensor::<B, 4>(p.clone());
    let out = match MemoryEfficientBackward
        .prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (o, lse) = blocked_forward(
                inner(&q.primitive),
                inner(&k.primitive),
                inner(&v.primitive),
                blocks,
            );
            let o = o.into_primitive().tensor();
            let state = (
                q.primitive,
                k.primitive,
                v.primitive,
                o.clone(),
                lse.into_primitive().tensor(),
                (blocks.q, blocks.k),
            );
            prep.finish(state, o)
        }
        OpsKind::UnTracked(prep) => {
            let (o, _) = blocked_forward(
                inner(&q.primitive),
                inner(&k.primitive),
                inner(&v.primitive),
                blocks,
            );
            prep.finish(o.into_primitive().tensor())
        }
    };
    tensor(out)
}

/// [`memory_efficient_attention`]'s inputs, for [`dispatch`].
struct MemoryEfficient<B: Backend> {
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
}

impl<B: Backend> CustomBackward<B> for MemoryEfficient<B> {
    type Output = Tensor<B, 4>;

    fn on_autodiff<I: Backend>(self) -> Result<Tensor<B, 4>, Self> {
        let Self { q, k, v } = self;
        let q = match first_input::<B, I, 4>(q) {
            Ok(q) => q,
            Err(q) => return Err(Self { q, k, v }),
        };
        let o = autodiff_attention(q, next_input::<B, I, 4>(k), next_input::<B, I, 4>(v));
        Ok(output(o))
    }

    fn otherwise(self) -> Tensor<B, 4> {
        let Self { q, k, v } = self;
        if B::ad_enabled(&q.device()) {
            return naive_attention(q, k, v);
        }
        let [b, h, sq, _] = q.dims();
        let blocks = BlockSizes::for_shape(b * h, sq, k.dims()[2]);
        blocked_forward(q, k, v, blocks).0
    }
}

/// Memory-efficient attention on any backend: the custom backward on Reel's autodiff
/// backends, the blocked forward on backends without autodiff, the plain formulation on other
/// autodiff backends. Shapes as in [`naive_attention`].
pub fn memory_efficient_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
) -> Tensor<B, 4> {
    dispatch(MemoryEfficient { q, k, v })
}

/// Whether `attention = "fused"` (or `"flash"`) runs the fused CubeCL kernels on the backend
/// `B` (otherwise it runs the blocked version); asks the same dispatch with a one-element
/// input.
pub fn fused_kernels_apply<B: Backend>(device: &B::Device) -> bool {
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    {
        let t = || Tensor::<B, 4>::zeros([1, 1, 1, 1], device);
        super::fused_attention::try_fused_attention(t(), t(), t(), false).is_ok()
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    {
        let _ = device;
        false
    }
}

/// Attention with the implementation `mode` selects for this query length.
pub fn attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mode: AttentionMode,
) -> Tensor<B, 4> {
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    let (q, k, v) = if matches!(mode, AttentionMode::Fused | AttentionMode::Flash) {
        match super::fused_attention::try_fused_attention(q, k, v, mode == AttentionMode::Flash) {
            Ok(o) => return o,
            Err(qkv) => qkv,
        }
    } else {
        (q, k, v)
    };
    if mode.use_memory_efficient(q.dims()[2]) {
        memory_efficient_attention(q, k, v)
    } else {
        naive_attention(q, k, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reel_core::rng::StreamRng;

    type Inner = burn::backend::NdArray;
    type Ad = Autodiff<Inner>;

    #[test]
    fn cpu_backends_run_no_fused_kernels() {
        let _turn = reel_core::parallel::autodiff_turn();
        assert!(!fused_kernels_apply::<Inner>(&Default::default()));
        assert!(!fused_kernels_apply::<Ad>(&Default::default()));
        assert!(!fused_kernels_apply::<burn::backend::Flex>(
            &Default::default()
        ));
    }

    /// Normal(0, 1.5) values from a private seeded stream (the backend's global RNG is
    /// shared between test threads).
    fn rand<B: Backend>(shape: [usize; 4], seed: u64) -> Tensor<B, 4> {
        let t: Tensor<B, 4> = StreamRng::from_seed(seed).normal_tensor(shape, &Default::default());
        t * 1.5
    }

    fn max_abs_diff<B: Backend>(a: Tensor<B, 4>, b: Tensor<B, 4>) -> f32 {
        (a - b).abs().max().into_scalar().elem()
    }

    use burn::tensor::ElementConversion;

    /// Gradients of `Σ w ∘ attention(q, k, v)` with respect to q, k, v.
    fn grads(
        f: impl Fn(Tensor<Ad, 4>, Tensor<Ad, 4>, Tensor<Ad, 4>) -> Tensor<Ad, 4>,
        shape_q: [usize; 4],
        shape_k: [usize; 4],
    ) -> [Tensor<Inner, 4>; 4] {
        let q = rand::<Ad>(shape_q, 1).require_grad();
        let k = rand::<Ad>(shape_k, 2).require_grad();
        let v = rand::<Ad>(shape_k, 3).require_grad();
        let o = f(q.clone(), k.clone(), v.clone());
        let w = rand::<Ad>(o.dims(), 4);
        let g = (o.clone() * w).sum().backward();
        [
            o.inner(),
            q.grad(&g).unwrap(),
            k.grad(&g).unwrap(),
            v.grad(&g).unwrap(),
        ]
    }

    #[test]
    fn blocked_forward_matches_naive_with_online_softmax() {
        let q = rand::<Inner>([2, 3, 37, 8], 1);
        let k = rand::<Inner>([2, 3, 53, 8], 2);
        let v = rand::<Inner>([2, 3, 53, 5], 3);
        let naive = naive_attention(q.clone(), k.clone(), v.clone());
        // Uneven blocks on both axes: 3 query blocks, 4 key blocks (last ones partial).
        let (o, lse) =
            blocked_forward(q.clone(), k.clone(), v.clone(), BlockSizes { q: 16, k: 16 });
        assert!(max_abs_diff(naive.clone(), o) < 1e-5);
        // lse is the log-sum-exp of the scaled scores.
        let scores = q.matmul(k.swap_dims(2, 3)) * (1.0 / 8f64.sqrt());
        let m = scores.clone().max_dim(3);
        let want = (scores - m.clone()).exp().sum_dim(3).log() + m;
        assert!(max_abs_diff(want, lse) < 1e-5);
        // One block covering everything gives the same output.
        let (o1, _) = blocked_forward(
            rand::<Inner>([2, 3, 37, 8], 1),
            rand::<Inner>([2, 3, 53, 8], 2),
            rand::<Inner>([2, 3, 53, 5], 3),
            BlockSizes { q: 64, k: 64 },
        );
        assert!(max_abs_diff(naive, o1) < 1e-5);
    }

    #[test]
    fn custom_backward_matches_naive_gradients() {
        let _turn = reel_core::parallel::autodiff_turn();
        for (sq, sk, bq, bk) in [(37, 53, 16, 16), (24, 24, 64, 4096), (20, 7, 3, 2)] {
            let naive = grads(naive_attention, [2, 3, sq, 8], [2, 3, sk, 8]);
            let blocked = grads(
                move |q, k, v| autodiff_attention_with(q, k, v, BlockSizes { q: bq, k: bk }),
                [2, 3, sq, 8],
                [2, 3, sk, 8],
            );
            for (name, (a, b)) in ["out", "dq", "dk", "dv"]
                .iter()
                .zip(naive.into_iter().zip(blocked))
            {
                let d = max_abs_diff(a, b);
                assert!(
                    d < 1e-4,
                    "{name} differs by {d} (sq {sq}, sk {sk}, blocks {bq}x{bk})"
                );
            }
        }
    }

    #[test]
    fn dispatch_uses_the_custom_op_and_matches() {
        let _turn = reel_core::parallel::autodiff_turn();
        // Through the public entry point on Reel's CPU autodiff backend.
        let naive = grads(naive_attention, [1, 2, 40, 16], [1, 2, 40, 16]);
        let eff = grads(memory_efficient_attention, [1, 2, 40, 16], [1, 2, 40, 16]);
        for (a, b) in naive.into_iter().zip(eff) {
            assert!(max_abs_diff(a, b) < 1e-4);
        }
        // Without autodiff: the blocked forward.
        let q = rand::<Inner>([1, 2, 40, 16], 1);
        let k = rand::<Inner>([1, 2, 40, 16], 2);
        let v = rand::<Inner>([1, 2, 40, 16], 3);
        let d = max_abs_diff(
            naive_attention(q.clone(), k.clone(), v.clone()),
            memory_efficient_attention(q, k, v),
        );
        assert!(d < 1e-5);
    }

    #[test]
    fn frozen_inputs_record_no_gradient() {
        let _turn = reel_core::parallel::autodiff_turn();
        let q = rand::<Ad>([1, 1, 8, 4], 1).require_grad();
        let k = rand::<Ad>([1, 1, 8, 4], 2);
        let v = rand::<Ad>([1, 1, 8, 4], 3);
        let g = autodiff_attention(q.clone(), k.clone(), v.clone())
            .sum()
            .backward();
        assert!(q.grad(&g).is_some());
        assert!(k.grad(&g).is_none() && v.grad(&g).is_none());
    }

    #[test]
    fn auto_mode_switches_at_the_threshold() {
        assert!(!AttentionMode::Auto.use_memory_efficient(AUTO_MIN_TOKENS - 1));
        assert!(AttentionMode::Auto.use_memory_efficient(AUTO_MIN_TOKENS));
        assert!(AttentionMode::MemoryEfficient.use_memory_efficient(1));
        assert!(!AttentionMode::Naive.use_memory_efficient(1 << 20));
        let b = BlockSizes::for_shape(24, 32760, 32760);
        assert_eq!(b.k, MAX_BLOCK_K);
        assert!(24 * b.q * b.k <= BLOCK_BUDGET && b.q >= 16);
    }
}
