//! Reshapes without ndarray's copy, in the forward and the backward pass.
//!
//! Burn's ndarray backend copies every tensor it reshapes, and Burn's autodiff reshapes the
//! gradient back the same way, so each `reshape` of the model costs two copies of an
//! activation on the `cpu` backend. [`reshape`] is `Tensor::reshape` with the same values
//! and gradients; on `Autodiff<NdArray>` it is one autodiff operation whose forward and
//! backward both go through [`reel_core::host::reshape`] (the same buffer under a new shape
//! where the tensor is contiguous), and on a plain ndarray tensor it is that function. Every
//! other backend runs Burn's own reshape.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{unary, Backward, Ops, OpsKind};
use burn::backend::{Autodiff, NdArray};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use reel_core::host;

use super::custom_op::{first_input, output, tensor};

/// `x` with the shape `shape` (the same number of values, in row-major order), as
/// `Tensor::reshape`; without copies on the `cpu` backend (module docs).
pub(crate) fn reshape<B: Backend, const D: usize, const D2: usize>(
    x: Tensor<B, D>,
    shape: [usize; D2],
) -> Tensor<B, D2> {
    match first_input::<B, NdArray, D>(x) {
        Ok(x) => output(autodiff_reshape(x, shape)),
        Err(x) => host::reshape(x, shape),
    }
}

/// The backward of [`reshape`]: the gradient reshaped to the input's dims (its state).
#[derive(Debug)]
struct ReshapeBackward<const D: usize, const D2: usize>;

impl<B: Backend, const D: usize, const D2: usize> Backward<B, 1> for ReshapeBackward<D, D2> {
    type State = [usize; D];

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let dims = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            host::reshape(tensor::<B, D2>(grad), dims)
                .into_primitive()
                .tensor()
        });
    }
}

/// [`reshape`] as one autodiff operation on `Autodiff<B, C>`.
fn autodiff_reshape<B: Backend, C: CheckpointStrategy, const D: usize, const D2: usize>(
    x: Tensor<Autodiff<B, C>, D>,
    shape: [usize; D2],
) -> Tensor<Autodiff<B, C>, D2> {
    let dims = x.dims();
    let x = x.into_primitive().tensor();
    let y = host::reshape(tensor::<B, D>(x.primitive), shape)
        .into_primitive()
        .tensor();
    let y = match ReshapeBackward::<D, D2>
        .prepare::<C>([x.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(dims, y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    tensor(y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    type A = Autodiff<NdArray>;

    fn input(strided: bool) -> Tensor<A, 3> {
        let v: Vec<f32> = (0..24).map(|i| (i as f32 * 0.7).sin()).collect();
        let t = Tensor::<A, 3>::from_data(TensorData::new(v, [2, 3, 4]), &Default::default());
        let t = if strided { t.swap_dims(1, 2) } else { t };
        t.require_grad()
    }

    /// The forward values and the input's gradient through a weighted sum equal Burn's
    /// reshape, for a contiguous and a transposed input.
    #[test]
    fn values_and_gradients_equal_burns_reshape() {
        let _turn = reel_core::parallel::autodiff_turn();
        for strided in [false, true] {
            let weights = |rows: usize, cols: usize| {
                let w: Vec<f32> = (0..rows * cols).map(|i| i as f32 - 7.5).collect();
                Tensor::<A, 2>::from_data(TensorData::new(w, [rows, cols]), &Default::default())
            };
            let run = |ours: bool| {
                let x = input(strided);
                let [a, b, c] = x.dims();
                let y = match ours {
                    true => reshape(x.clone(), [a * b, c]),
                    false => x.clone().reshape([a * b, c]),
                };
                let grads = (y.clone() * weights(a * b, c)).sum().backward();
                let g = x.grad(&grads).expect("a gradient for the input");
                (y.into_data(), g.into_data())
            };
            assert_eq!(run(true), run(false), "strided input: {strided}");
        }
    }

    /// Without autodiff the operation is [`host::reshape`]; on another backend, Burn's.
    #[test]
    fn plain_backends_reshape_the_same_values() {
        let _turn = reel_core::parallel::autodiff_turn();
        let flex =
            Tensor::<burn::backend::Flex, 2>::from_floats([[1.0, 2.0, 3.0]], &Default::default());
        assert_eq!(
            reshape(flex.clone(), [3]).into_data(),
            flex.reshape([3]).into_data()
        );
        let nd = input(true).inner();
        assert_eq!(
            reshape(nd.clone(), [24]).into_data(),
            nd.reshape([24]).into_data()
        );
    }
}
