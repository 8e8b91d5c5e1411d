//! What makes `reel preprocess` resumable without mixing runs: `preprocess.json` records the
//! settings and the clip list of the run that wrote the folder's shards, and a shard written
//! while some of its clips failed keeps a `data_<k>.failed.txt` beside it naming them.
//!
//! - A folder holding shards is resumed only with the same settings and the same clips (shard
//!   `k` holds the `k`-th run of `--rows-per-file` clips of the sorted list, so a clip added
//!   or removed would shift every later shard); the refusal names what differs.
//! - A folder without shards has nothing to protect: a run that stopped before its first
//!   shard (a mistyped `--vae`, say) does not block the corrected one.
//! - A shard with a `.failed.txt` is redone by the next run, so a caption written or a file
//!   repaired since is picked up; a shard without one is finished and skipped.
//!
//! Every file is written under a temporary name and renamed, the failure list before its
//! shard and removed after it, so a crash at any point leaves either the last good shard or
//! a shard that the next run redoes.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::Context;
use reel_core::io::{replace_file, tmp_sibling_target};
use reel_plugins::data::fastvideo::{write_fastvideo_parquet, FastVideoRecord};
use reel_plugins::data::negative;
use serde_json::Value;

/// File recording a preprocessing run's settings and clips, in the output folder.
pub const SETTINGS_FILE: &str = "preprocess.json";

/// Key of the clips' stamps ([`super::inputs::Item::stamp`]) in [`SETTINGS_FILE`]. Not a
/// setting: a clip or caption changed since its shard was written redoes that shard
/// ([`redo_changed`]), it does not refuse the folder.
pub const STAMPS: &str = "stamps";

/// Refuse to resume `out` when it holds shards written with other settings or clips than
/// `settings`. A folder without shards passes whatever its `preprocess.json` says.
pub fn check(out: &Path, settings: &Value) -> anyhow::Result<()> {
    if let Some(other) = foreign_parquet(out, 0) {
        anyhow::bail!(
            "{} holds {}, a parquet file `reel preprocess` did not write: a data set read from \
             the folder would mix it in; use another --out folder",
            out.display(),
            other.display()
        );
    }
    if !has_shards(out) {
        return Ok(());
    }
    let path = out.join(SETTINGS_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "{} holds data_*.parquet shards but no readable {SETTINGS_FILE}: use another --out \
             folder",
            out.display()
        )
    })?;
    let before: Value = serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: not JSON, so the shards beside it cannot be matched to their settings: \
                 use another --out folder (or delete the folder to start over)",
            path.display()
        )
    })?;
    let diffs = differences(&before, settings);
    anyhow::ensure!(
        diffs.is_empty(),
        "{} was written with other settings ({}); resume with the same ones or use another \
         --out folder",
        path.display(),
        diffs.join("; ")
    );
    Ok(())
}

/// Whether `out` records exactly `settings` (a run with these settings, the same models
/// included, wrote what is there); `false` when nothing readable is recorded.
pub fn recorded_as(out: &Path, settings: &Value) -> bool {
    std::fs::read_to_string(out.join(SETTINGS_FILE))
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .is_some_and(|before| differences(&before, settings).is_empty())
}

/// Write `settings` to `out`'s [`SETTINGS_FILE`], creating `out`; the temporary files a
/// killed run left there are removed (a shard's is as large as the shard).
pub fn record(out: &Path, settings: &Value) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    remove_temporaries(out);
    let text = serde_json::to_string_pretty(settings)?;
    let path = out.join(SETTINGS_FILE);
    replace_file(&path, text.as_bytes()).with_context(|| format!("cannot write {}", path.display()))
}

/// Mark for redoing each finished shard of `out` holding a clip whose stamp differs from the
/// one recorded when the shard was written (`shards[k]`: shard `k`'s clips as `(name,
/// stamp)`): its failure list names the changed clips, so this run redoes it, and so does the
/// next should this one stop first. Clips without a recorded stamp are not compared (folders
/// written before stamps). Returns the shards marked.
pub fn redo_changed(out: &Path, shards: &[Vec<(String, String)>]) -> anyhow::Result<usize> {
    let recorded: Value = std::fs::read_to_string(out.join(SETTINGS_FILE))
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default();
    let mut marked = 0;
    for (k, clips) in shards.iter().enumerate() {
        let shard = Shard::new(out, k);
        let changed: Vec<String> = clips
            .iter()
            .filter(|(name, stamp)| {
                let then = recorded[STAMPS][name.as_str()].as_str();
                then.is_some_and(|t| t != stamp)
            })
            .map(|(name, _)| format!("{name}: changed since its shard was written"))
            .collect();
        if changed.is_empty() || !shard.is_done() {
            continue;
        }
        let text = changed.join("\n") + "\n";
        replace_file(&shard.failed, text.as_bytes())
            .with_context(|| format!("cannot write {}", shard.failed.display()))?;
        marked += 1;
    }
    Ok(marked)
}

