//! Fused attention on Burn's CubeCL backends (`cuda`, `wgpu`): the memory-efficient attention
//! of [`super::mem_attention`] as three CubeCL kernels ([`kernels`]) instead of a sequence of
//! Burn tensor operations, so the score tiles live in registers and shared memory and never
//! reach device memory.
//!
//! Same contract as the blocked version: saved state `q, k, v, o, lse`, memory linear in the
//! sequence length, float32 softmax statistics, gradients of the exact softmax. Selected with
//! `attention = "fused"`; on other backends that mode runs the blocked version. With the
//! `fusion` feature the kernels also run under Burn's fusion layer (`fusion.rs`). With
//! `attention = "flash"`, bf16/f16 training attention runs on cuDNN (`cudnn`, the `cuda`
//! default) or the tensor-core kernels of [`tiled`] instead, and float32 forwards without
//! gradients cubek's flash kernel ([`flash`]).

mod autodiff;
mod backend;
#[cfg(feature = "cuda")]
pub mod cudnn;
pub mod flash;
mod fragments;
#[cfg(feature = "fusion")]
mod fusion;
pub mod kernels;
mod mma;
pub mod mma_backward;
pub mod mma_forward;
mod rows;
mod staging;
pub mod strips;
pub mod strips_backward;
mod tile_ops;
pub mod tiled;
pub mod tiled_kernels;
pub mod tiles;

pub use autodiff::{
    autodiff_attention, autodiff_attention_with, inference_attention, try_fused_attention, Qkv,
};
pub use backend::FusedKernels;

use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::{empty_device_contiguous_dtype, empty_device_dtype};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

/// Rows (units) per cube.
const UNITS: usize = 64;
/// Largest tile of the other sequence staged in shared memory, in rows.
const MAX_TILE: usize = 32;
/// Shared memory the staged tiles may use at most, in float32 elements (32 KiB).
const TILE_BUDGET: usize = 8192;

/// Rows per shared-memory tile for head dims `d` (queries/keys) and `dv` (values) when the
/// device gives a cube `shared_bytes` of shared memory: each staged row takes `d + dv` floats
/// plus two softmax statistics.
pub fn tile_rows(d: usize, dv: usize, shared_bytes: usize) -> usize {
    let budget = TILE_BUDGET.min(shared_bytes / 4);
    (budget / (d + dv + 2)).clamp(1, MAX_TILE)
}

/// [`tile_rows`] for the device of `t`; panics (an invariant of the caller's config) when
/// even one row does not fit.
fn device_tile<R: CubeRuntime>(t: &CubeTensor<R>, d: usize, dv: usize) -> usize {
    let shared = t.client.properties().hardware.max_shared_memory_size;
    let tile = tile_rows(d, dv, shared);
    if tile * (d + dv + 2) * 4 > shared {
        panic!(
            "fused attention: head dims {d} + {dv} do not fit the device's {shared} bytes of \
             shared memory"
        );
    }
    tile
}

fn check_shapes<R: CubeRuntime>(q: &CubeTensor<R>, k: &CubeTensor<R>, v: &CubeTensor<R>) {
    let (qs, ks, vs) = (q.meta.shape(), k.meta.shape(), v.meta.shape());
    let ok = qs.num_dims() == 4
        && ks.num_dims() == 4
        && vs.num_dims() == 4
        && qs[0] == ks[0]
        && qs[1] == ks[1]
        && qs[3] == ks[3]
        && ks[0] == vs[0]
        && ks[1] == vs[1]
        && ks[2] == vs[2]
        && q.dtype == k.dtype
        && k.dtype == v.dtype;
    if !ok {
        panic!(
            "fused attention: q {:?} {:?}, k {:?} {:?}, v {:?} {:?} are not [B, H, Sq, D], \
             [B, H, Sk, D], [B, H, Sk, Dv] of one dtype",
            qs, q.dtype, ks, k.dtype, vs, v.dtype
        );
    }
}

fn cube_count(rows: usize, batch_heads: usize) -> CubeCount {
    CubeCount::Static(rows.div_ceil(UNITS) as u32, batch_heads as u32, 1)
}

/// An uninitialized float32 `[B, H, S]` tensor (the log-sum-exp or `Δ`) for the rows of `t`,
/// packed (`[H·S, S, 1]`, where CubeCL would pad the rows): the kernels read any row strides,
/// but cuDNN's frontend always declares the statistics packed, so a cuDNN backward after
/// Reel's forward gets them as cuDNN's own forward writes them.
fn empty_rows<R: CubeRuntime>(t: &CubeTensor<R>) -> CubeTensor<R> {
    let s = t.meta.shape();
    let shape = Shape::new([s[0], s[1], s[2]]);
    empty_device_contiguous_dtype(t.client.clone(), t.device.clone(), shape, DType::F32)
}

