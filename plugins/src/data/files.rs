//! Helpers shared by the file-backed sources: finding a data set's files, and validation
//! prompts taken from its first samples.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use reel_core::data::{DataError, DataSource, Prompt};

/// The captions and text conditions of the first `n` samples that load (validation prompts
/// of sources without a prompt list of their own); a sample that does not load is left out
/// with a warning naming its file and record.
pub fn first_prompts(source: &dyn DataSource, n: usize) -> Vec<Prompt> {
    (0..source.len().min(n))
        .filter_map(|i| {
            source
                .get(i)
                .inspect_err(|e| {
                    let line = format!("reel: warning: validation prompt {i} left out: {e}");
                    crate::callbacks::print_line(&line);
                })
                .ok()
        })
        .map(|s| Prompt {
            caption: s.caption,
            text: s.text,
        })
        .collect()
}

/// `path` itself when it is a file, else every file under the folder `path` (recursively,
/// hidden entries skipped) whose name ends in `.{ext}`, sorted by path so sample indices are
/// stable. Links are followed, except a link to a folder that holds it (a cycle); a file
/// reached by several paths is taken once, under the first of them in order. Errors name the
/// path: missing, unreadable, or holding no such file.
pub fn find_files(path: &Path, ext: &str) -> Result<Vec<PathBuf>, DataError> {
    let meta = std::fs::metadata(path).map_err(|e| DataError::File {
        file: path.to_path_buf(),
        reason: format!("cannot read the data path: {e}"),
    })?;
    if meta.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let unreadable = |dir: &Path, e: std::io::Error| DataError::File {
        file: dir.to_path_buf(),
        reason: format!("cannot list folder: {e}"),
    };
    let mut files = Vec::new();
    // Each folder to list with the canonical paths of the folders above it.
    let mut stack = vec![(path.to_path_buf(), Vec::<PathBuf>::new())];
    while let Some((dir, mut above)) = stack.pop() {
        let canonical = dir.canonicalize().map_err(|e| unreadable(&dir, e))?;
        if above.contains(&canonical) {
            continue;
        }
        above.push(canonical);
        for entry in std::fs::read_dir(&dir).map_err(|e| unreadable(&dir, e))? {
            let entry = entry.map_err(|e| unreadable(&dir, e))?;
            let p = entry.path();
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            if p.is_dir() {
                stack.push((p, above.clone()));
            } else if p.extension().is_some_and(|e| e == ext) {
                files.push(p);
            }
        }
    }
    files.sort();
    let mut seen = HashSet::new();
    // A dangling link keeps its own path (reading it names it).
    files.retain(|f| seen.insert(f.canonicalize().unwrap_or_else(|_| f.clone())));
    if files.is_empty() {
        return Err(DataError::Empty {
            source_name: path.display().to_string(),
            reason: format!("no .{ext} files under this folder"),
        });
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_files_recursively_in_path_order() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("b/inner")).unwrap();
        std::fs::create_dir_all(root.join(".hidden")).unwrap();
        for f in [
            "b/inner/x.parquet",
            "a.parquet",
            "b/y.parquet",
            "notes.txt",
            ".hidden/z.parquet",
        ] {
            std::fs::write(root.join(f), b"").unwrap();
        }
        let found = find_files(root, "parquet").unwrap();
        let names: Vec<_> = found
            .iter()
            .map(|p| p.strip_prefix(root).unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["a.parquet", "b/inner/x.parquet", "b/y.parquet"]);
        assert_eq!(
            find_files(&root.join("a.parquet"), "parquet")
                .unwrap()
                .len(),
            1
        );
        let err = find_files(&root.join("missing"), "parquet").unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
        let err = find_files(&root.join("b/inner"), "safetensors").unwrap_err();
        assert!(matches!(err, DataError::Empty { .. }), "{err}");
    }

    /// Links back up the tree (to the folder itself, and to it from below) neither loop nor
    /// repeat files; a folder elsewhere linked twice is followed, its files taken once, under
    /// the first path in order.
    #[cfg(unix)]
    #[test]
    fn linked_folders_are_listed_once() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let (root, other) = (dir.path().join("set"), dir.path().join("other"));
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        for f in [
            root.join("a.parquet"),
            root.join("sub/b.parquet"),
            other.join("c.parquet"),
        ] {
            std::fs::write(f, b"").unwrap();
        }
        symlink(".", root.join("self")).unwrap();
        symlink("..", root.join("sub/up")).unwrap();
        symlink(&other, root.join("linked")).unwrap();
        symlink(&other, root.join("sub/linked_again")).unwrap();
        let found = find_files(&root, "parquet").unwrap();
        let names: Vec<_> = found
            .iter()
            .map(|p| {
                p.strip_prefix(&root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(names, ["a.parquet", "linked/c.parquet", "sub/b.parquet"]);
    }
}
