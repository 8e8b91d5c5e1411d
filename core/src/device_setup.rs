//! CubeCL's process-wide configuration, set once before the first GPU device is made: the
//! kernel cache on `cuda` ([`crate::kernel_cache`]) and how device memory is handed out
//! ([`crate::memory::allocator`], `REEL_GPU_MEMORY`).
//!
//! CubeCL reads its configuration (a `cubecl.toml` in the working directory or above it, and
//! its environment variables) once, when it first needs it, and keeps it for the process.
//! Here it is read the same way, Reel's settings are put into it, and it is stored before
//! CubeCL reads it, only when a setting changed it.

#[cfg(any(feature = "cuda", feature = "wgpu"))]
use crate::memory::allocator::{self, GpuMemory};

/// Put Reel's settings into CubeCL's configuration (once per process): the memory mode on
/// every CubeCL backend, the kernel cache when `cuda`. The backends' device functions call it
/// before making a device.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub(crate) fn before_gpu_device(cuda: bool) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| configure(cuda));
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn configure(cuda: bool) {
    use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};

    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    let memory = GpuMemory::of_process();
    let memory_set = allocator::configure(&mut config, memory);
    #[cfg(feature = "cuda")]
    let cache_set = cuda && crate::kernel_cache::configure(&mut config);
    #[cfg(not(feature = "cuda"))]
    let cache_set = {
        let _ = cuda;
        false
    };
    if !memory_set && !cache_set {
        return;
    }
    let mut slot = CubeClRuntimeConfig::storage().lock();
    if slot.is_some() {
        let mut unapplied = Vec::new();
        if cache_set {
            unapplied.push("the kernel cache".to_string());
        }
        if memory_set {
            unapplied.push(format!("{}={memory}", allocator::GPU_MEMORY_ENV));
        }
        eprintln!(
            "reel: CubeCL's configuration was read before the first device; not applied: {}",
            unapplied.join(" and ")
        );
        return;
    }
    *slot = Some(std::sync::Arc::new(config));
}
