//! Fused attention on Burn's CubeCL backends (`cuda`, `wgpu`): the memory-efficient attention
//! of [`super::mem_attention`] as three CubeCL kernels ([`kernels`]) instead of a sequence of
//! Burn tensor operations, so the score tiles live in registers and shared memory and never
//! reach device memory.
//!
//! Same contract as the blocked version: saved state `q, k, v, o, lse`, memory linear in the
//! sequence length, float32 softmax statistics, gradients of the exact softmax. Selected with
//! `attention = "fused"`; on other backends that mode runs the blocked version. With the
//! `fusion` feature the kernels also run under Burn's fusion layer (`fusion.rs`). With
//! `attention = "flash"`, bf16/f16 training attention runs the tensor-core kernels of
//! [`tiled`] instead, and forwards without gradients cubek's flash kernel ([`flash`]).

pub mod flash;
pub mod kernels;
pub mod tiled;
pub mod tiled_kernels;

#[cfg(feature = "fusion")]
mod fusion;
#[cfg(feature = "fusion")]
use fusion::FusionLayer;
#[cfg(not(feature = "fusion"))]
use no_fusion::FusionLayer;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, Tensor, TensorPrimitive};
use burn_cubecl::element::BoolElement;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::*;
use std::sync::Once;
use tiled::Products;

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

/// An uninitialized float32 `[B, H, S]` tensor (the log-sum-exp or `Δ`) for the rows of `t`.
fn empty_rows<R: CubeRuntime>(t: &CubeTensor<R>) -> CubeTensor<R> {
    let s = t.meta.shape();
    let shape = Shape::new([s[0], s[1], s[2]]);
    empty_device_dtype(t.client.clone(), t.device.clone(), shape, DType::F32)
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
/// `q` is ([`empty_in_layout_of`]).
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

/// A backend the fused kernels run on: [`CubeBackend`] directly and, with the `fusion`
/// feature, Burn's fusion layer over it (the kernels then run as one custom fusion operation
/// each, after the operations queued before them).
pub trait FusedKernels: Backend {
    /// [`forward`] on this backend's float tensors: `(o, lse)`.
    fn fused_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// [`backward`] on this backend's float tensors: `(dq, dk, dv)`.
    fn fused_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        o: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// The forward's output alone, for a forward that is not differentiated; with `flash`,
    /// the tensor-core flash kernel where it runs ([`flash`]), else [`Self::fused_forward`].
    fn fused_forward_output(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        flash: bool,
    ) -> FloatTensor<Self> {
        let _ = flash;
        Self::fused_forward(q, k, v).0
    }

    /// The tiled forward of [`tiled`] (`(o, lse)`, same contract as [`Self::fused_forward`])
    /// with `products`, or `None` where it cannot run (then the fused kernels do).
    fn tiled_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        products: Products,
    ) -> Option<(FloatTensor<Self>, FloatTensor<Self>)>;

    /// The tiled backward of [`tiled`] (`(dq, dk, dv)`), or `None` where it cannot run.
    fn tiled_backward(
        qkv: (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>),
        o: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
        products: Products,
    ) -> Option<(FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>)>;
}

/// `result`, or `None` after a one-time note on stderr of why the tensor-core kernels do not
/// run (unit products, the tests' choice, always run).
fn tiled_or_note<T>(result: Result<T, tiled::Unavailable>, shape: [usize; 4]) -> Option<T> {
    static NOTE: Once = Once::new();
    result
        .map_err(|e| {
            NOTE.call_once(|| {
                eprintln!(
                    "reel: attention = \"flash\": the tiled attention kernels cannot run q \
                     {shape:?} on this device ({e}); using the fused kernels"
                )
            })
        })
        .ok()
}

