//! Fused optimizer updates on Burn's CubeCL backends (`cuda`, `wgpu`): one kernel per
//! parameter tensor for the AdamW step (gradient scaling for clipping, both moments, decoupled
//! weight decay and the update), one for the EMA step, and one per gradient for the squared
//! norm that clipping and logging take ([`kernels`]), where the tensor
//! operations of [`crate::optim::adamw_update`] launch about fifteen element-wise kernels per
//! tensor and stream the parameter's buffers through memory as often.
//!
//! [`try_adamw`] and [`try_ema`] run the kernels when the tensors live on the plain CubeCL
//! backend (what a training role's inner backend is with `cuda` or `wgpu`, without Burn's
//! `fusion` feature) and are float32; otherwise they hand their inputs back and the caller
//! runs the tensor operations. Under the `fusion` feature Burn's fusion layer fuses those
//! element-wise chains itself. Selected per role by `optimizer.fused` (default on).

pub mod kernels;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor, TensorPrimitive};
use burn_cubecl::element::BoolElement;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::*;

use super::{AdamWScalars, Moments};
use crate::backend::downcast_tensor;

/// Units per cube of the update kernels.
const UNITS: u32 = 256;
/// Most cubes one launch uses; each unit strides over the rest of the buffer.
pub const MAX_CUBES: u32 = 65_535;

/// A backend the fused update kernels run on.
pub trait FusedOptim: Backend {
    /// One AdamW step of a flat float32 parameter: `(param, exp_avg, exp_avg_sq)`;
    /// `moments` is `None` on the first step.
    fn fused_adamw(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moments: Option<(FloatTensor<Self>, FloatTensor<Self>)>,
        s: &AdamWScalars,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// The sum of the squares of every value of `tensors` (flat, float32, at least one),
    /// `[1]` float32: one kernel per tensor writing partial sums into one buffer, and one
    /// sum of that buffer.
    fn fused_sum_squares(tensors: Vec<FloatTensor<Self>>) -> FloatTensor<Self>;

    /// One EMA step of a flat float32 shadow: `shadow·decay + param·(1 − decay)`.
    fn fused_ema(
        shadow: FloatTensor<Self>,
        param: FloatTensor<Self>,
        decay: f64,
    ) -> FloatTensor<Self>;
}

/// `t` with a contiguous layout, copied when it is a strided view (kernels that index the
/// flat buffer need it).
pub fn contiguous<R: CubeRuntime>(t: CubeTensor<R>) -> CubeTensor<R> {
    if t.is_contiguous() {
        t
    } else {
        into_contiguous(t)
    }
}

/// An empty float32 buffer shaped like `t`.
fn empty_like<R: CubeRuntime>(t: &CubeTensor<R>) -> CubeTensor<R> {
    empty_device_dtype(
        t.client.clone(),
        t.device.clone(),
        t.meta.shape().clone(),
        DType::F32,
    )
}

/// Most partial sums (cubes) of one tensor's sum of squares.
const NORM_CUBES: usize = 1024;

/// Cube count and dimension covering `len` elements with grid-stride units.
fn grid(len: usize) -> (CubeCount, CubeDim) {
    let cubes = len.div_ceil(UNITS as usize).clamp(1, MAX_CUBES as usize) as u32;
    (CubeCount::Static(cubes, 1, 1), CubeDim::new_1d(UNITS))
}

impl<R, F, I, BT> FusedOptim for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn fused_adamw(
        param: CubeTensor<R>,
        grad: CubeTensor<R>,
        moments: Option<(CubeTensor<R>, CubeTensor<R>)>,
        s: &AdamWScalars,
    ) -> (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>) {
        let len = param.meta.num_elements();
        let lens: Vec<usize> = std::iter::once(&grad)
            .chain(moments.iter().flat_map(|(m, v)| [m, v]))
            .map(|t| t.meta.num_elements())
            .collect();
        if lens.iter().any(|&l| l != len) {
            panic!(
                "fused AdamW: a parameter of {len} values with gradient and moments of {lens:?}"
            );
        }
        let (param, grad) = (contiguous(param), contiguous(grad));
        let first = moments.is_none();
        let (m, v) = match moments {
            Some((m, v)) => (contiguous(m), contiguous(v)),
            // Not read on the first step.
            None => (grad.clone(), grad.clone()),
        };
        let (out_p, out_m, out_v) = (empty_like(&param), empty_like(&param), empty_like(&param));
        let (count, dim) = grid(len);
        let client = param.client.clone();
        kernels::adamw_step::launch::<R>(
            &client,
            count,
            dim,
            param.into_tensor_arg(),
            grad.into_tensor_arg(),
            m.into_tensor_arg(),
            v.into_tensor_arg(),
            out_p.clone().into_tensor_arg(),
            out_m.clone().into_tensor_arg(),
            out_v.clone().into_tensor_arg(),
            s.grad_scale as f32,
            s.beta1 as f32,
            (1.0 - s.beta1) as f32,
            s.beta2 as f32,
            (1.0 - s.beta2) as f32,
            s.decay as f32,
            s.bc2_sqrt as f32,
            s.eps as f32,
            s.step_size as f32,
            u32::from(first),
        );
        (out_p, out_m, out_v)
    }

