//! Finding the clips of a `reel preprocess` input folder and their captions.
//!
//! Every entry of the folder is one item: a video (decoded by FFmpeg), a GIF, a PNG or JPEG
//! image, or a sub-folder of PNG or JPEG frames; other files (but captions) are listed on one
//! line as left out. A caption comes from, in order: the `--captions` list
//! (JSON or CSV), a sidecar `<name>.txt` beside the item (for a frame folder also
//! `<folder>/caption.txt`). Items are sorted by path, so shard `k` always holds the same
//! items and an interrupted run resumes where it stopped. The output folder, when it lies
//! inside the input folder, is not an item.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use reel_core::checkpoint::sha256_hex;
use reel_core::io::content_stamp;
use reel_plugins::media::decode::MediaKind;

/// One clip to preprocess.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// The file or frame folder.
    pub path: PathBuf,
    /// What it holds.
    pub kind: MediaKind,
    /// Its caption, or why there is none.
    pub caption: Result<String, String>,
}

impl Item {
    /// What a finished shard must still match to stay: the clip's [`content_stamp`] (a
    /// frame folder's over its files) and its caption's hash.
    pub fn stamp(&self) -> String {
        let media = content_stamp(&self.path, 64 << 10).unwrap_or_default();
        let caption = match &self.caption {
            Ok(text) => sha256_hex(text.as_bytes())[..16].to_string(),
            Err(_) => "none".into(),
        };
        format!("{media}/{caption}")
    }

    /// The file or folder name (caption lists, `preprocess.json` and FastVideo's
    /// `file_name` column key clips by it).
    pub fn name(&self) -> String {
        self.path
            .file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into())
    }
}

/// The items of `dir`, sorted by path, captioned from `list` (a caption file) or sidecars;
/// `out` (the output folder) is left out. Names in `list` that match no item are reported
/// on one line.
pub fn discover(dir: &Path, list: Option<&Path>, out: &Path) -> anyhow::Result<Vec<Item>> {
    let listed = match list {
        Some(p) => read_caption_list(p)?,
        None => BTreeMap::new(),
    };
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
    let out = std::fs::canonicalize(out).ok();
    // Hidden entries (`.git/`, macOS's `._clip.mp4`) are not clips.
    let hidden = |p: &Path| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with('.'))
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| !hidden(p))
        .filter(|p| out.is_none() || std::fs::canonicalize(p).ok() != out)
        .collect();
    paths.sort();
    let (mut items, mut others) = (vec![], vec![]);
    for path in paths {
        match MediaKind::of(&path) {
            Some(kind) => items.push(Item {
                caption: caption_of(&path, kind, &listed),
                path,
                kind,
            }),
            None => others.push(path),
        }
    }
    let left_out = not_clips(others, list);
    if let Some(first) = left_out.first() {
        eprintln!(
            "reel: left out {} file{} of {} that no reader takes (the first: {}); reel \
             preprocess reads videos (with FFmpeg), GIFs, PNG and JPEG images and folders of \
             PNG or JPEG frames",
            left_out.len(),
            if left_out.len() == 1 { "" } else { "s" },
            dir.display(),
            first.display()
        );
    }
    anyhow::ensure!(
        !items.is_empty(),
        "{}: no videos, GIFs, PNG or JPEG images or frame folders found",
        dir.display()
    );
    let stray = unmatched(&listed, &items);
    if let (Some(list), Some(first)) = (list, stray.first()) {
        eprintln!(
            "reel: {} names in {} match no clip in {} (the first: {first})",
            stray.len(),
            list.display(),
            dir.display()
        );
    }
    Ok(items)
}

/// Refuse a folder whose items would encode to two latent shapes: an image is one frame,
/// every other item `frames` frames, and a data set holds one shape (the data sources
/// refuse a record of another, possibly hours into a run). `dir` names the folder.
pub fn one_shape(dir: &Path, items: &[Item], frames: usize) -> anyhow::Result<()> {
    let (images, clips): (Vec<&Item>, Vec<&Item>) =
        items.iter().partition(|i| i.kind == MediaKind::Image);
    let (Some(image), Some(clip)) = (images.first(), clips.first()) else {
        return Ok(());
    };
    anyhow::ensure!(
        frames == 1,
        "{}: {} image{} (one frame, e.g. {}) and {} clip{} ({frames} frames, e.g. {}) would \
         make latents of two shapes, and a data set holds one: preprocess them into separate \
         --out folders, or pass --frames 1 to take one frame of every clip",
        dir.display(),
        images.len(),
        if images.len() == 1 { "" } else { "s" },
        image.name(),
        clips.len(),
        if clips.len() == 1 { "" } else { "s" },
        clip.name(),
    );
    Ok(())
}

