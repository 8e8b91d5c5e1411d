//! The block's element-wise steps around attention and the FFN, each one kernel on the plain
//! CubeCL backends: the gated residual `x + y·gate` with the gradients of `y` and of the gate,
//! and the rotary position embedding with its inverse (the gradient).
//!
//! Written with tensor operations, a gated residual is a multiply and an add forward, and its
//! gate's gradient a multiply and Burn's reduction over every token (without autotuning, one
//! unit per column looping over all tokens); the rotary embedding is four multiplies, a
//! subtraction, an addition and a concatenation forward, and about fifteen kernels backward,
//! each a pass over a float32 copy of `q` or `k`. All arithmetic is float32 whatever the
//! tensors' dtype; the tensor-operation versions run on the CPU backends and under Burn's
//! fusion layer.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};

use crate::wan::mem_attention::{to_dtype, to_f32};
use crate::wan::rope::RopeTables;

/// The gated residual `x + y·gate` in `x`'s dtype, computed in float32 and rounded once
/// (diffusers' `(x.float() + y·gate).type_as(x)`): `x, y [G, P, dim]` (any float dtypes),
/// `gate [G, 1, dim]` float32.
pub(crate) fn gated_residual<B: Backend>(
    x: Tensor<B, 3>,
    y: Tensor<B, 3>,
    gate: Tensor<B, 3>,
) -> Tensor<B, 3> {
    if has_work(&x) {
        on_cube!(
            B,
            |R, BT| super::cube_elementwise::gated_residual::<B, R, BT>(x, y, gate)
        );
    }
    gated_residual_ops(x, y, gate)
}

/// [`gated_residual`] with tensor operations.
pub(crate) fn gated_residual_ops<B: Backend>(
    x: Tensor<B, 3>,
    y: Tensor<B, 3>,
    gate: Tensor<B, 3>,
) -> Tensor<B, 3> {
    let dtype = x.dtype();
    to_dtype(to_f32(x) + to_f32(y) * gate, dtype)
}

/// The gradient of `y` through [`gated_residual`], `grad·gate` in `dtype`: `grad [G, P,
/// dim]` (any float dtype), `gate [G, 1, dim]` float32.
pub(crate) fn gate_dy<B: Backend>(
    grad: Tensor<B, 3>,
    gate: Tensor<B, 3>,
    dtype: DType,
) -> Tensor<B, 3> {
    if has_work(&grad) {
        on_cube!(B, |R, BT| super::cube_elementwise::gate_dy::<B, R, BT>(
            grad, gate, dtype
        ));
    }
    gate_dy_ops(grad, gate, dtype)
}

/// [`gate_dy`] with tensor operations.
pub(crate) fn gate_dy_ops<B: Backend>(
    grad: Tensor<B, 3>,
    gate: Tensor<B, 3>,
    dtype: DType,
) -> Tensor<B, 3> {
    to_dtype(to_f32(grad) * gate, dtype)
}

/// The gradient of the gate through [`gated_residual`], `Σ_p grad·y` float32 `[G, 1, dim]`,
/// from `grad, y [G, P, dim]` (any float dtypes). On the kernels: partial sums over chunks
/// of about `sqrt(P)` rows, one unit per column, then a small sum of the chunks.
pub(crate) fn gate_dgate<B: Backend>(grad: Tensor<B, 3>, y: Tensor<B, 3>) -> Tensor<B, 3> {
    if has_work(&grad) {
        on_cube!(B, |R, BT| super::cube::column_dots::<B, R, BT>(grad, y));
    }
    gate_dgate_ops(grad, y)
}

/// [`gate_dgate`] with tensor operations.
pub(crate) fn gate_dgate_ops<B: Backend>(grad: Tensor<B, 3>, y: Tensor<B, 3>) -> Tensor<B, 3> {
    (to_f32(grad) * to_f32(y)).sum_dim(1)
}

/// The rotary embedding of `x [B, S, H, D]` (any float dtype) by `tables` (for the `S`
/// tokens), computed in float32, in `out`; with `inverse`, the rotation back (the gradient of
/// the forward).
pub(crate) fn rope<B: Backend>(
    x: Tensor<B, 4>,
    tables: &RopeTables<B>,
    out: DType,
    inverse: bool,
) -> Tensor<B, 4> {
    tables.check(x.dims());
    if has_work(&x) {
        on_cube!(B, |R, BT| super::cube_elementwise::rope::<B, R, BT>(
            x,
            tables.cos.clone(),
            tables.sin.clone(),
            out,
            inverse
        ));
    }
    rope_ops(x, tables, out, inverse)
}

/// [`rope`] with tensor operations.
pub(crate) fn rope_ops<B: Backend>(
    x: Tensor<B, 4>,
    tables: &RopeTables<B>,
    out: DType,
    inverse: bool,
) -> Tensor<B, 4> {
    to_dtype(tables.rotate_ops(to_f32(x), inverse), out)
}

/// Whether a kernel has work on `t` (an empty tensor takes the tensor operations).
fn has_work<B: Backend, const D: usize>(t: &Tensor<B, D>) -> bool {
    t.shape().num_elements() > 0
}
