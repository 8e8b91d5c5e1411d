//! The block kernels launched on a plain CubeCL backend ([`CubeBackend`] over the runtime
//! `R`, float32 default element), from and to the generic backend `B` that it is.

use std::any::TypeId;

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Shape, Tensor, TensorPrimitive};
use burn_cubecl::element::BoolElement;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubecl::prelude::*;
use cubecl::zspace::metadata::Metadata;
use reel_core::backend::downcast_tensor;

use super::device as kernels;
use super::norms::{self, Grads, Rows, Stats, Wanted};

/// The CubeCL backend over `R` as Reel builds it.
pub(super) type Cube<R, BT> = CubeBackend<R, f32, i32, BT>;

/// Most cubes in one grid dimension (Vulkan's limit, and CUDA's for the second and third);
/// the row kernels stride over the rest.
pub(super) const MAX_CUBES: usize = 65_535;

/// Whether `B` is [`CubeBackend`] over `R` (with bool element `BT`).
pub(super) fn is<B: Backend, R: CubeRuntime, BT: BoolElement>() -> bool {
    TypeId::of::<B>() == TypeId::of::<Cube<R, BT>>()
}

/// `t`'s primitive, `B` being `Cube<R, BT>` ([`is`]).
pub(super) fn prim<B: Backend, R: CubeRuntime, BT: BoolElement, const D: usize>(
    t: Tensor<B, D>,
) -> CubeTensor<R> {
    let t = downcast_tensor::<B, Cube<R, BT>, D>(t)
        .unwrap_or_else(|_| unreachable!("the caller checked that B is the CubeCL backend"));
    t.into_primitive().tensor()
}

/// `t` as a tensor of `B`, `B` being `Cube<R, BT>`.
pub(super) fn wrap<B: Backend, R: CubeRuntime, BT: BoolElement, const D: usize>(
    t: CubeTensor<R>,
) -> Tensor<B, D> {
    let t = Tensor::<Cube<R, BT>, D>::from_primitive(TensorPrimitive::Float(t));
    downcast_tensor::<Cube<R, BT>, B, D>(t)
        .unwrap_or_else(|_| unreachable!("the caller checked that B is the CubeCL backend"))
}

/// [`super::rows::flatten_rows`] on a plain CubeCL backend: `t` as `[rows, cols]`, a view
/// with the rows' own stride when [`super::rows::row_stride`] finds one, else a reshape.
pub(super) fn flatten_rows<B: Backend, R: CubeRuntime, BT: BoolElement, const D: usize>(
    t: Tensor<B, D>,
    [rows, cols]: [usize; 2],
) -> Tensor<B, 2> {
    let mut p = prim::<B, R, BT, D>(t);
    match super::rows::row_stride(p.meta.shape(), p.meta.strides()) {
        Some(stride) => {
            *p.meta = Metadata::new([rows, cols], [stride, 1]);
            wrap::<B, R, BT, 2>(p)
        }
        None => wrap::<B, R, BT, D>(p).reshape([rows, cols]),
    }
}

/// `(rows per chunk, chunks)` for column sums over `rows` rows: about `sqrt(rows)` of each,
/// so that both the kernel's loop and the sum of the chunks are short.
fn chunking(rows: usize) -> (usize, usize) {
    let per_chunk = (rows as f64).sqrt().ceil().max(1.0) as usize;
    (per_chunk, rows.div_ceil(per_chunk))
}

