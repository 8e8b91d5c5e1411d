//! Operations with their own backward pass, and the one place that decides on which backends
//! they run as such (the fused CubeCL attention kernels have their own dispatch, as they run
//! on the CubeCL backends only).
//!
//! Burn's autodiff differentiates a function written with tensor operations by keeping the
//! inputs of every operation it records. For the memory-heavy parts of a block (attention,
//! the norms, the FFN's GELU) Reel registers one autodiff operation instead, whose backward
//! keeps only what it needs and recomputes the rest. Such an operation is written once for
//! `Autodiff<I, C>` over any inner backend `I`; [`dispatch`] runs it when the generic backend
//! `B` is one of Reel's autodiff backends (`Autodiff<NdArray>`, `Autodiff<Flex>`, and
//! `Autodiff<Cuda>` / `Autodiff<Wgpu>` with those features) and runs the operation's plain
//! formulation anywhere else (backends without autodiff, other autodiff stacks).

use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::NodeId;
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};
use reel_core::backend::downcast_tensor;

/// An operation with its own backward pass on `Autodiff<I>`, run by [`dispatch`].
pub(crate) trait CustomBackward<B: Backend>: Sized {
    /// The operation's result.
    type Output;

    /// The operation with its own backward when `B` is `Autodiff<I>`; `Err(self)` otherwise.
    /// Implementations start with [`first_input`] on their first tensor.
    fn on_autodiff<I: Backend>(self) -> Result<Self::Output, Self>;

    /// The operation on any other backend (plain tensor operations).
    fn otherwise(self) -> Self::Output;
}

/// Runs `op` with its own backward on Reel's autodiff backends, its plain formulation
/// elsewhere.
pub(crate) fn dispatch<B: Backend, Op: CustomBackward<B>>(op: Op) -> Op::Output {
    let op = match op.on_autodiff::<burn::backend::NdArray>() {
        Ok(out) => return out,
        Err(op) => op,
    };
    let op = match op.on_autodiff::<burn::backend::Flex>() {
        Ok(out) => return out,
        Err(op) => op,
    };
    #[cfg(feature = "cuda")]
    let op = match op.on_autodiff::<burn::backend::Cuda>() {
        Ok(out) => return out,
        Err(op) => op,
    };
    #[cfg(feature = "wgpu")]
    let op = match op.on_autodiff::<burn::backend::Wgpu>() {
        Ok(out) => return out,
        Err(op) => op,
    };
    op.otherwise()
}

/// The operation's first tensor on `Autodiff<I>` when `B` is that backend; `Err(t)`
/// otherwise (the caller rebuilds itself and returns it).
pub(crate) fn first_input<B: Backend, I: Backend, const D: usize>(
    t: Tensor<B, D>,
) -> Result<Tensor<Autodiff<I>, D>, Tensor<B, D>> {
    downcast_tensor::<B, Autodiff<I>, D>(t)
}

/// Another input of an operation whose first input [`first_input`] found on `Autodiff<I>`.
pub(crate) fn next_input<B: Backend, I: Backend, const D: usize>(
    t: Tensor<B, D>,
) -> Tensor<Autodiff<I>, D> {
    downcast_tensor::<B, Autodiff<I>, D>(t)
        .unwrap_or_else(|_| unreachable!("every input has the backend of the first"))
}

/// A result computed on `Autodiff<I>`, handed back as the caller's backend `B` (which
/// [`first_input`] found to be `Autodiff<I>`).
pub(crate) fn output<B: Backend, I: Backend, const D: usize>(
    t: Tensor<Autodiff<I>, D>,
) -> Tensor<B, D> {
    downcast_tensor::<Autodiff<I>, B, D>(t).unwrap_or_else(|_| unreachable!("B is Autodiff<I>"))
}

/// A float primitive (an operation's saved state, gradient or output) as a tensor of rank `D`.
pub(crate) fn tensor<B: Backend, const D: usize>(p: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// In a backward pass: registers `grad()` for `parent` when the parent needs a gradient
/// (`grad` runs only then).
pub(crate) fn register<B: Backend>(
    grads: &mut Gradients,
    parent: Option<NodeId>,
    grad: impl FnOnce() -> FloatTensor<B>,
) {
    if let Some(id) = parent {
        grads.register::<B>(id, grad());
    }
}
