//! Tensor-core flash attention forward for forwards without gradients (`attention = "flash"`):
//! Burn 0.21's `cubek-attention` kernel with cooperative-matrix (tensor-core) products,
//! reached through [`burn_cubecl::kernel::attention`].
//!
//! Its tiles hold `q`, `k`, `v` and the probabilities in float16, with float32 softmax
//! statistics and accumulators, and it returns no log-sum-exp, so it serves only forwards
//! whose output is not differentiated: a frozen teacher, DMD2's rollouts and critic scoring,
//! sampling and validation. It runs where Reel's tiled tensor-core kernels of
//! [`super::tiled`] cannot (they need bf16/f16 inputs; they run training forwards, the
//! backward, and the untracked bf16/f16 forwards too, so that a checkpointed run's first pass
//! matches its recomputation). cubek's routine needs query lengths that are multiples of its
//! stage, so the queries are zero-padded to one ([`STAGE_ROWS`]). When the device has no
//! matching tensor-core instruction, the caller falls back to the fused forward kernel; the
//! reason is printed once.

use std::sync::Once;

use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_cubecl::kernel::attention::{attention, AttentionStrategy};
use burn_cubecl::kernel::slice;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime};
use cubek::attention::definition::AttentionSetupError;
use cubek::attention::routines::blackbox_accelerated::BlackboxAcceleratedStrategy;
use reel_core::optim::fused::contiguous;

/// Planes (warps) per cube: query tiles computed side by side.
const PLANES: u8 = 4;

/// Which cubek routine runs the flash forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlashRoutine {
    /// Tensor-core (cooperative-matrix) tile products: what `attention = "flash"` runs.
    Accelerated,
    /// Tile products on plain units (no tensor cores): the same kernel structure on devices
    /// without cooperative matrices (the tests run it on a software Vulkan driver).
    Unit,
}

/// Query rows the tensor-core routine's stage covers at most: its four planes of tiles up
/// to 32 rows. cubek only runs query lengths that are multiples of its stage (64 rows with
/// 16×16 tiles), so the accelerated routine pads the queries to a multiple of this.
pub const STAGE_ROWS: usize = PLANES as usize * 32;

/// `softmax(q·kᵀ/√d)·v` for `q [B, H, Sq, D]`, `k [B, H, Sk, D]`, `v [B, H, Sk, Dv]` with the
/// cubek flash kernel: `o [B, H, Sq, Dv]`, or why the routine cannot run this problem here.
/// The accelerated routine runs on queries zero-padded to a multiple of [`STAGE_ROWS`] (the
/// padded rows' outputs are dropped: every query row is computed on its own).
pub fn flash_forward<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    routine: FlashRoutine,
) -> Result<CubeTensor<R>, AttentionSetupError> {
    let rows = match routine {
        FlashRoutine::Accelerated => STAGE_ROWS,
        FlashRoutine::Unit => 1,
    };
    flash_forward_padded(q, k, v, routine, rows)
}

/// [`flash_forward`] with the queries zero-padded to a multiple of `rows` (the tests pad the
/// unit routine too, which needs no padding, to check the padding on any device).
pub fn flash_forward_padded<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    routine: FlashRoutine,
    rows: usize,
) -> Result<CubeTensor<R>, AttentionSetupError> {
    let strategy = match routine {
        FlashRoutine::Accelerated => {
            AttentionStrategy::FlashBlackboxAccelerated(BlackboxAcceleratedStrategy {
                num_planes: PLANES,
                seq_q: 1,
                seq_kv: 1,
            })
        }
        FlashRoutine::Unit => AttentionStrategy::FlashUnit,
    };
    // The kernel reads its inputs as contiguous `[B, H, S, D]` buffers whatever their
    // strides (measured: the strided views the Wan blocks pass came back wrong), so views are
    // copied first (the padding copies the queries anyway). Default options: scale 1/√D, no
    // softcap, not causal.
    let [b, h, sq, _] = q.meta.shape().dims();
    let (q, k, v) = (pad_rows(q, rows), contiguous(k), contiguous(v));
    let options = AttentionModuleOptions::default();
    let o = attention(q, k, v, None, None, options, strategy)?;
    let dv = o.meta.shape()[3];
    Ok(if o.meta.shape()[2] == sq {
        o
    } else {
        slice(o, &[0..b, 0..h, 0..sq, 0..dv])
    })
}