impl<R, F, I, BT> FusedKernels for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn fused_forward(
        q: CubeTensor<R>,
        k: CubeTensor<R>,
        v: CubeTensor<R>,
    ) -> (CubeTensor<R>, CubeTensor<R>) {
        forward(q, k, v)
    }

    fn fused_backward(
        q: CubeTensor<R>,
        k: CubeTensor<R>,
        v: CubeTensor<R>,
        o: CubeTensor<R>,
        lse: CubeTensor<R>,
        d_out: CubeTensor<R>,
    ) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
        backward(q, k, v, o, lse, d_out)
    }

    fn fused_forward_output(
        q: CubeTensor<R>,
        k: CubeTensor<R>,
        v: CubeTensor<R>,
        flash: bool,
    ) -> CubeTensor<R> {
        if flash {
            if let Some(o) = flash::try_accelerated(&q, &k, &v) {
                return o;
            }
        }
        forward(q, k, v).0
    }

    fn tiled_forward(
        q: CubeTensor<R>,
        k: CubeTensor<R>,
        v: CubeTensor<R>,
        products: Products,
    ) -> Option<(CubeTensor<R>, CubeTensor<R>)> {
        check_shapes(&q, &k, &v);
        let shape = q.meta.shape().dims();
        tiled_or_note(tiled::forward(q, k, v, products), shape)
    }

    fn tiled_backward(
        qkv: (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>),
        o: CubeTensor<R>,
        lse: CubeTensor<R>,
        d_out: CubeTensor<R>,
        products: Products,
    ) -> Option<(CubeTensor<R>, CubeTensor<R>, CubeTensor<R>)> {
        check_shapes(&qkv.0, &qkv.1, &qkv.2);
        let shape = qkv.0.meta.shape().dims();
        tiled_or_note(tiled::backward(qkv, o, lse, d_out, products), shape)
    }
}

/// The backward of [`autodiff_attention`]; `tiled`: the products of the tiled kernels that
/// ran the forward, whose backward then runs too (the fused one where it cannot).
#[derive(Debug)]
struct FusedBackward {
    tiled: Option<Products>,
}

impl<B: FusedKernels> Backward<B, 3> for FusedBackward {
    // q, k, v, o, lse.
    type State = (
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
    );

    fn backward(
        self,
        ops: Ops<Self::State, 3>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let d_out = grads.consume::<B>(&ops.node);
        let (q, k, v, o, lse) = ops.state;
        let tiled = self.tiled.and_then(|products| {
            let qkv = (q.clone(), k.clone(), v.clone());
            B::tiled_backward(qkv, o.clone(), lse.clone(), d_out.clone(), products)
        });
        let (dq, dk, dv) = match tiled {
            Some(grads) => grads,
            None => B::fused_backward(q, k, v, o, lse, d_out),
        };
        let parents = ops.parents.map(|n| n.map(|n| n.id));
        super::mem_attention::register_qkv_grads::<B>(grads, parents, [dq, dk, dv]);
    }
}

/// Fused attention as one autodiff operation on `Autodiff<B, C>`. Shapes as in
/// [`super::mem_attention::naive_attention`]. With `flash`, a forward that no gradient
/// flows through runs the tensor-core flash kernel where it can ([`flash`]), and a tracked
/// forward and its backward the tensor-core tiled kernels where they can ([`tiled`]).
pub fn autodiff_attention<B: FusedKernels, C: CheckpointStrategy>(
    q: Tensor<Autodiff<B, C>, 4>,
    k: Tensor<Autodiff<B, C>, 4>,
    v: Tensor<Autodiff<B, C>, 4>,
    flash: bool,
) -> Tensor<Autodiff<B, C>, 4> {
    autodiff_attention_with(q, k, v, flash, flash.then_some(Products::TensorCores))
}

/// [`autodiff_attention`] whose tracked forward and backward try the tiled kernels with
/// `tiled` products first (the tests choose [`Products::Units`]).
pub fn autodiff_attention_with<B: FusedKernels, C: CheckpointStrategy>(
    q: Tensor<Autodiff<B, C>, 4>,
    k: Tensor<Autodiff<B, C>, 4>,
    v: Tensor<Autodiff<B, C>, 4>,
    flash: bool,
    tiled: Option<Products>,
) -> Tensor<Autodiff<B, C>, 4> {
    let q = q.into_primitive().tensor();
    let k = k.into_primitive().tensor();
    let v = v.into_primitive().tensor();
    let forward = |products: Products| {
        let (q, k, v) = (
            q.primitive.clone(),
            k.primitive.clone(),
            v.primitive.clone(),
        );
        B::tiled_forward(q, k, v, products).map(|r| (products, r))
    };
    // Decided before `prepare`, which takes the backward (and its products) by value.
    let tracked = [&q.node, &k.node, &v.node]
        .iter()
        .any(|n| !n.requirement.is_none());
    let tiled = tiled.filter(|_| tracked).and_then(forward);
    let backward = FusedBackward {
        tiled: tiled.as_ref().map(|(products, _)| *products),
    };
    let out = match backward
        .prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let (o, lse) = match tiled {
                Some((_, result)) => result,
                None => B::fused_forward(
                    q.primitive.clone(),
                    k.primitive.clone(),
                    v.primitive.clone(),
                ),
            };
            let state = (q.primitive, k.primitive, v.primitive, o.clone(), lse);
            prep.finish(state, o)
        }
        OpsKind::UnTracked(prep) => prep.finish(B::fused_forward_output(
            q.primitive,
            k.primitive,
            v.primitive,
            flash,
        )),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// Fused attention forward without autodiff (with `flash`, the tensor-core flash kernel
