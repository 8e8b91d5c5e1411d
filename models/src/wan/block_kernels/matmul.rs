//! Matrix products on a cubek kernel that Reel chooses, instead of the one Burn picks.
//!
//! Without Burn's `autotune` feature every matmul of the CUDA backend runs cubek's simple
//! single-buffered kernel (`Strategy::Auto`); the H100 profile of 2026-11-27 put 36 % of a
//! training step there at about 40 TFLOP/s. cubek ships faster kernels (double-buffered,
//! specialized, TMA loaders; `cmma` or manual `mma` tile products) that only `autotune` reaches,
//! by timing every candidate once per shape, at run time, with a choice that can differ from
//! run to run. Here a kernel is pinned by name:
//! - `REEL_MATMUL=<name>` ([`MATMUL_ENV`]) makes the products of the DiT's linear layers
//!   (forward and both gradients, the FFN's fused GELU product included; a LoRA adapter's
//!   small up projection stays on Burn's) run on that kernel on the plain CubeCL backends
//!   (`cuda`, `wgpu` without `fusion`); `burn` keeps Burn's own matmul, and unset,
//!   [`default_pin`] decides (cuBLAS on CubeCL's stream, `cublas-stream`, on `cuda`; Burn's
//!   matmul elsewhere);
//!   `REEL_MATMUL=forward=<name>,input-grad=<name>,weight-grad=<name>` pins one kernel per
//!   product layout ([`MatmulPin`]);
//! - `reel bench --matmul-only` times every kernel on the products of a preset's blocks, so
//!   that one GPU call says which name to pin.
//!
//! Besides cubek's kernels, `cublas`, `cublas-async`, `cublas-stream` and `cublas-queued` run
//! the products on NVIDIA's cuBLAS, on the `cuda` backend (`block_kernels/cublas.rs`); they
//! differ in how cuBLAS's work is ordered with CubeCL's.
//!
//! A product that the pinned kernel cannot run (a kernel without hardware support, a shape it
//! rejects) runs on Burn's matmul, with one line on stderr the first time.

use std::fmt;

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

pub use super::matmul_pin::{default_pin, pin, Layout, MatmulPin, PinError, LAYOUTS};

/// The environment variable that pins the kernel of the linear layers' products.
pub const MATMUL_ENV: &str = "REEL_MATMUL";

/// A cubek matmul kernel, as autotuning's candidates define it (`burn-cubecl`'s matmul tune
/// set): the routine, its loader and its tile product (`cmma` cooperative matrices or manual
/// `mma` instructions; `unit` kernels use neither and run on any CubeCL device).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatmulKernel {
    /// One unit per output tile, largest tiles (`SimpleUnit`).
    SimpleUnit,
    /// The same, double-buffered (`DoubleUnit`).
    DoubleUnit,
    /// Single-buffered plane kernel with cyclic loading (`SimpleCyclicCmma`: Burn's default).
    SimpleCmma,
    /// The same on manual `mma` (`SimpleCyclicMma`).
    SimpleMma,
    /// [`Self::SimpleCmma`] with several rows per plane.
    SimpleMultiRowCmma,
    /// [`Self::SimpleMma`] with several rows per plane.
    SimpleMultiRowMma,
    /// Ordered double buffering, 4 rows (`OrderedDoubleCmma`).
    OrderedCmma,
    /// Ordered double buffering, 4 rows (`OrderedDoubleMma`).
    OrderedMma,
    /// Ordered double buffering, 8 rows.
    Ordered8Cmma,
    /// Ordered double buffering, 8 rows.
    Ordered8Mma,
    /// Double buffering with cyclic loading (`DoubleCyclicCmma`).
    DoubleCmma,
    /// Double buffering with cyclic loading (`DoubleCyclicMma`).
    DoubleMma,
    /// Double buffering with loader and compute planes specialized.
    DoubleSpecializedCmma,
    /// Double buffering with loader and compute planes specialized.
    DoubleSpecializedMma,
    /// The specialized routine (`SpecializedCyclicCmma`).
    SpecializedCmma,
    /// The specialized routine (`SpecializedCyclicMma`).
    SpecializedMma,
    /// Single-buffered, tiles loaded by the tensor memory accelerator (Hopper and later).
    TmaCmma,
    /// Single-buffered, TMA loads, manual `mma`.
    TmaMma,
    /// The specialized routine with TMA loads.
    SpecializedTmaCmma,
    /// The specialized routine with TMA loads, manual `mma`.
    SpecializedTmaMma,
    /// NVIDIA's cuBLAS (`cublasGemmEx`, float32 accumulation), not a cubek kernel: CUDA only,
    /// with `libcublas` on the loader's path; ordered with CubeCL's streams by host syncs.
    Cublas,
    /// cuBLAS ordered with CubeCL's streams on the device, through flags in memory, with no
    /// host sync (`block_kernels/cublas_order.rs`).
    CublasAsync,
    /// cuBLAS on CubeCL's own stream, found through CUPTI (`block_kernels/cublas_stream.rs`):
    /// no ordering needed; host syncs where the stream is not found.
    CublasStream,
    /// `CublasStream` run from CubeCL's server thread, queued there after the kernels before
    /// it (`block_kernels/cublas_queued.rs`): the caller does not wait for the buffers'
    /// addresses.
    CublasQueued,
}