/// Remove the temporary files of what preprocessing writes into `out` (shards, failure lists,
/// the settings and the negative embedding) that a killed run left there.
fn remove_temporaries(out: &Path) {
    let ours = |name: &str| {
        name == SETTINGS_FILE || name == negative::FILE_NAME || name.starts_with("data_")
    };
    for entry in std::fs::read_dir(out).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if tmp_sibling_target(&name).is_some_and(ours) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// What differs between the recorded settings and this run's, one phrase per key, naming
/// the command-line flag; the clip lists as the clips added and removed.
pub fn differences(before: &Value, now: &Value) -> Vec<String> {
    let keys: BTreeSet<&String> = [before, now]
        .iter()
        .filter_map(|v| v.as_object())
        .flat_map(|o| o.keys())
        .filter(|k| k.as_str() != STAMPS)
        .collect();
    let none = Value::Null;
    keys.into_iter()
        .filter_map(|key| {
            let (a, b) = (
                before.get(key).unwrap_or(&none),
                now.get(key).unwrap_or(&none),
            );
            (a != b).then(|| match key.as_str() {
                "items" => clip_changes(a, b),
                "input" => format!("the input folder was {a}, now {b}"),
                _ => format!("--{} was {a}, now {b}", key.replace('_', "-")),
            })
        })
        .collect()
}

/// "clips: 2 added (x.gif, y.png), 1 removed (z.gif)", at most three names each.
fn clip_changes(before: &Value, now: &Value) -> String {
    let names = |v: &Value| -> BTreeSet<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    let (a, b) = (names(before), names(now));
    let list = |set: Vec<&String>, what: &str| {
        let shown: Vec<&str> = set.iter().take(3).map(|s| s.as_str()).collect();
        let more = if set.len() > 3 { ", ..." } else { "" };
        format!("{} {what} ({}{more})", set.len(), shown.join(", "))
    };
    let mut parts = Vec::new();
    let added: Vec<&String> = b.difference(&a).collect();
    if !added.is_empty() {
        parts.push(list(added, "added"));
    }
    let removed: Vec<&String> = a.difference(&b).collect();
    if !removed.is_empty() {
        parts.push(list(removed, "removed"));
    }
    if parts.is_empty() {
        parts.push("same names, another order".into());
    }
    format!("clips: {}", parts.join(", "))
}

/// A parquet file in `dir` (at any depth below it, as the data source reads them; `depth`
/// levels down already) other than the shards preprocessing writes at its top.
fn foreign_parquet(dir: &Path, depth: usize) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    for entry in entries.flatten() {
        let (path, name) = (
            entry.path(),
            entry.file_name().to_string_lossy().to_string(),
        );
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && depth < 8 {
            if let Some(found) = foreign_parquet(&path, depth + 1) {
                return Some(found);
            }
        } else if name.ends_with(".parquet") && !(depth == 0 && is_shard_name(&name)) {
            return Some(path);
        }
    }
    None
}

