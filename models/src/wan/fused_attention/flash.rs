//! Tensor-core flash attention forward for forwards without gradients (`attention = "flash"`):
//! Burn 0.21's `cubek-attention` kernel with cooperative-matrix (tensor-core) products,
//! reached through [`burn_cubecl::kernel::attention`].
//!
//! Its tiles hold `q`, `k`, `v` and the probabilities in float16, with float32 softmax
//! statistics and accumulators, and it returns no log-sum-exp, so it serves only forwards
//! whose output is not differentiated: a frozen teacher, DMD2's rollouts and critic scoring,
//! sampling and validation. Training forwards and the backward run the tiled tensor-core
//! kernels of [`super::tiled`] (bf16/f16 attention) or the fused ones. When
//! the device has no matching tensor-core instruction (or the shape does not tile), the
//! caller falls back to the fused forward kernel; the reason is printed once.

use std::sync::Once;

use burn::tensor::ops::AttentionModuleOptions;
use burn_cubecl::kernel::attention::{attention, AttentionStrategy};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
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

/// `softmax(q·kᵀ/√d)·v` for `q [B, H, Sq, D]`, `k [B, H, Sk, D]`, `v [B, H, Sk, Dv]` with the
/// cubek flash kernel: `o [B, H, Sq, Dv]`, or why the routine cannot run this problem here.
pub fn flash_forward<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    routine: FlashRoutine,
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
    // copied first. Default options: scale 1/√D, no softcap, not causal.
    let (q, k, v) = (contiguous(q), contiguous(k), contiguous(v));
    let options = AttentionModuleOptions::default();
    attention(q, k, v, None, None, options, strategy)
}

/// The tensor-core flash forward, or `None` (with a one-time note on stderr) when it cannot
/// run this problem on this device.
pub fn try_accelerated<R: CubeRuntime>(
    q: &CubeTensor<R>,
    k: &CubeTensor<R>,
    v: &CubeTensor<R>,
) -> Option<CubeTensor<R>> {
    static NOTE: Once = Once::new();
    match flash_forward(q.clone(), k.clone(), v.clone(), FlashRoutine::Accelerated) {
        Ok(o) => Some(o),
        Err(e) => {
            NOTE.call_once(|| {
                let why = format!("{e:?}");
                let why = why.split_whitespace().collect::<Vec<_>>().join(" ");
                eprintln!(
                    "reel: attention = \"flash\": the tensor-core kernel cannot run q {:?} on \
                     this device ({why}); using the fused kernels",
                    q.meta.shape().dims::<4>()
                )
            });
            None
        }
    }
}
