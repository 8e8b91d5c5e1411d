//! Publishing a run's final weights: `<run>/final/`, replaced as a whole folder.

use std::fs;
use std::path::{Path, PathBuf};

use super::{io_err, state, TrainError};
use crate::checkpoint::TrainerState;

/// Copy the final weights (and EMA shadows) of every role to `<run>/final/`, a stable path other
/// configs can name (e.g. a DMD2 teacher:
/// `weights = "runs/quickstart/final/student.ema.safetensors"`), with the data shapes the
/// checkpoint recorded ([`state::SHAPES_FILE`]).
///
/// The new folder is filled and synced beside the old one (`.final.tmp-<pid>`; its weights
/// are hard links to the checkpoint's files, whose contents never change, or copies where a
/// link cannot be made), then swapped in with two renames, so `final/` never holds the files
/// of two checkpoints, nor files an earlier publish left that this checkpoint lacks (an EMA no
/// longer kept). A `final` that is a link to a folder elsewhere is swapped where it leads, and
/// stays a link. A process that dies between the renames leaves no `final/`, but the
/// checkpoint it copies is intact and the next publish writes it again; leftovers of such a
/// death are removed after the next swap.
pub(super) fn publish_final(checkpoint: &Path, run_dir: &Path) -> Result<(), TrainError> {
    let link = run_dir.join("final");
    let final_dir = match fs::symlink_metadata(&link) {
        Ok(m) if m.file_type().is_symlink() => {
            fs::canonicalize(&link).map_err(|e| io_err(&link, e))?
        }
        _ => link,
    };
    let (folder, name) = match (final_dir.parent(), final_dir.file_name()) {
        (Some(folder), Some(name)) => (folder.to_path_buf(), name.to_string_lossy().into_owned()),
        _ => return Err(io_err(&final_dir, "not a folder that can be replaced")),
    };
    let pid = std::process::id();
    let staged = folder.join(format!(".{name}.tmp-{pid}"));
    let old = folder.join(format!(".{name}.old-{pid}"));
    let filled = fill(&staged, checkpoint);
    if filled.is_err() {
        let _ = fs::remove_dir_all(&staged);
        return filled;
    }
    swap(&staged, &final_dir, &old)?;
    crate::io::sync_dir(&folder);
    remove_leftovers(&folder, &name);
    Ok(())
}

/// Rename `staged` to `final_dir`, the folder there first to `old`; on an error the old folder
/// is put back and `staged` removed.
fn swap(staged: &Path, final_dir: &Path, old: &Path) -> Result<(), TrainError> {
    let result = crate::io::rename_replacing(staged, final_dir, old, "final-rename");
    if let Err(e) = result {
        let _ = fs::remove_dir_all(staged);
        return Err(io_err(final_dir, e));
    }
    Ok(())
}

/// `staged` made afresh with the checkpoint's weights and shapes, each file and the folder
/// synced.
fn fill(staged: &Path, checkpoint: &Path) -> Result<(), TrainError> {
    if fs::symlink_metadata(staged).is_ok() {
        fs::remove_dir_all(staged).map_err(|e| io_err(staged, e))?;
    }
    fs::create_dir_all(staged).map_err(|e| io_err(staged, e))?;
    for (name, from) in published_files(checkpoint)? {
        let to = staged.join(&name);
        if fs::hard_link(&from, &to).is_err() {
            fs::copy(&from, &to).map_err(|e| io_err(&to, e))?;
            fs::File::open(&to)
                .and_then(|f| f.sync_all())
                .map_err(|e| io_err(&to, e))?;
        }
    }
    // A checkpoint that recorded no shapes publishes none.
    if let Some(spec) = TrainerState::read(checkpoint)
        .ok()
        .and_then(|s| s.data_spec)
    {
        state::write_shapes(staged, &spec)?;
    }
    crate::io::sync_dir(staged);
    Ok(())
}

