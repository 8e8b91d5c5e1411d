//! Reel's fused CubeCL kernels for the rest of a Wan block (attention has its own,
//! [`super::fused_attention`]): the norms forward and backward and the column sums of a
//! bias's gradient ([`norms`]), and the tanh GELU and its gradient ([`gelu`]).
//!
//! Every entry point runs its kernels where the backend is a plain CubeCL one (`Cuda`, `Wgpu`
//! without Burn's fusion layer, with or without autodiff underneath: the entry points take
//! the inner backend's tensors) and the same computation in Burn tensor operations elsewhere
//! (the CPU backends; Burn's fusion layer, which fuses those operations itself). All
//! arithmetic is float32 whatever the tensors' dtype.
//!
//! `REEL_BLOCK_KERNELS=off` turns the kernels off for the process, for side-by-side
//! measurements (`bench/gpu.sh`).

/// `return $call` with the type aliases `$r` (the CubeCL runtime) and `$bt` (the bool
/// element) of the plain CubeCL backend `$b` is, when it is one and the kernels are on.
macro_rules! on_cube {
    ($b:ty, |$r:ident, $bt:ident| $call:expr) => {
        #[cfg(feature = "cuda")]
        if $crate::wan::block_kernels::kernels_on()
            && $crate::wan::block_kernels::cube::is::<$b, cubecl::cuda::CudaRuntime, u8>()
        {
            type $r = cubecl::cuda::CudaRuntime;
            type $bt = u8;
            return $call;
        }
        #[cfg(feature = "wgpu")]
        if $crate::wan::block_kernels::kernels_on()
            && $crate::wan::block_kernels::cube::is::<$b, cubecl::wgpu::WgpuRuntime, u32>()
        {
            type $r = cubecl::wgpu::WgpuRuntime;
            type $bt = u32;
            return $call;
        }
    };
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod cube;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod device;
pub(crate) mod gelu;
pub(crate) mod norms;
#[cfg(all(test, any(feature = "cuda", feature = "wgpu")))]
mod tests;

/// The environment variable that turns the kernels off (`off` or `0`).
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub(crate) const BLOCK_KERNELS_ENV: &str = "REEL_BLOCK_KERNELS";

/// Whether the kernels may run ([`BLOCK_KERNELS_ENV`], read once).
#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn kernels_on() -> bool {
    use std::sync::OnceLock;
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| !matches!(std::env::var(BLOCK_KERNELS_ENV).as_deref(), Ok("off" | "0")))
}
