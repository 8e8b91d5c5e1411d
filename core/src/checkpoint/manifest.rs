//! Checkpoint manifests: the list of files with their SHA-256 checksums, written last.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::CheckpointError;

/// Manifest file name inside a checkpoint folder.
pub const MANIFEST: &str = "manifest.json";
/// The trainer's state (step, RNG, optimizer steps: [`super::TrainerState`]) inside a
/// checkpoint folder.
pub const STATE_FILE: &str = "state.json";
/// Manifest format version.
pub const FORMAT_VERSION: u32 = 1;

/// One file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Hex SHA-256 of the contents.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: u64,
}

/// The manifest: what a complete checkpoint contains.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version.
    pub format: u32,
    /// Completed steps at save time.
    pub step: u64,
    /// Fingerprint of the config parts that must match on resume (models and method).
    pub config_fingerprint: String,
    /// Files by name (relative to the checkpoint folder).
    pub files: BTreeMap<String, FileEntry>,
}

/// Hex SHA-256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(bytes);
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hash a file's contents.
pub fn sha256_file(path: &Path) -> Result<FileEntry, CheckpointError> {
    let mut f = fs::File::open(path).map_err(|e| CheckpointError::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(|e| CheckpointError::io(path, e))?;
        if n == 0 {
            break;
        }
        total += n as u64;
        h.update(&buf[..n]);
    }
    Ok(FileEntry {
        sha256: hex(&h.finalize()),
        bytes: total,
    })
}

/// Write `bytes` to `path` and fsync it.
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let mut f = fs::File::create(path).map_err(|e| CheckpointError::io(path, e))?;
    f.write_all(bytes)
        .map_err(|e| CheckpointError::io(path, e))?;
    f.sync_all().map_err(|e| CheckpointError::io(path, e))?;
    Ok(())
}

impl Manifest {
    /// Read and parse a checkpoint's manifest: one that is missing or does not parse makes
    /// the checkpoint [`CheckpointError::Damaged`]; one that cannot be read now (a permission,
    /// a network file system's hiccup) is [`CheckpointError::Io`], which says nothing of the
    /// checkpoint.
    pub fn read(dir: &Path) -> Result<Self, CheckpointError> {
        let p = dir.join(MANIFEST);
        let text = fs::read_to_string(&p).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => CheckpointError::Damaged {
                dir: dir.to_path_buf(),
                reason: "manifest.json is missing (incomplete checkpoint)".into(),
            },
            _ => CheckpointError::io(&p, e),
        })?;
        let m: Manifest = serde_json::from_str(&text).map_err(|e| CheckpointError::Damaged {
            dir: dir.to_path_buf(),
            reason: format!("manifest.json is not valid: {e}"),
        })?;
        if m.format != FORMAT_VERSION {
            return Err(CheckpointError::Damaged {
                dir: dir.to_path_buf(),
                reason: format!(
                    "manifest format {} is not supported (expected {FORMAT_VERSION})",
                    m.format
                ),
            });
        }
        Ok(m)
    }

    /// Check every listed file's size and checksum: a file missing or unlike its entry makes
    /// the checkpoint [`CheckpointError::Damaged`]; one that cannot be read now is
    /// [`CheckpointError::Io`].
    pub fn verify(&self, dir: &Path) -> Result<(), CheckpointError> {
        for (name, entry) in &self.files {
            let p = dir.join(name);
            let missing = || CheckpointError::Damaged {
                dir: dir.to_path_buf(),
                reason: format!("file `{name}` listed in the manifest is missing"),
            };
            match fs::metadata(&p) {
                Ok(m) if m.is_file() => {}
                Ok(_) => return Err(missing()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(missing()),
                Err(e) => return Err(CheckpointError::io(&p, e)),
            }
            let actual = sha256_file(&p)?;
            if actual.bytes != entry.bytes {
                return Err(CheckpointError::Damaged {
                    dir: dir.to_path_buf(),
                    reason: format!(
                        "file `{name}` has {} bytes, manifest says {} (truncated?)",
                        actual.bytes, entry.bytes
                    ),
                });
            }
            if actual.sha256 != entry.sha256 {
                return Err(CheckpointError::Damaged {
                    dir: dir.to_path_buf(),
                    reason: format!("file `{name}` fails its SHA-256 checksum (corrupted)"),
                });
            }
        }
        Ok(())
    }
}