/// The files of `others` (entries of the input folder that are not media) that are not
/// captions either: not a sidecar `.txt`, not the caption list `list`.
fn not_clips(others: Vec<PathBuf>, list: Option<&Path>) -> Vec<PathBuf> {
    let list = list.and_then(|l| std::fs::canonicalize(l).ok());
    others
        .into_iter()
        .filter(|p| {
            let sidecar = p.extension().is_some_and(|e| e.eq_ignore_ascii_case("txt"));
            !sidecar && (list.is_none() || std::fs::canonicalize(p).ok() != list)
        })
        .collect()
}

/// The names of `listed` that no item has.
fn unmatched(listed: &BTreeMap<String, String>, items: &[Item]) -> Vec<String> {
    let names: std::collections::BTreeSet<String> = items.iter().map(Item::name).collect();
    listed
        .keys()
        .filter(|k| !names.contains(*k))
        .cloned()
        .collect()
}

/// The caption of `path`: from the list (keyed by file name), else a sidecar file.
fn caption_of(
    path: &Path,
    kind: MediaKind,
    listed: &BTreeMap<String, String>,
) -> Result<String, String> {
    let name = path.file_name().map(|n| n.to_string_lossy().to_string());
    if let Some(c) = name.as_ref().and_then(|n| listed.get(n)) {
        return Ok(c.clone());
    }
    // A folder's name may hold a dot (`scene.001`): its sidecar is the whole name + `.txt`.
    let sidecars = match kind {
        MediaKind::FrameFolder => vec![
            path.join("caption.txt"),
            PathBuf::from({
                let mut name = path.as_os_str().to_owned();
                name.push(".txt");
                name
            }),
        ],
        _ => vec![path.with_extension("txt")],
    };
    for s in &sidecars {
        // A named pipe would wait for a writer forever.
        if reel_core::io::is_special(s) {
            return Err(format!("{} is not a regular file", s.display()));
        }
        let bytes = match std::fs::read(s) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            // A frame folder's `caption.txt` may be missing in another way (`<folder>.txt`).
            Err(_) if s.is_dir() => continue,
            Err(e) => return Err(format!("cannot read {}: {e}", s.display())),
        };
        let Ok(text) = String::from_utf8(bytes) else {
            return Err(format!("{} is not UTF-8 text", s.display()));
        };
        // A byte-order mark (Windows editors write one) is not part of the caption.
        let text = text.trim_start_matches('\u{feff}').trim();
        if text.is_empty() {
            return Err(format!("{} is empty", s.display()));
        }
        return Ok(text.to_string());
    }
    Err(format!(
        "no caption: write {} or list it in --captions",
        sidecars[0].display()
    ))
}

/// A caption list: JSON (`[{"path": "a.mp4", "caption": "..."}]`; FastVideo's
/// `{"path": .., "cap": [".."]}` rows work too) or CSV with a header naming `path` (or
/// `file_name`) and `caption` (or `cap`) columns. Keys are file names; captions are trimmed.
/// An empty caption or a file name listed twice is an error naming the list and the record.
pub fn read_caption_list(path: &Path) -> anyhow::Result<BTreeMap<String, String>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let text = text.trim_start_matches('\u{feff}');
    let is_json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    // Records are numbered as the readers number them: JSON from 0, CSV rows from 1.
    let (rows, first) = if is_json {
        (json_rows(text), 0)
    } else {
        (csv_rows(text), 1)
    };
    let rows = rows.map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let mut listed = BTreeMap::new();
    for (i, (p, caption)) in rows.into_iter().enumerate() {
        let record = i + first;
        let name = Path::new(&p)
            .file_name()
            .map_or(p.clone(), |n| n.to_string_lossy().to_string());
        let caption = caption.trim();
        anyhow::ensure!(
            !caption.is_empty(),
            "{}: record {record}: the caption of {p} is empty",
            path.display()
        );
        anyhow::ensure!(
            listed.insert(name.clone(), caption.to_string()).is_none(),
            "{}: record {record}: {p} names a file named {name} again (items are matched by \
             file name)",
            path.display()
        );
    }
    Ok(listed)
}

fn json_rows(text: &str) -> Result<Vec<(String, String)>, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let rows = value.as_array().ok_or("expected a JSON array of objects")?;
    (rows.iter().enumerate())
        .map(|(i, row)| json_row(row).map_err(|e| format!("record {i}: {e}")))
        .collect()
}

