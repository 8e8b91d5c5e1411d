//! Fused optimizer updates on Burn's CubeCL backends (`cuda`, `wgpu`): the AdamW step
//! (gradient scaling for clipping, both moments, decoupled weight decay and the update), the
//! EMA step, and the squared norm that clipping and logging take ([`kernels`]), each one
//! kernel launch per group of up to [`MAX_GROUP`] parameter tensors, where the tensor
//! operations of [`crate::optim::adamw_updates`] launch about fifteen element-wise kernels per
//! tensor and stream the parameter's buffers through memory as often. A Wan2.1-1.3B role has
//! 825 parameter tensors: its AdamW step is 52 launches, not 825 (or about 12,000 unfused).
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

use super::{AdamWInputs, AdamWOutput, AdamWScalars, EmaPair, Moments};
use crate::backend::downcast_tensor;

/// Units per cube of the update kernels.
const UNITS: u32 = 256;
/// Most cubes one launch uses; each unit strides over the rest of the buffer.
pub const MAX_CUBES: u32 = 65_535;
/// Most parameter tensors one launch takes, fewer where the runtime allows fewer buffers per
/// kernel (its `max_bindings`; lavapipe's 31 give AdamW groups of 4). Each group size
/// compiles its own kernel: a role's groups are all this size but the last. CubeCL's CUDA
/// runtime passes each buffer as a kernel parameter, a pointer and 20 bytes of lengths and
/// layout offsets: an AdamW launch of 16 parameters (112 buffers) takes about 3.2 KB, within
/// the 4 KiB of kernel parameters that CUDA allowed before 12.1.
pub const MAX_GROUP: usize = 16;

/// One parameter's AdamW inputs as a fused backend's tensors `T`: `(param, grad, moments)`,
/// flat float32; `moments` (`exp_avg`, `exp_avg_sq`) is `None` on the first step.
pub type AdamWTensors<T> = (T, T, Option<(T, T)>);

/// A backend the fused update kernels run on.
pub trait FusedOptim: Backend {
    /// One AdamW step of each parameter of `items`: `(param, exp_avg, exp_avg_sq)` each, in
    /// the order of `items`.
    fn fused_adamw(
        items: Vec<AdamWTensors<FloatTensor<Self>>>,
        s: &AdamWScalars,
    ) -> Vec<(FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>)>;

    /// The sum of the squares of every value of `tensors` (flat, float32, at least one),
    /// `[1]` float32: one kernel per group of tensors writing partial sums into one buffer,
    /// and one sum of that buffer.
    fn fused_sum_squares(tensors: Vec<FloatTensor<Self>>) -> FloatTensor<Self>;

