//! CubeCL kernels of the fused optimizer updates, each launched once per group of parameter
//! tensors (a [`Sequence`] of flat, contiguous float32 buffers, unrolled at compile time):
//! the AdamW step, the EMA step, and the squared L2 norm of gradients (for clipping), summed
//! within each cube.
//!
//! Every cube works on every tensor of its group in turn, each unit walking the tensor with
//! a grid stride (`units · cubes` elements apart), so one launch of at most
//! [`super::MAX_CUBES`] cubes covers any lengths within the cube-count limits of every CubeCL
//! runtime (Vulkan allows 65,535 cubes per dimension). The arithmetic is the operation order
//! of [`crate::optim::adamw_updates`]' tensor operations, element by element, so the results
//! equal them up to the compiler's fused multiply-adds.

// The `#[cube(launch)]` macro generates undocumented launch modules and structs.
#![allow(missing_docs)]

use cubecl::prelude::*;

/// The host-side scalars of an AdamW step, as the kernel takes them.
#[derive(CubeType, CubeLaunch, Clone, Copy)]
pub struct AdamWArgs {
    /// Factor on the gradient (clipping).
    pub grad_scale: f32,
    /// `β1` and `1 − β1`.
    pub beta1: f32,
    pub one_minus_beta1: f32,
    /// `β2` and `1 − β2`.
    pub beta2: f32,
    pub one_minus_beta2: f32,
    /// `1 − lr·wd`.
    pub decay: f32,
    /// `sqrt(1 − β2^k)`.
    pub bc2_sqrt: f32,
    /// `ε`.
    pub eps: f32,
    /// `lr / (1 − β1^k)`.
    pub step_size: f32,
    /// Not 0 on the first step: the previous moments are zero and are not read.
    pub first: u32,
}

/// One AdamW step of each flat parameter of a group (`torch.optim.AdamW` order, gradient
/// scaled first):
///
/// `g ← g·grad_scale; m ← β1·m + (1−β1)·g; v ← β2·v + (1−β2)·g²;
///  p ← p·decay − (m / (sqrt(v) / bc2_sqrt + ε))·step_size`
///
/// With `first` not 0, `exp_avg`/`exp_avg_sq` are not read (the caller may pass any
/// buffers). `first` is a runtime value, not a compile-time one, so that the second step does
/// not compile a second kernel: a JIT compile there would land in the first timed step of a
/// benchmark that warms up with one step.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn adamw_steps(
    param: &Sequence<Tensor<f32>>,
    grad: &Sequence<Tensor<f32>>,
    exp_avg: &Sequence<Tensor<f32>>,
    exp_avg_sq: &Sequence<Tensor<f32>>,
    out_param: &mut Sequence<Tensor<f32>>,
    out_avg: &mut Sequence<Tensor<f32>>,
    out_avg_sq: &mut Sequence<Tensor<f32>>,
    s: AdamWArgs,
) {
    let tensors = comptime![param.len()];
    #[unroll]
    for t in 0..tensors {
        adamw_step(
            param.index(t),
            grad.index(t),
            exp_avg.index(t),
            exp_avg_sq.index(t),
            out_param.index_mut(t),
            out_avg.index_mut(t),
            out_avg_sq.index_mut(t),
            s,
        );
    }
}

/// [`adamw_steps`] on one tensor of the group.
#[cube]
#[allow(clippy::too_many_arguments)]
fn adamw_step(
    param: &Tensor<f32>,
    grad: &Tensor<f32>,
    exp_avg: &Tensor<f32>,
    exp_avg_sq: &Tensor<f32>,
    out_param: &mut Tensor<f32>,
    out_avg: &mut Tensor<f32>,
    out_avg_sq: &mut Tensor<f32>,
    s: AdamWArgs,
) {
    let len = param.len();
    let stride = (CUBE_DIM_X * CUBE_COUNT_X) as usize;
    let mut i = (CUBE_POS_X * CUBE_DIM_X + UNIT_POS_X) as usize;
    while i < len {
        let g = grad[i] * s.grad_scale;
        let new_m = g * s.one_minus_beta1;
        let new_v = g * g * s.one_minus_beta2;
        let mut m = new_m;
        let mut v = new_v;
        if s.first == 0 {
            m = exp_avg[i] * s.beta1 + new_m;
            v = exp_avg_sq[i] * s.beta2 + new_v;
        }
        let denom = f32::sqrt(v) / s.bc2_sqrt + s.eps;
        out_param[i] = param[i] * s.decay - m / denom * s.step_size;
        out_avg[i] = m;
        out_avg_sq[i] = v;
        i += stride;
    }
}

/// One EMA step of each flat shadow of a group: `e ← e·decay + p·(1 − decay)`.
#[cube(launch)]
pub fn ema_steps(
    shadow: &Sequence<Tensor<f32>>,
    param: &Sequence<Tensor<f32>>,
    out: &mut Sequence<Tensor<f32>>,
    decay: f32,
    one_minus_decay: f32,
) {
    let tensors = comptime![shadow.len()];
    #[unroll]
    for t in 0..tensors {
        ema_step(
            shadow.index(t),
            param.index(t),
            out.index_mut(t),
            decay,
            one_minus_decay,
        );
    }
}

/// [`ema_steps`] on one tensor of the group.
#[cube]
fn ema_step(
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

/// Partial sums of squares of a group of flat float32 buffers: each cube sums `t[i]²` over
/// its units' grid-stride elements of every tensor of the group and writes the total to
/// `out[offset + cube]` (so one buffer holds the partial sums of many groups, each at its own
/// offset).
#[cube(launch)]
pub fn sum_squares(
    tensors: &Sequence<Tensor<f32>>,
    out: &mut Tensor<f32>,
    offset: usize,
    #[comptime] units: usize,
) {
    let count = comptime![tensors.len()];
    let stride = units * CUBE_COUNT_X as usize;
    let start = CUBE_POS_X as usize * units + UNIT_POS_X as usize;
    let mut s = 0.0f32;
    #[unroll]
    for k in 0..count {
        let t = tensors.index(k);
        let mut i = start;
        while i < t.len() {
            let v = t[i];
            s += v * v;
            i += stride;
        }
    }
    let mut buf = SharedMemory::<f32>::new(units);
    let total = cube_sum(s, &mut buf, units);
    if UNIT_POS_X == 0 {
        out[offset + CUBE_POS_X as usize] = total;
    }
}