/// where it can run).
pub fn inference_attention<B: FusedKernels>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    flash: bool,
) -> Tensor<B, 4> {
    let o = B::fused_forward_output(
        q.into_primitive().tensor(),
        k.into_primitive().tensor(),
        v.into_primitive().tensor(),
        flash,
    );
    Tensor::from_primitive(TensorPrimitive::Float(o))
}

/// `t` as a tensor of the concrete backend `T` when `B` is `T`.
fn cast<B: Backend, T: Backend>(t: Tensor<B, 4>) -> Result<Tensor<T, 4>, Tensor<B, 4>> {
    reel_core::backend::downcast_tensor::<B, T, 4>(t)
}

/// Whatever `cast` cannot fail on: `k` and `v` have the type of `q`.
fn same<B: Backend, T: Backend>(t: Tensor<B, 4>) -> Tensor<T, 4> {
    cast::<B, T>(t).unwrap_or_else(|_| unreachable!("q, k, v share one backend type"))
}

/// The three attention inputs, handed back when no fused kernel applies.
pub type Qkv<B> = (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>);

/// Fused attention when `B` is `Autodiff<K>` or `K`.
fn try_kernels<B: Backend, K: FusedKernels>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    flash: bool,
) -> Result<Tensor<B, 4>, Qkv<B>> {
    let q = match cast::<B, Autodiff<K>>(q) {
        Ok(q) => {
            let o = autodiff_attention(q, same(k), same(v), flash);
            return Ok(same(o));
        }
        Err(q) => q,
    };
    match cast::<B, K>(q) {
        Ok(q) => Ok(same(inference_attention(q, same(k), same(v), flash))),
        Err(q) => Err((q, k, v)),
    }
}

/// Fused attention on the CubeCL backend `Cube` and, with the `fusion` feature, on
/// `Fusion<Cube>` (what `burn::backend::Cuda` / `Wgpu` are then).
fn try_cube<B: Backend, Cube: FusedKernels + FusionLayer>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    flash: bool,
) -> Result<Tensor<B, 4>, Qkv<B>> {
    let (q, k, v) = match try_kernels::<B, Cube>(q, k, v, flash) {
        Ok(o) => return Ok(o),
        Err(qkv) => qkv,
    };
    Cube::try_fused::<B>(q, k, v, flash)
}

/// The fused kernels when `B` is one of the compiled CubeCL backends (`Cuda`, `Wgpu`, with or
/// without autodiff, with or without Burn's fusion layer); otherwise the inputs come back
/// unchanged. With `flash`, forwards without gradients on the plain CubeCL backends run the
/// tensor-core flash kernel where it can ([`flash`]).
pub fn try_fused_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    flash: bool,
) -> Result<Tensor<B, 4>, Qkv<B>> {
    #[cfg(feature = "cuda")]
    let (q, k, v) =
        match try_cube::<B, CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>>(q, k, v, flash) {
            Ok(o) => return Ok(o),
            Err(qkv) => qkv,
        };
    #[cfg(feature = "wgpu")]
    let (q, k, v) = match try_cube::<B, CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u32>>(
        q, k, v, flash,
    ) {
        Ok(o) => return Ok(o),
        Err(qkv) => qkv,
    };
    Err((q, k, v))
}

/// Without the `fusion` feature there is no fusion layer to try.
#[cfg(not(feature = "fusion"))]
mod no_fusion {
    use super::*;

    /// The fused kernels on `Fusion<Self>`; without the `fusion` feature, never.
    pub trait FusionLayer {
        /// Hands the inputs back.
        fn try_fused<B: Backend>(
            q: Tensor<B, 4>,
            k: Tensor<B, 4>,
            v: Tensor<B, 4>,
            flash: bool,
        ) -> Result<Tensor<B, 4>, Qkv<B>> {
            let _ = flash;
            Err((q, k, v))
        }
    }

    impl<K: FusedKernels> FusionLayer for K {}
}

#[cfg(test)]
mod tests;
