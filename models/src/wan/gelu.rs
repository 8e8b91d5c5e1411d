//! GELU with the tanh approximation (PyTorch `approximate="tanh"`) whose training backward
//! keeps only its input.
//!
//! Written with Burn tensor operations, `x · (1 + tanh(√(2/π) · (x + 0.044715 x³))) / 2`
//! makes Burn's autodiff keep four full-size tensors for the backward pass (`x`, `x²`, the
//! tanh input and `1 + tanh`), and its sigmoid form ([`gelu_tanh_plain`]) three. In Wan's
//! feed-forward network these are the largest activations of a block (`ffn_dim` = 8960 wide
//! at 1.3B, 5.8 × the model width). As one autodiff operation (`GeluBackward`) it keeps `x`
//! alone and recomputes the rest in the backward pass, a third of the memory or less.
//!
//! The operation runs on Reel's autodiff backends (`wan::custom_op`); anywhere else, and
//! without autodiff, the plain formulation runs. On the plain CubeCL backends the forward and
//! the gradient are one kernel each (`block_kernels::gelu`). All compute in float32
//! and return the input's dtype, as PyTorch's GELU does for bfloat16 inputs.

use super::block_kernels;
use super::custom_op::{dispatch, first_input, output, tensor, CustomBackward};
use super::mem_attention::{to_dtype, to_f32};
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{unary, Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::activation::sigmoid;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::Tensor;

/// `√(2/π)`.
pub(crate) const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the approximation.
pub(crate) const CUBIC: f64 = 0.044715;

/// `GELU_tanh(x)`, element-wise, any shape; the result has the dtype of `x`.
pub fn gelu_tanh<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    dispatch(Gelu(x))
}

/// [`gelu_tanh`]'s input, for [`dispatch`].
struct Gelu<B: Backend, const D: usize>(Tensor<B, D>);

impl<B: Backend, const D: usize> CustomBackward<B> for Gelu<B, D> {
    type Output = Tensor<B, D>;

    fn on_autodiff<I: Backend>(self) -> Result<Tensor<B, D>, Self> {
        let x = first_input::<B, I, D>(self.0).map_err(Gelu)?;
        Ok(output(autodiff_gelu_tanh(x)))
    }

    fn otherwise(self) -> Tensor<B, D> {
        block_kernels::gelu::forward(self.0)
    }
}

/// `GELU_tanh(x)` written with Burn tensor operations (differentiable on any backend, with
/// the three saved tensors described in the module docs), as `x · σ(2u)` with `u = √(2/π) ·
/// (x + 0.044715 x³)`: the same function, since `(1 + tanh u) / 2 = σ(2u)`, without a tanh.
/// Burn's ndarray backend computes tanh in float64 through libm, which took a fifth of the
/// CPU quickstart's step (`perf`, 2026-12-01); its exp and log are float32, and Flex has a
/// sigmoid kernel. Burn's sigmoid is one operation to its autodiff, whose gradient stays
/// finite where `e^(−2u)` overflows.
pub fn gelu_tanh_plain<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    let dtype = x.dtype();
    let x = to_f32(x);
    let two_u = scaled_u(x.clone() * x.clone(), x.clone(), 2.0);
    to_dtype(x * sigmoid(two_u), dtype)
}

/// `k·u = k√(2/π) · (x²·0.044715 + 1) · x` from `x²` and `x`.
fn scaled_u<B: Backend, const D: usize>(x2: Tensor<B, D>, x: Tensor<B, D>, k: f64) -> Tensor<B, D> {
    (x2 * (k * SQRT_2_OVER_PI * CUBIC) + k * SQRT_2_OVER_PI) * x
}

/// [`gelu_tanh_plain`] for one float32 value, with the sigmoid as `1 / (1 + e^(−2u))`: one
/// `exp`, where Burn's sigmoid (`exp(−ln(e^(−z) + 1))`) takes two and a `ln`, which were a
/// sixth of the CPU quickstart's step. It is as exact or more (Burn's form loses relative
/// digits in its final `exp` for large `|z|`): a test holds it to the tanh formula in float64
/// within 1e-6. Where `e^(−2u)` overflows the quotient is `x / ∞ = −0`, as Burn's gives.
pub(crate) fn gelu_tanh_value(x: f32) -> f32 {
    let two_u = (x * x * (2.0 * SQRT_2_OVER_PI * CUBIC) as f32 + (2.0 * SQRT_2_OVER_PI) as f32) * x;
    x / ((-two_u).exp() + 1.0)
}

