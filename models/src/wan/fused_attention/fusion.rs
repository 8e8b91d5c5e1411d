//! The fused attention kernels under Burn's fusion layer (`fusion` feature), where
//! `burn::backend::Cuda` / `Wgpu` are `Fusion<CubeBackend<..>>`.
//!
//! The fusion layer records operations into streams and runs them later, fused where it can.
//! Each kernel call is recorded as one custom operation ([`CustomOpIr`]) declaring its inputs
//! and outputs; when the stream reaches it, the operation takes the inner backend's tensors
//! from the handle container, runs [`FusedKernels`] on them and registers the results.

use super::{try_kernels, FusedKernels, Qkv};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, Tensor};
use burn_fusion::stream::{Operation, OperationStreams};
use burn_fusion::{Client, Fusion, FusionBackend, FusionRuntime, FusionTensor};
use burn_ir::{CustomOpIr, HandleContainer, OperationIr, TensorIr};
use std::marker::PhantomData;

/// The fused kernels on `Fusion<Self>`.
pub trait FusionLayer: FusedKernels {
    /// Fused attention when `B` is `Autodiff<Fusion<Self>>` or `Fusion<Self>`.
    fn try_fused<B: Backend>(
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> Result<Tensor<B, 4>, Qkv<B>>;
}

impl<K: FusedKernels + FusionBackend> FusionLayer for K {
    fn try_fused<B: Backend>(
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> Result<Tensor<B, 4>, Qkv<B>> {
        try_kernels::<B, Fusion<K>>(q, k, v, false)
    }
}

/// Custom operation ids, as recorded in the fusion stream.
const FORWARD_ID: &str = "reel_fused_attention_forward";
const BACKWARD_ID: &str = "reel_fused_attention_backward";

/// The forward kernel as a fusion operation: inputs `q, k, v`, outputs `o, lse`.
#[derive(Debug)]
struct ForwardOp<K> {
    desc: CustomOpIr,
    _k: PhantomData<K>,
}

impl<K: FusedKernels + FusionBackend> Operation<K::FusionRuntime> for ForwardOp<K> {
    fn execute(
        &self,
        handles: &mut HandleContainer<<K::FusionRuntime as FusionRuntime>::FusionHandle>,
    ) {
        let ([q, k, v], [o, lse]) = self.desc.as_fixed();
        let (out, l) = K::fused_forward(
            handles.get_float_tensor::<K>(q),
            handles.get_float_tensor::<K>(k),
            handles.get_float_tensor::<K>(v),
        );
        handles.register_float_tensor::<K>(&o.id, out);
        handles.register_float_tensor::<K>(&lse.id, l);
    }
}

/// The two backward kernels as one fusion operation: inputs `q, k, v, o, lse, d_out`,
/// outputs `dq, dk, dv`.
#[derive(Debug)]
struct BackwardOp<K> {
    desc: CustomOpIr,
    _k: PhantomData<K>,
}

impl<K: FusedKernels + FusionBackend> Operation<K::FusionRuntime> for BackwardOp<K> {
    fn execute(
        &self,
        handles: &mut HandleContainer<<K::FusionRuntime as FusionRuntime>::FusionHandle>,
    ) {
        let ([q, k, v, o, lse, d_out], [dq, dk, dv]) = self.desc.as_fixed();
        let (gq, gk, gv) = K::fused_backward(
            handles.get_float_tensor::<K>(q),
            handles.get_float_tensor::<K>(k),
            handles.get_float_tensor::<K>(v),
            handles.get_float_tensor::<K>(o),
            handles.get_float_tensor::<K>(lse),
            handles.get_float_tensor::<K>(d_out),
        );
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

impl<K: FusedKernels + FusionBackend> FusedKernels for Fusion<K> {
    fn fused_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
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
            _k: PhantomData,
        };
        let [o, lse]: [FusionTensor<K::FusionRuntime>; 2] = record(&client, streams, desc, op)
            .try_into()
            .unwrap_or_else(|v: Vec<_>| panic!("forward op gave {} outputs, not 2", v.len()));
        (o, lse)
    }

    fn fused_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        o: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
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
            _k: PhantomData,
        };
        let [dq, dk, dv]: [FusionTensor<K::FusionRuntime>; 3] = record(&client, streams, desc, op)
            .try_into()
            .unwrap_or_else(|v: Vec<_>| panic!("backward op gave {} outputs, not 3", v.len()));
        (dq, dk, dv)
    }
}
