//! Paths compared as folders: two spellings of one folder (links, `.` and `..`, relative or
//! absolute) made equal, for checks such as "does this run folder lie in the data's folder".

use std::path::{Component, Path, PathBuf};

/// `path` made absolute with its links resolved as far as it exists (a run folder may not
/// exist yet), so that two spellings of one folder compare equal.
pub fn resolved(path: &Path) -> PathBuf {
    let parts: Vec<Component> = path.components().collect();
    for n in (0..=parts.len()).rev() {
        let prefix: PathBuf = parts[..n].iter().collect();
        let prefix = if n == 0 { PathBuf::from(".") } else { prefix };
        let Ok(real) = std::fs::canonicalize(&prefix) else {
            continue;
        };
        // The part that does not exist yet, its `..` taken lexically, as making the folders
        // would take them (`new/../data/run` is `data/run`).
        return push_lexically(real, &parts[n..]);
    }
    path.to_path_buf()
}

/// `path` made absolute as written: links are not resolved, `..` drops the name before it.
pub fn as_written(path: &Path) -> PathBuf {
    let Ok(full) = std::path::absolute(path) else {
        return path.to_path_buf();
    };
    let parts: Vec<_> = full.components().collect();
    push_lexically(PathBuf::new(), &parts)
}

/// `base` with `parts` pushed, `.` skipped and `..` popping the last name.
fn push_lexically(base: PathBuf, parts: &[Component]) -> PathBuf {
    parts.iter().fold(base, |mut p, part| {
        match part {
            Component::ParentDir => {
                p.pop();
            }
            Component::CurDir => {}
            part => p.push(part),
        }
        p
    })
}

#[cfg(test)]
mod tests {
    use super::{as_written, resolved};

    /// Two spellings of one folder, existing or not yet, compare equal; `..` after a folder
    /// that does not exist is taken as making the folders would take it.
    #[test]
    fn absolute_paths_resolve_what_exists_and_the_rest_lexically() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let real = std::fs::canonicalize(&data).unwrap();
        assert_eq!(resolved(&data), real);
        assert_eq!(
            resolved(&tmp.path().join("data/./run/a")),
            real.join("run/a")
        );
        assert_eq!(
            resolved(&tmp.path().join("absent/../data/run")),
            real.join("run")
        );
        assert_eq!(resolved(&tmp.path().join("data/x/..")), real);
        assert!(!resolved(&tmp.path().join("elsewhere/run")).starts_with(&real));
        // As written: a link stays, `..` and `.` fold.
        let written = as_written(&tmp.path().join("data/./link/../run"));
        assert_eq!(written, as_written(tmp.path()).join("data/run"));
        assert!(written.is_absolute());
        // A link inside the folder to another folder: resolved leaves the folder, as
        // written stays in it.
        #[cfg(unix)]
        {
            std::fs::create_dir(tmp.path().join("elsewhere")).unwrap();
            std::os::unix::fs::symlink(tmp.path().join("elsewhere"), data.join("link")).unwrap();
            let run = data.join("link/run");
            assert!(!resolved(&run).starts_with(&real));
            assert!(as_written(&run).starts_with(as_written(&data)));
        }
    }
}