/// [`gelu_tanh_backward_plain`] for one float32 value and its gradient: the same float32
/// operations in the same order as its tensor operations on ndarray, so the values are
/// bit-identical (tested). The constants are rounded from float64 as Burn rounds a scalar
/// operand.
pub(crate) fn gelu_tanh_grad_value(x: f32, grad: f32) -> f32 {
    let x2 = x * x;
    let e =
        ((x2 * (-2.0 * SQRT_2_OVER_PI * CUBIC) as f32 + (-2.0 * SQRT_2_OVER_PI) as f32) * x).exp();
    let s = 1.0 / (e + 1.0);
    let one_minus_s = 1.0 / (1.0 / e + 1.0);
    let dv = x2 * (6.0 * SQRT_2_OVER_PI * CUBIC) as f32 + (2.0 * SQRT_2_OVER_PI) as f32;
    (one_minus_s * dv * x + 1.0) * s * grad
}

/// `grad · dGELU_tanh/dx (x)` in the dtype of `x`: one kernel on the plain CubeCL backends
/// (`block_kernels::gelu`), [`gelu_tanh_backward_plain`] elsewhere.
pub(crate) fn gelu_tanh_backward<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    grad: Tensor<B, D>,
) -> Tensor<B, D> {
    block_kernels::gelu::backward(x, grad)
}

/// `grad · dGELU_tanh/dx (x)`, in the dtype of `x`, written with Burn tensor operations in
/// the sigmoid form of [`gelu_tanh_plain`]: `s · (1 + x (1 − s) dv)` with `s = σ(2u) = 1 /
/// (1 + e)`, `e = e^(−2u)`, and `dv = 2√(2/π) (1 + 3 · 0.044715 x²)`, the derivative of
/// `2u`. `1 − s` is computed as `1 / (1 + 1/e)`, not by a subtraction that loses its digits
/// where `s` is near 1 (1.6e-6 relative at x = 4.6), and right where `e` overflows to
/// infinity or underflows to 0.
pub(crate) fn gelu_tanh_backward_plain<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    grad: Tensor<B, D>,
) -> Tensor<B, D> {
    let dtype = x.dtype();
    let (x, grad) = (to_f32(x), to_f32(grad));
    let x2 = x.clone() * x.clone();
    let e = scaled_u(x2.clone(), x.clone(), -2.0).exp();
    let s = (e.clone() + 1.0).recip();
    let one_minus_s = (e.recip() + 1.0).recip();
    let dv = x2 * (6.0 * SQRT_2_OVER_PI * CUBIC) + 2.0 * SQRT_2_OVER_PI;
    let d = (one_minus_s * dv * x + 1.0) * s;
    to_dtype(d * grad, dtype)
}

/// The backward of [`gelu_tanh`] on `Autodiff<B>`; its state is the input.
#[derive(Debug)]
struct GeluBackward<const D: usize>;

impl<B: Backend, const D: usize> Backward<B, 1> for GeluBackward<D> {
    type State = FloatTensor<B>;

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let x = tensor::<B, D>(ops.state);
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            gelu_tanh_backward(x, tensor(grad))
                .into_primitive()
                .tensor()
        });
    }
}

