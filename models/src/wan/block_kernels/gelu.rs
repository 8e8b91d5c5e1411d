//! The tanh GELU and its gradient, element by element: one kernel each on the plain CubeCL
//! backends, where the tensor-operation formulation ([`gelu_tanh_plain`],
//! [`gelu_tanh_backward_plain`]) is about ten element-wise kernels forward and twelve
//! backward, each a pass over a float32 copy of the FFN's widest activations. On ndarray
//! (the `cpu` backend) each is one pass over the host buffers ([`reel_core::host::zip_map`]):
//! the gradient bit for bit the tensor operations' values, the forward within float32
//! rounding of them (its sigmoid takes one `exp`, see [`gelu_tanh_value`]).

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use reel_core::host::zip_map;

use crate::wan::gelu::{
    gelu_tanh_backward_plain, gelu_tanh_grad_value, gelu_tanh_plain, gelu_tanh_value,
};

/// `GELU_tanh(x)`, any shape; the result has the dtype of `x`.
pub(crate) fn forward<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    on_cube!(B, |R, BT| super::cube::gelu_forward::<B, R, BT, D>(x));
    match zip_map([x], |[x]| gelu_tanh_value(x)) {
        Ok(y) => y,
        Err([x]) => gelu_tanh_plain(x),
    }
}

/// `grad · dGELU_tanh/dx (x)` in the dtype of `x`; `grad` of the shape of `x`, any dtype.
pub(crate) fn backward<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    grad: Tensor<B, D>,
) -> Tensor<B, D> {
    on_cube!(B, |R, BT| super::cube::gelu_backward::<B, R, BT, D>(
        x, grad
    ));
    match zip_map([x, grad], |[x, g]| gelu_tanh_grad_value(x, g)) {
        Ok(dx) => dx,
        Err([x, grad]) => gelu_tanh_backward_plain(x, grad),
    }
}