    /// One EMA step of each flat float32 `(shadow, param)` of `pairs`:
    /// `shadow·decay + param·(1 − decay)`, in the order of `pairs`.
    fn fused_ema(
        pairs: Vec<(FloatTensor<Self>, FloatTensor<Self>)>,
        decay: f64,
    ) -> Vec<FloatTensor<Self>>;
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

/// Most partial sums (cubes) of one group's sum of squares.
const NORM_CUBES: usize = 1024;

/// How many tensors one launch takes when each brings `buffers` buffers: [`MAX_GROUP`] at
/// most, within the runtime's bindings per kernel (less two: CubeCL's metadata and a shared
/// output), at least one.
fn group_size<R: CubeRuntime>(client: &ComputeClient<R>, buffers: usize) -> usize {
    let bindings = client.properties().hardware.max_bindings as usize;
    (bindings.saturating_sub(2) / buffers).clamp(1, MAX_GROUP)
}

/// Cube count and dimension covering `len` elements with grid-stride units.
fn grid(len: usize) -> (CubeCount, CubeDim) {
    let cubes = len.div_ceil(UNITS as usize).clamp(1, MAX_CUBES as usize) as u32;
    (CubeCount::Static(cubes, 1, 1), CubeDim::new_1d(UNITS))
}

/// `items` in order, in groups of `size` (the last one may be shorter).
fn groups<T>(items: Vec<T>, size: usize) -> Vec<Vec<T>> {
    let mut items = items.into_iter().peekable();
    let mut out = Vec::new();
    while items.peek().is_some() {
        out.push(items.by_ref().take(size).collect());
    }
    out
}

/// The longest of `tensors`, in values.
fn longest<R: CubeRuntime>(tensors: &[CubeTensor<R>]) -> usize {
    tensors
        .iter()
        .map(|t| t.meta.num_elements())
        .max()
        .unwrap_or(0)
}

/// `tensors` as one launch argument.
fn sequence<R: CubeRuntime>(
    tensors: &[CubeTensor<R>],
) -> SequenceArg<R, cubecl::prelude::Tensor<f32>> {
    tensors
        .iter()
        .map(|t| t.clone().into_tensor_arg())
        .collect()
}

/// Panics unless every tensor of one parameter's update has its `len` values.
fn check_lens<R: CubeRuntime>(what: &str, len: usize, others: &[&CubeTensor<R>]) {
    let lens: Vec<usize> = others.iter().map(|t| t.meta.num_elements()).collect();
    if lens.iter().any(|&l| l != len) {
        panic!("fused {what}: a parameter of {len} values with other operands of {lens:?}");
    }
}

/// One launch of [`kernels::adamw_steps`] over a group: the parameters, gradients and
/// moments in, the new parameters and moments out.
fn adamw_group<R: CubeRuntime>(
    group: Vec<AdamWTensors<CubeTensor<R>>>,
    s: &AdamWScalars,
) -> Vec<(CubeTensor<R>, CubeTensor<R>, CubeTensor<R>)> {
    let first = group.iter().all(|(_, _, m)| m.is_none());
    let (mut ins, mut outs) = ([vec![], vec![], vec![], vec![]], [vec![], vec![], vec![]]);
    for (param, grad, moments) in group {
        let len = param.meta.num_elements();
        let (param, grad) = (contiguous(param), contiguous(grad));
        let (m, v) = match moments {
            Some((m, v)) => (contiguous(m), contiguous(v)),
            // Not read on the first step.
            None => (grad.clone(), grad.clone()),
        };
        check_lens("AdamW", len, &[&grad, &m, &v]);
        for out in &mut outs {
            out.push(empty_like(&param));
        }
        for (list, t) in ins.iter_mut().zip([param, grad, m, v]) {
            list.push(t);
        }
    }
    let client = ins[0][0].client.clone();
    let (count, dim) = grid(longest(&ins[0]));
    let args = kernels::AdamWArgsLaunch::new(
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
    kernels::adamw_steps::launch::<R>(
        &client,
        count,
        dim,
        sequence(&ins[0]),
        sequence(&ins[1]),
        sequence(&ins[2]),
        sequence(&ins[3]),
        sequence(&outs[0]),
        sequence(&outs[1]),
        sequence(&outs[2]),
        args,
    );
    let [p, m, v] = outs;
    p.into_iter()
        .zip(m)
        .zip(v)
        .map(|((p, m), v)| (p, m, v))
        .collect()
}

impl<R, F, I, BT> FusedOptim for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn fused_adamw(
        items: Vec<AdamWTensors<FloatTensor<Self>>>,
        s: &AdamWScalars,
    ) -> Vec<(CubeTensor<R>, CubeTensor<R>, CubeTensor<R>)> {
        let Some((param, _, _)) = items.first() else {
            return vec![];
        };
        // Seven buffers a parameter: four in, three out.
        let size = group_size(&param.client, 7);
        // The first step (no moments) and the later ones launch apart: `first` is one value
        // per launch.
        let (firsts, laters): (Vec<_>, Vec<_>) = items
            .into_iter()
            .enumerate()
            .partition(|(_, it)| it.2.is_none());
        let mut out: Vec<_> = std::iter::repeat_with(|| None)
            .take(firsts.len() + laters.len())
            .collect();
        for group in groups(firsts, size).into_iter().chain(groups(laters, size)) {
            let (index, group): (Vec<usize>, Vec<_>) = group.into_iter().unzip();
            for (i, updated) in index.into_iter().zip(adamw_group(group, s)) {
                out[i] = Some(updated);
            }
        }
        out.into_iter()
            .map(|o| o.unwrap_or_else(|| unreachable!("every parameter is in one group")))
            .collect()
    }

    fn fused_sum_squares(tensors: Vec<CubeTensor<R>>) -> CubeTensor<R> {
        let Some(first) = tensors.first() else {
            panic!("fused sum of squares: no tensors");
        };
        let (client, device) = (first.client.clone(), first.device.clone());
        let tensors = tensors.into_iter().map(contiguous).collect();
        let groups = groups(tensors, group_size(&client, 1));
        let cubes: Vec<usize> = groups
            .iter()
            .map(|g| longest(g).div_ceil(UNITS as usize).clamp(1, NORM_CUBES))
            .collect();
        let total = cubes.iter().sum::<usize>();
        let partial = empty_device_dtype(client.clone(), device, [total].into(), DType::F32);
        let mut offset = 0;
        for (group, n) in groups.iter().zip(cubes) {
            kernels::sum_squares::launch::<R>(
                &client,
                CubeCount::Static(n as u32, 1, 1),
                CubeDim::new_1d(UNITS),
                sequence(group),
                partial.clone().into_tensor_arg(),
                offset,
                UNITS as usize,
            );
            offset += n;
        }
        float(tensor::<Self>(partial).sum())
    }

    fn fused_ema(pairs: Vec<(CubeTensor<R>, CubeTensor<R>)>, decay: f64) -> Vec<CubeTensor<R>> {
        let Some((shadow, _)) = pairs.first() else {
            return vec![];
        };
        let client = shadow.client.clone();
        // Three buffers a parameter: shadow and parameter in, the new shadow out.
        let size = group_size(&client, 3);
        let mut out = Vec::with_capacity(pairs.len());
        for group in groups(pairs, size) {
            let (shadows, params): (Vec<_>, Vec<_>) = group
                .into_iter()
                .map(|(e, p)| {
                    check_lens("EMA", e.meta.num_elements(), &[&p]);
                    (contiguous(e), contiguous(p))
                })
                .unzip();
            let news: Vec<_> = shadows.iter().map(empty_like).collect();
            let (count, dim) = grid(longest(&shadows));
            kernels::ema_steps::launch::<R>(
                &client,
                count,
                dim,
                sequence(&shadows),
                sequence(&params),
                sequence(&news),
                decay as f32,
                (1.0 - decay) as f32,
            );
            out.extend(news);
        }
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

/// Whether `B` is `K` and every tensor of `tensors` is float32.
fn fused_on<'a, B: Backend, K: FusedOptim>(
    mut tensors: impl Iterator<Item = &'a Tensor<B, 1>>,
) -> bool {
    let Some(first) = tensors.next() else {
        return false;
    };
    let f32_only = first.dtype() == DType::F32 && tensors.all(|t| t.dtype() == DType::F32);
    f32_only && downcast_tensor::<B, K, 1>(first.clone()).is_ok()
}

/// The fused AdamW steps when `B` is `K` and every tensor is float32.
fn adamw_on<B: Backend, K: FusedOptim>(
    items: Vec<AdamWInputs<B>>,
    s: &AdamWScalars,
) -> Result<Vec<AdamWOutput<B>>, Vec<AdamWInputs<B>>> {
    let all = items.iter().flat_map(|(p, g, m)| {
        [p, g]
            .into_iter()
            .chain(m.iter().flat_map(|m| [&m.exp_avg, &m.exp_avg_sq]))
    });
    if !fused_on::<B, K>(all) {
        return Err(items);
    }
    let inputs = items
        .into_iter()
        .map(|(p, g, m)| {
            let m = m.map(|m| {
                let (m, v) = (same::<B, K>(m.exp_avg), same::<B, K>(m.exp_avg_sq));
                (float(m), float(v))
            });
            (float(same::<B, K>(p)), float(same::<B, K>(g)), m)
        })
        .collect();
    Ok(K::fused_adamw(inputs, s)
        .into_iter()
        .map(|(p, m, v)| {
            let moments = Moments {
                exp_avg: same(tensor::<K>(m)),
                exp_avg_sq: same(tensor::<K>(v)),
            };
            (same(tensor::<K>(p)), moments)
        })
        .collect())
}

/// The fused EMA steps when `B` is `K` and every tensor is float32.
fn ema_on<B: Backend, K: FusedOptim>(
    pairs: Vec<EmaPair<B>>,
    decay: f64,
) -> Result<Vec<Tensor<B, 1>>, Vec<EmaPair<B>>> {
    if !fused_on::<B, K>(pairs.iter().flat_map(|(e, p)| [e, p])) {
        return Err(pairs);
    }
    let inputs = pairs
        .into_iter()
        .map(|(e, p)| (float(same::<B, K>(e)), float(same::<B, K>(p))))
        .collect();
    Ok(K::fused_ema(inputs, decay)
        .into_iter()
        .map(|e| same(tensor::<K>(e)))
        .collect())
}

/// The fused sum of squares when `B` is `K` and every tensor is float32.
fn sum_squares_on<B: Backend, K: FusedOptim>(
    tensors: Vec<Tensor<B, 1>>,
) -> Result<Tensor<B, 1>, Vec<Tensor<B, 1>>> {
    if !fused_on::<B, K>(tensors.iter()) {
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

/// The AdamW steps of `items` fused when `B` is a compiled CubeCL backend and the tensors are
/// float32 (one launch per group of parameters); otherwise the inputs come back unchanged.
pub fn try_adamw<B: Backend>(
    items: Vec<AdamWInputs<B>>,
    s: &AdamWScalars,
) -> Result<Vec<AdamWOutput<B>>, Vec<AdamWInputs<B>>> {
    #[cfg(feature = "cuda")]
    let items = match adamw_on::<B, CudaCube>(items, s) {
        Ok(out) => return Ok(out),
        Err(items) => items,
    };
    #[cfg(feature = "wgpu")]
    let items = match adamw_on::<B, WgpuCube>(items, s) {
        Ok(out) => return Ok(out),
        Err(items) => items,
    };
    Err(items)
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

/// The EMA steps of `(shadow, param)` pairs fused when `B` is a compiled CubeCL backend and
/// the tensors are float32 (one launch per group); otherwise the pairs come back unchanged.
pub fn try_ema<B: Backend>(
    pairs: Vec<EmaPair<B>>,
    decay: f64,
) -> Result<Vec<Tensor<B, 1>>, Vec<EmaPair<B>>> {
    #[cfg(feature = "cuda")]
    let pairs = match ema_on::<B, CudaCube>(pairs, decay) {
        Ok(out) => return Ok(out),
        Err(pairs) => pairs,
    };
    #[cfg(feature = "wgpu")]
    let pairs = match ema_on::<B, WgpuCube>(pairs, decay) {
        Ok(out) => return Ok(out),
        Err(pairs) => pairs,
    };
    Err(pairs)
}

#[cfg(test)]
mod tests;