/// `q [B, H, S, D]` as a contiguous `[B, H, S', D]` with `S'` the next multiple of `rows`,
/// the added rows zero.
fn pad_rows<R: CubeRuntime>(q: CubeTensor<R>, rows: usize) -> CubeTensor<R> {
    let [b, h, s, d] = q.meta.shape().dims();
    let pad = s.next_multiple_of(rows.max(1)) - s;
    if pad == 0 {
        return contiguous(q);
    }
    // Any element types do: the tensors keep their own dtype.
    type K<R> = CubeBackend<R, f32, i32, u32>;
    let dtype = q.dtype;
    let q = Tensor::<K<R>, 4>::from_primitive(TensorPrimitive::Float(q));
    let zeros = Tensor::<K<R>, 4>::zeros([b, h, pad, d], (&q.device(), dtype));
    Tensor::cat(vec![q, zeros], 2).into_primitive().tensor()
}
/// The tensor-core flash forward, or `None` (with a one-time note on stderr, after `tiled`:
/// why the tiled tensor-core forward did not run either) when it cannot run this problem on
/// this device.
pub fn try_accelerated<R: CubeRuntime>(
    q: &CubeTensor<R>,
    k: &CubeTensor<R>,
    v: &CubeTensor<R>,
    tiled: &dyn std::fmt::Display,
) -> Option<CubeTensor<R>> {
    static NOTE: Once = Once::new();
    match flash_forward(q.clone(), k.clone(), v.clone(), FlashRoutine::Accelerated) {
        Ok(o) => Some(o),
        Err(e) => {
            NOTE.call_once(|| {
                let why = reason(&e);
                eprintln!(
                    "reel: attention = \"flash\": neither tensor-core forward can run q {:?} on \
                     this device (tiled kernels: {tiled}; cubek's flash kernel: {why}); using \
                     the fused kernels",
                    q.meta.shape().dims::<4>()
                )
            });
            None
        }
    }
}

/// cubek's reason for not running a problem, on one line.
fn reason(e: &AttentionSetupError) -> String {
    format!("{e:?}")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// cubek's tensor-core flash forward on Burn tensors of a compiled plain CubeCL backend
/// (`Cuda`, `Wgpu`, without Burn's fusion layer or autodiff), for benchmarks beside the
/// kernels the model picks: `o [B, H, Sq, Dv]`, or why it does not run (another backend, or
/// cubek's own reason).
pub fn cubek_forward<B: burn::tensor::backend::Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
) -> Result<Tensor<B, 4>, String> {
    #[cfg(feature = "cuda")]
    let (q, k, v) = match cubek_on::<B, cubecl::cuda::CudaRuntime, u8>(q, k, v) {
        Ok(o) => return o,
        Err(qkv) => qkv,
    };
    #[cfg(feature = "wgpu")]
    let (q, k, v) = match cubek_on::<B, cubecl::wgpu::WgpuRuntime, u32>(q, k, v) {
        Ok(o) => return o,
        Err(qkv) => qkv,
    };
    let _ = (q, k, v);
    Err(format!(
        "cubek's flash kernel runs on the plain CubeCL backends, not {}",
        std::any::type_name::<B>()
    ))
}

/// [`cubek_forward`] when `B` is `CubeBackend<R, f32, i32, BT>`; the inputs back otherwise.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
#[allow(clippy::type_complexity)]
fn cubek_on<B, R, BT>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
) -> Result<Result<Tensor<B, 4>, String>, super::Qkv<B>>
where
    B: burn::tensor::backend::Backend,
    R: CubeRuntime,
    BT: burn_cubecl::element::BoolElement,
{
    use reel_core::backend::downcast_tensor;
    type K<R, BT> = CubeBackend<R, f32, i32, BT>;
    let q = match downcast_tensor::<B, K<R, BT>, 4>(q) {
        Ok(q) => q,
        Err(q) => return Err((q, k, v)),
    };
    let same = |t: Tensor<B, 4>| {
        downcast_tensor::<B, K<R, BT>, 4>(t)
            .unwrap_or_else(|_| unreachable!("q, k, v share one backend type"))
            .into_primitive()
            .tensor()
    };
    let (q, k, v) = (q.into_primitive().tensor(), same(k), same(v));
    Ok(flash_forward(q, k, v, FlashRoutine::Accelerated)
        .map(|o| {
            let o = Tensor::<K<R, BT>, 4>::from_primitive(TensorPrimitive::Float(o));
            downcast_tensor::<K<R, BT>, B, 4>(o).unwrap_or_else(|_| unreachable!("K is B"))
        })
        .map_err(|e| reason(&e)))
}
