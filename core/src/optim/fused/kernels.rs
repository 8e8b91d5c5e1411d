//! CubeCL kernels of the fused optimizer updates: one AdamW step and one EMA step per
//! parameter tensor, each a single pass over flat, contiguous float32 buffers; and the
//! squared L2 norm of a gradient (for clipping) in one pass, summed within each cube.
//!
//! Each unit walks the buffer with a grid stride (`units · cubes` elements apart), so one
//! launch of at most [`super::MAX_CUBES`] cubes covers any length within the cube-count limits
//! of every CubeCL runtime (Vulkan allows 65,535 cubes per dimension). The arithmetic is the
//! operation order of [`crate::optim::adamw_update`], element by element, so the results equal
//! the tensor-operation version up to the compiler's fused multiply-adds.

// The `#[cube(launch)]` macro generates undocumented launch modules and structs.
#![allow(missing_docs)]

use cubecl::prelude::*;

/// One AdamW step of a flat parameter (`torch.optim.AdamW` order, gradient scaled first):
///
/// `g ← g·grad_scale; m ← β1·m + (1−β1)·g; v ← β2·v + (1−β2)·g²;
///  p ← p·decay − (m / (sqrt(v) / bc2_sqrt + ε))·step_size`
///
/// with `decay = 1 − lr·wd` and `step_size = lr / (1 − β1^k)`. With `first` not 0, the
/// previous moments are zero and `exp_avg`/`exp_avg_sq` are not read (the caller may pass any
/// buffer). `first` is a runtime value, not a compile-time one, so that the second step does
/// not compile a second kernel: a JIT compile there would land in the first timed step of a
/// benchmark that warms up with one step.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn adamw_step(
    param: &Tensor<f32>,
    grad: &Tensor<f32>,
    exp_avg: &Tensor<f32>,
    exp_avg_sq: &Tensor<f32>,
    out_param: &mut Tensor<f32>,
    out_avg: &mut Tensor<f32>,
    out_avg_sq: &mut Tensor<f32>,
    grad_scale: f32,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    decay: f32,
    bc2_sqrt: f32,
    eps: f32,
    step_size: f32,
    first: u32,
) {
    let len = param.len();
    let stride = (CUBE_DIM_X * CUBE_COUNT_X) as usize;
    let mut i = (CUBE_POS_X * CUBE_DIM_X + UNIT_POS_X) as usize;
    while i < len {
        let g = grad[i] * grad_scale;
        let new_m = g * one_minus_beta1;
        let new_v = g * g * one_minus_beta2;
        let mut m = new_m;
        let mut v = new_v;
        if first == 0 {
            m = exp_avg[i] * beta1 + new_m;
            v = exp_avg_sq[i] * beta2 + new_v;
        }
        let denom = f32::sqrt(v) / bc2_sqrt + eps;
        out_param[i] = param[i] * decay - m / denom * step_size;
        out_avg[i] = m;
        out_avg_sq[i] = v;
        i += stride;
    }
}

/// One EMA step of a flat shadow: `e ← e·decay + p·(1 − decay)`.
#[cube(launch)]
pub fn ema_step(
    shadow: &Tensor<f32>,
    param: &Tensor<f32>,
    out: &mut Tensor<f32>,
    decay: f32,
    one_minus_decay: f32,
) {
    let len = shadow.len();
    let stride = (CUBE_DIM_X * CUBE_COUNT_X) as usize;
    let mut i = (CUBE_POS_X * CUBE_DIM_X + UNIT_POS_X) as usize;
    while i < len {
        out[i] = shadow[i] * decay + param[i] * one_minus_decay;
        i += stride;
    }
}

/// The sum of every unit's `value` in the cube, through the shared `buf` of `units` (a power
/// of two, the cube's size) values. Every unit gets the sum; `buf` is free again on return.
#[cube]
pub fn cube_sum(value: f32, buf: &mut SharedMemory<f32>, #[comptime] units: usize) -> f32 {
    let u = UNIT_POS_X as usize;
    buf[u] = value;
    sync_cube();
    let mut active = units.runtime();
    while active > 1 {
        active /= 2;
        if u < active {
            let s = buf[u] + buf[u + active];
            buf[u] = s;
        }
        sync_cube();
    }
    let total = buf[0];
    sync_cube();
    total
}

/// Partial sums of squares of a flat float32 buffer: each cube sums `t[i]²` over its units'
/// grid-stride elements and writes the total to `out[offset + cube]` (so one buffer holds
/// the partial sums of many tensors, each at its own offset).
#[cube(launch)]
pub fn sum_squares(
    t: &Tensor<f32>,
    out: &mut Tensor<f32>,
    offset: usize,
    #[comptime] units: usize,
) {
    let stride = units * CUBE_COUNT_X as usize;
    let mut i = CUBE_POS_X as usize * units + UNIT_POS_X as usize;
    let mut s = 0.0f32;
    while i < t.len() {
        let v = t[i];
        s += v * v;
        i += stride;
    }
    let mut buf = SharedMemory::<f32>::new(units);
    let total = cube_sum(s, &mut buf, units);
    if UNIT_POS_X == 0 {
        out[offset + CUBE_POS_X as usize] = total;
    }
}
