//! The gated residual of a Wan block, `x + y · gate` (diffusers `WanTransformerBlock`:
//! `(hidden_states.float() + attn_output * gate_msa).type_as(hidden_states)`), as one
//! autodiff operation.
//!
//! Written with Burn tensor operations, the gate's gradient is a multiply over all the
//! activations and Burn's broadcast reduction over every token (without autotuning, one unit
//! per column, each a serial loop over all tokens), twice per block. As its own operation the
//! forward and `y`'s gradient are one kernel each on the plain CubeCL backends, and the
//! gate's gradient the chunked column sums of the norms' scale gradients
//! (`block_kernels::elementwise`); elsewhere the same computation in tensor operations.
//!
//! The operation runs on Reel's autodiff backends (`wan::custom_op`); anywhere else, and
//! without autodiff, its forward runs alone.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor};

use super::block_kernels::elementwise::{
    gate_dgate, gate_dy, gated_residual as forward, gated_residual_ops,
};
use super::custom_op::{
    dispatch, first_input, next_input, output, register, tensor, CustomBackward,
};
use super::mem_attention::{to_dtype, to_f32};

/// `x + y · gate` in `x`'s dtype, computed in float32 and rounded once: `x, y [B, N, dim]`,
/// `gate [B, 1, dim]` or `[1, 1, dim]` (any float dtypes) -> `[B, N, dim]`.
pub fn gated_residual<B: Backend>(
    x: Tensor<B, 3>,
    y: Tensor<B, 3>,
    gate: Tensor<B, 3>,
) -> Tensor<B, 3> {
    dispatch(Gated { x, y, gate })
}

/// [`gated_residual`] written with Burn tensor operations.
pub fn gated_residual_plain<B: Backend>(
    x: Tensor<B, 3>,
    y: Tensor<B, 3>,
    gate: Tensor<B, 3>,
) -> Tensor<B, 3> {
    gated_residual_ops(x, y, to_f32(gate))
}

/// `gate` as float32 `[B, 1, dim]` for `x [B, N, dim]`; panics unless it broadcasts so.
fn gate_operand<B: Backend>(gate: Tensor<B, 3>, [b, _, dim]: [usize; 3]) -> Tensor<B, 3> {
    let [gb, one, gdim] = gate.dims();
    assert!(
        (gb == b || gb == 1) && one == 1 && gdim == dim,
        "gate {:?} must be [{b} or 1, 1, {dim}]",
        [gb, one, gdim]
    );
    to_f32(gate).expand([b, 1, dim])
}

/// [`gated_residual`]'s inputs, for [`dispatch`].
struct Gated<B: Backend> {
    x: Tensor<B, 3>,
    y: Tensor<B, 3>,
    gate: Tensor<B, 3>,
}

impl<B: Backend> CustomBackward<B> for Gated<B> {
    type Output = Tensor<B, 3>;

    fn on_autodiff<I: Backend>(self) -> Result<Tensor<B, 3>, Self> {
        let Self { x, y, gate } = self;
        let x = match first_input::<B, I, 3>(x) {
            Ok(x) => x,
            Err(x) => return Err(Self { x, y, gate }),
        };
        let (y, gate) = (next_input::<B, I, 3>(y), next_input::<B, I, 3>(gate));
        Ok(output(autodiff_gated_residual(x, y, gate)))
    }

    fn otherwise(self) -> Tensor<B, 3> {
        let gate = gate_operand(self.gate, self.x.dims());
        forward(self.x, self.y, gate)
    }
}

/// What the gated residual keeps for its backward pass: `y` when the gate needs a gradient,
/// the float32 gate `[B, 1, dim]` when `y` does, and the dtypes and shape the gradients take.
#[derive(Debug, Clone)]
struct GateState<B: Backend> {
    y: Option<FloatTensor<B>>,
    gate: Option<FloatTensor<B>>,
    y_dtype: DType,
    gate_dtype: DType,
    gate_dims: [usize; 3],
}

/// The backward of [`gated_residual`]: `dx = g`, `dy = g · gate`, `dgate = Σ_tokens g · y`.
#[derive(Debug)]
struct GateBackward;

impl<B: Backend> Backward<B, 3> for GateBackward {
    type State = GateState<B>;

    fn backward(
        self,
        ops: Ops<Self::State, 3>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let s = ops.state;
        let [px, py, pgate] = ops.parents.map(|n| n.map(|n| n.id));
        let g = tensor::<B, 3>(grads.consume::<B>(&ops.node));
        if let (Some(pgate), Some(y)) = (pgate, s.y) {
            let mut d = gate_dgate(g.clone(), tensor::<B, 3>(y));
            if s.gate_dims[0] == 1 {
                d = d.sum_dim(0);
            }
            let d = to_dtype(d, s.gate_dtype);
            grads.register::<B>(pgate, d.into_primitive().tensor());
        }
        if let (Some(py), Some(gate)) = (py, s.gate) {
            let dy = gate_dy(g.clone(), tensor::<B, 3>(gate), s.y_dtype);
            grads.register::<B>(py, dy.into_primitive().tensor());
        }
        register::<B>(grads, px, || g.into_primitive().tensor());
    }
}