/// `data_<k>.parquet`, the name of a shard [`Shard::new`] gives.
fn is_shard_name(name: &str) -> bool {
    name.strip_prefix("data_")
        .and_then(|n| n.strip_suffix(".parquet"))
        .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether `out` holds any finished shard.
fn has_shards(out: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(out) else {
        return false;
    };
    entries
        .filter_map(Result::ok)
        .any(|e| is_shard_name(&e.file_name().to_string_lossy()))
}

/// Shard `k` of an output folder: its parquet file and the list of its clips that failed.
pub struct Shard {
    /// `data_<k>.parquet`.
    pub path: PathBuf,
    /// `data_<k>.failed.txt`, present while some of the shard's clips failed.
    pub failed: PathBuf,
}

impl Shard {
    /// Shard `k` of `out`.
    pub fn new(out: &Path, k: usize) -> Self {
        Self {
            path: out.join(format!("data_{k:05}.parquet")),
            failed: out.join(format!("data_{k:05}.failed.txt")),
        }
    }

    /// Written with every one of its clips (and whole: it ends with parquet's footer
    /// magic): the next run skips it.
    pub fn is_done(&self) -> bool {
        !self.failed.exists() && ends_with_parquet_magic(&self.path)
    }

    /// Write the shard's `records` (when there are any) and its `failures` (one line each):
    /// the failure list first, then the shard; a list left from an earlier run goes last.
    pub fn save(&self, records: &[FastVideoRecord], failures: &[String]) -> anyhow::Result<()> {
        if !failures.is_empty() {
            let text = failures.join("\n") + "\n";
            replace_file(&self.failed, text.as_bytes())
                .with_context(|| format!("cannot write {}", self.failed.display()))?;
        }
        if !records.is_empty() {
            write_fastvideo_parquet(&self.path, records, records.len())
                .with_context(|| format!("writing {}", self.path.display()))?;
        }
        if failures.is_empty() {
            match std::fs::remove_file(&self.failed) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("removing {}", self.failed.display()))
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Whether `path` is a file ending with parquet's footer magic (`PAR1`): a shard cut short
/// does not.
fn ends_with_parquet_magic(path: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let mut tail = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| {
            f.seek(SeekFrom::End(-4))?;
            f.read_exact(&mut tail)
        })
        .is_ok_and(|()| &tail == b"PAR1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn differences_name_the_flags_and_the_clips() {
        let before = json!({"height": 480, "text_len": 512, "input": "/a",
                            "items": ["a.gif", "b.gif", "c.gif"]});
        let now = json!({"height": 480, "text_len": 16, "input": "/a",
                         "items": ["a.gif", "c.gif", "d.png", "e.png", "f.png", "g.png"]});
        assert!(differences(&before, &before).is_empty());
        let d = differences(&before, &now);
        assert_eq!(
            d,
            [
                "clips: 4 added (d.png, e.png, f.png, ...), 1 removed (b.gif)",
                "--text-len was 512, now 16",
            ]
        );
        let d = differences(
            &json!({"input": "/a"}),
            &json!({"input": "/b", "fps": 16.0}),
        );
        assert_eq!(
            d,
            [
                "--fps was null, now 16.0",
                "the input folder was \"/a\", now \"/b\""
            ]
        );
    }

    #[test]
    fn a_folder_is_checked_only_once_it_holds_shards() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path();
        record(out, &json!({"height": 480})).unwrap();
        // No shard yet: other settings may take the folder over.
        check(out, &json!({"height": 16})).unwrap();
        std::fs::write(out.join("data_00000.parquet"), b"x").unwrap();
        check(out, &json!({"height": 480})).unwrap();
        let err = check(out, &json!({"height": 16})).unwrap_err().to_string();
        assert!(err.contains("--height was 480, now 16"), "{err}");
        std::fs::remove_file(out.join(SETTINGS_FILE)).unwrap();
        let err = check(out, &json!({"height": 480})).unwrap_err().to_string();
        assert!(err.contains("no readable preprocess.json"), "{err}");
    }

    /// Parquet files the data source would read beside the shards (at the top or below it)
    /// make the folder unusable; hidden temporary files a killed run left are removed when
    /// the folder is taken over.
    #[test]
    fn other_parquet_files_are_refused_and_stale_temporaries_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path();
        std::fs::write(out.join("data_00000.parquet"), b"PAR1").unwrap();
        record(out, &json!({"height": 480})).unwrap();
        check(out, &json!({"height": 480})).unwrap();
        for other in [
            "part-0.parquet",
            "old/train-0000.parquet",
            "old/data_00001.parquet",
        ] {
            let path = out.join(other);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, b"PAR1").unwrap();
            let err = check(out, &json!({"height": 480})).unwrap_err().to_string();
            assert!(
                err.contains(other) && err.contains("did not write"),
                "{err}"
            );
            std::fs::remove_file(&path).unwrap();
        }
        let stale = [
            ".data_00001.parquet.tmp4242",
            ".preprocess.json.tmp7",
            ".negative.safetensors.tmp9",
        ];
        for name in stale {
            std::fs::write(out.join(name), b"partial").unwrap();
        }
        std::fs::write(out.join(".notes.tmp1"), b"not ours").unwrap();
        record(out, &json!({"height": 480})).unwrap();
        for name in stale {
            assert!(!out.join(name).exists(), "{name} was left");
        }
        assert!(
            out.join(".notes.tmp1").exists(),
            "only preprocessing's own temporaries go"
        );
    }

    #[test]
    fn a_shard_with_failures_is_not_done_until_saved_without() {
        let tmp = tempfile::tempdir().unwrap();
        let shard = Shard::new(tmp.path(), 3);
        assert!(shard.path.ends_with("data_00003.parquet"));
        assert!(!shard.is_done());
        // Every clip failed: the list is written, no shard.
        shard.save(&[], &["a.gif: broken".into()]).unwrap();
        assert!(!shard.path.exists() && !shard.is_done());
        assert_eq!(
            std::fs::read_to_string(&shard.failed).unwrap(),
            "a.gif: broken\n"
        );
        // A shard written earlier with failures stays until redone (the bytes stand in for a
        // parquet file: its magic at both ends).
        std::fs::write(&shard.path, b"PAR1 rows PAR1").unwrap();
        assert!(!shard.is_done());
        shard.save(&[], &[]).unwrap();
        assert!(shard.is_done(), "no failures left: the list is removed");
        // A shard cut short (no footer) is not done: the next run writes it again.
        std::fs::write(&shard.path, b"PAR1 rows").unwrap();
        assert!(!shard.is_done());
        std::fs::write(&shard.path, b"PAR1 rows PAR1").unwrap();
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        assert_eq!(names, ["data_00003.parquet"], "no temporary file is left");
    }
}
