//! Fused attention on Burn tensors: one autodiff operation ([`autodiff_attention`]), the
//! forward without autodiff ([`inference_attention`]), and the dispatch that finds the fused
//! kernels behind a generic backend ([`try_fused_attention`]).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};
#[cfg(any(feature = "cuda", feature = "wgpu"))]
use burn_cubecl::CubeBackend;

#[cfg(feature = "fusion")]
use super::fusion::FusionLayer;
use super::tiled::Products;
use super::FusedKernels;
#[cfg(not(feature = "fusion"))]
use no_fusion::FusionLayer;

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
        crate::wan::mem_attention::register_qkv_grads::<B>(grads, parents, [dq, dk, dv]);
    }
}

/// Fused attention as one autodiff operation on `Autodiff<B, C>`. Shapes as in
/// [`naive_attention`](crate::wan::mem_attention::naive_attention). With `flash`, a forward that no
/// gradient flows through runs the tensor-core flash kernel where it can ([`flash`](super::flash)),
/// and a tracked forward and its backward the tensor-core tiled kernels where they can
/// ([`tiled`](super::tiled)).
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
pub(super) fn try_kernels<B: Backend, K: FusedKernels>(
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
/// tensor-core flash kernel where it can ([`flash`](super::flash)).
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