/// One JSON record's `(path, caption)`; what is missing or of the wrong type is named.
fn json_row(row: &serde_json::Value) -> Result<(String, String), String> {
    use serde_json::Value;
    if !row.is_object() {
        return Err(format!(
            "expected an object with `path` and `caption`, found {}",
            json_kind(row)
        ));
    }
    let field = |names: &[&'static str]| names.iter().find_map(|&n| Some((n, row.get(n)?)));
    let path = match field(&["path", "file_name"]) {
        Some((_, Value::String(p))) => p.clone(),
        Some((name, v)) => return Err(format!("`{name}` is {}, expected a string", json_kind(v))),
        None => return Err("expected `path` (or `file_name`) and `caption` (or `cap`)".into()),
    };
    match field(&["caption", "cap"]) {
        Some((_, Value::String(c))) => Ok((path, c.clone())),
        Some((_, Value::Array(a))) if a.first().is_some_and(Value::is_string) => {
            Ok((path, a[0].as_str().unwrap_or_default().to_string()))
        }
        Some((name, v)) => Err(format!(
            "`{name}` of {path} is {}, expected a string (or, as FastVideo's `cap`, a list of \
             strings)",
            json_kind(v)
        )),
        None => Err(format!("{path} has no `caption` (or `cap`)")),
    }
}

/// What a JSON value is, for an error: `the number 12`, `an empty list`, ...
fn json_kind(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(_) => "a string".into(),
        Value::Array(a) if a.is_empty() => "an empty list".into(),
        Value::Array(_) => "a list whose first item is not a string".into(),
        Value::Object(_) => "an object".into(),
    }
}

fn csv_rows(text: &str) -> Result<Vec<(String, String)>, String> {
    if let Some(record) = unclosed_quote(text) {
        // The csv reader would end the field at the end of the file and take every line
        // after the quote as one caption.
        return Err(format!(
            "record {record}: a quoted field is never closed (a missing `\"`)"
        ));
    }
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let headers = reader.headers().map_err(|e| e.to_string())?.clone();
    let col = |names: &[&str]| {
        let named = |h: &str| names.iter().any(|n| h.trim().eq_ignore_ascii_case(n));
        headers.iter().position(named)
    };
    let (Some(p), Some(c)) = (col(&["path", "file_name"]), col(&["caption", "cap"])) else {
        let first = text.lines().next().unwrap_or("").trim();
        return Err(format!(
            "expected a first line naming comma-separated `path` (or `file_name`) and \
             `caption` (or `cap`) columns, found `{first}`"
        ));
    };
    reader
        .records()
        .enumerate()
        .map(|(i, r)| {
            let r = r.map_err(|e| format!("record {}: {e}", i + 1))?;
            match (r.get(p), r.get(c)) {
                (Some(p), Some(c)) => Ok((p.to_string(), c.to_string())),
                _ => Err(format!("record {}: missing `path` or `caption`", i + 1)),
            }
        })
        .collect()
}