/// [`norms::sum_rows`] on the kernels.
pub(super) fn sum_rows<B: Backend, R: CubeRuntime, BT: BoolElement>(
    t: Tensor<B, 2>,
) -> Tensor<B, 1> {
    let [rows, cols] = t.dims();
    if rows * cols == 0 {
        return norms::sum_rows_ops(t);
    }
    let t = prim::<B, R, BT, 2>(t);
    let (rows_per_chunk, chunks) = chunking(rows);
    let partial = empty(&t, &[chunks, cols], DType::F32);
    let units = units(cols);
    let dtype = t.dtype;
    kernels::column_sums::launch::<R>(
        &t.client.clone(),
        CubeCount::Static(cols.div_ceil(units) as u32, chunks as u32, 1),
        CubeDim::new_1d(units as u32),
        t.into_tensor_arg(),
        partial.clone().into_tensor_arg(),
        rows_per_chunk,
        units,
        dtype.into(),
    );
    wrap::<B, R, BT, 2>(partial).sum_dim(0).reshape([cols])
}

/// An uninitialized tensor of `dims` and `dtype` on `like`'s device.
pub(super) fn empty<R: CubeRuntime>(
    like: &CubeTensor<R>,
    dims: &[usize],
    dtype: DType,
) -> CubeTensor<R> {
    let shape = Shape::from(dims.to_vec());
    empty_device_dtype(like.client.clone(), like.device.clone(), shape, dtype)
}

/// Units per cube for rows of `dim` values: a power of two, 32 to 256.
fn units(dim: usize) -> usize {
    dim.next_power_of_two().clamp(32, 256)
}

/// Cubes for the row kernels: one per row, at most [`MAX_CUBES`].
fn row_cubes(rows: usize) -> CubeCount {
    CubeCount::Static(rows.clamp(1, MAX_CUBES) as u32, 1, 1)
}

/// [`norms::forward`] on the kernels.
pub(super) fn norm_forward<B: Backend, R: CubeRuntime, BT: BoolElement>(
    rows: Rows<B>,
    eps: f64,
    out: DType,
) -> (Tensor<B, 3>, Stats<B>) {
    let [g, p, dim] = rows.x.dims();
    if g * p * dim == 0 {
        return norms::forward_ops(rows, eps, out);
    }
    let x = prim::<B, R, BT, 3>(rows.x);
    let scale = prim::<B, R, BT, 3>(rows.scale);
    let centered = rows.shift.is_some();
    let shift = match rows.shift {
        Some(s) => prim::<B, R, BT, 3>(s),
        None => empty(&x, &[1, 1, 1], DType::F32),
    };
    let y = empty(&x, &[g, p, dim], out);
    let mean = empty(&x, &[if centered { g * p } else { 1 }], DType::F32);
    let rstd = empty(&x, &[g * p], DType::F32);
    let units = units(dim);
    let x_dtype = x.dtype;
    kernels::norm_forward::launch::<R>(
        &x.client.clone(),
        row_cubes(g * p),
        CubeDim::new_1d(units as u32),
        x.into_tensor_arg(),
        scale.into_tensor_arg(),
        shift.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        mean.clone().into_tensor_arg(),
        rstd.clone().into_tensor_arg(),
        eps as f32,
        units,
        centered,
        centered,
        x_dtype.into(),
        out.into(),
    );
    let stat = |t: CubeTensor<R>| wrap::<B, R, BT, 3>(t).reshape([g, p, 1]);
    let stats = Stats {
        mean: centered.then(|| stat(mean)),
        rstd: stat(rstd),
    };
    (wrap::<B, R, BT, 3>(y), stats)
}

