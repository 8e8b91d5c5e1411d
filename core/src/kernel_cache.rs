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
//! - Under the root, one folder per binary and set of GPUs ([`folder_name`]): a kernel's
//!   cache key is CubeCL's hash of its id, which names the kernel and its launch settings
//!   but not its source code, so PTX compiled by another build of Reel, or for another GPU
//!   architecture, must never be found. The binary is told apart by its size, modification
//!   time and first and last 64 KiB; the GPUs by their names and compute capabilities. A
//!   machine whose GPUs are not all the same model gets no cache.
//! - A `cubecl.toml` that sets `[compilation] cache` itself wins.
//! - Folders of other binaries unused for [`PRUNE_AFTER`] are removed when a new one is
//!   made (only folders with Reel's marker file, [`MARKER`]).
//!
//! Library users and the test binaries get no cache unless they call [`enable`].

use std::ffi::OsStr;
use std::hash::{Hash, Hasher};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

/// The environment variable naming the cache's root folder (`off`: no cache).
pub const KERNEL_CACHE_ENV: &str = "REEL_KERNEL_CACHE";

/// The file that marks a folder under the root as Reel's (its text says which binary and
/// GPUs it serves; its modification time, when it was last used).
pub const MARKER: &str = "reel-kernel-cache.txt";

/// How long another binary's folder stays after its last use.
pub const PRUNE_AFTER: Duration = Duration::from_secs(30 * 24 * 3600);

/// Bytes of the binary read from each end for its identity.
const ENDS: u64 = 64 * 1024;

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
                (_, Some(h)) if !h.is_empty() => Path::new(h).join(".cache"),
                _ => return None,
            };
            Some(base.join("reel").join("kernels"))
        }
    }
}

/// The folder name for the binary at `exe` and the GPUs `devices` (one `name (sm_XY)` line
/// each): 16 hex digits of a hash of the binary's size, modification time and first and last
/// [`ENDS`] bytes and of the GPUs' lines.
pub fn folder_name(exe: &Path, devices: &[String]) -> std::io::Result<String> {
    let mut file = std::fs::File::open(exe)?;
    let meta = file.metadata()?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    meta.len().hash(&mut hasher);
    let modified = meta.modified()?.duration_since(SystemTime::UNIX_EPOCH);
    modified
        .map(|d| d.as_nanos())
        .unwrap_or(0)
        .hash(&mut hasher);
    let mut buf = Vec::with_capacity(2 * ENDS as usize);
    (&mut file).take(ENDS).read_to_end(&mut buf)?;
    file.seek(SeekFrom::Start(meta.len().saturating_sub(ENDS)))?;
    file.take(ENDS).read_to_end(&mut buf)?;
    buf.hash(&mut hasher);
    devices.hash(&mut hasher);
    Ok(format!("{:016x}", hasher.finish()))
}

/// Make `root/name` with its [`MARKER`] (rewritten: its time is the folder's last use) and
/// return it; when the folder is new, remove the marked folders beside it unused for
/// [`PRUNE_AFTER`].
pub fn prepare(root: &Path, name: &str, about: &str) -> std::io::Result<PathBuf> {
    let dir = root.join(name);
    let new = !dir.join(MARKER).exists();
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(MARKER), about)?;
    if new {
        prune(root, &dir, PRUNE_AFTER);
    }
    Ok(dir)
}

