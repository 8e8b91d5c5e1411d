//! `x · wᵀ`, a linear layer's product, as one autodiff operation whose three products (the
//! forward, the input's and the weight's gradients) run on the cubek matmul kernels pinned for
//! their layouts ([`super::matmul`], `REEL_MATMUL`).
//!
//! Written as `x.matmul(w.transpose())`, Burn's autodiff computes the gradients with Burn's
//! matmul whatever kernel the forward ran on. [`super::linear::Linear`] uses this operation
//! when a kernel is pinned, and Burn's product otherwise. It runs on Reel's autodiff backends
//! (`wan::custom_op`); anywhere else (inference) the forward product runs through
//! [`matmul`] alone (the kernel where its check passed, Burn's matmul otherwise).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor};

use super::custom_op::{dispatch, first_input, next_input, output, tensor, CustomBackward};
use super::matmul::{matmul, MatmulPin};
use super::mem_attention::to_dtype;

/// `x · wᵀ` for `x [rows, in]` and `w [out, in]` of the same dtype -> `[rows, out]`, each of
/// its products on the kernel `pin` names for its layout (Burn's matmul for `None` or what the
/// kernel refuses).
pub fn linear_product<B: Backend>(
    x: Tensor<B, 2>,
    w: Tensor<B, 2>,
    pin: MatmulPin,
) -> Tensor<B, 2> {
    dispatch(Product { x, w, pin })
}

/// [`linear_product`] written as Burn's product (`x.matmul(w.transpose())`).
pub fn linear_product_plain<B: Backend>(x: Tensor<B, 2>, w: Tensor<B, 2>) -> Tensor<B, 2> {
    x.matmul(w.transpose())
}

/// [`linear_product`]'s inputs, for [`dispatch`].
struct Product<B: Backend> {
    x: Tensor<B, 2>,
    w: Tensor<B, 2>,
    pin: MatmulPin,
}

impl<B: Backend> CustomBackward<B> for Product<B> {
    type Output = Tensor<B, 2>;

    fn on_autodiff<I: Backend>(self) -> Result<Tensor<B, 2>, Self> {
        let Self { x, w, pin } = self;
        let x = match first_input::<B, I, 2>(x) {
            Ok(x) => x,
            Err(x) => return Err(Self { x, w, pin }),
        };
        Ok(output(autodiff_linear_product(
            x,
            next_input::<B, I, 2>(w),
            pin,
        )))
    }

    fn otherwise(self) -> Tensor<B, 2> {
        matmul(self.x, self.w.transpose(), self.pin.forward)
    }
}

/// The backward of [`linear_product`]: `dx = g · w`, `dw = gᵀ · x`. Its state is `x` when
/// `w` needs a gradient and `w` when `x` does (as Burn's matmul keeps them: a frozen weight's
/// input is not kept), and the dtype of `x`.
#[derive(Debug)]
struct ProductBackward {
    pin: MatmulPin,
}

impl<B: Backend> Backward<B, 2> for ProductBackward {
    type State = (Option<FloatTensor<B>>, Option<FloatTensor<B>>, DType);

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let (x, w, x_dtype) = ops.state;
        let [px, pw] = ops.parents.map(|n| n.map(|n| n.id));
        let g = tensor::<B, 2>(grads.consume::<B>(&ops.node));
        if let (Some(pw), Some(x)) = (pw, x) {
            let x = tensor::<B, 2>(x);
            let g = to_dtype(g.clone(), x.dtype());
            let dw = matmul(g.transpose(), x, self.pin.weight_grad);
            grads.register::<B>(pw, dw.into_primitive().tensor());
        }
        if let (Some(px), Some(w)) = (px, w) {
            let w = tensor::<B, 2>(w);
            let g = to_dtype(g, w.dtype());
            let dx = to_dtype(matmul(g, w, self.pin.input_grad), x_dtype);
            grads.register::<B>(px, dx.into_primitive().tensor());
        }
    }
}

