//! The operations of cuDNN's attention graphs: matrix products, element-wise operations,
//! reductions and reshapes (views), each an operation descriptor over tensor descriptors.

use cudarc::cudnn::sys as dnn;
use dnn::cudnnBackendAttributeName_t as Attr;
use dnn::cudnnBackendAttributeType_t as Ty;
use dnn::cudnnBackendDescriptorType_t as Kind;

use super::graph::{Desc, F32};
use super::CudnnError;

/// The operation `c = a · b` (batched over the leading dims), float32 accumulation.
pub(super) fn matmul(a: &Desc, b: &Desc, c: &Desc) -> Result<Desc, CudnnError> {
    let desc = Desc::new(Kind::CUDNN_BACKEND_MATMUL_DESCRIPTOR)?;
    desc.set(
        Attr::CUDNN_ATTR_MATMUL_COMP_TYPE,
        Ty::CUDNN_TYPE_DATA_TYPE,
        &[F32],
    )?;
    let desc = desc.finalize()?;
    let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR)?;
    op.descs(Attr::CUDNN_ATTR_OPERATION_MATMUL_ADESC, &[a])?
        .descs(Attr::CUDNN_ATTR_OPERATION_MATMUL_BDESC, &[b])?
        .descs(Attr::CUDNN_ATTR_OPERATION_MATMUL_CDESC, &[c])?
        .descs(Attr::CUDNN_ATTR_OPERATION_MATMUL_DESC, &[&desc])?;
    op.finalize()
}

/// The element-wise operation `y = mode(x[, b])` (`b` broadcast), computed in float32.
pub(super) fn pointwise(
    mode: dnn::cudnnPointwiseMode_t,
    x: &Desc,
    b: Option<&Desc>,
    y: &Desc,
) -> Result<Desc, CudnnError> {
    let desc = Desc::new(Kind::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
    desc.set(
        Attr::CUDNN_ATTR_POINTWISE_MODE,
        Ty::CUDNN_TYPE_POINTWISE_MODE,
        &[mode],
    )?
    .set(
        Attr::CUDNN_ATTR_POINTWISE_MATH_PREC,
        Ty::CUDNN_TYPE_DATA_TYPE,
        &[F32],
    )?;
    let desc = desc.finalize()?;
    let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
    op.descs(Attr::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[&desc])?
        .descs(Attr::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &[x])?;
    if let Some(b) = b {
        op.descs(Attr::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[b])?;
    }
    op.descs(Attr::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[y])?;
    op.finalize()
}

/// The reduction `y = reduce(x)` over the dims where `y` has extent 1, in float32.
pub(super) fn reduction(
    operator: dnn::cudnnReduceTensorOp_t,
    x: &Desc,
    y: &Desc,
) -> Result<Desc, CudnnError> {
    let desc = Desc::new(Kind::CUDNN_BACKEND_REDUCTION_DESCRIPTOR)?;
    desc.set(
        Attr::CUDNN_ATTR_REDUCTION_OPERATOR,
        Ty::CUDNN_TYPE_REDUCTION_OPERATOR_TYPE,
        &[operator],
    )?
    .set(
        Attr::CUDNN_ATTR_REDUCTION_COMP_TYPE,
        Ty::CUDNN_TYPE_DATA_TYPE,
        &[F32],
    )?;
    let desc = desc.finalize()?;
    let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR)?;
    op.descs(Attr::CUDNN_ATTR_OPERATION_REDUCTION_XDESC, &[x])?
        .descs(Attr::CUDNN_ATTR_OPERATION_REDUCTION_YDESC, &[y])?
        .descs(Attr::CUDNN_ATTR_OPERATION_REDUCTION_DESC, &[&desc])?;
    op.finalize()
}

/// The operation `y = x` seen with `y`'s dims and strides (a transposed view, or another
/// dtype for a virtual tensor inside the fused kernel).
pub(super) fn reshape(x: &Desc, y: &Desc) -> Result<Desc, CudnnError> {
    let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR)?;
    op.descs(Attr::CUDNN_ATTR_OPERATION_RESHAPE_XDESC, &[x])?
        .descs(Attr::CUDNN_ATTR_OPERATION_RESHAPE_YDESC, &[y])?;
    op.finalize()
}
