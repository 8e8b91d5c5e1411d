//! CubeCL kernels of the block's norms over rows: the forward (statistics and the affine
//! output in one pass over each row), the input gradient (one pass per row) and the scale and
//! shift gradients (partial sums over chunks of rows, one unit per column).
//!
//! Layout: `x [G, P, dim]` (any strides; rows `(g, p)`), `scale`/`shift [G, 1, dim]` float32
//! (row `(g, p)` takes group `g`), statistics flat `[G·P]` float32. All arithmetic is float32
//! whatever the element types `F` (input) and `E` (output gradient) or `O` (output).

// The `#[cube(launch)]` macro generates undocumented launch modules and structs.
#![allow(missing_docs)]

use cubecl::prelude::*;
// The cube-wide tree sum of the optimizer's norm kernel serves the rows here too.
use reel_core::optim::fused::kernels::cube_sum;

/// Offset of element `(g, p, c)` of a `[G, P, C]` tensor.
#[cube]
fn at<E: CubePrimitive>(t: &Tensor<E>, g: usize, p: usize, c: usize) -> usize {
    g * t.stride(0) + p * t.stride(1) + c * t.stride(2)
}

/// Forward, one cube per row (grid-stride over rows): `xhat = (x − mean)·rstd` (LayerNorm,
/// `centered`) or `x·rstd` (RMSNorm), `y = xhat·scale (+ shift)` in `O`, and the row's `mean`
/// (when `centered`) and `rstd = 1 / sqrt(var + eps)`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn norm_forward<F: Float, O: Float>(
    x: &Tensor<F>,
    scale: &Tensor<f32>,
    shift: &Tensor<f32>,
    y: &mut Tensor<O>,
    mean: &mut Tensor<f32>,
    rstd: &mut Tensor<f32>,
    eps: f32,
    #[comptime] units: usize,
    #[comptime] centered: bool,
    #[comptime] shifted: bool,
    #[define(F)] _x_dtype: StorageType,
    #[define(O)] _y_dtype: StorageType,
) {
    let per = x.shape(1);
    let dim = x.shape(2);
    let rows = x.shape(0) * per;
    let n = f32::cast_from(dim);
    let u = UNIT_POS_X as usize;
    let mut buf = SharedMemory::<f32>::new(units);
    let mut row = CUBE_POS_X as usize;
    while row < rows {
        let (g, p) = (row / per, row % per);
        let mut m = 0.0f32;
        if centered {
            let mut s = 0.0f32;
            let mut c = u;
            while c < dim {
                s += f32::cast_from(x[at(x, g, p, c)]);
                c += units;
            }
            m = cube_sum(s, &mut buf, units) / n;
        }
        let mut s2 = 0.0f32;
        let mut c = u;
        while c < dim {
            let v = f32::cast_from(x[at(x, g, p, c)]) - m;
            s2 += v * v;
            c += units;
        }
        let r = 1.0f32 / f32::sqrt(cube_sum(s2, &mut buf, units) / n + eps);
        let mut c = u;
        while c < dim {
            let mut out = (f32::cast_from(x[at(x, g, p, c)]) - m) * r * scale[at(scale, g, 0, c)];
            if shifted {
                out += shift[at(shift, g, 0, c)];
            }
            y[at(y, g, p, c)] = O::cast_from(out);
            c += units;
        }
        if u == 0 {
            rstd[row] = r;
            if centered {
                mean[row] = m;
            }
        }
        row += CUBE_COUNT_X as usize;
    }
}

/// Input gradient, one cube per row (grid-stride over rows): with `gs = grad·scale` and
/// `xhat` as in [`norm_forward()`], `dx = (gs − mean(gs) − xhat·mean(gs·xhat))·rstd`
/// (LayerNorm, `centered`) or `(gs − xhat·mean(gs·xhat))·rstd` (RMSNorm), in `F`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn norm_backward_x<E: Float, F: Float>(
    grad: &Tensor<E>,
    x: &Tensor<F>,
    scale: &Tensor<f32>,
    mean: &Tensor<f32>,
    rstd: &Tensor<f32>,
    dx: &mut Tensor<F>,
    #[comptime] units: usize,
    #[comptime] centered: bool,
    #[define(E)] _grad_dtype: StorageType,
    #[define(F)] _x_dtype: StorageType,
) {
    let per = x.shape(1);
    let dim = x.shape(2);
    let rows = x.shape(0) * per;
    let n = f32::cast_from(dim);
    let u = UNIT_POS_X as usize;
    let mut buf = SharedMemory::<f32>::new(units);
    let mut row = CUBE_POS_X as usize;
    while row < rows {
        let (g, p) = (row / per, row % per);
        let mut m = 0.0f32;
        if centered {
            m = mean[row];
        }
        let r = rstd[row];
        let mut a = 0.0f32;
        let mut b = 0.0f32;
        let mut c = u;
        while c < dim {
            let gs = f32::cast_from(grad[at(grad, g, p, c)]) * scale[at(scale, g, 0, c)];
            a += gs;
            b += gs * (f32::cast_from(x[at(x, g, p, c)]) - m) * r;
            c += units;
        }
        let mut mean_gs = 0.0f32;
        if centered {
            mean_gs = cube_sum(a, &mut buf, units) / n;
        }
        let mean_gsx = cube_sum(b, &mut buf, units) / n;
        let mut c = u;
        while c < dim {
            let gs = f32::cast_from(grad[at(grad, g, p, c)]) * scale[at(scale, g, 0, c)];
            let xhat = (f32::cast_from(x[at(x, g, p, c)]) - m) * r;
            dx[at(dx, g, p, c)] = F::cast_from((gs - mean_gs - xhat * mean_gsx) * r);
            c += units;
        }
        row += CUBE_COUNT_X as usize;
    }
}

