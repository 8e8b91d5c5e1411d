//! The element-wise block kernels ([`super::device_elementwise`]) launched on a plain CubeCL
//! backend, from and to the generic backend `B` that it is (see [`super::cube`]).

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};
use burn_cubecl::element::BoolElement;
use burn_cubecl::CubeRuntime;

use super::cube::{empty, flat, flat_grid, wrap};
use super::device_elementwise as kernels;

/// [`super::elementwise::gated_residual`] on the kernel: `x, y [G, P, dim]`, `gate [G, 1,
/// dim]` float32.
pub(super) fn gated_residual<B: Backend, R: CubeRuntime, BT: BoolElement>(
    x: Tensor<B, 3>,
    y: Tensor<B, 3>,
    gate: Tensor<B, 3>,
) -> Tensor<B, 3> {
    let [g, p, dim] = x.dims();
    let (x, y) = (flat::<B, R, BT, 3>(x), flat::<B, R, BT, 3>(y));
    let gate = flat::<B, R, BT, 3>(gate);
    let out = empty(&x, &[g * p * dim], x.dtype);
    let (cubes, units) = flat_grid(g * p * dim);
    let (x_dtype, y_dtype) = (x.dtype, y.dtype);
    kernels::gated_residual::launch::<R>(
        &x.client.clone(),
        cubes,
        units,
        x.into_tensor_arg(),
        y.into_tensor_arg(),
        gate.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        p * dim,
        dim,
        x_dtype.into(),
        y_dtype.into(),
    );
    wrap::<B, R, BT, 1>(out).reshape([g, p, dim])
}

/// [`super::elementwise::gate_dy`] on the kernel: `grad [G, P, dim]`, `gate [G, 1, dim]`
/// float32, the result in `dtype`.
pub(super) fn gate_dy<B: Backend, R: CubeRuntime, BT: BoolElement>(
    grad: Tensor<B, 3>,
    gate: Tensor<B, 3>,
    dtype: DType,
) -> Tensor<B, 3> {
    let [g, p, dim] = grad.dims();
    let (grad, gate) = (flat::<B, R, BT, 3>(grad), flat::<B, R, BT, 3>(gate));
    let dy = empty(&grad, &[g * p * dim], dtype);
    let (cubes, units) = flat_grid(g * p * dim);
    let grad_dtype = grad.dtype;
    kernels::gated_residual_dy::launch::<R>(
        &grad.client.clone(),
        cubes,
        units,
        grad.into_tensor_arg(),
        gate.into_tensor_arg(),
        dy.clone().into_tensor_arg(),
        p * dim,
        dim,
        grad_dtype.into(),
        dtype.into(),
    );
    wrap::<B, R, BT, 1>(dy).reshape([g, p, dim])
}

/// [`super::elementwise::rope`] on the kernel: `x [B, S, H, D]`, `cos`/`sin [S, D]` float32.
pub(super) fn rope<B: Backend, R: CubeRuntime, BT: BoolElement>(
    x: Tensor<B, 4>,
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    out: DType,
    inverse: bool,
) -> Tensor<B, 4> {
    let dims = x.dims();
    let [_, s, h, d] = dims;
    let n = x.shape().num_elements();
    let x = flat::<B, R, BT, 4>(x);
    let (cos, sin) = (flat::<B, R, BT, 2>(cos), flat::<B, R, BT, 2>(sin));
    let y = empty(&x, &[n], out);
    let (cubes, units) = flat_grid(n / 2);
    let x_dtype = x.dtype;
    kernels::rope_rotate::launch::<R>(
        &x.client.clone(),
        cubes,
        units,
        x.into_tensor_arg(),
        cos.into_tensor_arg(),
        sin.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        h * d,
        s,
        d,
        inverse,
        x_dtype.into(),
        out.into(),
    );
    wrap::<B, R, BT, 1>(y).reshape(dims)
}
