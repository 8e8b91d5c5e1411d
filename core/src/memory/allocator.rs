//! How CubeCL's GPU backends (`cuda`, `wgpu`) hand out device memory: `REEL_GPU_MEMORY`.
//!
//! CubeCL 0.10 serves every allocation from pools of large pages cut into slices
//! ([`GpuMemory::Pages`], its default). Finding room walks the pool's pages one after the other,
//! merging each page's free neighbours and then scanning its slices, on the device thread that
//! also launches every kernel. A training run keeps its weights, AdamW moments and EMA in those
//! pages for good: thousands of live slices that every later allocation of a similar size walks
//! past. [`GpuMemory::Exact`] turns on CubeCL's persistent memory for every allocation: each
//! buffer is allocated at its exact size and kept after it is freed for the next allocation of
//! that size, found through a table by size. A training step asks for the same sizes every
//! step, so after the first one no allocation walks anything. What it gives up: a freed buffer
//! serves only its own size, where a page's freed bytes serve any size of that pool, so the
//! peak reserved memory can differ either way (pages also carry slack at their ends).
//!
//! Measured on the host side (docs/performance.md, "How the GPU memory is handed out"): on
//! `wgpu` (lavapipe) a 30-block model's training step spent a fifth of its time in the pages'
//! walk. Reel leaves the default at `pages` until a GPU session has set the two side by side on
//! step time and peak memory (`bench/gpu.sh`'s `host` and `small` parts run both).

use std::fmt;

/// The environment variable that chooses [`GpuMemory`]: `pages` or `exact`.
pub const GPU_MEMORY_ENV: &str = "REEL_GPU_MEMORY";

/// How the CubeCL backends allocate device memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GpuMemory {
    /// CubeCL's default: pools of pages cut into slices, searched page by page.
    #[default]
    Pages,
    /// Buffers of the exact size asked for, each kept for reuse by the next allocation of
    /// its size (CubeCL's persistent memory, enforced for every allocation).
    Exact,
}

impl GpuMemory {
    /// `pages` or `exact`.
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim() {
            "pages" => Some(Self::Pages),
            "exact" => Some(Self::Exact),
            _ => None,
        }
    }

    /// The name [`Self::parse`] takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pages => "pages",
            Self::Exact => "exact",
        }
    }

    /// The mode `setting` ([`GPU_MEMORY_ENV`]'s value) names: the default when unset, an error
    /// naming the variable and the choices when it names none.
    pub fn from_setting(setting: Option<&str>) -> Result<Self, String> {
        match setting {
            None => Ok(Self::default()),
            Some(v) => Self::parse(v)
                .ok_or_else(|| format!("{GPU_MEMORY_ENV}={v}: expected `pages` or `exact`")),
        }
    }

    /// The mode of this process: [`GPU_MEMORY_ENV`] read once; one line on stderr (and the
    /// default) when it names none.
    pub fn of_process() -> Self {
        static MODE: std::sync::OnceLock<GpuMemory> = std::sync::OnceLock::new();
        *MODE.get_or_init(|| {
            let v = std::env::var(GPU_MEMORY_ENV).ok();
            Self::from_setting(v.as_deref()).unwrap_or_else(|why| {
                let fallback = Self::default();
                eprintln!("reel: {why}; using `{fallback}`");
                fallback
            })
        })
    }
}

impl fmt::Display for GpuMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What CubeCL's pools hold on one device: the bytes of live tensors and the bytes the pools
/// have taken from the device (pages or exact-size buffers, used or kept for reuse). Neither
/// pool mode gives memory back during a run, so `reserved` at the end of a run is its peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolUsage {
    /// Bytes of the tensors alive now.
    pub in_use: u64,
    /// Bytes the pools hold from the device.
    pub reserved: u64,
}

/// [`PoolUsage`] of `device` on the CubeCL backends compiled in (`cuda`, `wgpu`); `None` on
/// the others, or when the device does not answer. Waits for the device's queue.
pub fn pool_usage<B: burn::tensor::backend::Backend>(device: &B::Device) -> Option<PoolUsage> {
    let any = device as &dyn std::any::Any;
    #[cfg(feature = "cuda")]
    if let Some(d) = any.downcast_ref::<burn::backend::cuda::CudaDevice>() {
        return usage_of::<cubecl::cuda::CudaRuntime>(d);
    }
    #[cfg(feature = "wgpu")]
    if let Some(d) = any.downcast_ref::<burn::backend::wgpu::WgpuDevice>() {
        return usage_of::<cubecl::wgpu::WgpuRuntime>(d);
    }
    let _ = any;
    None
}

#[cfg(any(feature = "cuda", feature = "wgpu"))]
fn usage_of<R: cubecl::Runtime>(device: &R::Device) -> Option<PoolUsage> {
    let usage = R::client(device).memory_usage().ok()?;
    Some(PoolUsage {
        in_use: usage.bytes_in_use,
        reserved: usage.bytes_reserved,
    })
}

/// Set `mode` in CubeCL's configuration; whether that changed it.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
pub(crate) fn configure(config: &mut cubecl::config::CubeClRuntimeConfig, mode: GpuMemory) -> bool {
    use cubecl::config::memory::PersistentMemory;
    match mode {
        GpuMemory::Pages => false,
        GpuMemory::Exact => {
            config.memory.persistent_memory = PersistentMemory::Enforced;
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_unknown_settings_are_named() {
        for mode in [GpuMemory::Pages, GpuMemory::Exact] {
            assert_eq!(GpuMemory::parse(mode.name()), Some(mode));
            assert_eq!(GpuMemory::from_setting(Some(mode.name())), Ok(mode));
        }
        assert_eq!(GpuMemory::from_setting(None), Ok(GpuMemory::Pages));
        let err = GpuMemory::from_setting(Some("slices")).unwrap_err();
        assert!(
            err.contains("REEL_GPU_MEMORY=slices") && err.contains("`exact`"),
            "{err}"
        );
    }

    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    #[test]
    fn wgpu_and_cuda_builds_set_exact_as_cubecls_enforced_persistent_memory() {
        use cubecl::config::memory::PersistentMemory;
        use cubecl::config::CubeClRuntimeConfig;
        let mut config = CubeClRuntimeConfig::default();
        assert!(!configure(&mut config, GpuMemory::Pages));
        assert!(matches!(
            config.memory.persistent_memory,
            PersistentMemory::Enabled
        ));
        assert!(configure(&mut config, GpuMemory::Exact));
        assert!(matches!(
            config.memory.persistent_memory,
            PersistentMemory::Enforced
        ));
    }
}