/// Every kernel with its name, in the order `reel bench --matmul-only` times them.
pub const MATMUL_KERNELS: [(MatmulKernel, &str); 24] = [
    (MatmulKernel::SimpleUnit, "simple-unit"),
    (MatmulKernel::DoubleUnit, "double-unit"),
    (MatmulKernel::SimpleCmma, "simple-cmma"),
    (MatmulKernel::SimpleMma, "simple-mma"),
    (MatmulKernel::SimpleMultiRowCmma, "simple-multirow-cmma"),
    (MatmulKernel::SimpleMultiRowMma, "simple-multirow-mma"),
    (MatmulKernel::OrderedCmma, "ordered-cmma"),
    (MatmulKernel::OrderedMma, "ordered-mma"),
    (MatmulKernel::Ordered8Cmma, "ordered8-cmma"),
    (MatmulKernel::Ordered8Mma, "ordered8-mma"),
    (MatmulKernel::DoubleCmma, "double-cmma"),
    (MatmulKernel::DoubleMma, "double-mma"),
    (
        MatmulKernel::DoubleSpecializedCmma,
        "double-specialized-cmma",
    ),
    (MatmulKernel::DoubleSpecializedMma, "double-specialized-mma"),
    (MatmulKernel::SpecializedCmma, "specialized-cmma"),
    (MatmulKernel::SpecializedMma, "specialized-mma"),
    (MatmulKernel::TmaCmma, "tma-cmma"),
    (MatmulKernel::TmaMma, "tma-mma"),
    (MatmulKernel::SpecializedTmaCmma, "specialized-tma-cmma"),
    (MatmulKernel::SpecializedTmaMma, "specialized-tma-mma"),
    (MatmulKernel::Cublas, "cublas"),
    (MatmulKernel::CublasAsync, "cublas-async"),
    (MatmulKernel::CublasStream, "cublas-stream"),
    (MatmulKernel::CublasQueued, "cublas-queued"),
];

/// The name that stands for Burn's own matmul.
pub const BURN_MATMUL: &str = "burn";

impl MatmulKernel {
    /// The kernel's name (`REEL_MATMUL`, `reel bench --matmul-only`).
    pub fn name(self) -> &'static str {
        MATMUL_KERNELS
            .iter()
            .find(|(k, _)| *k == self)
            .map(|(_, n)| *n)
            .unwrap_or_else(|| panic!("{self:?} is missing from MATMUL_KERNELS"))
    }

    /// The kernel named `name`; `Ok(None)` for [`BURN_MATMUL`] (Burn's own matmul).
    pub fn parse(name: &str) -> Result<Option<Self>, UnknownKernel> {
        let name = name.trim();
        if name == BURN_MATMUL {
            return Ok(None);
        }
        MATMUL_KERNELS
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(k, _)| Some(*k))
            .ok_or_else(|| UnknownKernel(name.to_string()))
    }
}