/// The record (the header is 0) whose quoted field is still open at the end of `text`, as
/// RFC 4180 reads quotes: a field that starts with `"` runs to the next `"` not doubled;
/// a `"` inside an unquoted field is a plain character.
fn unclosed_quote(text: &str) -> Option<usize> {
    let (mut record, mut opened) = (0, None);
    let mut at_field_start = true;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (opened, c) {
            (Some(_), '"') if chars.peek() == Some(&'"') => {
                chars.next();
            }
            (Some(_), '"') => {
                opened = None;
                at_field_start = false;
            }
            (Some(_), _) => {}
            (None, '"') if at_field_start => {
                opened = Some(record);
                at_field_start = false;
            }
            (None, '\n') => {
                record += 1;
                at_field_start = true;
            }
            (None, ',') => at_field_start = true,
            (None, _) => at_field_start = false,
        }
    }
    opened
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unclosed quote is an error naming its record (the csv reader would take the rest of
    /// the file as one caption); doubled quotes, quotes inside unquoted fields and quoted
    /// line breaks are fine.
    #[test]
    fn an_unclosed_quote_in_a_csv_list_names_its_record() {
        assert_eq!(
            unclosed_quote("path,caption\na.gif,fine\nx.gif,\"open\ny.gif,hi\n"),
            Some(2)
        );
        assert_eq!(unclosed_quote("path,caption\n\"a.gif,x\n"), Some(1));
        for ok in [
            "path,caption\na.gif,\"say \"\"hi\"\", twice\"\n",
            "path,caption\na.gif,a 5\" screen\n",
            "path,caption\na.gif,\"two\nlines\"\nb.gif,next\n",
        ] {
            assert_eq!(unclosed_quote(ok), None, "{ok:?}");
        }
        let tmp = tempfile::tempdir().unwrap();
        let list = tmp.path().join("list.csv");
        std::fs::write(&list, "path,caption\nx.gif,\"unterminated\ny.gif,hello\n").unwrap();
        let err = read_caption_list(&list).unwrap_err().to_string();
        assert!(
            err.contains("list.csv: record 1") && err.contains("never closed"),
            "{err}"
        );
    }

    #[test]
    fn captions_come_from_lists_and_sidecars() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        for f in ["b.gif", "a.png", "c.gif", "notes.md"] {
            std::fs::write(d.join(f), "x").unwrap();
        }
        std::fs::create_dir(d.join("frames")).unwrap();
        std::fs::write(d.join("frames/caption.txt"), "a folder\n").unwrap();
        // A byte-order mark (Windows editors write one) is not part of the caption.
        std::fs::write(d.join("a.txt"), "\u{feff} a sidecar ").unwrap();
        // Hidden entries are no clips; a dotted folder's sidecar is its whole name + `.txt`.
        std::fs::write(d.join("._b.gif"), "x").unwrap();
        std::fs::create_dir(d.join(".git")).unwrap();
        std::fs::create_dir(d.join("scene.001")).unwrap();
        std::fs::write(d.join("scene.001.txt"), "the folder's own").unwrap();
        std::fs::write(d.join("scene.txt"), "another's").unwrap();
        let list = d.join("list.csv");
        std::fs::write(&list, "path,caption\nsub/b.gif,\"listed, with comma\"\n").unwrap();
        let items = discover(d, Some(&list), &d.join("out")).unwrap();
        let names: Vec<_> = items
            .iter()
            .map(|i| i.path.file_name().unwrap().to_string_lossy().to_string())
            .collect();
        assert_eq!(names, ["a.png", "b.gif", "c.gif", "frames", "scene.001"]);
        assert_eq!(items[4].caption, Ok("the folder's own".into()));
        assert_eq!(items[0].caption, Ok("a sidecar".into()));
        assert_eq!(items[1].caption, Ok("listed, with comma".into()));
        assert!(items[2].caption.as_ref().unwrap_err().contains("c.txt"));
        assert_eq!(items[3].caption, Ok("a folder".into()));
        assert_eq!(items[3].kind, MediaKind::FrameFolder);

        let json = d.join("list.json");
        std::fs::write(&json, r#"[{"path": "x/c.gif", "cap": ["from fastvideo"]}]"#).unwrap();
        assert_eq!(read_caption_list(&json).unwrap()["c.gif"], "from fastvideo");
        // An empty caption and a file name listed twice name the list and the record.
        std::fs::write(&list, "path,caption\na.png,fine\nb.gif,\"  \"\n").unwrap();
        let err = read_caption_list(&list).unwrap_err().to_string();
        assert!(
            err.contains("list.csv: record 2") && err.contains("empty"),
            "{err}"
        );
        std::fs::write(&list, "path,caption\nx/a.png,one\ny/a.png,two\n").unwrap();
        let err = read_caption_list(&list).unwrap_err().to_string();
        assert!(err.contains("record 2") && err.contains("y/a.png"), "{err}");
        std::fs::write(&json, r#"[{"path": "c.gif"}]"#).unwrap();
        let err = read_caption_list(&json).unwrap_err().to_string();
        assert!(
            err.contains("list.json: record 0: c.gif has no `caption`"),
            "{err}"
        );
        // A value of the wrong type is named with its key, its record and what it is.
        let wrong = [
            (
                r#"[{"path": "a.png", "caption": 12}]"#,
                "`caption` of a.png is the number 12",
            ),
            (
                r#"[{"path": "a.png", "cap": []}]"#,
                "`cap` of a.png is an empty list",
            ),
            (
                r#"[{"path": ["a.png"], "caption": "x"}]"#,
                "`path` is a list",
            ),
            (
                r#"[{"path": "a.png", "caption": "x"}, "b.png"]"#,
                "record 1: expected an object",
            ),
        ];
        for (text, says) in wrong {
            std::fs::write(&json, text).unwrap();
            let err = read_caption_list(&json).unwrap_err().to_string();
            assert!(
                err.contains("list.json: record") && err.contains(says),
                "{err}"
            );
        }
        // `.JSON` is JSON; CSV headers match in any case; a header naming neither column
        // (tab-separated here) is quoted in the error.
        let upper = d.join("LIST.JSON");
        std::fs::write(
            &upper,
            "\u{feff}[{\"path\": \"c.gif\", \"caption\": \"up\"}]",
        )
        .unwrap();
        assert_eq!(read_caption_list(&upper).unwrap()["c.gif"], "up");
        std::fs::write(&list, "Path,Caption\nc.gif,cased\n").unwrap();
        assert_eq!(read_caption_list(&list).unwrap()["c.gif"], "cased");
        std::fs::write(&list, "path\tcaption\nc.gif\ttabbed\n").unwrap();
        let err = read_caption_list(&list).unwrap_err().to_string();
        assert!(
            err.contains("comma-separated") && err.contains("found `path\tcaption`"),
            "{err}"
        );
    }

    #[test]
    fn files_no_reader_takes_are_listed_but_captions_are_not() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let files = ["a.txt", "B.TXT", "list.csv", "notes.md", "photo.webp"];
        for f in files {
            std::fs::write(d.join(f), "x").unwrap();
        }
        let others: Vec<PathBuf> = files.iter().map(|f| d.join(f)).collect();
        let left = not_clips(others, Some(&d.join("list.csv")));
        assert_eq!(left, [d.join("notes.md"), d.join("photo.webp")]);
        // Without `--captions` a CSV in the folder is no caption list.
        assert_eq!(
            not_clips(vec![d.join("list.csv")], None),
            [d.join("list.csv")]
        );
        // JPEG images are clips now, in any case of the extension.
        for f in ["c.jpg", "d.JPEG"] {
            std::fs::write(d.join(f), "x").unwrap();
        }
        let items = discover(d, None, &d.join("out")).unwrap();
        let kinds: Vec<_> = items.iter().map(|i| (i.name(), i.kind)).collect();
        assert_eq!(
            kinds,
            [
                ("c.jpg".to_string(), MediaKind::Image),
                ("d.JPEG".to_string(), MediaKind::Image)
            ]
        );
    }

    #[test]
    fn the_output_folder_is_no_clip_and_unreadable_captions_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        for f in ["a.gif", "b.gif"] {
            std::fs::write(d.join(f), "x").unwrap();
        }
        std::fs::write(d.join("a.txt"), b"\xff\xfe latin-1").unwrap();
        // The output folder, inside the input and holding a PNG, would be a frame folder.
        std::fs::create_dir(d.join("out")).unwrap();
        std::fs::write(d.join("out/x.png"), "x").unwrap();
        let items = discover(d, None, &d.join("./out")).unwrap();
        let names: Vec<_> = items.iter().map(|i| i.path.file_name().unwrap()).collect();
        assert_eq!(names, ["a.gif", "b.gif"]);
        let err = items[0].caption.as_ref().unwrap_err();
        assert!(err.contains("a.txt is not UTF-8"), "{err}");
        assert!(items[1]
            .caption
            .as_ref()
            .unwrap_err()
            .contains("no caption"));
        // Without the exclusion it is an item.
        assert_eq!(discover(d, None, &d.join("elsewhere")).unwrap().len(), 3);

        let listed = BTreeMap::from([
            ("b.gif".to_string(), "listed".to_string()),
            ("typo.gif".to_string(), "lost".to_string()),
        ]);
        assert_eq!(unmatched(&listed, &items), ["typo.gif"]);
    }

    #[test]
    fn images_and_clips_are_not_mixed_in_one_set() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        for f in ["a.png", "b.gif", "c.png"] {
            std::fs::write(d.join(f), "x").unwrap();
        }
        std::fs::create_dir(d.join("frames")).unwrap();
        std::fs::write(d.join("frames/0.png"), "x").unwrap();
        let items = discover(d, None, &d.join("out")).unwrap();
        let err = one_shape(d, &items, 5).unwrap_err().to_string();
        for want in [
            "2 images",
            "a.png",
            "2 clips (5 frames",
            "b.gif",
            "--frames 1",
        ] {
            assert!(err.contains(want), "`{want}` not in: {err}");
        }
        one_shape(d, &items, 1).unwrap();
        let (images, clips): (Vec<Item>, Vec<Item>) =
            items.into_iter().partition(|i| i.kind == MediaKind::Image);
        one_shape(d, &images, 5).unwrap();
        one_shape(d, &clips, 5).unwrap();
    }
}
