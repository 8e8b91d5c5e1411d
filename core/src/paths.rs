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

/// A link inside `folder` (hidden names skipped, as the data's file search skips them) to a
/// folder that holds `path` or is `path`: a search of `folder` that follows links reaches
/// `path` through it, although `path` itself names a place outside (`data/runs -> /scratch`
/// holds `/scratch/a`). `None` where there is none. Links are followed as the search follows
/// them, each folder listed once and its entries in name order, so that the link named is the
/// same on every call; files cost no more than their listing, and a folder that cannot be
/// listed is passed by (the search itself names it).
pub fn link_reaching(folder: &Path, path: &Path) -> Option<PathBuf> {
    let target = resolved(path);
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![folder.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if !dir.canonicalize().is_ok_and(|real| seen.insert(real)) {
            continue;
        }
        // Folders and links only: a data folder's many files are passed by unlisted.
        let mut entries: Vec<(PathBuf, bool)> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|e| {
                let kind = e.file_type().ok()?;
                (kind.is_dir() || kind.is_symlink()).then(|| (e.path(), kind.is_symlink()))
            })
            .collect();
        entries.sort();
        let mut below = Vec::new();
        for (p, link) in entries {
            if !link {
                below.push(p);
                continue;
            }
            match p.canonicalize() {
                Ok(real) if real.is_dir() && target.starts_with(&real) => return Some(p),
                Ok(real) if real.is_dir() => below.push(p),
                _ => {}
            }
        }
        // Listed next in name order.
        stack.extend(below.into_iter().rev());
    }
    None
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
    use super::{lies_in, link_reaching, resolved};

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
        // The same folder named by its own path: the link that reaches it is found.
        #[cfg(unix)]
        {
            let elsewhere = tmp.path().join("elsewhere");
            assert_eq!(
                link_reaching(&data, &elsewhere.join("run")),
                Some(data.join("link"))
            );
            assert_eq!(link_reaching(&data, &elsewhere), Some(data.join("link")));
            assert_eq!(link_reaching(&data, &tmp.path().join("run")), None);
            // Found below a real folder and through a link to a link; a link back up loops
            // not, and hidden names are passed by as the search passes them.
            let deeper = tmp.path().join("deeper");
            std::fs::create_dir_all(deeper.join("runs")).unwrap();
            std::fs::create_dir_all(data.join("sub")).unwrap();
            std::os::unix::fs::symlink(&data, data.join("sub/up")).unwrap();
            std::os::unix::fs::symlink(&deeper, elsewhere.join("on")).unwrap();
            let run = deeper.join("runs/a");
            assert_eq!(link_reaching(&data, &run), Some(data.join("link/on")));
            // Of two links that reach it, the first in name order is named, every time.
            let other = tmp.path().join("other");
            std::fs::create_dir_all(other.join("runs")).unwrap();
            for name in ["zz", "mm"] {
                std::os::unix::fs::symlink(&other, data.join(name)).unwrap();
            }
            let run = other.join("runs/a");
            for _ in 0..3 {
                assert_eq!(link_reaching(&data, &run), Some(data.join("mm")));
            }
            std::fs::create_dir_all(data.join(".hidden")).unwrap();
            std::os::unix::fs::symlink(tmp.path(), data.join(".hidden/all")).unwrap();
            assert_eq!(link_reaching(&data, &tmp.path().join("run")), None);
        }
        assert!(lies_in(&data, &data));
        assert!(!lies_in(&tmp.path().join("data-2/run"), &data));
        assert!(!lies_in(&data.join("../run"), &data));
    }
}
