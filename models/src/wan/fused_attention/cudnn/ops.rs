//! The operations of Reel's cuDNN graphs, each an operation descriptor over tensor
//! descriptors: for attention, matrix products, element-wise operations (with the index,
//! comparison and select ones of a padding mask), reductions and reshapes (views); for the
//! VAE, the convolution.

use cudarc::cudnn::sys as dnn;
use dnn::cudnnBackendAttributeName_t as Attr;
use dnn::cudnnBackendAttributeType_t as Ty;
use dnn::cudnnBackendDescriptorType_t as Kind;

use super::graph::{Desc, F32};
use super::CudnnError;

/// The operation `c = a · b` (batched over the leading dims), float32 accumulation.
pub(super) fn matmul(a: &Desc, b: &Desc, c: &Desc) -> Result<Desc, CudnnError> {
    matmul_sized(a, b, c, [None; 3])
}

/// [`matmul`] whose `[M, N, K]` extents, where given, are read per batch from int32
/// `[B, 1, 1, 1]` tensors (the sequence lengths of a padding mask: cuDNN's
/// `CUDNN_ATTR_OPERATION_MATMUL_GEMM_{M,N,K}_OVERRIDE_DESC`).
pub(super) fn matmul_sized(
    a: &Desc,
    b: &Desc,
    c: &Desc,
    [m, n, k]: [Option<&Desc>; 3],
) -> Result<Desc, CudnnError> {
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
    let overrides = [
        (Attr::CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, m),
        (Attr::CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, n),
        (Attr::CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, k),
    ];
    for (attr, extent) in overrides {
        if let Some(extent) = extent {
            op.descs(attr, &[extent])?;
        }
    }
    op.finalize()
}

/// The element-wise operation `y = mode(x[, b])` (`b` broadcast), computed in float32.
pub(super) fn pointwise(
    mode: dnn::cudnnPointwiseMode_t,
    x: &Desc,
    b: Option<&Desc>,
    y: &Desc,
) -> Result<Desc, CudnnError> {
    let desc = pointwise_desc(mode, F32, None)?;
    pointwise_op(&desc, [Some(x), b, None], y)
}

/// `y` = the index of each element of `x` along `axis` (int32; `x`'s values are not read).
pub(super) fn gen_index(axis: i64, x: &Desc, y: &Desc) -> Result<Desc, CudnnError> {
    let int32 = dnn::cudnnDataType_t::CUDNN_DATA_INT32;
    let desc = pointwise_desc(
        dnn::cudnnPointwiseMode_t::CUDNN_POINTWISE_GEN_INDEX,
        int32,
        Some(axis),
    )?;
    pointwise_op(&desc, [Some(x), None, None], y)
}

/// The boolean `y = mode(x, b)` (a comparison or a logical operation, `b` broadcast).
pub(super) fn logical(
    mode: dnn::cudnnPointwiseMode_t,
    x: &Desc,
    b: &Desc,
    y: &Desc,
) -> Result<Desc, CudnnError> {
    let boolean = dnn::cudnnDataType_t::CUDNN_DATA_BOOLEAN;
    let desc = pointwise_desc(mode, boolean, None)?;
    pointwise_op(&desc, [Some(x), Some(b), None], y)
}

/// `y = if t { x } else { b }` element-wise (`b` and `t` broadcast), in float32.
pub(super) fn select(x: &Desc, b: &Desc, t: &Desc, y: &Desc) -> Result<Desc, CudnnError> {
    let desc = pointwise_desc(
        dnn::cudnnPointwiseMode_t::CUDNN_POINTWISE_BINARY_SELECT,
        F32,
        None,
    )?;
    pointwise_op(&desc, [Some(x), Some(b), Some(t)], y)
}

/// A finalized pointwise descriptor of `mode` computed in `compute` (`axis`: GEN_INDEX's).
fn pointwise_desc(
    mode: dnn::cudnnPointwiseMode_t,
    compute: dnn::cudnnDataType_t,
    axis: Option<i64>,
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
        &[compute],
    )?;
    if let Some(axis) = axis {
        desc.set(
            Attr::CUDNN_ATTR_POINTWISE_AXIS,
            Ty::CUDNN_TYPE_INT64,
            &[axis],
        )?;
    }
    desc.finalize()
}

/// The pointwise operation of `desc` on the inputs `[x, b, t]` (those given), into `y`.
fn pointwise_op(desc: &Desc, [x, b, t]: [Option<&Desc>; 3], y: &Desc) -> Result<Desc, CudnnError> {
    let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
    op.descs(Attr::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[desc])?;
    let inputs = [
        (Attr::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x),
        (Attr::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b),
        (Attr::CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t),
    ];
    for (attr, input) in inputs {
        if let Some(input) = input {
            op.descs(attr, &[input])?;
        }
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

/// The operation `y = conv(x, w)`: a cross-correlation (PyTorch's and Burn's convolution) over
/// `stride.len()` spatial dims, with zero padding `pre` before and `post` after each, float32
/// accumulation (TF32 products on tensor cores where an engine uses them, as PyTorch's cuDNN
/// convolutions do by default). Tensors `x [N, C, spatial..]`, `w [O, C, kernel..]`,
/// `y [N, O, spatial'..]`.
pub(super) fn convolution_forward(
    [x, w, y]: [&Desc; 3],
    stride: &[i64],
    pre: &[i64],
    post: &[i64],
) -> Result<Desc, CudnnError> {
    let dims = stride.len() as i64;
    let desc = Desc::new(Kind::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
    desc.set(
        Attr::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
        Ty::CUDNN_TYPE_DATA_TYPE,
        &[F32],
    )?
    .set(
        Attr::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
        Ty::CUDNN_TYPE_CONVOLUTION_MODE,
        &[dnn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION],
    )?
    .set(
        Attr::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS,
        Ty::CUDNN_TYPE_INT64,
        &[dims],
    )?
    .set(
        Attr::CUDNN_ATTR_CONVOLUTION_DILATIONS,
        Ty::CUDNN_TYPE_INT64,
        &vec![1i64; stride.len()],
    )?
    .set(
        Attr::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES,
        Ty::CUDNN_TYPE_INT64,
        stride,
    )?
    .set(
        Attr::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS,
        Ty::CUDNN_TYPE_INT64,
        pre,
    )?
    .set(
        Attr::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS,
        Ty::CUDNN_TYPE_INT64,
        post,
    )?;
    let desc = desc.finalize()?;
    let op = Desc::new(Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)?;
    op.descs(Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, &[x])?
        .descs(Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, &[w])?
        .descs(Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, &[y])?
        .descs(
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
            &[&desc],
        )?
        .set(
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
            Ty::CUDNN_TYPE_FLOAT,
            &[1.0f32],
        )?
        .set(
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
            Ty::CUDNN_TYPE_FLOAT,
            &[0.0f32],
        )?;
    op.finalize()
}
