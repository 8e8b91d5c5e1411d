//! The fused attention kernels under Burn's fusion layer (`fusion` feature), where
//! `burn::backend::Cuda` / `Wgpu` are `Fusion<CubeBackend<..>>`.
//!
//! The fusion layer records operations into streams and runs them later, fused where it can.
//! Each kernel call is recorded as one custom operation ([`CustomOpIr`]) declaring its inputs
//! and outputs; when the stream reaches it, the operation takes the inner backend's tensors
//! from the handle container, runs [`FusedKernels`] on them and registers the results. With
//! `attention = "flash"` the operations run the tiled tensor-core kernels ([`super::tiled`])
//! where they can, the fused ones otherwise (the outputs are the same either way).

use super::autodiff::try_kernels;
use super::tiled::Products;
use super::{FusedKernels, Qkv};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, Tensor};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Client, Fusion, FusionBackend, FusionRuntime, FusionTensor};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};
use std::marker::PhantomData;

/// The fused kernels on `Fusion<Self>`.
pub trait FusionLayer: FusedKernels {
    /// Fused attention when `B` is `Autodiff<Fusion<Self>>` or `Fusion<Self>` (with `flash`,
    /// on tensor cores where the tiled kernels run).
    fn try_fused<B: Backend>(
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        flash: bool,
    ) -> Result<Tensor<B, 4>, Qkv<B>>;
}

impl<K: FusedKernels + FusionBackend> FusionLayer for K {
    fn try_fused<B: Backend>(
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        flash: bool,
    ) -> Result<Tensor<B, 4>, Qkv<B>> {
        try_kernels::<B, Fusion<K>>(q, k, v, flash)
    }
}

/// Custom operation ids, as recorded in the fusion stream.
const FORWARD_ID: &str = "reel_fused_attention_forward";
const BACKWARD_ID: &str = "reel_fused_attention_backward";

/// The forward kernel as a fusion operation: inputs `q, k, v`, outputs `o, lse`; `tiled`:
/// the tiled kernels' products to try first.
#[derive(Debug)]
struct ForwardOp<K> {
    desc: CustomOpIr,
    tiled: Option<Products>,
    _k: PhantomData<K>,
}

impl<K: FusedKernels + FusionBackend> Operation<K::FusionRuntime> for ForwardOp<K> {
    fn execute(
        &self,
        handles: &mut HandleContainer<<K::FusionRuntime as FusionRuntime>::FusionHandle>,
    ) {
        let ([q, k, v], [o, lse]) = self.desc.as_fixed();
        let q = handles.get_float_tensor::<K>(q);
        let k = handles.get_float_tensor::<K>(k);
        let v = handles.get_float_tensor::<K>(v);
        let tiled = self
            .tiled
            .and_then(|p| K::tiled_forward(q.clone(), k.clone(), v.clone(), p));
        let (out, l) = tiled.unwrap_or_else(|| K::fused_forward(q, k, v));
        handles.register_float_tensor::<K>(&o.id, out);
        handles.register_float_tensor::<K>(&lse.id, l);
    }
}

/// The two backward kernels as one fusion operation: inputs `q, k, v, o, lse, d_out`,
/// outputs `dq, dk, dv`; `tiled`: the tiled kernels' products to try first.
#[derive(Debug)]
struct BackwardOp<K> {
    desc: CustomOpIr,
    tiled: Option<Products>,
    _k: PhantomData<K>,
}

impl<K: FusedKernels + FusionBackend> Operation<K::FusionRuntime> for BackwardOp<K> {
    fn execute(
        &self,
        handles: &mut HandleContainer<<K::FusionRuntime as FusionRuntime>::FusionHandle>,
    ) {
        let ([q, k, v, o, lse, d_out], [dq, dk, dv]) = self.desc.as_fixed();
        let [q, k, v, o, lse, d_out] =
            [q, k, v, o, lse, d_out].map(|t| handles.get_float_tensor::<K>(t));
        let tiled = self.tiled.and_then(|p| {
            let qkv = (q.clone(), k.clone(), v.clone());
            K::tiled_backward(qkv, o.clone(), lse.clone(), d_out.clone(), p)
        });
        let (gq, gk, gv) = tiled.unwrap_or_else(|| K::fused_backward(q, k, v, o, lse, d_out));
        handles.register_float_tensor::<K>(&dq.id, gq);
        handles.register_float_tensor::<K>(&dk.id, gk);
        handles.register_float_tensor::<K>(&dv.id, gv);
    }
}

/// A not-yet-computed output of `shape` and `dtype` on the client of `like`.
fn output<R: FusionRuntime>(like: &FusionTensor<R>, shape: Shape, dtype: DType) -> TensorIr {
    TensorIr::uninit(like.client.create_empty_handle(), shape, dtype)
}

