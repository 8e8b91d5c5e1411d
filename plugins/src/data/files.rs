//! Helpers shared by the file-backed sources: finding a data set's files, and validation
//! prompts taken from its first samples.

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
/// stable. Errors name the path: missing, unreadable, or holding no such file.
pub fn find_files(path: &Path, ext: &str) -> Result<Vec<PathBuf>, DataError> {
    let meta = std::fs::metadata(path).map_err(|e| DataError::File {
        file: path.to_path_buf(),
        reason: format!("cannot read the data path: {e}"),
    })?;
    if meta.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut out = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| DataError::File {
            file: dir.clone(),
            reason: format!("cannot list folder: {e}"),
        })?;
        for entry in entries {
            let entry = entry.map_err(|e| DataError::File {
                file: dir.clone(),
                reason: format!("cannot list folder: {e}"),
            })?;
            let p = entry.path();
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == ext) {
                out.push(p);
            }
        }
    }
    if out.is_empty() {
        return Err(DataError::Empty {
            source_name: path.display().to_string(),
            reason: format!("no .{ext} files under this folder"),
        });
    }
    out.sort();
    Ok(out)
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
}