    fn fused_sum_squares(tensors: Vec<CubeTensor<R>>) -> CubeTensor<R> {
        let Some(first) = tensors.first() else {
            panic!("fused sum of squares: no tensors");
        };
        let cubes: Vec<usize> = tensors
            .iter()
            .map(|t| {
                t.meta
                    .num_elements()
                    .div_ceil(UNITS as usize)
                    .clamp(1, NORM_CUBES)
            })
            .collect();
        let partial = empty_device_dtype(
            first.client.clone(),
            first.device.clone(),
            [cubes.iter().sum::<usize>()].into(),
            DType::F32,
        );
        let client = first.client.clone();
        let mut offset = 0;
        for (t, n) in tensors.into_iter().zip(cubes) {
            kernels::sum_squares::launch::<R>(
                &client,
                CubeCount::Static(n as u32, 1, 1),
                CubeDim::new_1d(UNITS),
                contiguous(t).into_tensor_arg(),
                partial.clone().into_tensor_arg(),
                offset,
                UNITS as usize,
            );
            offset += n;
        }
        float(tensor::<Self>(partial).sum())
    }

    fn fused_ema(shadow: CubeTensor<R>, param: CubeTensor<R>, decay: f64) -> CubeTensor<R> {
        let (len, other) = (shadow.meta.num_elements(), param.meta.num_elements());
        if len != other {
            panic!("fused EMA: a shadow of {len} values for a parameter of {other}");
        }
        let (shadow, param) = (contiguous(shadow), contiguous(param));
        let out = empty_like(&shadow);
        let (count, dim) = grid(len);
        let client = shadow.client.clone();
        kernels::ema_step::launch::<R>(
            &client,
            count,
            dim,
            shadow.into_tensor_arg(),
            param.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            decay as f32,
            (1.0 - decay) as f32,
        );
        out
    }
}

/// What [`downcast_tensor`] cannot fail on: a tensor of the type another tensor was cast
/// from.
fn same<B: Backend, T: Backend>(t: Tensor<B, 1>) -> Tensor<T, 1> {
    downcast_tensor::<B, T, 1>(t)
        .unwrap_or_else(|_| unreachable!("the tensors share one backend type"))
}

fn float<K: Backend>(t: Tensor<K, 1>) -> FloatTensor<K> {
    t.into_primitive().tensor()
}

fn tensor<K: Backend>(t: FloatTensor<K>) -> Tensor<K, 1> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// The inputs of an AdamW step, handed back when no fused kernel applies.
pub type AdamWInputs<B> = (Tensor<B, 1>, Tensor<B, 1>, Option<Moments<B>>);

/// The fused AdamW step when `B` is `K` and every tensor is float32.
fn adamw_on<B: Backend, K: FusedOptim>(
    (param, grad, moments): AdamWInputs<B>,
    s: &AdamWScalars,
) -> Result<(Tensor<B, 1>, Moments<B>), AdamWInputs<B>> {
    let f32_only = param.dtype() == DType::F32
        && grad.dtype() == DType::F32
        && moments
            .as_ref()
            .is_none_or(|m| m.exp_avg.dtype() == DType::F32 && m.exp_avg_sq.dtype() == DType::F32);
    let param = match downcast_tensor::<B, K, 1>(param) {
        Ok(p) if f32_only => p,
        Ok(p) => return Err((same(p), grad, moments)),
        Err(p) => return Err((p, grad, moments)),
    };
    let prev = moments.map(|m| {
        (
            float(same::<B, K>(m.exp_avg)),
            float(same::<B, K>(m.exp_avg_sq)),
        )
    });
    let (p, m, v) = K::fused_adamw(float(param), float(same::<B, K>(grad)), prev, s);
    let moments = Moments {
        exp_avg: same(tensor::<K>(m)),
        exp_avg_sq: same(tensor::<K>(v)),
    };
    Ok((same(tensor::<K>(p)), moments))
}