/// An uninitialized tensor of `dims` and `dtype` whose dimensions lie in memory in the order
/// of `like`'s (largest stride outermost; ties keep the dimension order).
///
/// The attention's output and gradients follow their inputs' layout: the Wan blocks pass
/// `[B, S, H, D]` tensors seen as `[B, H, S, D]`, and get the output and the gradients back
/// stored `[B, S, H, D]`, so that transposing them back and merging the heads
/// (`[B, S, H·D]`) is a view, not a copy (as PyTorch's attention keeps the query's layout).
pub(crate) fn empty_in_layout_of<R: CubeRuntime>(
    like: &CubeTensor<R>,
    dims: [usize; 4],
    dtype: DType,
) -> CubeTensor<R> {
    let strides = like.meta.strides();
    let mut order = [0, 1, 2, 3];
    order.sort_by_key(|&i| std::cmp::Reverse(strides[i]));
    let stored = Shape::new(order.map(|i| dims[i]));
    let t = empty_device_dtype(like.client.clone(), like.device.clone(), stored, dtype);
    let mut axes = [0; 4];
    for (pos, &dim) in order.iter().enumerate() {
        axes[dim] = pos;
    }
    burn_cubecl::ops::permute(t, &axes)
}

/// [`empty_in_layout_of`] with `t`'s dims and dtype.
fn empty_like<R: CubeRuntime>(t: &CubeTensor<R>) -> CubeTensor<R> {
    empty_in_layout_of(t, t.meta.shape().dims(), t.dtype)
}

/// `t` in `dtype` (cast when it is not): the backward kernels read the output gradient in the
/// inputs' dtype.
fn as_dtype<R: CubeRuntime>(t: CubeTensor<R>, dtype: DType) -> CubeTensor<R> {
    if t.dtype == dtype {
        t
    } else {
        burn_cubecl::kernel::cast(t, dtype)
    }
}

/// Forward: `(o [B, H, Sq, Dv], lse [B, H, Sq] float32)` for `q [B, H, Sq, D]`,
/// `k [B, H, Sk, D]`, `v [B, H, Sk, Dv]` (any strides, one float dtype); `o` is laid out as
/// `q` is (`empty_in_layout_of`).
pub fn forward<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>) {
    check_shapes(&q, &k, &v);
    let [b, h, sq, d] = q.meta.shape().dims();
    let dv = v.meta.shape()[3];
    let out = empty_in_layout_of(&q, [b, h, sq, dv], q.dtype);
    let lse = empty_rows(&q);
    let scale = 1.0 / (d as f32).sqrt();
    let dtype = q.dtype;
    kernels::attention_forward::launch::<R>(
        &q.client.clone(),
        cube_count(sq, b * h),
        CubeDim::new_1d(UNITS as u32),
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        lse.clone().into_tensor_arg(),
        scale,
        d,
        dv,
        UNITS,
        device_tile(&out, d, dv),
        dtype.into(),
    );
    (out, lse)
}

/// Backward: `(dq, dk, dv)` shaped and laid out like `q, k, v` from the saved `o`, `lse` and
/// the output gradient `d_out [B, H, Sq, Dv]` (any strides).
pub fn backward<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    o: CubeTensor<R>,
    lse: CubeTensor<R>,
    d_out: CubeTensor<R>,
) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
    check_shapes(&q, &k, &v);
    let [b, h, sq, d] = q.meta.shape().dims();
    let sk = k.meta.shape()[2];
    let dv = v.meta.shape()[3];
    let dtype = q.dtype;
    let d_out = as_dtype(d_out, dtype);
    let (dq, dk, dvt) = (empty_like(&q), empty_like(&k), empty_like(&v));
    let delta = empty_rows(&q);
    let scale = 1.0 / (d as f32).sqrt();
    let tile = device_tile(&dq, d, dv);
    let client = q.client.clone();
    kernels::attention_backward_q::launch::<R>(
        &client,
        cube_count(sq, b * h),
        CubeDim::new_1d(UNITS as u32),
        q.clone().into_tensor_arg(),
        k.clone().into_tensor_arg(),
        v.clone().into_tensor_arg(),
        o.into_tensor_arg(),
        d_out.clone().into_tensor_arg(),
        lse.clone().into_tensor_arg(),
        dq.clone().into_tensor_arg(),
        delta.clone().into_tensor_arg(),
        scale,
        d,
        dv,
        UNITS,
        tile,
        dtype.into(),
    );
    kernels::attention_backward_kv::launch::<R>(
        &client,
        cube_count(sk, b * h),
        CubeDim::new_1d(UNITS as u32),
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        d_out.into_tensor_arg(),
        lse.into_tensor_arg(),
        delta.into_tensor_arg(),
        dk.clone().into_tensor_arg(),
        dvt.clone().into_tensor_arg(),
        scale,
        d,
        dv,
        UNITS,
        tile,
        dtype.into(),
    );
    (dq, dk, dvt)
}

#[cfg(test)]
mod tests;