/// The checkpoint's weight and EMA files (not the optimizer's), `(name, path)`; an entry that
/// cannot be read is an error, not a file left out.
fn published_files(checkpoint: &Path) -> Result<Vec<(String, PathBuf)>, TrainError> {
    let mut out = vec![];
    for e in fs::read_dir(checkpoint).map_err(|e| io_err(checkpoint, e))? {
        let e = e.map_err(|e| io_err(checkpoint, e))?;
        let name = e.file_name().to_string_lossy().to_string();
        if name.ends_with(".safetensors") && !name.contains(".optim.") {
            out.push((name, e.path()));
        }
    }
    Ok(out)
}

/// Remove the staged and replaced folders of earlier publishes of `name` in `folder` (any
/// process's).
fn remove_leftovers(folder: &Path, name: &str) {
    let Ok(entries) = fs::read_dir(folder) else {
        return;
    };
    let (tmp, old) = (format!(".{name}.tmp-"), format!(".{name}.old-"));
    for e in entries.flatten() {
        let entry = e.file_name().to_string_lossy().to_string();
        if entry.starts_with(&tmp) || entry.starts_with(&old) {
            let _ = crate::io::remove_any(&e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint folder holding `files` (each file's bytes are its name).
    fn checkpoint(root: &Path, step: &str, files: &[&str]) -> PathBuf {
        let dir = root.join(step);
        fs::create_dir_all(&dir).unwrap();
        for f in files {
            fs::write(dir.join(f), f.as_bytes()).unwrap();
        }
        dir
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        v.sort();
        v
    }

    /// A second publish replaces the whole folder: a file the newer checkpoint lacks (an EMA
    /// no longer kept) is gone, the optimizer state is never published, and no staging or
    /// replaced folder is left in the run.
    #[test]
    fn a_publish_replaces_the_whole_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path();
        let first = ["student.safetensors", "student.ema.safetensors"];
        let a = checkpoint(
            run,
            "a",
            &[&first[..], &["student.optim.safetensors"]].concat(),
        );
        publish_final(&a, run).unwrap();
        assert_eq!(
            names(&run.join("final")),
            ["student.ema.safetensors", "student.safetensors"]
        );
        let b = checkpoint(run, "b", &["student.safetensors", "critic.safetensors"]);
        fs::write(b.join("student.safetensors"), b"newer").unwrap();
        publish_final(&b, run).unwrap();
        let fin = run.join("final");
        assert_eq!(names(&fin), ["critic.safetensors", "student.safetensors"]);
        assert_eq!(fs::read(fin.join("student.safetensors")).unwrap(), b"newer");
        assert_eq!(names(run), ["a", "b", "final"]);
    }

    /// A `final` that links to a folder elsewhere stays a link, and the folder it leads to
    /// is what is replaced.
    #[cfg(unix)]
    #[test]
    fn a_linked_final_folder_is_replaced_where_it_leads() {
        let tmp = tempfile::tempdir().unwrap();
        let (run, store) = (tmp.path().join("run"), tmp.path().join("store"));
        fs::create_dir_all(store.join("model")).unwrap();
        fs::write(store.join("model/stale.safetensors"), b"old").unwrap();
        fs::create_dir_all(&run).unwrap();
        std::os::unix::fs::symlink(store.join("model"), run.join("final")).unwrap();
        let a = checkpoint(&run, "a", &["student.safetensors"]);
        publish_final(&a, &run).unwrap();
        let link = fs::symlink_metadata(run.join("final")).unwrap();
        assert!(link.file_type().is_symlink());
        assert_eq!(names(&store.join("model")), ["student.safetensors"]);
        assert_eq!(names(&store), ["model"]);
    }

    /// A publish that cannot read its checkpoint leaves the previous `final/` as it was, and
    /// no staging folder; a death between the renames (a replaced folder left, no `final/`)
    /// is cleaned up by the next publish.
    #[test]
    fn a_failed_publish_keeps_the_previous_one() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path();
        let a = checkpoint(run, "a", &["student.safetensors"]);
        publish_final(&a, run).unwrap();
        assert!(publish_final(&run.join("missing"), run).is_err());
        assert_eq!(names(&run.join("final")), ["student.safetensors"]);
        assert_eq!(names(run), ["a", "final"]);
        fs::rename(run.join("final"), run.join(".final.old-1")).unwrap();
        publish_final(&a, run).unwrap();
        assert_eq!(names(run), ["a", "final"]);
    }
}
