//! Files replaced whole. A file Reel writes for keeps (weights, data shards, media, a metrics
//! log rewritten on resume) is written to a hidden temporary sibling, synced to disk and then
//! renamed over its path: a crash, a full disk or a power cut leaves the previous file (or
//! none), never a cut one, and a failed write leaves no temporary file behind.
//!
//! Checkpoints use the same steps on whole folders (`crate::checkpoint`).

use std::io;
use std::path::{Path, PathBuf};

/// The temporary sibling of `path` that [`replace_file_with`] writes: `.<name>.tmp<pid>`,
/// hidden so that folder listings and data readers skip it, and one per process.
pub fn tmp_sibling(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy());
    path.with_file_name(format!(".{name}.tmp{}", std::process::id()))
}

/// The name of the file a [`tmp_sibling`] name stands for (`.<name>.tmp<pid>` gives
/// `<name>`), `None` for other names. A crash (a kill, a power cut) between the write and the
/// rename leaves such a file behind: whoever owns the folder can remove it.
pub fn tmp_sibling_target(file_name: &str) -> Option<&str> {
    let (name, pid) = file_name.strip_prefix('.')?.rsplit_once(".tmp")?;
    let pid_like = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
    (pid_like && !name.is_empty()).then_some(name)
}

/// Have `write` create [`tmp_sibling`]`(path)` (it is given that path), then sync that file,
/// rename it over `path` and sync the folder (best effort: not every platform syncs a
/// folder). On any failure the temporary file is removed and `path` is left as it was;
/// `io_error` turns the sync's or the rename's error into the caller's.
pub fn replace_file_with<E>(
    path: &Path,
    write: impl FnOnce(&Path) -> Result<(), E>,
    io_error: impl Fn(io::Error) -> E,
) -> Result<(), E> {
    let tmp = tmp_sibling(path);
    let result = write(&tmp).and_then(|()| publish(&tmp, path).map_err(&io_error));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Replace `path` with `bytes`, as [`replace_file_with`] does.
pub fn replace_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    replace_file_with(path, |tmp| std::fs::write(tmp, bytes), |e| e)
}

fn publish(tmp: &Path, path: &Path) -> io::Result<()> {
    std::fs::File::open(tmp)?.sync_all()?;
    std::fs::rename(tmp, path)?;
    let folder = path.parent().filter(|p| !p.as_os_str().is_empty());
    sync_dir(folder.unwrap_or(Path::new(".")));
    Ok(())
}

/// Remove what is at `path`: a folder with all it holds, or a file. A link is removed itself,
/// never what it leads to.
pub fn remove_any(path: &Path) -> io::Result<()> {
    if std::fs::symlink_metadata(path)?.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    }
}

/// Rename `new` (a folder or a file) to `path`, whatever is there first renamed to `aside`
/// (a leftover at `aside` removed before). If the second rename fails, what was set aside is
/// put back, so `path` is never left empty by an error; a death between the two renames
/// leaves it at `aside`, which the caller must treat as `path` until a new copy is in place.
/// The fault point `fault` (see [`crate::fault`]) lies between the renames. Returns whether
/// something was set aside: the caller removes `aside` once the folder is synced. `new` is
/// left where it was on an error.
pub fn rename_replacing(new: &Path, path: &Path, aside: &Path, fault: &str) -> io::Result<bool> {
    let replaced = std::fs::symlink_metadata(path).is_ok();
    if replaced {
        if std::fs::symlink_metadata(aside).is_ok() {
            remove_any(aside)?;
        }
        std::fs::rename(path, aside)?;
    }
    crate::fault::point(fault);
    if let Err(e) = std::fs::rename(new, path) {
        if replaced && std::fs::symlink_metadata(path).is_err() {
            let _ = std::fs::rename(aside, path);
        }
        return Err(e);
    }
    Ok(replaced)
}

