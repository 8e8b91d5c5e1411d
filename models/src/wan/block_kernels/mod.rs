//! Reel's fused CubeCL kernels for the rest of a Wan block (attention has its own,
//! [`super::fused_attention`]): the norms forward and backward and the column sums of a
//! bias's gradient ([`norms`]), the tanh GELU and its gradient ([`gelu`]), the gated residual
//! and the rotary embedding ([`elementwise`]); and the linear
//! layers' products on a pinned cubek matmul kernel ([`matmul`], `REEL_MATMUL`).
//!
//! Every entry point runs its kernels where the backend is a plain CubeCL one (`Cuda`, `Wgpu`
//! without Burn's fusion layer, with or without autodiff underneath: the entry points take
//! the inner backend's tensors) and the same computation in Burn tensor operations elsewhere
//! (the CPU backends; Burn's fusion layer, which fuses those operations itself). All
//! arithmetic is float32 whatever the tensors' dtype.
//!
//! `REEL_BLOCK_KERNELS=off` turns the norm, bias, GELU, gate and RoPE kernels off for the process,
//! for side-by-side measurements (`bench/gpu.sh`); the matmul pin has its own variable.

/// `return $call` with the type aliases `$r` (the CubeCL runtime) and `$bt` (the bool
/// element) of the plain CubeCL backend `$b` is, when it is one.
macro_rules! on_cube_backend {
    ($b:ty, |$r:ident, $bt:ident| $call:expr) => {
        #[cfg(feature = "cuda")]
        if $crate::wan::block_kernels::cube::is::<$b, cubecl::cuda::CudaRuntime, u8>() {
            type $r = cubecl::cuda::CudaRuntime;
            type $bt = u8;
            return $call;
        }
        #[cfg(feature = "wgpu")]
        if $crate::wan::block_kernels::cube::is::<$b, cubecl::wgpu::WgpuRuntime, u32>() {
            type $r = cubecl::wgpu::WgpuRuntime;
            type $bt = u32;
            return $call;
        }
    };
}

/// [`on_cube_backend`] when the kernels are on ([`BLOCK_KERNELS_ENV`]).
macro_rules! on_cube {
    ($b:ty, |$r:ident, $bt:ident| $call:expr) => {
        #[cfg(any(feature = "cuda", feature = "wgpu"))]
        if $crate::wan::block_kernels::kernels_on() {
            on_cube_backend!($b, |$r, $bt| $call);
        }
    };
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod cube;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod cube_elementwise;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod cube_matmul;
#[cfg(feature = "cuda")]
pub(crate) mod cublas;
#[cfg(feature = "cuda")]
mod cublas_order;
#[cfg(feature = "cuda")]
mod cublas_queued;
#[cfg(feature = "cuda")]
pub(crate) mod cublas_stream;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod device;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
mod device_elementwise;
pub(crate) mod elementwise;
pub(crate) mod gelu;
pub mod matmul;
mod matmul_pin;
#[cfg(all(test, any(feature = "cuda", feature = "wgpu")))]
mod matmul_tests;
pub(crate) mod norms;
pub(crate) mod rows;
// Used by `cuda`'s queued cuBLAS products; tested on `wgpu` too.
#[cfg(any(feature = "cuda", all(test, feature = "wgpu")))]
pub(crate) mod server_queue;
#[cfg(all(test, any(feature = "cuda", feature = "wgpu")))]
mod tests;
#[cfg(all(test, any(feature = "cuda", feature = "wgpu")))]
mod tests_elementwise;

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
