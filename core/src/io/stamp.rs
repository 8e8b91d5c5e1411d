//! Cheap, deterministic identities of files whose change matters (a weights file a resumed
//! run reads again, a clip whose shard is already written).
//!
//! A stamp is the file's size and a SHA-256 of its first and last bytes: reading a 5 GB file
//! whole would cost seconds, and a stamp depends on the bytes only, not on the path or the
//! modification time, so it is the same on every machine and after a copy.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::checkpoint::sha256_hex;

/// Whether `path` is a named pipe, socket or device: neither a regular file nor a folder.
/// Reading one would wait for a writer forever, or never end; `false` for a path that
/// cannot be looked at (its reader reports that).
pub fn is_special(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// `size:hash` of a file: its size and a SHA-256 of its first and last `end` bytes; `None`
/// if it cannot be read or is not a regular file (opening a named pipe would wait for a
/// writer forever).
fn file_stamp(path: &Path, end: u64) -> Option<String> {
    if !std::fs::metadata(path).ok()?.is_file() {
        return None;
    }
    let mut f = File::open(path).ok()?;
    let size = f.metadata().ok()?.len();
    let mut bytes = Vec::with_capacity((2 * end).min(size) as usize);
    (&mut f).take(end).read_to_end(&mut bytes).ok()?;
    if size > end {
        f.seek(SeekFrom::Start(size.saturating_sub(end).max(end)))
            .ok()?;
        f.take(end).read_to_end(&mut bytes).ok()?;
    }
    Some(format!("{size}:{}", sha256_hex(&bytes)))
}

/// The stamp of a file, or of a folder (a diffusers `transformer/`, a folder of frames): its
/// files' names and stamps, in name order, hashed together. `end` bytes are read from each
/// end of each file (weights: a MiB, the header and the last tensors). `None` when it cannot
/// be read.
pub fn content_stamp(path: &Path, end: u64) -> Option<String> {
    if !path.is_dir() {
        return file_stamp(path, end);
    }
    let mut names: Vec<_> = std::fs::read_dir(path)
        .ok()?
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| e.file_name())
        .collect();
    names.sort();
    let parts: Vec<String> = names
        .iter()
        .filter_map(|n| {
            Some(format!(
                "{}={}",
                n.to_string_lossy(),
                file_stamp(&path.join(n), end)?
            ))
        })
        .collect();
    Some(sha256_hex(parts.join("\n").as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_see_changes_at_either_end_and_folders_by_file() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("w.safetensors");
        const END: u64 = 1 << 10;
        let stamp = |p: &Path| content_stamp(p, END);
        let mut bytes = vec![7u8; 3 * END as usize];
        std::fs::write(&f, &bytes).unwrap();
        let a = stamp(&f).unwrap();
        assert_eq!(stamp(&f).unwrap(), a, "deterministic");
        bytes[3] = 8;
        std::fs::write(&f, &bytes).unwrap();
        let b = stamp(&f).unwrap();
        assert_ne!(a, b, "a change in the header");
        let last = bytes.len() - 2;
        bytes[last] = 9;
        std::fs::write(&f, &bytes).unwrap();
        assert_ne!(stamp(&f).unwrap(), b, "a change in the last tensors");
        std::fs::write(&f, b"short").unwrap();
        assert!(stamp(&f).unwrap().starts_with("5:"));
        assert_eq!(stamp(&tmp.path().join("missing")), None);
        let folder = stamp(tmp.path()).unwrap();
        std::fs::write(tmp.path().join("config.json"), b"{}").unwrap();
        assert_ne!(stamp(tmp.path()).unwrap(), folder);
    }

    /// A named pipe (a `clip.mp4` that is a FIFO in a folder to preprocess) has no stamp, and
    /// asking for one returns at once instead of waiting for a writer.
    #[cfg(unix)]
    #[test]
    fn a_named_pipe_has_no_stamp_and_does_not_block() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("clip.mp4");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("skipped: mkfifo is not available");
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || tx.send(content_stamp(&path, 1 << 10)).unwrap());
        let got = rx.recv_timeout(std::time::Duration::from_secs(20));
        assert_eq!(got, Ok(None), "the stamp of a named pipe");
        // The folder's stamp leaves it out as it leaves out sub-folders.
        let with_pipe = content_stamp(tmp.path(), 1 << 10);
        std::fs::remove_file(&fifo).unwrap();
        assert_eq!(with_pipe, content_stamp(tmp.path(), 1 << 10));
    }
}