/// fsync the folder `path` so that renames inside it are durable (best effort: not every
/// platform syncs a folder).
pub fn sync_dir(path: &Path) {
    if let Ok(dir) = std::fs::File::open(path) {
        let _ = dir.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_names_give_their_target() {
        let tmp = tmp_sibling(Path::new("out/data_00001.parquet"));
        let name = tmp.file_name().unwrap().to_str().unwrap();
        assert_eq!(tmp_sibling_target(name), Some("data_00001.parquet"));
        for other in [
            "data.parquet",
            ".hidden",
            ".x.tmp",
            ".x.tmpab",
            "..tmp12",
            ".a.tmp1b",
        ] {
            assert_eq!(tmp_sibling_target(other), None, "{other}");
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut n: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    }

    #[test]
    fn a_file_is_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.bin");
        replace_file(&p, b"first").unwrap();
        replace_file(&p, b"second, longer").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"second, longer");
        assert_eq!(
            names(dir.path()),
            vec!["a.bin"],
            "no temporary file is left"
        );
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.bin");
        replace_file(&p, b"good").unwrap();
        let failed = replace_file_with(
            &p,
            |tmp| {
                std::fs::write(tmp, b"half")?;
                Err(io::Error::other("disk full"))
            },
            |e| e,
        );
        assert_eq!(failed.unwrap_err().to_string(), "disk full");
        assert_eq!(std::fs::read(&p).unwrap(), b"good");
        assert_eq!(names(dir.path()), vec!["a.bin"]);
    }

    #[test]
    fn a_rename_that_fails_is_the_callers_error() {
        let dir = tempfile::tempdir().unwrap();
        // A folder where the file should go: the rename fails.
        let p = dir.path().join("taken");
        std::fs::create_dir_all(p.join("inside")).unwrap();
        let e = replace_file_with(
            &p,
            |tmp| std::fs::write(tmp, b"x").map_err(|e| e.to_string()),
            |e| format!("renaming: {e}"),
        )
        .unwrap_err();
        assert!(e.starts_with("renaming: "), "{e}");
        assert_eq!(names(dir.path()), vec!["taken"]);
    }

    #[test]
    fn remove_any_takes_folders_files_and_links_but_not_their_targets() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("folder/inner")).unwrap();
        std::fs::write(d.join("folder/inner/f"), b"x").unwrap();
        std::fs::write(d.join("file"), b"y").unwrap();
        std::fs::create_dir_all(d.join("kept")).unwrap();
        std::fs::write(d.join("kept/k"), b"z").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(d.join("kept"), d.join("link")).unwrap();
        for name in ["folder", "file", "link"] {
            if d.join(name).symlink_metadata().is_ok() {
                remove_any(&d.join(name)).unwrap();
            }
        }
        assert_eq!(names(d), vec!["kept"]);
        assert_eq!(names(&d.join("kept")), vec!["k"]);
        let missing = remove_any(&d.join("missing")).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
    }

    /// A folder in place is set aside and the new one renamed in; a stale folder at the
    /// aside name is cleared first; a second rename that fails puts the old folder back.
    #[test]
    fn rename_replacing_sets_aside_and_puts_back() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (new, path, aside) = (d.join("new"), d.join("path"), d.join("aside"));
        std::fs::create_dir_all(&new).unwrap();
        std::fs::write(new.join("v"), b"1").unwrap();
        assert!(!rename_replacing(&new, &path, &aside, "test-rename").unwrap());
        std::fs::create_dir_all(aside.join("stale")).unwrap();
        std::fs::create_dir_all(&new).unwrap();
        std::fs::write(new.join("v"), b"2").unwrap();
        assert!(rename_replacing(&new, &path, &aside, "test-rename").unwrap());
        assert_eq!(std::fs::read(path.join("v")).unwrap(), b"2");
        assert_eq!(std::fs::read(aside.join("v")).unwrap(), b"1");
        assert_eq!(names(d), vec!["aside", "path"]);
        // A `new` that is missing: the rename fails and the folder in place comes back.
        let e = rename_replacing(&d.join("gone"), &path, &aside, "test-rename").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert_eq!(std::fs::read(path.join("v")).unwrap(), b"2");
        assert_eq!(names(d), vec!["path"]);
    }

    #[test]
    fn the_temporary_file_is_hidden_and_per_process() {
        let t = tmp_sibling(Path::new("out/data_00001.parquet"));
        let name = t.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with(".data_00001.parquet.tmp"), "{name}");
        assert!(name.ends_with(&std::process::id().to_string()), "{name}");
        assert_eq!(t.parent(), Some(Path::new("out")));
    }
}