/// [`norms::backward`] on the kernels.
pub(super) fn norm_backward<B: Backend, R: CubeRuntime, BT: BoolElement>(
    grad: Tensor<B, 3>,
    x: Tensor<B, 3>,
    scale: Tensor<B, 3>,
    stats: Stats<B>,
    wanted: Wanted,
) -> Grads<B> {
    let [g, p, dim] = x.dims();
    // The scale/shift kernel's grid has one cube layer per group (at most MAX_CUBES).
    if g * p * dim == 0 || g > MAX_CUBES {
        return norms::backward_ops(grad, x, scale, stats, wanted);
    }
    let centered = stats.mean.is_some();
    let flat = |t: Tensor<B, 3>| prim::<B, R, BT, 3>(t.reshape([1, 1, g * p]));
    let rstd = flat(stats.rstd);
    let mean = match stats.mean {
        Some(m) => flat(m),
        None => empty(&rstd, &[1], DType::F32),
    };
    let (grad, x) = (prim::<B, R, BT, 3>(grad), prim::<B, R, BT, 3>(x));
    let dx = wanted.x.then(|| {
        let scale = prim::<B, R, BT, 3>(scale);
        input_grad(&grad, &x, scale, (&mean, &rstd), centered)
    });
    let shifted = wanted.shift && centered;
    let (dscale, dshift) = if wanted.scale || shifted {
        affine_grads(&grad, &x, (&mean, &rstd), centered, shifted)
    } else {
        (None, None)
    };
    let sum = |t: CubeTensor<R>| wrap::<B, R, BT, 3>(t).sum_dim(1);
    Grads {
        x: dx.map(wrap::<B, R, BT, 3>),
        scale: dscale.filter(|_| wanted.scale).map(sum),
        shift: dshift.map(sum),
    }
}

/// [`super::elementwise::gate_dgate`] on the kernels: `Σ_p a·b` of `a, b [G, P, dim]`, float32
/// `[G, 1, dim]`. This is the scale gradient of an RMSNorm whose rows have `rstd = 1`
/// (`grad = a`, `x = b`), so it runs [`affine_grads`] with unit statistics.
pub(super) fn column_dots<B: Backend, R: CubeRuntime, BT: BoolElement>(
    a: Tensor<B, 3>,
    b: Tensor<B, 3>,
) -> Tensor<B, 3> {
    let [g, p, _] = a.dims();
    // The kernel's grid has one cube layer per group.
    if g > MAX_CUBES {
        return super::elementwise::gate_dgate_ops(a, b);
    }
    let ones = Tensor::<B, 1>::ones([g * p], &a.device());
    let (a, b) = (prim::<B, R, BT, 3>(a), prim::<B, R, BT, 3>(b));
    let rstd = prim::<B, R, BT, 1>(ones);
    let unused_mean = empty(&rstd, &[1], DType::F32);
    let (sums, _) = affine_grads(&a, &b, (&unused_mean, &rstd), false, false);
    let sums = sums.expect("the scale sums are always computed");
    wrap::<B, R, BT, 3>(sums).sum_dim(1)
}

/// `dx` in `x`'s dtype ([`kernels::norm_backward_x()`]); `mean`, `rstd` flat.
fn input_grad<R: CubeRuntime>(
    grad: &CubeTensor<R>,
    x: &CubeTensor<R>,
    scale: CubeTensor<R>,
    (mean, rstd): (&CubeTensor<R>, &CubeTensor<R>),
    centered: bool,
) -> CubeTensor<R> {
    let dims: [usize; 3] = x.meta.shape().dims();
    let dx = empty(x, &dims, x.dtype);
    let units = units(dims[2]);
    kernels::norm_backward_x::launch::<R>(
        &x.client.clone(),
        row_cubes(dims[0] * dims[1]),
        CubeDim::new_1d(units as u32),
        grad.clone().into_tensor_arg(),
        x.clone().into_tensor_arg(),
        scale.into_tensor_arg(),
        mean.clone().into_tensor_arg(),
        rstd.clone().into_tensor_arg(),
        dx.clone().into_tensor_arg(),
        units,
        centered,
        grad.dtype.into(),
        x.dtype.into(),
    );
    dx
}

