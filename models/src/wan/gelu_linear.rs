//! `GELU_tanh(u) · Wᵀ` as one autodiff operation: the FFN's output projection applied to the
//! GELU of the hidden projection, keeping only `u` (and the weight) for the backward pass.
//!
//! Applied one after the other, the GELU keeps its input `u` and the product keeps its input
//! `GELU(u)`: two tensors of the FFN's width (`ffn_dim`, 5.8 × the model width at 1.3B), the
//! largest activations of a block. As one operation (`GeluMatmulBackward`) only `u` is
//! kept, and the backward pass recomputes `GELU(u)` for the weight's gradient, one
//! element-wise pass next to two matrix products.
//!
//! The GELU computes in float32 and is rounded to the weight's dtype, the product runs in
//! that dtype (bfloat16 in a bf16 run) and the result keeps it, as the product inside
//! [`super::linear::Linear::forward`] does; the cast back to the input's dtype, the bias and
//! any LoRA branch stay with the caller. The products run on the pinned matmul kernel
//! (`REEL_MATMUL`, [`super::matmul`]) when there is one. It runs on Reel's autodiff backends
//! (`wan::custom_op`); anywhere else the two steps run one after the other.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::Tensor;

use super::block_kernels;
use super::custom_op::{
    dispatch, first_input, next_input, output, register, tensor, CustomBackward,
};
use super::gelu::{gelu_tanh, gelu_tanh_backward};
use super::matmul::{matmul, pin};
use super::mem_attention::to_dtype;

/// `GELU_tanh(u) · wᵀ`: `u [rows, in]` (any float dtype), `w [out, in]` -> `[rows, out]`; the
/// product runs in, and the result has, the dtype of `w`.
pub fn gelu_matmul<B: Backend>(u: Tensor<B, 2>, w: Tensor<B, 2>) -> Tensor<B, 2> {
    dispatch(GeluMatmul { u, w })
}

/// [`gelu_matmul`] as two steps (the GELU, then the product), differentiable anywhere.
pub fn gelu_matmul_plain<B: Backend>(u: Tensor<B, 2>, w: Tensor<B, 2>) -> Tensor<B, 2> {
    let compute = w.dtype();
    to_dtype(gelu_tanh(u), compute).matmul(w.transpose())
}

/// [`gelu_matmul`]'s inputs, for [`dispatch`].
struct GeluMatmul<B: Backend> {
    u: Tensor<B, 2>,
    w: Tensor<B, 2>,
}

impl<B: Backend> CustomBackward<B> for GeluMatmul<B> {
    type Output = Tensor<B, 2>;

    fn on_autodiff<I: Backend>(self) -> Result<Tensor<B, 2>, Self> {
        let Self { u, w } = self;
        let u = match first_input::<B, I, 2>(u) {
            Ok(u) => u,
            Err(u) => return Err(Self { u, w }),
        };
        Ok(output(autodiff_gelu_matmul(u, next_input::<B, I, 2>(w))))
    }

    fn otherwise(self) -> Tensor<B, 2> {
        // `gelu_matmul_plain`, its product on the pinned kernel (if any).
        let a = to_dtype(gelu_tanh(self.u), self.w.dtype());
        matmul(a, self.w.transpose(), pin::<B>().forward)
    }
}

/// `GELU(u)`, computed in float32 and rounded to the dtype of `w`.
fn activation<B: Backend>(u: Tensor<B, 2>, w: &Tensor<B, 2>) -> Tensor<B, 2> {
    to_dtype(block_kernels::gelu::forward(u), w.dtype())
}

/// The backward of [`gelu_matmul`]; its state is `u` and `w`.
#[derive(Debug)]
struct GeluMatmulBackward;

impl<B: Backend> Backward<B, 2> for GeluMatmulBackward {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let (u, w) = (tensor::<B, 2>(ops.state.0), tensor::<B, 2>(ops.state.1));
        let [pu, pw] = ops.parents.map(|n| n.map(|n| n.id));
        let g = to_dtype(tensor::<B, 2>(grads.consume::<B>(&ops.node)), w.dtype());
        register::<B>(grads, pw, || {
            let dw = matmul(
                g.clone().transpose(),
                activation(u.clone(), &w),
                pin::<B>().weight_grad,
            );
            dw.into_primitive().tensor()
        });
        register::<B>(grads, pu, || {
            let da = to_dtype(matmul(g, w, pin::<B>().input_grad), u.dtype());
            gelu_tanh_backward(u, da).into_primitive().tensor()
        });
    }
}