/// Scale and shift gradients in partial sums: cube `(column block, chunk, g)` sums
/// `grad·xhat` (into `dscale [G, chunks, dim]`) and, when `shifted`, `grad` (into `dshift`)
/// over the rows `chunk·rows_per_chunk ..` of group `g`, one unit per column. The caller sums
/// the chunks.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn norm_backward_affine<E: Float, F: Float>(
    grad: &Tensor<E>,
    x: &Tensor<F>,
    mean: &Tensor<f32>,
    rstd: &Tensor<f32>,
    dscale: &mut Tensor<f32>,
    dshift: &mut Tensor<f32>,
    rows_per_chunk: usize,
    #[comptime] units: usize,
    #[comptime] centered: bool,
    #[comptime] shifted: bool,
    #[define(E)] _grad_dtype: StorageType,
    #[define(F)] _x_dtype: StorageType,
) {
    let per = x.shape(1);
    let dim = x.shape(2);
    let c = CUBE_POS_X as usize * units + UNIT_POS_X as usize;
    let chunk = CUBE_POS_Y as usize;
    let g = CUBE_POS_Z as usize;
    if c < dim {
        let first = chunk * rows_per_chunk;
        let mut end = first + rows_per_chunk;
        if end > per {
            end = per;
        }
        let mut sx = 0.0f32;
        let mut s = 0.0f32;
        let mut p = first;
        while p < end {
            let row = g * per + p;
            let mut m = 0.0f32;
            if centered {
                m = mean[row];
            }
            let gv = f32::cast_from(grad[at(grad, g, p, c)]);
            sx += gv * (f32::cast_from(x[at(x, g, p, c)]) - m) * rstd[row];
            s += gv;
            p += 1;
        }
        dscale[at(dscale, g, chunk, c)] = sx;
        if shifted {
            dshift[at(dshift, g, chunk, c)] = s;
        }
    }
}

/// Column sums in partial sums: cube `(column block, chunk)` sums `t [R, C]` over the rows
/// `chunk·rows_per_chunk ..` into `out [chunks, C]`, one unit per column. The caller sums the
/// chunks.
#[cube(launch)]
pub fn column_sums<E: Float>(
    t: &Tensor<E>,
    out: &mut Tensor<f32>,
    rows_per_chunk: usize,
    #[comptime] units: usize,
    #[define(E)] _dtype: StorageType,
) {
    let rows = t.shape(0);
    let c = CUBE_POS_X as usize * units + UNIT_POS_X as usize;
    let chunk = CUBE_POS_Y as usize;
    if c < t.shape(1) {
        let mut r = chunk * rows_per_chunk;
        let mut end = r + rows_per_chunk;
        if end > rows {
            end = rows;
        }
        let mut s = 0.0f32;
        while r < end {
            s += f32::cast_from(t[r * t.stride(0) + c * t.stride(1)]);
            r += 1;
        }
        out[chunk * out.stride(0) + c * out.stride(1)] = s;
    }
}

/// `√(2/π)` in float32.
const SQRT_2_OVER_PI: f32 = crate::wan::gelu::SQRT_2_OVER_PI as f32;
/// The GELU's cubic coefficient in float32.
const CUBIC: f32 = crate::wan::gelu::CUBIC as f32;
/// Three times [`CUBIC`], rounded once from float64.
const CUBIC_3: f32 = (3.0 * crate::wan::gelu::CUBIC) as f32;

/// `GELU_tanh(x)` element by element over the flat buffers `x` and `y` (grid stride):
/// `x · (tanh((x + x³·c)·√(2/π)) + 1) · 0.5` (GPUs have a fast float32 tanh; the tensor
/// formulation's sigmoid form gives the same values to float32 rounding).
#[cube(launch)]
pub fn gelu_forward<F: Float>(x: &Tensor<F>, y: &mut Tensor<F>, #[define(F)] _dtype: StorageType) {
    let stride = (CUBE_DIM_X * CUBE_COUNT_X) as usize;
    let mut i = (CUBE_POS_X * CUBE_DIM_X + UNIT_POS_X) as usize;
    while i < x.len() {
        let v = f32::cast_from(x[i]);
        let inner = (v + v * v * v * CUBIC) * SQRT_2_OVER_PI;
        y[i] = F::cast_from(v * (f32::tanh(inner) + 1.0) * 0.5);
        i += stride;
    }
}

/// `grad · GELU_tanh'(x)` element by element over the flat buffers (grid stride), in `F`:
/// `(t + 1 + x·(1 − t²)·du)·0.5·grad` with `t = tanh((x²·c + 1)·x·√(2/π))` and
/// `du = (x²·3c + 1)·√(2/π)`.
#[cube(launch)]
pub fn gelu_backward<F: Float, E: Float>(
    x: &Tensor<F>,
    grad: &Tensor<E>,
    dx: &mut Tensor<F>,
    #[define(F)] _x_dtype: StorageType,
    #[define(E)] _grad_dtype: StorageType,
) {
    let stride = (CUBE_DIM_X * CUBE_COUNT_X) as usize;
    let mut i = (CUBE_POS_X * CUBE_DIM_X + UNIT_POS_X) as usize;
    while i < x.len() {
        let v = f32::cast_from(x[i]);
        let v2 = v * v;
        let t = f32::tanh((v2 * CUBIC + 1.0) * v * SQRT_2_OVER_PI);
        let du = (v2 * CUBIC_3 + 1.0) * SQRT_2_OVER_PI;
        let sech2 = 1.0 - t * t;
        let d = (t + 1.0 + v * sech2 * du) * 0.5;
        dx[i] = F::cast_from(d * f32::cast_from(grad[i]));
        i += stride;
    }
}
