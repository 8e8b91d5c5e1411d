//! What makes `reel preprocess` resumable without mixing runs: `preprocess.json` records the
//! settings and the clip list of the run that wrote the folder's shards, and a shard written
//! while some of its clips failed keeps a `data_<k>.failed.txt` beside it naming them.
//!
//! - A folder holding shards is resumed only with the same settings and the same clips (shard
//!   `k` holds the `k`-th run of `--rows-per-file` clips of the sorted list, so a clip added
//!   or removed would shift every later shard); the refusal names what differs.
//! - A folder without shards has nothing to protect: a run that stopped before its first
//!   shard (a mistyped `--vae`, say) does not block the corrected one.
//! - A shard without a `.failed.txt` is finished and skipped. One with a list is skipped too
//!   (its failed clips left out again, without re-encoding the rest) unless a clip or caption
//!   of the shard changed since it was written, so a caption written or a file repaired since
//!   is picked up, or `--retry-failed` asks to try every failed clip again (a failure that
//!   may pass now: FFmpeg installed since, say).
//!
//! Every file is written under a temporary name and renamed. While a shard is rewritten its
//! failure list starts with [`UNFINISHED`], and the list is settled (or removed) only after
//! the shard, so a crash at any point leaves either the last good shard or a shard that the
//! next run redoes.

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

/// The first line of a shard's failure list while the shard is being rewritten: the shard
/// beside the list may not be the one it describes, so the next run redoes it.
pub const UNFINISHED: &str = "(the run writing this shard stopped before it was complete)";

/// Why a shard file without parquet's footer is redone.
const CUT_SHORT: &str = "it is not a whole parquet file (cut short)";

/// The end of a failure list's line naming a clip changed since its shard was written: the
/// next run redoes the shard.
const CHANGED: &str = ": changed since its shard was written";

/// The first line of a settled failure list (one this version wrote after its shard). A list
/// without it (written by an earlier version, whose lists did not always describe the shard
/// beside them) makes the next run redo the shard once.
pub const SETTLED: &str =
    "# clips left out of this shard; tried again when they or their captions change, or with \
     --retry-failed";

/// Mark for redoing each written shard of `out` (finished, or settled with failures) holding
/// a clip whose stamp differs from the one recorded when the shard was written
/// (`shards[k]`: shard `k`'s clips as `(name, stamp)`): its failure list names the changed
/// clips first, so this run redoes it, and so does the next should this one stop first.
/// Clips without a recorded stamp are not compared (folders written before stamps). Returns
/// the shards marked.
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
            .map(|(name, _)| format!("{name}{CHANGED}"))
            .collect();
        if changed.is_empty() || matches!(shard.state(clips.len()), ShardState::Redo(_)) {
            continue;
        }
        let earlier = std::fs::read_to_string(&shard.failed).unwrap_or_default();
        let text = changed.join("\n") + "\n" + &earlier;
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
    is_numbered(name, ".parquet")
}

