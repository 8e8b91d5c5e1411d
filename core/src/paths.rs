//! Paths compared as folders: two spellings of one folder (links, `.` and `..`, relative or
//! absolute) made equal, and whether a path lies in a folder as a search of it would reach
//! it, for checks such as "does this run folder lie in the data's folder".

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

/// Whether `path`, followed from the root one name at a time, enters `folder` and stays in
/// it, as a search of `folder` that follows links would reach it: a name below a folder
/// inside stays inside even through a link (`data/runs -> /scratch`: `data/runs/a` lies in
/// `data`), while a `..` is taken where its links lead (`data/link/../a` with
/// `data/link -> /scratch/x` is `/scratch/a`, outside). Parts that do not exist yet are
/// taken as making the folders would take them.
pub fn lies_in(path: &Path, folder: &Path) -> bool {
    let Ok(full) = std::path::absolute(path) else {
        return resolved(path).starts_with(resolved(folder));
    };
    let folder = resolved(folder);
    let mut prefix = PathBuf::new();
    let mut inside = false;
    for part in full.components() {
        prefix.push(part);
        // Descending from a folder inside keeps inside; anything else is judged afresh.
        if !(inside && matches!(part, Component::Normal(_))) {
            inside = resolved(&prefix).starts_with(&folder);
        }
    }
    inside
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
    use super::{lies_in, resolved};

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
        // A link inside the folder to another folder: the path through it lies in the
        // folder (a search following links reaches it), a `..` after it does not.
        #[cfg(unix)]
        {
            let elsewhere = tmp.path().join("elsewhere");
            std::fs::create_dir(&elsewhere).unwrap();
            std::os::unix::fs::symlink(&elsewhere, data.join("link")).unwrap();
            assert!(!resolved(&data.join("link/run")).starts_with(&real));
            assert!(lies_in(&data.join("link/run"), &data));
            assert!(!lies_in(&data.join("link/../../outside"), &data));
            assert!(!lies_in(&elsewhere.join("run"), &data));
        }
        assert!(lies_in(&tmp.path().join("absent/../data/run"), &data));
        assert!(lies_in(&data, &data));
        assert!(!lies_in(&tmp.path().join("data-2/run"), &data));
        assert!(!lies_in(&data.join("../run"), &data));
    }
}
