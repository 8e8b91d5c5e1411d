//! The kernel cache's folders: one per binary and GPU, named by a hash of both, and kept in
//! bounds (old folders pruned, an oversized one started over, stale lock files removed).

use std::hash::{Hash, Hasher};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The file that marks a folder under the root as Reel's (its text says which binary and
/// GPU it serves; its modification time, when it was last used).
pub const MARKER: &str = "reel-kernel-cache.txt";

/// How long another binary's folder stays after its last use.
pub const PRUNE_AFTER: Duration = Duration::from_secs(30 * 24 * 3600);

/// How many other binaries' folders stay at most (the most recently used).
pub const KEEP: usize = 8;

/// A folder larger than this starts over (CubeCL appends to its files and reads them whole at
/// every start; processes that compile the same kernel at once each append it).
pub const MAX_BYTES: u64 = 1 << 30;

/// Below this much free disk there is no cache: CubeCL panics when a write to it fails.
pub const MIN_FREE: u64 = 2 << 30;

/// A lock file older than this was left by a killed process (CubeCL holds its locks for the
/// time of one small write, and waits 30 s for a lock before it gives up on its cache).
pub const STALE_LOCK: Duration = Duration::from_secs(60);

/// Bytes of the binary read from each end for its identity.
const ENDS: u64 = 64 * 1024;

/// The folder name for the binary at `exe` on `machine` (the GPU model and the CUDA driver's
/// and NVRTC's versions): 16 hex digits of a hash of both. The binary is told apart by its
/// size, modification time, first and last 64 KiB (`ENDS`) and, on Unix, its inode, device
/// and status-change time (which no copy preserves and `touch` cannot set).
pub fn folder_name(exe: &Path, machine: &str) -> std::io::Result<String> {
    let mut file = std::fs::File::open(exe)?;
    let meta = file.metadata()?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    meta.len().hash(&mut hasher);
    let modified = meta.modified()?.duration_since(SystemTime::UNIX_EPOCH);
    modified
        .map(|d| d.as_nanos())
        .unwrap_or(0)
        .hash(&mut hasher);
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        (meta.ino(), meta.dev(), meta.ctime(), meta.ctime_nsec()).hash(&mut hasher);
    }
    let mut buf = Vec::with_capacity(2 * ENDS as usize);
    (&mut file).take(ENDS).read_to_end(&mut buf)?;
    file.seek(SeekFrom::Start(meta.len().saturating_sub(ENDS)))?;
    file.take(ENDS).read_to_end(&mut buf)?;
    buf.hash(&mut hasher);
    machine.hash(&mut hasher);
    Ok(format!("{:016x}", hasher.finish()))
}

/// The folder for the binary at `exe` on `machine` under `root`, made and kept in bounds
/// ([`prepare`]), or why there is none (less than [`MIN_FREE`] of free disk: no folder is made).
pub fn prepare_for(root: &Path, exe: &Path, machine: &str) -> Result<PathBuf, String> {
    let name = folder_name(exe, machine).map_err(|e| format!("{}: {e}", exe.display()))?;
    let about = format!(
        "Kernels compiled by Reel's CubeCL runtime (PTX). Delete the folder when no reel \
         process is running.\nbinary: {}\nmachine: {machine}\n",
        exe.display()
    );
    let dir = root.join(&name);
    let at = |e: std::io::Error| format!("{}: {e}", dir.display());
    std::fs::create_dir_all(root).map_err(at)?;
    if let Some(free) = free_bytes(root).filter(|&free| free < MIN_FREE) {
        return Err(format!(
            "{}: {} MiB of free disk, less than {} MiB",
            root.display(),
            free >> 20,
            MIN_FREE >> 20
        ));
    }
    prepare(root, &name, &about).map_err(at)
}

/// Make `root/name` with its [`MARKER`] (rewritten: its time is the folder's last use) and
/// return it, after removing its stale lock files and, past [`MAX_BYTES`], its contents;
/// when the folder is new, prune the marked folders beside it ([`prune`]).
pub fn prepare(root: &Path, name: &str, about: &str) -> std::io::Result<PathBuf> {
    let dir = root.join(name);
    let new = !dir.join(MARKER).exists();
    std::fs::create_dir_all(&dir)?;
    let files = files(&dir);
    if files.iter().map(|(_, m)| m.len()).sum::<u64>() > MAX_BYTES {
        std::fs::remove_dir_all(&dir)?;
        std::fs::create_dir_all(&dir)?;
    } else {
        remove_stale_locks(&files, STALE_LOCK);
    }
    std::fs::write(dir.join(MARKER), about)?;
    if new {
        prune(root, &dir, PRUNE_AFTER, KEEP);
    }
    Ok(dir)
}

/// Remove the folders under `root` other than `keep` that carry a [`MARKER`] older than `age`
/// or that are not among the `most` most recently used (best effort: a folder that cannot be
/// read or removed stays).
pub fn prune(root: &Path, keep: &Path, age: Duration, most: usize) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    let mut marked: Vec<(SystemTime, PathBuf)> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|dir| dir != keep)
        .filter_map(|dir| Some((modified(&dir.join(MARKER))?, dir)))
        .collect();
    marked.sort_by_key(|m| std::cmp::Reverse(m.0));
    let now = SystemTime::now();
    for (i, (used, dir)) in marked.iter().enumerate() {
        if i >= most || now.duration_since(*used).unwrap_or_default() > age {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Every file under `dir`, with its metadata.
fn files(dir: &Path) -> Vec<(PathBuf, std::fs::Metadata)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match entry.metadata() {
                Ok(m) if m.is_dir() => stack.push(entry.path()),
                Ok(m) => out.push((entry.path(), m)),
                Err(_) => {}
            }
        }
    }
    out
}

