//! CubeCL kernels of the block's element-wise steps around attention and the FFN: the gated
//! residual `x + y·gate` and the gradient of `y` through it, and the rotary position
//! embedding (forward, and its inverse for the gradient). Each is one pass over flat,
//! contiguous buffers with a grid stride; all arithmetic is float32 whatever the element
//! types.

// The `#[cube(launch)]` macro generates undocumented launch modules and structs.
#![allow(missing_docs)]

use cubecl::prelude::*;

/// The gate's index for element `i` of a flat `[G, P, dim]` buffer: `gate` is `[G, dim]`,
/// `group_len = P·dim`.
#[cube]
fn gate_index(i: usize, group_len: usize, dim: usize) -> usize {
    (i / group_len) * dim + i % dim
}

/// The gated residual `out = x + y·gate` over flat `[G, P, dim]` buffers `x` (in `F`, the
/// output's type) and `y` (in `Y`), `gate [G, dim]` float32 (`group_len = P·dim`); computed
/// in float32 and rounded once, as diffusers' `(x.float() + y·gate).type_as(x)`.
#[cube(launch)]
pub fn gated_residual<F: Float, Y: Float>(
    x: &Tensor<F>,
    y: &Tensor<Y>,
    gate: &Tensor<f32>,
    out: &mut Tensor<F>,
    group_len: usize,
    dim: usize,
    #[define(F)] _x_dtype: StorageType,
    #[define(Y)] _y_dtype: StorageType,
) {
    let stride = (CUBE_DIM_X * CUBE_COUNT_X) as usize;
    let mut i = (CUBE_POS_X * CUBE_DIM_X + UNIT_POS_X) as usize;
    while i < x.len() {
        let gv = gate[gate_index(i, group_len, dim)];
        out[i] = F::cast_from(f32::cast_from(x[i]) + f32::cast_from(y[i]) * gv);
        i += stride;
    }
}

/// The gradient of `y` through [`gated_residual()`]: `dy = grad·gate` in `Y`, from the
/// output gradient `grad` (in `E`); layout as there.
#[cube(launch)]
pub fn gated_residual_dy<E: Float, Y: Float>(
    grad: &Tensor<E>,
    gate: &Tensor<f32>,
    dy: &mut Tensor<Y>,
    group_len: usize,
    dim: usize,
    #[define(E)] _grad_dtype: StorageType,
    #[define(Y)] _y_dtype: StorageType,
) {
    let stride = (CUBE_DIM_X * CUBE_COUNT_X) as usize;
    let mut i = (CUBE_POS_X * CUBE_DIM_X + UNIT_POS_X) as usize;
    while i < grad.len() {
        let gv = gate[gate_index(i, group_len, dim)];
        dy[i] = Y::cast_from(f32::cast_from(grad[i]) * gv);
        i += stride;
    }
}

/// The rotary embedding of a flat `[B, S, H, D]` buffer `x` (in `F`) into `out` (in `O`),
/// one unit per channel pair `(x[2j], x[2j+1])` (grid stride): with `c`, `s` the cosine and
/// sine of the pair's angle (`cos`/`sin [S, D]` float32, both channels of a pair hold the
/// same angle), `(x1·c − x2·s, x1·s + x2·c)`; with `inverse` the rotation back,
/// `(x1·c + x2·s, x2·c − x1·s)` (the gradient of the forward). `row_len = H·D`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn rope_rotate<F: Float, O: Float>(
    x: &Tensor<F>,
    cos: &Tensor<f32>,
    sin: &Tensor<f32>,
    out: &mut Tensor<O>,
    row_len: usize,
    seq: usize,
    head_dim: usize,
    #[comptime] inverse: bool,
    #[define(F)] _x_dtype: StorageType,
    #[define(O)] _out_dtype: StorageType,
) {
    let stride = (CUBE_DIM_X * CUBE_COUNT_X) as usize;
    let pairs = x.len() / 2;
    let mut i = (CUBE_POS_X * CUBE_DIM_X + UNIT_POS_X) as usize;
    while i < pairs {
        let e = 2 * i;
        let t = ((e / row_len) % seq) * head_dim + e % head_dim;
        let c = cos[t];
        let s = sin[t];
        let x1 = f32::cast_from(x[e]);
        let x2 = f32::cast_from(x[e + 1]);
        if inverse {
            out[e] = O::cast_from(x1 * c + x2 * s);
            out[e + 1] = O::cast_from(x2 * c - x1 * s);
        } else {
            out[e] = O::cast_from(x1 * c - x2 * s);
            out[e + 1] = O::cast_from(x1 * s + x2 * c);
        }
        i += stride;
    }
}