/// Remove the folders under `root` other than `keep` whose [`MARKER`] is older than `age`
/// (best effort: a folder that cannot be read or removed stays).
pub fn prune(root: &Path, keep: &Path, age: Duration) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    let now = SystemTime::now();
    for dir in entries.flatten().map(|e| e.path()) {
        let unused = std::fs::metadata(dir.join(MARKER))
            .and_then(|m| m.modified())
            .is_ok_and(|t| now.duration_since(t).unwrap_or_default() > age);
        if dir != keep && unused {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// The folder for this process, or why there is none (`Ok(None)`: turned off).
#[cfg(feature = "cuda")]
fn folder(devices: &[String]) -> Result<Option<PathBuf>, String> {
    let env = |k: &str| std::env::var_os(k);
    let Some(root) = root(
        env(KERNEL_CACHE_ENV).as_deref(),
        env("XDG_CACHE_HOME").as_deref(),
        env("HOME").as_deref(),
    ) else {
        return Ok(None);
    };
    if devices.windows(2).any(|w| w[0] != w[1]) {
        return Err(format!("GPUs of different models ({})", devices.join(", ")));
    }
    let exe = std::env::current_exe().map_err(|e| format!("this binary's path: {e}"))?;
    let name = folder_name(&exe, devices).map_err(|e| format!("{}: {e}", exe.display()))?;
    let about = format!(
        "Kernels compiled by Reel's CubeCL runtime (PTX), safe to delete.\nbinary: {}\nGPUs: {}\n",
        exe.display(),
        devices.join(", ")
    );
    prepare(&root, &name, &about)
        .map(Some)
        .map_err(|e| format!("{}: {e}", root.join(&name).display()))
}

/// Before the first CUDA device is made: point CubeCL's compilation cache at this binary's
/// folder if [`enable`] was called (once per process; one line on stderr when the cache
/// cannot be used).
#[cfg(feature = "cuda")]
pub(crate) fn before_cuda_device() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    ONCE.call_once(|| {
        let result = cuda::devices()
            .and_then(|d| folder(&d))
            .and_then(|dir| match dir {
                Some(dir) => cuda::set_cache(dir),
                None => Ok(()),
            });
        if let Err(why) = result {
            eprintln!("reel: no kernel cache ({why}); set {KERNEL_CACHE_ENV}=off to silence this");
        }
    });
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::path::PathBuf;
    use std::sync::Arc;

    use cubecl::config::cache::CacheConfig;
    use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    use cudarc::driver::result as driver;
    use cudarc::driver::sys::CUdevice_attribute as Attr;

    /// `name (sm_XY)` for each visible GPU.
    pub(super) fn devices() -> Result<Vec<String>, String> {
        let err = |e: driver::DriverError| format!("CUDA driver: {e}");
        driver::init().map_err(err)?;
        let count = driver::device::get_count().map_err(err)?;
        (0..count)
            .map(|i| {
                let dev = driver::device::get(i).map_err(err)?;
                let name = driver::device::get_name(dev).map_err(err)?;
                // SAFETY: `dev` is a device handle the driver just returned.
                let cc = |a| unsafe { driver::device::get_attribute(dev, a) }.map_err(err);
                let major = cc(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
                let minor = cc(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
                Ok(format!("{name} (sm_{major}{minor})"))
            })
            .collect()
    }

    /// Set CubeCL's configuration (its `cubecl.toml` and environment, as CubeCL would read
    /// them) with `dir` as the compilation cache, unless the configuration sets a cache or
    /// was already read.
    pub(super) fn set_cache(dir: PathBuf) -> Result<(), String> {
        let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
        if config.compilation.cache.is_some() {
            return Ok(());
        }
        config.compilation.cache = Some(CacheConfig::File(dir));
        let mut slot = CubeClRuntimeConfig::storage().lock();
        if slot.is_some() {
            return Err("CubeCL's configuration was read before the first device".into());
        }
        *slot = Some(Arc::new(config));
        Ok(())
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

    #[test]
    fn another_binary_or_gpu_gets_another_folder() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("reel");
        let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&exe, &bytes).unwrap();
        let h100 = vec!["NVIDIA H100 (sm_90)".to_string()];
        let a = folder_name(&exe, &h100).unwrap();
        assert_eq!(a.len(), 16);
        assert_eq!(
            folder_name(&exe, &h100).unwrap(),
            a,
            "same binary, same GPUs"
        );
        let a100 = vec!["NVIDIA A100 (sm_80)".to_string()];
        assert_ne!(folder_name(&exe, &a100).unwrap(), a);
        // One byte changed at either end, same size and time: another binary.
        let time = std::fs::metadata(&exe).unwrap().modified().unwrap();
        for at in [10, bytes.len() - 10] {
            let mut other = bytes.clone();
            other[at] ^= 1;
            std::fs::write(&exe, &other).unwrap();
            std::fs::File::options()
                .write(true)
                .open(&exe)
                .unwrap()
                .set_modified(time)
                .unwrap();
            assert_ne!(folder_name(&exe, &h100).unwrap(), a, "byte {at}");
        }
        let missing = folder_name(&dir.path().join("gone"), &h100);
        assert!(missing.is_err());
    }

    #[test]
    fn a_new_folder_removes_only_old_marked_folders() {
        let root = tempfile::tempdir().unwrap();
        let old = prepare(root.path(), "old", "old").unwrap();
        let recent = prepare(root.path(), "recent", "recent").unwrap();
        let foreign = root.path().join("not-reels");
        std::fs::create_dir(&foreign).unwrap();
        let long_ago = SystemTime::now() - PRUNE_AFTER - Duration::from_secs(60);
        let marker = std::fs::File::options().write(true).open(old.join(MARKER));
        marker.unwrap().set_modified(long_ago).unwrap();
        let new = prepare(root.path(), "new", "about").unwrap();
        assert_eq!(std::fs::read_to_string(new.join(MARKER)).unwrap(), "about");
        assert!(!old.exists(), "unused for longer than PRUNE_AFTER");
        assert!(recent.exists() && foreign.exists());
        // Using a folder again rewrites its marker and removes nothing.
        prepare(root.path(), "recent", "again").unwrap();
        assert!(new.exists());
    }

    #[test]
    fn an_unwritable_root_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "x").unwrap();
        assert!(prepare(&file, "k", "about").is_err());
    }
}