/// [`gelu_matmul`] as one autodiff operation on `Autodiff<B, C>`.
pub fn autodiff_gelu_matmul<B: Backend, C: CheckpointStrategy>(
    u: Tensor<Autodiff<B, C>, 2>,
    w: Tensor<Autodiff<B, C>, 2>,
) -> Tensor<Autodiff<B, C>, 2> {
    let (u, w) = (u.into_primitive().tensor(), w.into_primitive().tensor());
    let w_inner = tensor::<B, 2>(w.primitive.clone());
    let a = activation(tensor(u.primitive.clone()), &w_inner);
    let y = matmul(a, w_inner.transpose(), pin::<B>().forward)
        .into_primitive()
        .tensor();
    let out = match GeluMatmulBackward
        .prepare::<C>([u.node, w.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish((u.primitive, w.primitive), y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    tensor(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wan::linear::Linear;
    use burn::module::Param;
    use burn::tensor::backend::AutodiffBackend;
    use burn::tensor::{DType, FloatDType, TensorData};

    type NdAd = Autodiff<burn::backend::NdArray>;
    type FlexAd = Autodiff<burn::backend::Flex>;

    /// A deterministic, irregular `[rows, cols]` tensor with values within about ±2.
    fn det<B: Backend>(rows: usize, cols: usize, phase: f32) -> Tensor<B, 2> {
        let v: Vec<f32> = (0..rows * cols)
            .map(|i| 2.0 * (i as f32 * 0.613 + phase).sin() * (i as f32 * 0.291).cos())
            .collect();
        Tensor::from_data(TensorData::new(v, [rows, cols]), &Default::default())
    }

    fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
        to_dtype(t, DType::F32).into_data().to_vec::<f32>().unwrap()
    }

    fn assert_close(a: &[f32], b: &[f32], rel: f32, what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1.0);
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= rel * scale, "{what}[{i}]: {x} vs {y}");
        }
    }

    /// Output and gradients (`u`, and `w` when tracked) of `sum(m ∘ f(u, w))`.
    fn case<B: AutodiffBackend>(
        f: fn(Tensor<B, 2>, Tensor<B, 2>) -> Tensor<B, 2>,
        dtype: FloatDType,
        track_w: bool,
    ) -> (Vec<f32>, Vec<f32>, Option<Vec<f32>>) {
        let (rows, d_in, d_out) = (7, 12, 5);
        let u = det::<B>(rows, d_in, 0.4).cast(dtype).require_grad();
        let mut w = det::<B>(d_out, d_in, 1.3).mul_scalar(0.5).cast(dtype);
        if track_w {
            w = w.require_grad();
        }
        let y = f(u.clone(), w.clone());
        assert_eq!(y.dims(), [rows, d_out]);
        assert_eq!(y.dtype(), w.dtype(), "the result takes w's dtype");
        let m = det::<B>(rows, d_out, 2.2);
        let grads = (to_dtype(y.clone(), DType::F32) * m).sum().backward();
        let gu = u.grad(&grads).expect("u has a gradient");
        assert_eq!(gu.dtype(), u.dtype(), "u's gradient has its dtype");
        let gw = w.grad(&grads).map(|g| {
            assert_eq!(g.dtype(), w.dtype(), "w's gradient has its dtype");
            values(g)
        });
        assert_eq!(
            gw.is_some(),
            track_w,
            "w has a gradient exactly when tracked"
        );
        (values(y), values(gu), gw)
    }

    #[test]
    fn one_operation_matches_gelu_then_product() {
        let _turn = reel_core::parallel::autodiff_turn();
        for track_w in [true, false] {
            let (y, gu, gw) = case::<NdAd>(gelu_matmul, FloatDType::F32, track_w);
            let (y_ref, gu_ref, gw_ref) = case::<NdAd>(gelu_matmul_plain, FloatDType::F32, track_w);
            assert_eq!(y, y_ref, "the forward is the same computation");
            assert_close(&gu, &gu_ref, 1e-6, "u gradient");
            if let (Some(gw), Some(gw_ref)) = (gw, gw_ref) {
                assert_close(&gw, &gw_ref, 1e-6, "w gradient");
            }
        }
    }

    #[test]
    fn bf16_products_match_gelu_then_product_in_bf16() {
        let _turn = reel_core::parallel::autodiff_turn();
        let (y, gu, gw) = case::<FlexAd>(gelu_matmul, FloatDType::BF16, true);
        let (y_ref, gu_ref, gw_ref) = case::<FlexAd>(gelu_matmul_plain, FloatDType::BF16, true);
        assert_eq!(y, y_ref, "the forward is the same computation");
        // The same products and roundings; the GEMMs may sum in another order.
        assert_close(&gu, &gu_ref, 1e-2, "u gradient");
        assert_close(&gw.unwrap(), &gw_ref.unwrap(), 1e-2, "w gradient");
    }

    /// `Linear::forward_gelu` against `forward(gelu_tanh(..))`, without and with LoRA: the same
    /// outputs, and the gradients of the input, the weight and the adapter's factors.
    #[test]
    fn linear_forward_gelu_equals_forward_of_the_gelu() {
        let _turn = reel_core::parallel::autodiff_turn();
        type B = NdAd;
        let dev = Default::default();
        let mut lin = Linear::<B>::from_params(
            Param::from_tensor(det::<B>(4, 6, 0.7)),
            Some(Param::from_tensor(det::<B>(1, 4, 1.9).reshape([4]))),
        );
        for lora in [false, true] {
            if lora {
                let (a, b) = (det::<B>(2, 6, 2.5), det::<B>(4, 2, 3.1));
                lin.attach_lora(Param::from_tensor(a), Param::from_tensor(b), 0.5);
            }
            let u = det::<B>(6, 6, 0.1).reshape([2, 3, 6]);
            let u = Tensor::<B, 3>::from_data(u.into_data(), &dev).require_grad();
            let run = |y: Tensor<B, 3>| {
                let grads = (y.clone() * y.clone()).sum().backward();
                let mut params = vec![lin.weight.val()];
                params.extend(lin.lora_A.iter().map(|a| a.weight.val()));
                params.extend(lin.lora_B.iter().map(|b| b.weight.val()));
                let mut g = vec![values(u.grad(&grads).expect("u has a gradient"))];
                g.extend(
                    params
                        .iter()
                        .map(|p| values(p.grad(&grads).expect("a gradient"))),
                );
                (values(y), g)
            };
            let (y, g) = run(lin.forward_gelu(u.clone()));
            let (y_ref, g_ref) = run(lin.forward(super::super::gelu::gelu_tanh(u.clone())));
            assert_eq!(y, y_ref, "lora = {lora}: outputs");
            assert_eq!(g.len(), if lora { 4 } else { 2 });
            for (i, (g, r)) in g.iter().zip(&g_ref).enumerate() {
                assert_close(g, r, 1e-6, &format!("lora = {lora}: gradient {i}"));
            }
        }
    }
}
