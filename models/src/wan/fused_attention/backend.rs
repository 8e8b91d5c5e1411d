//! [`FusedKernels`]: the fused and tiled attention kernels on a backend's float tensors, for
//! [`CubeBackend`] directly (and, in `fusion.rs`, for Burn's fusion layer over it).

use std::sync::Once;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn_cubecl::element::BoolElement;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime, FloatElement, IntElement};

use super::tiled::{self, Products};
use super::{backward, check_shapes, flash, forward};

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
    /// cuDNN's where it is chosen and runs (the `cuda` default, [`super::cudnn`]), else the
    /// tiled tensor-core forward where it runs ([`tiled`], bf16/f16: the kernel the
    /// training forward runs), else the tensor-core flash kernel where it runs ([`flash`]),
    /// else [`Self::fused_forward`].
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
    /// with `products`, or `None` where it cannot run (then the fused kernels do); with
    /// tensor-core products, cuDNN's where it is chosen and runs (the `cuda` default).
    fn tiled_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        products: Products,
    ) -> Option<(FloatTensor<Self>, FloatTensor<Self>)>;

    /// The tiled backward of [`tiled`] (`(dq, dk, dv)`), or `None` where it cannot run; with
    /// tensor-core products, cuDNN's where it is chosen and runs (the `cuda` default).
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
            // The training kernels first, so that a forward without a graph (a checkpointed
            // run's first pass) computes what their recomputation with a graph does.
            check_shapes(&q, &k, &v);
            #[cfg(feature = "cuda")]
            if let Some((o, _lse)) = super::cudnn::forward_if_chosen(&q, &k, &v) {
                return o;
            }
            match tiled::forward(q.clone(), k.clone(), v.clone(), Products::TensorCores) {
                Ok((o, _lse)) => return o,
                Err(tiled) => {
                    if let Some(o) = flash::try_accelerated(&q, &k, &v, &tiled) {
                        return o;
                    }
                }
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
        #[cfg(feature = "cuda")]
        if products == Products::TensorCores {
            if let Some(result) = super::cudnn::forward_if_chosen(&q, &k, &v) {
                return Some(result);
            }
        }
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
        #[cfg(feature = "cuda")]
        if products == Products::TensorCores {
            let inputs = [&qkv.0, &qkv.1, &qkv.2];
            if let Some(grads) = super::cudnn::backward_if_chosen(inputs, &o, &lse, &d_out) {
                return Some(grads);
            }
        }
        let shape = qkv.0.meta.shape().dims();
        tiled_or_note(tiled::backward(qkv, o, lse, d_out, products), shape)
    }
}
