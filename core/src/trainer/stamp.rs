//! Cheap identities of the weight files a run reads (`models.<role>.weights`), kept in each
//! checkpoint's `state.json`: a resume whose files changed under the same path (a teacher
//! replaced by another) says so, where the config fingerprint, which covers only the config's
//! text, cannot tell.
//!
//! A stamp is the file's size and a SHA-256 of its first and last MiB (the safetensors
//! header and the last tensors' bytes): reading a 5 GB file whole at every checkpoint would
//! cost seconds, and a stamp is the same on every machine, so two runs' checkpoints stay
//! byte-identical.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::checkpoint::sha256_hex;
use crate::config::LoadedConfig;

/// Bytes read from each end of a file.
const END: u64 = 1 << 20;

/// `size:sha256(first MiB ‖ last MiB)` of a file, `None` if it cannot be read.
fn file_stamp(path: &Path) -> Option<String> {
    let mut f = File::open(path).ok()?;
    let size = f.metadata().ok()?.len();
    let mut bytes = Vec::with_capacity((2 * END).min(size) as usize);
    (&mut f).take(END).read_to_end(&mut bytes).ok()?;
    if size > END {
        f.seek(SeekFrom::Start(size.saturating_sub(END).max(END)))
            .ok()?;
        f.take(END).read_to_end(&mut bytes).ok()?;
    }
    Some(format!("{size}:{}", sha256_hex(&bytes)))
}

/// The stamp of a weights file, or of a folder (a diffusers `transformer/`): its files'
/// names and stamps, in name order, hashed together.
pub fn weights_stamp(path: &Path) -> Option<String> {
    if !path.is_dir() {
        return file_stamp(path);
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
                file_stamp(&path.join(n))?
            ))
        })
        .collect();
    Some(sha256_hex(parts.join("\n").as_bytes()))
}

/// Stamps of the `weights` whose values a checkpoint does not hold, by role name: a frozen
/// role's and an adapter role's base (a role trained in full gets every value back from the
/// checkpoint, whatever its file holds now).
pub fn role_weight_stamps(loaded: &LoadedConfig) -> BTreeMap<String, String> {
    let roles = loaded.config.models.iter();
    roles
        .filter(|(_, role)| !role.trainable || role.adapter.is_some())
        .filter_map(|(name, role)| {
            let path = loaded.resolve(role.weights.as_ref()?);
            Some((name.clone(), weights_stamp(&path)?))
        })
        .collect()
}

/// The roles whose weights stamp in `now` differs from the checkpoint's `then` (a role the
/// checkpoint has no stamp for is not compared: checkpoints from before stamps).
pub fn changed_weights(
    then: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
) -> Vec<String> {
    let differs = |(name, stamp): (&String, &String)| now.get(name).is_some_and(|s| s != stamp);
    then.iter()
        .filter(|e| differs(*e))
        .map(|(n, _)| n.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_see_changes_at_either_end_and_folders_by_file() {
        let tmp = tempfile::tempdir().unwrap();
        let f = tmp.path().join("w.safetensors");
        let mut bytes = vec![7u8; 3 * END as usize];
        std::fs::write(&f, &bytes).unwrap();
        let a = weights_stamp(&f).unwrap();
        assert_eq!(weights_stamp(&f).unwrap(), a, "deterministic");
        bytes[3] = 8;
        std::fs::write(&f, &bytes).unwrap();
        let b = weights_stamp(&f).unwrap();
        assert_ne!(a, b, "a change in the header");
        let last = bytes.len() - 2;
        bytes[last] = 9;
        std::fs::write(&f, &bytes).unwrap();
        assert_ne!(
            weights_stamp(&f).unwrap(),
            b,
            "a change in the last tensors"
        );
        std::fs::write(&f, b"short").unwrap();
        assert!(weights_stamp(&f).unwrap().starts_with("5:"));
        assert_eq!(weights_stamp(&tmp.path().join("missing")), None);
        let folder = weights_stamp(tmp.path()).unwrap();
        std::fs::write(tmp.path().join("config.json"), b"{}").unwrap();
        assert_ne!(weights_stamp(tmp.path()).unwrap(), folder);

        let then = BTreeMap::from([("teacher".to_string(), a.clone()), ("old".into(), a)]);
        let now = BTreeMap::from([("teacher".to_string(), b)]);
        assert_eq!(changed_weights(&then, &now), ["teacher"]);
        assert!(changed_weights(&now, &now).is_empty());
    }
}