/// `data_<k><suffix>`, `k` a number: a name [`Shard::new`] gives.
fn is_numbered(name: &str, suffix: &str) -> bool {
    name.strip_prefix("data_")
        .and_then(|n| n.strip_suffix(suffix))
        .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether `out` holds any shard or failure list (a shard whose clips all failed has only
/// its list, which names clips of the recorded run).
fn has_shards(out: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(out) else {
        return false;
    };
    entries.filter_map(Result::ok).any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        is_shard_name(&name) || is_numbered(&name, ".failed.txt")
    })
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

    /// Where the shard stands, for a shard of `clips` clips (see [`ShardState`]).
    pub fn state(&self, clips: usize) -> ShardState {
        let whole = ends_with_parquet_magic(&self.path);
        let listed = match std::fs::read_to_string(&self.failed) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return match (whole, self.path.exists()) {
                    (true, _) => ShardState::Done,
                    (false, true) => ShardState::Redo(CUT_SHORT.into()),
                    (false, false) => ShardState::Redo("not written yet".into()),
                };
            }
            Err(e) => {
                return ShardState::Redo(format!("cannot read {}: {e}", self.failed.display()))
            }
        };
        let lines: Vec<&str> = listed.lines().filter(|l| !l.is_empty()).collect();
        let redo = lines
            .iter()
            .find(|l| **l == UNFINISHED || l.ends_with(CHANGED));
        if let Some(why) = redo {
            return ShardState::Redo(why.to_string());
        }
        let Some((&SETTLED, failed)) = lines.split_first() else {
            return ShardState::Redo("its failure list was written by an earlier version".into());
        };
        // Settled: a whole shard of the clips that did not fail, or none when all did.
        match (whole, self.path.exists(), failed.len()) {
            (_, _, 0) => ShardState::Redo("its failure list names no clip".into()),
            (false, true, _) => ShardState::Redo(CUT_SHORT.into()),
            (true, _, n) if n < clips => ShardState::Failed(n),
            (false, false, n) if n >= clips => ShardState::Failed(clips),
            _ => ShardState::Redo("its failure list does not match the shard".into()),
        }
    }

    /// Write the shard's `records` and its `failures` (one line each). While the shard is
    /// written, its failure list (when there is or will be one) starts with [`UNFINISHED`];
    /// afterwards the list is settled, or removed when nothing failed. A shard with no
    /// records is removed (all its clips failed).
    pub fn save(&self, records: &[FastVideoRecord], failures: &[String]) -> anyhow::Result<()> {
        let write_list = |lines: &[&str]| {
            let text = lines.join("\n") + "\n";
            replace_file(&self.failed, text.as_bytes())
                .with_context(|| format!("cannot write {}", self.failed.display()))
        };
        let failures: Vec<&str> = failures.iter().map(String::as_str).collect();
        if !failures.is_empty() || self.failed.exists() {
            write_list(&[&[UNFINISHED][..], &failures].concat())?;
        }
        if records.is_empty() {
            remove_if_there(&self.path)?;
        } else {
            write_fastvideo_parquet(&self.path, records, records.len())
                .with_context(|| format!("writing {}", self.path.display()))?;
        }
        if failures.is_empty() {
            remove_if_there(&self.failed)
        } else {
            write_list(&[&[SETTLED][..], &failures].concat())
        }
    }
}

/// Where a shard stands at the start of a run.
#[derive(Debug, PartialEq)]
pub enum ShardState {
    /// Written whole with every one of its clips: skipped.
    Done,
    /// Written whole without the given number of clips, which failed (listed in its
    /// `.failed.txt`), none changed since: skipped unless `--retry-failed`.
    Failed(usize),
    /// To be written (again), for the reason given.
    Redo(String),
}