impl fmt::Display for MatmulKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A kernel name that [`MatmulKernel::parse`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown matmul kernel `{0}`: expected {BURN_MATMUL} or one of {names}", names = kernel_names())]
pub struct UnknownKernel(pub String);

/// The kernels' names, comma-separated.
pub fn kernel_names() -> String {
    MATMUL_KERNELS
        .iter()
        .map(|(_, n)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why [`matmul_on`] did not run a product on its kernel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MatmulError {
    /// The backend is not a plain CubeCL one (or the build has neither `cuda` nor `wgpu`).
    #[error("cubek kernels need a plain CubeCL backend (cuda, or wgpu without fusion)")]
    NotCubeBackend,
    /// The operands' dtypes differ.
    #[error("operands of different dtypes ({0} and {1})")]
    MixedDtypes(String, String),
    /// cubek refused the problem (no hardware support, a shape or layout it does not take).
    #[error("{0}")]
    Refused(String),
}

/// `lhs · rhs` (`[m, k] · [k, n] -> [m, n]`, any strides, the dtype of `lhs`) on `kernel`.
pub fn matmul_on<B: Backend>(
    lhs: Tensor<B, 2>,
    rhs: Tensor<B, 2>,
    kernel: MatmulKernel,
) -> Result<Tensor<B, 2>, MatmulError> {
    let [m, k] = lhs.dims();
    let [k2, n] = rhs.dims();
    assert_eq!(k, k2, "matmul of [{m}, {k}] by [{k2}, {n}]");
    if lhs.dtype() != rhs.dtype() {
        let (a, b) = (lhs.dtype(), rhs.dtype());
        return Err(MatmulError::MixedDtypes(format!("{a:?}"), format!("{b:?}")));
    }
    on_cube_backend!(B, |R, BT| super::cube_matmul::matmul::<B, R, BT>(
        lhs, rhs, kernel
    ));
    let _ = (lhs, rhs, kernel);
    Err(MatmulError::NotCubeBackend)
}

/// `lhs · rhs` on `kernel` when one is given, on Burn's matmul otherwise (on ndarray without
/// its copies, [`reel_core::host::matmul`]).
///
/// The kernel is trusted only where it has proven right: the first product of each kind
/// (kernel, shape, which operands are transposed, dtype) also runs on Burn's matmul, and
/// the kernel's result is used, then and for every later product of that kind, only when it
/// is within [`CHECK_TOLERANCE`] of Burn's (relative to the largest magnitude). A kind that the
/// kernel refuses or gets wrong (or whose first reference holds a NaN) runs on Burn's matmul,
/// with one line on stderr. The check is against gross errors, one bar for every dtype;
/// `reel bench --matmul-only` applies it too. (cubek's
/// `double-unit` kernel gives wrong products for some shapes with a transposed right operand
/// on wgpu; `block_kernels::matmul_tests` shows it.)
pub fn matmul<B: Backend>(
    lhs: Tensor<B, 2>,
    rhs: Tensor<B, 2>,
    kernel: Option<MatmulKernel>,
) -> Tensor<B, 2> {
    let Some(kernel) = kernel else {
        return reel_core::host::matmul(lhs, rhs);
    };
    if lhs.dtype() != rhs.dtype() {
        let (a, b) = (lhs.dtype(), rhs.dtype());
        warn_once(
            kernel,
            MatmulError::MixedDtypes(format!("{a:?}"), format!("{b:?}")),
        );
        return lhs.matmul(rhs);
    }
    on_cube_backend!(B, |R, BT| super::cube_matmul::checked::<B, R, BT>(
        lhs, rhs, kernel
    ));
    warn_once(kernel, MatmulError::NotCubeBackend);
    lhs.matmul(rhs)
}

/// How far a kernel's product may be from Burn's, relative to the largest magnitude, for
/// [`matmul`] to use it: a few units in the last place of a bf16 result.
pub const CHECK_TOLERANCE: f32 = 2e-2;

/// One line on stderr the first time a pinned kernel cannot run here at all (the backend or
/// mixed dtypes; kinds it refuses on a CubeCL backend are reported by the check).
fn warn_once(kernel: MatmulKernel, why: MatmulError) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        eprintln!("reel: matmul kernel {kernel}: {why}; Burn's matmul runs these products");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    #[test]
    fn names_parse_back_to_their_kernels() {
        for (kernel, name) in MATMUL_KERNELS {
            assert_eq!(kernel.name(), name);
            assert_eq!(MatmulKernel::parse(name), Ok(Some(kernel)));
        }
        assert_eq!(MatmulKernel::parse(" burn "), Ok(None));
        let err = MatmulKernel::parse("fastest").unwrap_err().to_string();
        assert!(err.contains("`fastest`"), "{err}");
        assert!(err.contains("double-mma") && err.contains("burn"), "{err}");
    }

    #[test]
    fn without_a_cube_backend_burns_matmul_runs() {
        type B = burn::backend::NdArray;
        let dev = Default::default();
        let a = Tensor::<B, 2>::from_data(TensorData::new(vec![1f32, 2., 3., 4.], [2, 2]), &dev);
        let b = Tensor::<B, 2>::from_data(TensorData::new(vec![1f32, 0., 1., 1.], [2, 2]), &dev);
        assert_eq!(
            matmul_on(a.clone(), b.clone(), MatmulKernel::DoubleMma).unwrap_err(),
            MatmulError::NotCubeBackend
        );
        let got = matmul(a.clone(), b.clone(), Some(MatmulKernel::DoubleMma));
        let want = a.matmul(b);
        assert_eq!(got.into_data(), want.into_data());
    }
}
