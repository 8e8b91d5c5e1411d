//! A cache of compiled GPU kernels on disk, so that a `reel` process on CUDA compiles each
//! kernel once per binary and machine instead of once per process.
//!
//! CubeCL generates every kernel (Burn's tensor operations, Reel's attention, norm and
//! optimizer kernels) as CUDA C++ when it is first launched and compiles it with NVRTC, in
//! every process: a training run, a resume, each `reel sample` and each `reel bench` row pays
//! for the same compilations again before its first step. CubeCL can keep the compiled PTX in
//! a cache folder (`[compilation] cache` in a `cubecl.toml`); Reel turns that on for the
//! `reel` binary ([`enable`]) and chooses the folder:
//!
//! - `REEL_KERNEL_CACHE` ([`KERNEL_CACHE_ENV`]) names the root folder; `off` (or `0`, or
//!   empty) turns the cache off; unset, the root is `$XDG_CACHE_HOME/reel/kernels` or
//!   `~/.cache/reel/kernels`.
//! - Under the root, one folder per binary and GPU ([`folder::folder_name`]): a kernel's cache
//!   key is CubeCL's hash of its id, which names the kernel and its launch settings but not
//!   its source code, so PTX compiled by another build of Reel, for another GPU model, or by
//!   another NVRTC or for another driver must never be found. A machine whose GPUs are not
//!   all the same model gets no cache.
//! - A `cubecl.toml` that sets `[compilation] cache` itself wins, and CubeCL's debug logging
//!   (`CUBECL_DEBUG_LOG`, `CUBECL_DEBUG_OPTION`) turns the cache off, since a cached kernel
//!   logs no source.
//! - [`folder::prepare`] keeps the folders in bounds: other binaries' folders unused for
//!   [`folder::PRUNE_AFTER`] or beyond the [`folder::KEEP`] most recently used go, a folder
//!   past [`folder::MAX_BYTES`] starts over, lock files a killed process left are removed,
//!   and with less than [`folder::MIN_FREE`] of free disk there is no cache (CubeCL panics
//!   when a write to its cache fails).
//!
//! Library users and the test binaries get no cache unless they call [`enable`].

pub mod folder;

use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// The environment variable naming the cache's root folder (`off`: no cache).
pub const KERNEL_CACHE_ENV: &str = "REEL_KERNEL_CACHE";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Use the kernel cache in this process (the `reel` binary calls it first thing). It takes
/// effect when the first CUDA device is made.
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// The cache's root folder: `setting` is [`KERNEL_CACHE_ENV`]'s value, `xdg` and `home` those
/// of `XDG_CACHE_HOME` and `HOME`. `None`: no cache.
pub fn root(setting: Option<&OsStr>, xdg: Option<&OsStr>, home: Option<&OsStr>) -> Option<PathBuf> {
    match setting {
        Some(v) if v.is_empty() || v == "off" || v == "0" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => {
            let base = match (xdg, home) {
                (Some(x), _) if !x.is_empty() => PathBuf::from(x),
                (_, Some(h)) if !h.is_empty() => std::path::Path::new(h).join(".cache"),
                _ => return None,
            };
            Some(base.join("reel").join("kernels"))
        }
    }
}

/// Point CubeCL's compilation cache in `config` (read as CubeCL reads it) at this binary's
/// folder if [`enable`] was called; whether `config` changed. One line on stderr when the
/// cache cannot be used. Called once, before the first CUDA device is made
/// ([`crate::device_setup`]).
#[cfg(feature = "cuda")]
pub(crate) fn configure(config: &mut cubecl::config::CubeClRuntimeConfig) -> bool {
    if !ENABLED.load(Ordering::Relaxed) {
        return false;
    }
    match cuda::cache_folder(config) {
        Ok(Some(dir)) => {
            config.compilation.cache = Some(cubecl::config::cache::CacheConfig::File(dir));
            true
        }
        Ok(None) => false,
        Err(why) => {
            eprintln!("reel: no kernel cache ({why}); set {KERNEL_CACHE_ENV}=off to silence this");
            false
        }
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::path::PathBuf;

    use cubecl::config::CubeClRuntimeConfig;
    use cudarc::driver::result as driver;
    use cudarc::driver::sys::CUdevice_attribute as Attr;

    use super::{folder, root, KERNEL_CACHE_ENV};

    /// This binary's cache folder for `config`, made ready. `None` when the cache is off, when
    /// the configuration sets one or logs kernels, or without a CUDA driver (CubeCL then says
    /// so itself).
    pub(super) fn cache_folder(config: &CubeClRuntimeConfig) -> Result<Option<PathBuf>, String> {
        let env = |k: &str| std::env::var_os(k);
        let Some(root) = root(
            env(KERNEL_CACHE_ENV).as_deref(),
            env("XDG_CACHE_HOME").as_deref(),
            env("HOME").as_deref(),
        ) else {
            return Ok(None);
        };
        if env("CUBECL_DEBUG_LOG").is_some() || env("CUBECL_DEBUG_OPTION").is_some() {
            return Ok(None);
        }
        // SAFETY: only looks for the driver library.
        if config.compilation.cache.is_some() || !unsafe { cudarc::driver::sys::is_culib_present() }
        {
            return Ok(None);
        }
        let gpu = machine()?;
        let exe = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
        folder::prepare_for(&root, &exe, &gpu).map(Some)
    }

    /// One line for the GPUs and the CUDA software that make the PTX: the GPU model (name,
    /// compute capability, multiprocessors, shared memory a block may opt into), the driver's
    /// CUDA version and NVRTC's. An error when the GPUs are not all of one model.
    fn machine() -> Result<String, String> {
        let err = |e: driver::DriverError| format!("CUDA driver: {e}");
        driver::init().map_err(err)?;
        let count = driver::device::get_count().map_err(err)?;
        let mut models: Vec<String> = (0..count)
            .map(|i| {
                let dev = driver::device::get(i).map_err(err)?;
                let name = driver::device::get_name(dev).map_err(err)?;
                // SAFETY: `dev` is a device handle the driver just returned.
                let attr = |a| unsafe { driver::device::get_attribute(dev, a) }.map_err(err);
                let major = attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
                let minor = attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
                let sms = attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
                let shared = attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
                Ok(format!(
                    "{name} (sm_{major}{minor}, {sms} SMs, {shared} B shared)"
                ))
            })
            .collect::<Result<_, String>>()?;
        models.dedup();
        if models.len() > 1 {
            return Err(format!("GPUs of different models ({})", models.join(", ")));
        }
        let mut driver_version = 0;
        // SAFETY: writes one int.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints; NVRTC is loaded as CubeCL loads it.
        if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
        }
        let gpu = models.pop().unwrap_or_else(|| "no GPU".into());
        Ok(format!(
            "{gpu}; CUDA driver {driver_version}; NVRTC {major}.{minor}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_follows_the_setting_then_xdg_then_home() {
        fn s(v: &str) -> Option<&OsStr> {
            Some(OsStr::new(v))
        }
        for off in ["off", "0", ""] {
            assert_eq!(root(s(off), s("/x"), s("/h")), None, "{off:?}");
        }
        assert_eq!(root(s("/k"), s("/x"), s("/h")), Some("/k".into()));
        assert_eq!(root(None, s("/x"), s("/h")), Some("/x/reel/kernels".into()));
        assert_eq!(
            root(None, s(""), s("/h")),
            Some("/h/.cache/reel/kernels".into())
        );
        assert_eq!(root(None, None, None), None);
    }
}