/// [`gelu_tanh`] as one autodiff operation on `Autodiff<B, C>`.
pub fn autodiff_gelu_tanh<B: Backend, C: CheckpointStrategy, const D: usize>(
    x: Tensor<Autodiff<B, C>, D>,
) -> Tensor<Autodiff<B, C>, D> {
    let x = x.into_primitive().tensor();
    let y = block_kernels::gelu::forward(tensor::<B, D>(x.primitive.clone()))
        .into_primitive()
        .tensor();
    let out = match GeluBackward::<D>
        .prepare::<C>([x.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(x.primitive, y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    tensor(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{DType, FloatDType, TensorData};

    type TestBackend = Autodiff<burn::backend::NdArray>;

    /// Values over the whole useful range, both signs, and a few large ones.
    fn points() -> Vec<f32> {
        (0..97)
            .map(|i| (i as f32 - 48.0) * 0.125)
            .chain([-30.0, 30.0])
            .collect()
    }

    fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
        to_f32(t).into_data().to_vec::<f32>().unwrap()
    }

    /// Output and input gradient of `sum(w ∘ f(x))` for fixed weights `w`.
    fn output_and_grad<B: burn::tensor::backend::AutodiffBackend>(
        f: fn(Tensor<B, 2>) -> Tensor<B, 2>,
        dtype: FloatDType,
    ) -> (Vec<f32>, Vec<f32>) {
        let dev = Default::default();
        let p = points();
        let n = p.len();
        let x = Tensor::<B, 2>::from_data(TensorData::new(p, [1, n]), &dev)
            .cast(dtype)
            .require_grad();
        let w: Vec<f32> = (0..n).map(|i| 1.0 + (i % 5) as f32 * 0.25).collect();
        let w = Tensor::<B, 2>::from_data(TensorData::new(w, [1, n]), &dev);
        let y = f(x.clone());
        assert_eq!(y.dtype(), x.dtype(), "the output keeps the input's dtype");
        let grads = (to_f32(y.clone()) * w).sum().backward();
        let g = x.grad(&grads).expect("x has a gradient");
        assert_eq!(g.dtype(), x.dtype(), "the gradient has the input's dtype");
        (values(y), values(g))
    }

    #[test]
    fn one_operation_matches_the_plain_formulation_and_its_gradient() {
        let _turn = reel_core::parallel::autodiff_turn();
        let (y, g) = output_and_grad::<TestBackend>(gelu_tanh, FloatDType::F32);
        let (y_ref, g_ref) = output_and_grad::<TestBackend>(gelu_tanh_plain, FloatDType::F32);
        // The forward is the same function (on ndarray with a one-`exp` sigmoid, so within
        // float32 rounding); the gradient is the closed form. The reference is Burn's
        // sigmoid gradient `s (1 − s)`, which loses digits where `s` is near 1 (1.7e-6 at
        // x = 4.6); the closed form is held to 1e-6 against float64 in
        // `the_sigmoid_form_equals_the_tanh_formula_and_its_derivative`.
        for ((a, b), x) in y.iter().zip(&y_ref).zip(points()) {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                "x = {x}: {a} vs {b}"
            );
        }
        for ((a, b), x) in g.iter().zip(&g_ref).zip(points()) {
            assert!(
                (a - b).abs() <= 5e-6 * b.abs().max(1.0),
                "x = {x}: {a} vs {b}"
            );
        }
        // PyTorch's values at a few points (`F.gelu(x, approximate="tanh")` in float64).
        let at = |x: f32| y[points().iter().position(|p| *p == x).unwrap()];
        for (x, want) in [(-1.0f32, -0.158_808), (0.5, 0.345_714), (2.0, 1.954_598)] {
            assert!(
                (at(x) - want).abs() < 1e-5,
                "gelu({x}) = {} vs {want}",
                at(x)
            );
        }
        assert_eq!(at(30.0), 30.0);
        assert_eq!(at(-30.0), 0.0);
    }

    /// The tanh formula of GELU at `x` and its derivative, in float64.
    fn tanh_formula(x: f32) -> (f64, f64) {
        let v = x as f64;
        let t = (SQRT_2_OVER_PI * (v + CUBIC * v * v * v)).tanh();
        let du = SQRT_2_OVER_PI * (1.0 + 3.0 * CUBIC * v * v);
        (
            v * (1.0 + t) / 2.0,
            (1.0 + t) / 2.0 + v * (1.0 - t * t) * du / 2.0,
        )
    }

    /// `got` within 1e-6 of `want`, relative above 1 and absolute below.
    fn close(got: f32, want: f64) -> bool {
        (got as f64 - want).abs() <= 1e-6 * want.abs().max(1.0)
    }

    #[test]
    fn the_sigmoid_form_equals_the_tanh_formula_and_its_derivative() {
        type B = burn::backend::NdArray;
        let dev = Default::default();
        let p: Vec<f32> = points()
            .into_iter()
            .chain([-12.0, -9.5, 9.5, 1e-3])
            .collect();
        let n = p.len();
        let x = Tensor::<B, 1>::from_data(TensorData::new(p.clone(), [n]), &dev);
        let ones = Tensor::<B, 1>::ones([n], &dev);
        let y = values(gelu_tanh_plain(x.clone()));
        let d = values(gelu_tanh_backward_plain(x, ones));
        for (i, &v) in p.iter().enumerate() {
            let (want_y, want_d) = tanh_formula(v);
            assert!(close(y[i], want_y), "GELU({v}) = {} vs {want_y}", y[i]);
            assert!(close(d[i], want_d), "GELU'({v}) = {} vs {want_d}", d[i]);
        }
    }

    #[test]
    fn the_one_pass_cpu_gelu_is_the_tanh_formula_and_its_gradient_the_tensor_operations() {
        type B = burn::backend::NdArray;
        let dev = Default::default();
        // The useful range, tiny, huge and signed-zero inputs, and irregular values.
        let p: Vec<f32> = points()
            .into_iter()
            .chain([0.0, -0.0, 1e-30, -1e-7, 60.0, -60.0, 1e4, -1e4])
            .chain((0..300).map(|i| (i as f32 * 0.731).sin() * 7.0))
            .collect();
        let g: Vec<f32> = (0..p.len())
            .map(|i| (i as f32 * 0.37).cos() * 2.5)
            .collect();
        let n = p.len();
        let t = |v: &[f32]| Tensor::<B, 1>::from_data(TensorData::new(v.to_vec(), [n]), &dev);
        let y = values(block_kernels::gelu::forward(t(&p)));
        for (&x, &y) in p.iter().zip(&y) {
            let (want, _) = tanh_formula(x);
            assert!(close(y, want), "GELU({x}) = {y} vs {want}");
        }
        assert_eq!(
            y[p.iter().position(|&x| x == -1e4).unwrap()].to_bits(),
            (-0.0f32).to_bits()
        );
        let bits =
            |t: Tensor<B, 1>| -> Vec<u32> { values(t).iter().map(|v| v.to_bits()).collect() };
        assert_eq!(
            bits(block_kernels::gelu::backward(t(&p), t(&g))),
            bits(gelu_tanh_backward_plain(t(&p), t(&g))),
            "backward"
        );
        // A strided input goes to the tensor operations.
        let x = Tensor::<B, 2>::from_data(TensorData::new(p[..300].to_vec(), [20, 15]), &dev);
        let y = block_kernels::gelu::forward(x.clone().swap_dims(0, 1));
        assert_eq!(values(y), values(gelu_tanh_plain(x.swap_dims(0, 1))));
    }

    #[test]
    fn bf16_inputs_compute_in_float32_and_stay_bf16() {
        let _turn = reel_core::parallel::autodiff_turn();
        type Flex = Autodiff<burn::backend::Flex>;
        let (y16, g16) = output_and_grad::<Flex>(gelu_tanh, FloatDType::BF16);
        let (y32, g32) = output_and_grad::<Flex>(gelu_tanh, FloatDType::F32);
        // Only the input and the output are rounded: within two bf16 roundings (2⁻⁸).
        for (a, b) in y16.iter().zip(&y32).chain(g16.iter().zip(&g32)) {
            assert!((a - b).abs() <= 8e-3 * b.abs().max(0.1), "{a} vs {b}");
        }
    }

    #[test]
    fn without_autodiff_the_plain_formulation_runs() {
        type B = burn::backend::NdArray;
        let dev = Default::default();
        let p = points();
        let n = p.len();
        let x = Tensor::<B, 1>::from_data(TensorData::new(p, [n]), &dev);
        let (y, y_ref) = (
            values(gelu_tanh(x.clone())),
            values(gelu_tanh_plain(x.clone())),
        );
        for (a, b) in y.iter().zip(&y_ref) {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{a} vs {b}");
        }
        assert_eq!(gelu_tanh(x).dtype(), DType::F32);
    }
}