/// Remove the file `path` if there is one.
fn remove_if_there(path: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", path.display()))
        }
        _ => Ok(()),
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
        // A failure list alone (every clip of its shard failed) names the recorded clips: the
        // folder is held by those settings too.
        std::fs::write(out.join("data_00000.failed.txt"), "x\n").unwrap();
        let err = check(out, &json!({"height": 16})).unwrap_err().to_string();
        assert!(err.contains("--height was 480, now 16"), "{err}");
        std::fs::remove_file(out.join("data_00000.failed.txt")).unwrap();
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

    /// A one-row shard's record.
    fn record_row() -> FastVideoRecord {
        use reel_plugins::data::fastvideo::StoredTensor;
        FastVideoRecord {
            id: "00000000".into(),
            latent: StoredTensor::f32(&[0.5; 4], &[1, 1, 2, 2]),
            text_embedding: StoredTensor::f32(&[1.0; 3], &[1, 3]),
            caption: "a".into(),
            media: None,
        }
    }

    /// A shard's failure list decides whether the next run skips it: settled failures are
    /// left out again, a list marked unfinished (a crash mid-rewrite) or naming a changed
    /// clip redoes the shard, and a shard saved without failures is done.
    #[test]
    fn shard_states_follow_the_failure_list() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path();
        let shard = Shard::new(out, 1);
        assert!(shard.path.ends_with("data_00001.parquet"));
        assert_eq!(shard.state(2), ShardState::Redo("not written yet".into()));
        // Every clip failed: the list is settled, no shard is written.
        shard
            .save(&[], &["a.gif: broken".into(), "b.gif: broken".into()])
            .unwrap();
        assert!(!shard.path.exists());
        let listed = std::fs::read_to_string(&shard.failed).unwrap();
        assert_eq!(listed, format!("{SETTLED}\na.gif: broken\nb.gif: broken\n"));
        assert_eq!(shard.state(2), ShardState::Failed(2));
        // A list an earlier version wrote (no header) is not trusted: the shard is redone.
        std::fs::write(&shard.failed, "a.gif: broken\nb.gif: broken\n").unwrap();
        assert!(matches!(shard.state(2), ShardState::Redo(w) if w.contains("earlier version")));
        std::fs::write(&shard.failed, &listed).unwrap();
        // A list naming fewer clips than the shard holds, and no shard: not settled.
        assert!(matches!(shard.state(3), ShardState::Redo(_)));
        // One clip failed, the other written.
        shard
            .save(&[record_row()], &["a.gif: broken".into()])
            .unwrap();
        assert_eq!(shard.state(2), ShardState::Failed(1));
        // A rewrite that a crash cut short leaves its list marked: redone, whole file or not.
        std::fs::write(&shard.failed, format!("{UNFINISHED}\na.gif: broken\n")).unwrap();
        assert_eq!(shard.state(2), ShardState::Redo(UNFINISHED.into()));
        let settled = format!("{SETTLED}\na.gif: broken\n");
        // A whole shard beside a list naming every clip (as an earlier version could leave):
        // the list does not describe it.
        std::fs::write(&shard.failed, format!("{settled}b.gif: broken\n")).unwrap();
        assert!(matches!(shard.state(2), ShardState::Redo(_)));
        std::fs::write(&shard.failed, &settled).unwrap();
        // A clip changed since (its stamp differs from the recorded one) redoes the shard,
        // the earlier failures still listed; a shard not written yet is not marked.
        let mut settings = json!({"height": 480});
        settings[STAMPS] = json!({"a.gif": "s1", "b.gif": "s1", "c.gif": "s1"});
        record(out, &settings).unwrap();
        let clips = |a: &str| vec![("a.gif".into(), a.into()), ("b.gif".into(), "s1".into())];
        let shards = [vec![("c.gif".to_string(), "s2".to_string())], clips("s2")];
        assert_eq!(redo_changed(out, &shards).unwrap(), 1);
        let why = format!("a.gif{CHANGED}");
        assert_eq!(shard.state(2), ShardState::Redo(why.clone()));
        let listed = std::fs::read_to_string(&shard.failed).unwrap();
        assert_eq!(listed, format!("{why}\n{settled}"));
        assert!(!Shard::new(out, 0).failed.exists());
        // Saved without failures: the list goes and the shard is done.
        shard.save(&[record_row(), record_row()], &[]).unwrap();
        assert_eq!(shard.state(2), ShardState::Done);
        // A shard cut short (no footer) is redone.
        let bytes = std::fs::read(&shard.path).unwrap();
        std::fs::write(&shard.path, &bytes[..bytes.len() - 1]).unwrap();
        assert!(matches!(shard.state(2), ShardState::Redo(_)));
        // A redo in which every clip fails leaves no shard from before.
        shard
            .save(&[], &["a.gif: broken".into(), "b.gif: broken".into()])
            .unwrap();
        assert!(!shard.path.exists());
        let names: Vec<_> = std::fs::read_dir(out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(names.is_empty(), "temporary files left: {names:?}");
    }
}