/// The scale gradient's and (when `shifted`) the shift gradient's partial sums
/// `[G, chunks, dim]` ([`kernels::norm_backward_affine()`], chunks of [`chunking`]).
fn affine_grads<R: CubeRuntime>(
    grad: &CubeTensor<R>,
    x: &CubeTensor<R>,
    (mean, rstd): (&CubeTensor<R>, &CubeTensor<R>),
    centered: bool,
    shifted: bool,
) -> (Option<CubeTensor<R>>, Option<CubeTensor<R>>) {
    let [g, p, dim] = x.meta.shape().dims();
    let (rows_per_chunk, chunks) = chunking(p);
    let dscale = empty(x, &[g, chunks, dim], DType::F32);
    let dshift_dims = if shifted { [g, chunks, dim] } else { [1, 1, 1] };
    let dshift = empty(x, &dshift_dims, DType::F32);
    let units = units(dim);
    kernels::norm_backward_affine::launch::<R>(
        &x.client.clone(),
        CubeCount::Static(dim.div_ceil(units) as u32, chunks as u32, g as u32),
        CubeDim::new_1d(units as u32),
        grad.clone().into_tensor_arg(),
        x.clone().into_tensor_arg(),
        mean.clone().into_tensor_arg(),
        rstd.clone().into_tensor_arg(),
        dscale.clone().into_tensor_arg(),
        dshift.clone().into_tensor_arg(),
        rows_per_chunk,
        units,
        centered,
        shifted,
        grad.dtype.into(),
        x.dtype.into(),
    );
    (Some(dscale), shifted.then_some(dshift))
}

/// Cubes and units of an element-wise grid-stride launch over `len` values.
pub(super) fn flat_grid(len: usize) -> (CubeCount, CubeDim) {
    const UNITS: usize = 256;
    let cubes = len.div_ceil(UNITS).clamp(1, MAX_CUBES);
    (
        CubeCount::Static(cubes as u32, 1, 1),
        CubeDim::new_1d(UNITS as u32),
    )
}

/// `t` as a flat, contiguous primitive (a copy when it is not contiguous).
pub(super) fn flat<B: Backend, R: CubeRuntime, BT: BoolElement, const D: usize>(
    t: Tensor<B, D>,
) -> CubeTensor<R> {
    let n = t.shape().num_elements();
    burn_cubecl::kernel::into_contiguous(prim::<B, R, BT, 1>(t.reshape([n])))
}

/// [`super::gelu::forward`] on the kernel.
pub(super) fn gelu_forward<B: Backend, R: CubeRuntime, BT: BoolElement, const D: usize>(
    x: Tensor<B, D>,
) -> Tensor<B, D> {
    let dims = x.dims();
    if x.shape().num_elements() == 0 {
        return crate::wan::gelu::gelu_tanh_plain(x);
    }
    let x = flat::<B, R, BT, D>(x);
    let n = x.meta.shape()[0];
    let y = empty(&x, &[n], x.dtype);
    let (cubes, units) = flat_grid(n);
    let dtype = x.dtype;
    kernels::gelu_forward::launch::<R>(
        &x.client.clone(),
        cubes,
        units,
        x.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        dtype.into(),
    );
    wrap::<B, R, BT, 1>(y).reshape(dims)
}

/// [`super::gelu::backward`] on the kernel.
pub(super) fn gelu_backward<B: Backend, R: CubeRuntime, BT: BoolElement, const D: usize>(
    x: Tensor<B, D>,
    grad: Tensor<B, D>,
) -> Tensor<B, D> {
    let dims = x.dims();
    if x.shape().num_elements() == 0 {
        return crate::wan::gelu::gelu_tanh_backward_plain(x, grad);
    }
    let (x, grad) = (flat::<B, R, BT, D>(x), flat::<B, R, BT, D>(grad));
    let n = x.meta.shape()[0];
    let dx = empty(&x, &[n], x.dtype);
    let (cubes, units) = flat_grid(n);
    let (x_dtype, grad_dtype) = (x.dtype, grad.dtype);
    kernels::gelu_backward::launch::<R>(
        &x.client.clone(),
        cubes,
        units,
        x.into_tensor_arg(),
        grad.into_tensor_arg(),
        dx.clone().into_tensor_arg(),
        x_dtype.into(),
        grad_dtype.into(),
    );
    wrap::<B, R, BT, 1>(dx).reshape(dims)
}
