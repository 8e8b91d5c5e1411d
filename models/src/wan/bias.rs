//! `y + bias` over the rows of `y` as one autodiff operation whose bias gradient is a chunked
//! column sum (`block_kernels::norms::sum_rows`).
//!
//! Written with Burn tensor operations, the bias gradient of a linear layer is Burn's
//! broadcast reduction of the output gradient over all tokens, which without autotuning runs
//! one unit per output column, each a serial loop over every token (at 8190 tokens, 8190
//! dependent loads per unit). As its own operation the gradient is the fused column sums on
//! the plain CubeCL backends and `sum_dim` elsewhere; nothing is kept for the backward pass.
//!
//! The operation runs on Reel's autodiff backends (`wan::custom_op`); anywhere else, and
//! without autodiff, the plain formulation runs.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};

use super::block_kernels::norms::sum_rows;
use super::custom_op::{
    dispatch, first_input, next_input, output, register, tensor, CustomBackward,
};
use super::mem_attention::to_dtype;

/// `y + bias` for `y [rows, out]` and `bias [out]` of the same dtype -> `[rows, out]`.
pub fn add_bias<B: Backend>(y: Tensor<B, 2>, bias: Tensor<B, 1>) -> Tensor<B, 2> {
    dispatch(AddBias { y, bias })
}

/// [`add_bias`] written with Burn tensor operations.
pub fn add_bias_plain<B: Backend>(y: Tensor<B, 2>, bias: Tensor<B, 1>) -> Tensor<B, 2> {
    y + bias.unsqueeze_dim::<2>(0)
}

/// [`add_bias`]'s inputs, for [`dispatch`].
struct AddBias<B: Backend> {
    y: Tensor<B, 2>,
    bias: Tensor<B, 1>,
}

impl<B: Backend> CustomBackward<B> for AddBias<B> {
    type Output = Tensor<B, 2>;

    fn on_autodiff<I: Backend>(self) -> Result<Tensor<B, 2>, Self> {
        let Self { y, bias } = self;
        let y = match first_input::<B, I, 2>(y) {
            Ok(y) => y,
            Err(y) => return Err(Self { y, bias }),
        };
        Ok(output(autodiff_add_bias(y, next_input::<B, I, 1>(bias))))
    }

    fn otherwise(self) -> Tensor<B, 2> {
        add_bias_plain(self.y, self.bias)
    }
}

/// The backward of [`add_bias`]; its state is the bias's dtype.
#[derive(Debug)]
struct AddBiasBackward;

impl<B: Backend> Backward<B, 2> for AddBiasBackward {
    type State = DType;

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let [py, pbias] = ops.parents.map(|n| n.map(|n| n.id));
        let g = tensor::<B, 2>(grads.consume::<B>(&ops.node));
        register::<B>(grads, pbias, || {
            to_dtype(sum_rows(g.clone()), ops.state)
                .into_primitive()
                .tensor()
        });
        register::<B>(grads, py, || g.into_primitive().tensor());
    }
}

/// [`add_bias`] as one autodiff operation on `Autodiff<B, C>`.
pub fn autodiff_add_bias<B: Backend, C: CheckpointStrategy>(
    y: Tensor<Autodiff<B, C>, 2>,
    bias: Tensor<Autodiff<B, C>, 1>,
) -> Tensor<Autodiff<B, C>, 2> {
    let dtype = bias.dtype();
    let (y, bias) = (y.into_primitive().tensor(), bias.into_primitive().tensor());
    let out = add_bias_plain(tensor::<B, 2>(y.primitive), tensor::<B, 1>(bias.primitive))
        .into_primitive()
        .tensor();
    match AddBiasBackward
        .prepare::<C>([y.node, bias.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => tensor(prep.finish(dtype, out)),
        OpsKind::UnTracked(prep) => tensor(prep.finish(out)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::backend::AutodiffBackend;
    use burn::tensor::TensorData;

    fn values<K: Backend, const D: usize>(t: Tensor<K, D>) -> Vec<f32> {
        t.into_data().to_vec::<f32>().expect("float32 data")
    }

    /// Deterministic, irregular values.
    fn det(n: usize, phase: f32) -> Vec<f32> {
        (0..n)
            .map(|i| (i as f32 * 0.37 + phase).sin() * 1.5)
            .collect()
    }

    /// `(out, dy, dbias)` of `sum(w ∘ f(y, bias))` with `y [rows, cols]`.
    fn case<B: AutodiffBackend>(
        f: fn(Tensor<B, 2>, Tensor<B, 1>) -> Tensor<B, 2>,
        [rows, cols]: [usize; 2],
    ) -> [Vec<f32>; 3] {
        let device = Default::default();
        let leaf = |v, shape| Tensor::<B, 2>::from_data(TensorData::new(v, shape), &device);
        let y = leaf(det(rows * cols, 0.1), [rows, cols]).require_grad();
        let bias = Tensor::<B, 1>::from_data(TensorData::new(det(cols, 0.7), [cols]), &device)
            .require_grad();
        let w = leaf(det(rows * cols, 2.3), [rows, cols]);
        let out = f(y.clone(), bias.clone());
        let grads = (out.clone() * w).sum().backward();
        let dy = y.grad(&grads).expect("y's gradient");
        let db = bias.grad(&grads).expect("the bias's gradient");
        [values(out), values(dy), values(db)]
    }

    #[test]
    fn bias_gradients_are_the_sums_over_rows() {
        let _turn = reel_core::parallel::autodiff_turn();
        type Ad = Autodiff<burn::backend::NdArray>;
        for shape in [[1, 3], [7, 5], [130, 9]] {
            let got = case::<Ad>(add_bias, shape);
            let want = case::<Ad>(add_bias_plain, shape);
            assert_eq!(got[0], want[0], "{shape:?}: the same forward");
            assert_eq!(got[1], want[1], "{shape:?}: y's gradient passes through");
            for (a, b) in got[2].iter().zip(&want[2]) {
                assert!(
                    (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                    "{shape:?}: {a} vs {b}"
                );
            }
        }
    }
}