/// The fused EMA step when `B` is `K` and both tensors are float32.
fn ema_on<B: Backend, K: FusedOptim>(
    shadow: Tensor<B, 1>,
    param: Tensor<B, 1>,
    decay: f64,
) -> Result<Tensor<B, 1>, (Tensor<B, 1>, Tensor<B, 1>)> {
    let f32_only = shadow.dtype() == DType::F32 && param.dtype() == DType::F32;
    let shadow = match downcast_tensor::<B, K, 1>(shadow) {
        Ok(e) if f32_only => e,
        Ok(e) => return Err((same(e), param)),
        Err(e) => return Err((e, param)),
    };
    let out = K::fused_ema(float(shadow), float(same::<B, K>(param)), decay);
    Ok(same(tensor::<K>(out)))
}

/// The fused sum of squares when `B` is `K` and every tensor is float32.
fn sum_squares_on<B: Backend, K: FusedOptim>(
    tensors: Vec<Tensor<B, 1>>,
) -> Result<Tensor<B, 1>, Vec<Tensor<B, 1>>> {
    let f32_only = tensors.iter().all(|t| t.dtype() == DType::F32);
    if tensors.is_empty() || !f32_only || downcast_tensor::<B, K, 1>(tensors[0].clone()).is_err() {
        return Err(tensors);
    }
    let prims = tensors
        .into_iter()
        .map(|t| float(same::<B, K>(t)))
        .collect();
    Ok(same(tensor::<K>(K::fused_sum_squares(prims))))
}

/// The CubeCL backends compiled in, as [`CubeBackend`] types.
#[cfg(feature = "cuda")]
type CudaCube = CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;
#[cfg(feature = "wgpu")]
type WgpuCube = CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u32>;

/// One fused AdamW step when `B` is a compiled CubeCL backend and the tensors are float32;
/// otherwise the inputs come back unchanged.
pub fn try_adamw<B: Backend>(
    inputs: AdamWInputs<B>,
    s: &AdamWScalars,
) -> Result<(Tensor<B, 1>, Moments<B>), AdamWInputs<B>> {
    #[cfg(feature = "cuda")]
    let inputs = match adamw_on::<B, CudaCube>(inputs, s) {
        Ok(out) => return Ok(out),
        Err(inputs) => inputs,
    };
    #[cfg(feature = "wgpu")]
    let inputs = match adamw_on::<B, WgpuCube>(inputs, s) {
        Ok(out) => return Ok(out),
        Err(inputs) => inputs,
    };
    Err(inputs)
}

/// The sum of the squares of every value of `tensors`, `[1]` float32, fused when `B` is a
/// compiled CubeCL backend and the tensors are float32; otherwise the tensors come back.
pub fn try_sum_squares<B: Backend>(
    tensors: Vec<Tensor<B, 1>>,
) -> Result<Tensor<B, 1>, Vec<Tensor<B, 1>>> {
    #[cfg(feature = "cuda")]
    let tensors = match sum_squares_on::<B, CudaCube>(tensors) {
        Ok(out) => return Ok(out),
        Err(tensors) => tensors,
    };
    #[cfg(feature = "wgpu")]
    let tensors = match sum_squares_on::<B, WgpuCube>(tensors) {
        Ok(out) => return Ok(out),
        Err(tensors) => tensors,
    };
    Err(tensors)
}

/// One fused EMA step when `B` is a compiled CubeCL backend and the tensors are float32;
/// otherwise the inputs come back unchanged.
pub fn try_ema<B: Backend>(
    shadow: Tensor<B, 1>,
    param: Tensor<B, 1>,
    decay: f64,
) -> Result<Tensor<B, 1>, (Tensor<B, 1>, Tensor<B, 1>)> {
    #[cfg(feature = "cuda")]
    let (shadow, param) = match ema_on::<B, CudaCube>(shadow, param, decay) {
        Ok(out) => return Ok(out),
        Err(inputs) => inputs,
    };
    #[cfg(feature = "wgpu")]
    let (shadow, param) = match ema_on::<B, WgpuCube>(shadow, param, decay) {
        Ok(out) => return Ok(out),
        Err(inputs) => inputs,
    };
    Err((shadow, param))
}

#[cfg(test)]
mod tests;