/// [`linear_product`] as one autodiff operation on `Autodiff<B, C>`.
pub fn autodiff_linear_product<B: Backend, C: CheckpointStrategy>(
    x: Tensor<Autodiff<B, C>, 2>,
    w: Tensor<Autodiff<B, C>, 2>,
    pin: MatmulPin,
) -> Tensor<Autodiff<B, C>, 2> {
    let x_dtype = x.dtype();
    let (x, w) = (x.into_primitive().tensor(), w.into_primitive().tensor());
    let (x_tracked, w_tracked) = (x.is_tracked(), w.is_tracked());
    let (x_inner, w_inner) = (
        tensor::<B, 2>(x.primitive.clone()),
        tensor::<B, 2>(w.primitive.clone()),
    );
    let y = matmul(x_inner, w_inner.transpose(), pin.forward)
        .into_primitive()
        .tensor();
    let out = match (ProductBackward { pin })
        .prepare::<C>([x.node, w.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let keep_x = w_tracked.then_some(x.primitive);
            let keep_w = x_tracked.then_some(w.primitive);
            prep.finish((keep_x, keep_w, x_dtype), y)
        }
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    tensor(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::backend::AutodiffBackend;
    use burn::tensor::TensorData;

    /// Deterministic, irregular values.
    fn det<B: Backend>(rows: usize, cols: usize, phase: f32) -> Tensor<B, 2> {
        let v: Vec<f32> = (0..rows * cols)
            .map(|i| (i as f32 * 0.53 + phase).sin() * 1.7)
            .collect();
        Tensor::from_data(TensorData::new(v, [rows, cols]), &Default::default())
    }

    fn values<B: Backend>(t: Tensor<B, 2>) -> Vec<f32> {
        t.into_data().to_vec::<f32>().expect("float32 data")
    }

    /// `(y, dx, dw)` of `sum(m ∘ f(x, w))`, each gradient when its input is tracked.
    fn case<B: AutodiffBackend>(
        f: &dyn Fn(Tensor<B, 2>, Tensor<B, 2>) -> Tensor<B, 2>,
        [track_x, track_w]: [bool; 2],
    ) -> (Vec<f32>, Option<Vec<f32>>, Option<Vec<f32>>) {
        let (rows, d_in, d_out) = (9, 6, 4);
        let track = |t: Tensor<B, 2>, on: bool| if on { t.require_grad() } else { t };
        let x = track(det::<B>(rows, d_in, 0.3), track_x);
        let w = track(det::<B>(d_out, d_in, 1.1), track_w);
        let y = f(x.clone(), w.clone());
        assert_eq!(y.dims(), [rows, d_out]);
        if !(track_x || track_w) {
            return (values(y), None, None);
        }
        let grads = (y.clone() * det::<B>(rows, d_out, 2.6)).sum().backward();
        let dx = x.grad(&grads).map(values);
        let dw = w.grad(&grads).map(values);
        assert_eq!(
            dx.is_some(),
            track_x,
            "x has a gradient exactly when tracked"
        );
        assert_eq!(
            dw.is_some(),
            track_w,
            "w has a gradient exactly when tracked"
        );
        (values(y), dx, dw)
    }

    /// With either input frozen the operation keeps only what the other's gradient needs (as
    /// Burn's matmul does); every gradient asked for is Burn's.
    #[test]
    fn gradients_are_those_of_burns_product() {
        let _turn = reel_core::parallel::autodiff_turn();
        type Ad = Autodiff<burn::backend::NdArray>;
        let close = |a: Option<Vec<f32>>, b: Option<Vec<f32>>, what: &str| {
            assert_eq!(a.is_some(), b.is_some(), "{what}");
            for (i, (p, q)) in a
                .unwrap_or_default()
                .iter()
                .zip(b.unwrap_or_default())
                .enumerate()
            {
                assert!(
                    (p - q).abs() <= 1e-5 * q.abs().max(1.0),
                    "{what}[{i}]: {p} vs {q}"
                );
            }
        };
        for tracked in [[true, true], [true, false], [false, true], [false, false]] {
            let pin = MatmulPin::parse("forward=double-mma,weight-grad=simple-unit").unwrap();
            let got = case::<Ad>(&|x, w| linear_product(x, w, pin), tracked);
            let want = case::<Ad>(&linear_product_plain, tracked);
            assert_eq!(got.0, want.0, "{tracked:?}: the same forward product");
            close(got.1, want.1, &format!("{tracked:?}: x gradient"));
            close(got.2, want.2, &format!("{tracked:?}: w gradient"));
        }
    }
}