/// `[B, H, S]` of a `[B, H, S, C]` tensor, and `[B, H, S, cols]`.
fn rows(t: &FusionTensor<impl FusionRuntime>, cols: Option<usize>) -> Shape {
    let s = &t.shape;
    match cols {
        Some(c) => Shape::new([s[0], s[1], s[2], c]),
        None => Shape::new([s[0], s[1], s[2]]),
    }
}

/// Records the custom operation `desc` (run by `op`) after the operations that produce
/// its inputs, and returns its outputs.
fn record<R: FusionRuntime, O: Operation<R> + 'static>(
    client: &Client<R>,
    streams: OperationStreams,
    desc: CustomOpIr,
    op: O,
) -> Vec<FusionTensor<R>> {
    client.register(streams, OperationIr::Custom(desc), op)
}

/// Records the forward operation (`tiled`: the products to try first): `(o, lse)`.
fn record_forward<K: FusedKernels + FusionBackend>(
    q: FusionTensor<K::FusionRuntime>,
    k: FusionTensor<K::FusionRuntime>,
    v: FusionTensor<K::FusionRuntime>,
    tiled: Option<Products>,
) -> (
    FusionTensor<K::FusionRuntime>,
    FusionTensor<K::FusionRuntime>,
) {
    let outputs = [
        output(&q, rows(&q, Some(v.shape[3])), q.dtype),
        output(&q, rows(&q, None), DType::F32),
    ];
    let client = q.client.clone();
    let streams = OperationStreams::with_inputs([&q, &k, &v]);
    let desc = CustomOpIr::new(
        FORWARD_ID,
        &[q.into_ir(), k.into_ir(), v.into_ir()],
        &outputs,
    );
    let op = ForwardOp::<K> {
        desc: desc.clone(),
        tiled,
        _k: PhantomData,
    };
    let [o, lse]: [FusionTensor<K::FusionRuntime>; 2] = record(&client, streams, desc, op)
        .try_into()
        .unwrap_or_else(|v: Vec<_>| panic!("forward op gave {} outputs, not 2", v.len()));
    (o, lse)
}

/// Records the backward operation (`tiled`: the products to try first): `(dq, dk, dv)`.
fn record_backward<K: FusedKernels + FusionBackend>(
    [q, k, v, o, lse, d_out]: [FusionTensor<K::FusionRuntime>; 6],
    tiled: Option<Products>,
) -> Qkv3<K> {
    let outputs = [
        output(&q, q.shape.clone(), q.dtype),
        output(&q, k.shape.clone(), q.dtype),
        output(&q, v.shape.clone(), q.dtype),
    ];
    let client = q.client.clone();
    let streams = OperationStreams::with_inputs([&q, &k, &v, &o, &lse, &d_out]);
    let desc = CustomOpIr::new(
        BACKWARD_ID,
        &[q, k, v, o, lse, d_out].map(FusionTensor::into_ir),
        &outputs,
    );
    let op = BackwardOp::<K> {
        desc: desc.clone(),
        tiled,
        _k: PhantomData,
    };
    let [dq, dk, dv]: [FusionTensor<K::FusionRuntime>; 3] = record(&client, streams, desc, op)
        .try_into()
        .unwrap_or_else(|v: Vec<_>| panic!("backward op gave {} outputs, not 3", v.len()));
    (dq, dk, dv)
}

/// `(q, k, v)`-shaped fusion tensors: the gradients.
type Qkv3<K> = (
    FusionTensor<<K as FusionBackend>::FusionRuntime>,
    FusionTensor<<K as FusionBackend>::FusionRuntime>,
    FusionTensor<<K as FusionBackend>::FusionRuntime>,
);

impl<K: FusedKernels + FusionBackend> FusedKernels for Fusion<K> {
    fn fused_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        record_forward::<K>(q, k, v, None)
    }

    fn fused_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        o: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        record_backward::<K>([q, k, v, o, lse, d_out], None)
    }

    /// With `flash`, the tiled tensor-core forward where it runs (cubek's flash kernel does
    /// not run under the fusion layer).
    fn fused_forward_output(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        flash: bool,
    ) -> FloatTensor<Self> {
        record_forward::<K>(q, k, v, flash.then_some(Products::TensorCores)).0
    }

    fn tiled_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        products: Products,
    ) -> Option<(FloatTensor<Self>, FloatTensor<Self>)> {
        Some(record_forward::<K>(q, k, v, Some(products)))
    }

    fn tiled_backward(
        (q, k, v): (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>),
        o: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
        products: Products,
    ) -> Option<(FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>)> {
        Some(record_backward::<K>(
            [q, k, v, o, lse, d_out],
            Some(products),
        ))
    }
}