/// [`gated_residual`] as one autodiff operation on `Autodiff<B, C>`.
pub fn autodiff_gated_residual<B: Backend, C: CheckpointStrategy>(
    x: Tensor<Autodiff<B, C>, 3>,
    y: Tensor<Autodiff<B, C>, 3>,
    gate: Tensor<Autodiff<B, C>, 3>,
) -> Tensor<Autodiff<B, C>, 3> {
    let dims = x.dims();
    let (y_dtype, gate_dtype, gate_dims) = (y.dtype(), gate.dtype(), gate.dims());
    let (x, y, gate) = (
        x.into_primitive().tensor(),
        y.into_primitive().tensor(),
        gate.into_primitive().tensor(),
    );
    let (y_tracked, gate_tracked) = (y.is_tracked(), gate.is_tracked());
    let gate32 = gate_operand(tensor::<B, 3>(gate.primitive), dims);
    let out = forward(
        tensor::<B, 3>(x.primitive),
        tensor::<B, 3>(y.primitive.clone()),
        gate32.clone(),
    )
    .into_primitive()
    .tensor();
    let out = match GateBackward
        .prepare::<C>([x.node, y.node, gate.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let state = GateState {
                y: gate_tracked.then_some(y.primitive),
                gate: y_tracked.then(|| gate32.into_primitive().tensor()),
                y_dtype,
                gate_dtype,
                gate_dims,
            };
            prep.finish(state, out)
        }
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    tensor(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::backend::AutodiffBackend;
    use burn::tensor::{FloatDType, TensorData};

    fn values<K: Backend, const D: usize>(t: Tensor<K, D>) -> Vec<f32> {
        to_f32(t).into_data().to_vec::<f32>().expect("float32 data")
    }

    /// Deterministic, irregular values.
    fn det(n: usize, phase: f32) -> Vec<f32> {
        (0..n)
            .map(|i| (i as f32 * 0.37 + phase).sin() * 1.5)
            .collect()
    }

    /// `[out, dx, dy, dgate]` of `sum(w ∘ f(x, y, gate))` with `x, y` in `dtype`; which of
    /// `(x, y, gate)` are tracked as `tracked`; an untracked input's gradient is empty.
    fn case<K: AutodiffBackend>(
        f: fn(Tensor<K, 3>, Tensor<K, 3>, Tensor<K, 3>) -> Tensor<K, 3>,
        dims: [usize; 3],
        gate_batch: usize,
        dtype: FloatDType,
        tracked: [bool; 3],
    ) -> [Vec<f32>; 4] {
        let device = Default::default();
        let leaf = |v: Vec<f32>, shape: [usize; 3], track: bool| {
            let t = Tensor::<K, 3>::from_data(TensorData::new(v, shape), &device);
            if track {
                t.require_grad()
            } else {
                t
            }
        };
        let [b, n, dim] = dims;
        let x = leaf(det(b * n * dim, 0.1), dims, tracked[0]).cast(dtype);
        let y = leaf(det(b * n * dim, 0.9), dims, tracked[1]).cast(dtype);
        let gate = leaf(det(gate_batch * dim, 0.4), [gate_batch, 1, dim], tracked[2]);
        let w = leaf(det(b * n * dim, 2.3), dims, false);
        let out = f(x.clone(), y.clone(), gate.clone());
        assert_eq!(out.dtype(), x.dtype(), "the output has x's dtype");
        let grads = (to_f32(out.clone()) * w).sum().backward();
        let grad = |t: &Tensor<K, 3>| t.grad(&grads).map(values).unwrap_or_default();
        [values(out), grad(&x), grad(&y), grad(&gate)]
    }

    #[test]
    fn gradients_match_the_plain_formulation() {
        let _turn = reel_core::parallel::autodiff_turn();
        type Ad = Autodiff<burn::backend::NdArray>;
        let tracked = [
            [true, true, true],
            [true, false, true],
            [false, true, false],
            [true, false, false],
        ];
        for (dims, gate_batch) in [([1, 1, 3], 1), ([2, 7, 5], 2), ([3, 40, 9], 1)] {
            for t in tracked {
                let what = format!("{dims:?}, gate batch {gate_batch}, tracked {t:?}");
                let got = case::<Ad>(gated_residual, dims, gate_batch, FloatDType::F32, t);
                let want = case::<Ad>(gated_residual_plain, dims, gate_batch, FloatDType::F32, t);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(a.len(), b.len(), "{what}: value {i}'s presence");
                    for (p, q) in a.iter().zip(b) {
                        assert!(
                            (p - q).abs() <= 1e-5 * q.abs().max(1.0),
                            "{what}: value {i}: {p} vs {q}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bf16_rounds_once_from_float32() {
        let _turn = reel_core::parallel::autodiff_turn();
        type Ad = Autodiff<burn::backend::Flex>;
        let all = [true; 3];
        let [out, dx, dy, dgate] = case::<Ad>(gated_residual, [2, 6, 8], 2, FloatDType::BF16, all);
        let [out32, dx32, dy32, dgate32] =
            case::<Ad>(gated_residual_plain, [2, 6, 8], 2, FloatDType::BF16, all);
        // The same float32 computation, rounded once to bf16.
        assert_eq!(out, out32);
        assert_eq!(dx, dx32);
        for (a, b) in dy.iter().zip(&dy32).chain(dgate.iter().zip(&dgate32)) {
            assert!((a - b).abs() <= 8e-3 * b.abs().max(0.1), "{a} vs {b}");
        }
    }
}