/// Remove the `*.lock` files of `files` last written more than `age` ago.
fn remove_stale_locks(files: &[(PathBuf, std::fs::Metadata)], age: Duration) {
    let now = SystemTime::now();
    for (path, meta) in files {
        let old = meta
            .modified()
            .is_ok_and(|t| now.duration_since(t).unwrap_or_default() > age);
        if old && path.extension().is_some_and(|e| e == "lock") {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Free bytes on `dir`'s file system for an unprivileged process (`None`: unknown).
#[cfg(all(unix, feature = "cuda"))]
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is NUL-terminated and `stat` is written by the call before it is read.
    if unsafe { libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `stat`.
    let stat = unsafe { stat.assume_init() };
    // Their types differ between platforms (u64 on 64-bit Linux).
    #[allow(clippy::unnecessary_cast)]
    Some(stat.f_bavail as u64 * stat.f_frsize as u64)
}

#[cfg(not(all(unix, feature = "cuda")))]
fn free_bytes(_dir: &Path) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_time(path: &Path, t: SystemTime) {
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(t).unwrap();
    }

    #[test]
    fn another_binary_or_machine_gets_another_folder() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("reel");
        let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&exe, &bytes).unwrap();
        let h100 = "NVIDIA H100 (sm_90, 132 SMs, 232448 B shared); CUDA driver 12080; NVRTC 12.8";
        let a = folder_name(&exe, h100).unwrap();
        assert_eq!(a.len(), 16);
        assert_eq!(
            folder_name(&exe, h100).unwrap(),
            a,
            "same binary, same GPUs"
        );
        let a100 = h100.replace("H100 (sm_90", "A100 (sm_80");
        assert_ne!(folder_name(&exe, &a100).unwrap(), a);
        let nvrtc = h100.replace("NVRTC 12.8", "NVRTC 12.9");
        assert_ne!(folder_name(&exe, &nvrtc).unwrap(), a);
        // One byte changed at either end, same size and time: another binary.
        let time = std::fs::metadata(&exe).unwrap().modified().unwrap();
        for at in [10, bytes.len() - 10] {
            let mut other = bytes.clone();
            other[at] ^= 1;
            std::fs::write(&exe, &other).unwrap();
            set_time(&exe, time);
            assert_ne!(folder_name(&exe, h100).unwrap(), a, "byte {at}");
        }
        assert!(folder_name(&dir.path().join("gone"), h100).is_err());
    }

    #[test]
    fn new_folders_prune_old_and_surplus_marked_folders_only() {
        let root = tempfile::tempdir().unwrap();
        let old = prepare(root.path(), "old", "old").unwrap();
        let foreign = root.path().join("not-reels");
        std::fs::create_dir(&foreign).unwrap();
        let long_ago = SystemTime::now() - PRUNE_AFTER - Duration::from_secs(60);
        set_time(&old.join(MARKER), long_ago);
        // KEEP + 1 recent folders, the first the least recently used.
        let recent: Vec<PathBuf> = (0..=KEEP)
            .map(|i| {
                let d = prepare(root.path(), &format!("r{i}"), "recent").unwrap();
                let t = SystemTime::now() - Duration::from_secs(100 - i as u64);
                set_time(&d.join(MARKER), t);
                d
            })
            .collect();
        let new = prepare(root.path(), "new", "about").unwrap();
        assert_eq!(std::fs::read_to_string(new.join(MARKER)).unwrap(), "about");
        assert!(!old.exists(), "unused for longer than PRUNE_AFTER");
        assert!(!recent[0].exists(), "the least recently used beyond KEEP");
        assert!(recent[1..].iter().all(|d| d.exists()) && foreign.exists());
        // Using a folder again rewrites its marker and removes nothing.
        prepare(root.path(), "r1", "again").unwrap();
        assert!(new.exists() && recent[1..].iter().all(|d| d.exists()));
    }

    #[test]
    fn stale_locks_go_and_an_oversized_folder_starts_over() {
        let root = tempfile::tempdir().unwrap();
        let dir = prepare(root.path(), "k", "about").unwrap();
        let ptx = dir.join("cuda/0.10.0/ptx");
        std::fs::create_dir_all(&ptx).unwrap();
        let (stale, fresh) = (ptx.join("toc.json.log.lock"), ptx.join("other.lock"));
        for f in [&stale, &fresh] {
            std::fs::write(f, "").unwrap();
        }
        set_time(&stale, SystemTime::now() - STALE_LOCK * 2);
        let chunk = ptx.join("chunk0.cbor");
        std::fs::write(&chunk, "entries").unwrap();
        prepare(root.path(), "k", "about").unwrap();
        assert!(!stale.exists() && fresh.exists() && chunk.exists());
        // Past MAX_BYTES (a sparse file), the folder's contents go.
        let big = std::fs::File::create(ptx.join("chunk1.cbor")).unwrap();
        big.set_len(MAX_BYTES + 1).unwrap();
        prepare(root.path(), "k", "about").unwrap();
        assert!(!chunk.exists() && dir.join(MARKER).exists());
    }

    /// The free-disk check reads the file system (it exists with the `cuda` feature only).
    #[cfg(all(unix, feature = "cuda"))]
    #[test]
    fn cuda_kernel_cache_knows_the_free_disk() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).is_some_and(|b| b > 0));
        assert_eq!(free_bytes(&dir.path().join("not\0here")), None);
    }

    #[test]
    fn an_unwritable_root_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "x").unwrap();
        assert!(prepare(&file, "k", "about").is_err());
        let exe = dir.path().join("a-file");
        assert!(prepare_for(&file, &exe, "gpu").is_err());
    }
}
