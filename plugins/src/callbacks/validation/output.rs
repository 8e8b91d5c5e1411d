//! What one validation writes and reports: a GIF per clip, the contact sheet, the scores file
//! and the printed summary line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use reel_core::callback::CallbackError;
use reel_core::data::{ClipScore, DataSpec};

use crate::callbacks::io_error;
use crate::data::clip_to_rgb;
use crate::media::{contact_sheet, write_gif, write_png, MediaError};

/// Frame delay of the GIFs, in hundredths of a second.
pub const GIF_DELAY_CS: u16 = 12;
/// File name of the contact sheet.
pub const SHEET_FILE: &str = "sheet.png";
/// File name of the per-clip scores.
pub const SCORES_FILE: &str = "scores.json";

/// File name of clip `i`: `<i>-<caption>.gif`, spaces as `_`, other characters that are not
/// alphanumeric, `-` or `.` dropped (`clip` for an empty caption).
pub fn clip_file_name(i: usize, caption: &str) -> String {
    let mut stem: String = caption
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('_'),
            c if c.is_alphanumeric() || c == '-' || c == '_' || c == '.' => Some(c),
            _ => None,
        })
        .take(80)
        .collect();
    if stem.is_empty() {
        stem = "clip".into();
    }
    format!("{i}-{stem}.gif")
}

/// Upscaling factor of GIFs and sheets: 8, less for large latents (at most ~256 px a side).
pub fn display_scale(spec: &DataSpec) -> u32 {
    (256 / spec.height.max(spec.width).max(1)).clamp(1, 8) as u32
}

/// Mean scores over clips: `("val/overall", ..)` first, then `val/<criterion>` in the order
/// the criteria first appear.
pub fn mean_scores(scores: &[ClipScore]) -> Vec<(String, f64)> {
    if scores.is_empty() {
        return Vec::new();
    }
    let n = scores.len() as f64;
    let mut out = vec![(
        "val/overall".to_string(),
        scores.iter().map(|s| s.overall as f64).sum::<f64>() / n,
    )];
    let mut sums: Vec<(String, f64)> = Vec::new();
    for s in scores {
        for (name, v) in &s.criteria {
            match sums.iter_mut().find(|(k, _)| k == name) {
                Some((_, acc)) => *acc += *v as f64,
                None => sums.push((name.clone(), *v as f64)),
            }
        }
    }
    out.extend(sums.into_iter().map(|(k, v)| (format!("val/{k}"), v / n)));
    out
}

/// The printed summary line of one validation.
pub fn summary_line(step: u64, metrics: &[(String, f64)], clips: usize, sheet: &Path) -> String {
    let scores = match metrics.split_first() {
        Some(((_, overall), rest)) => {
            let parts: Vec<String> = rest
                .iter()
                .map(|(k, v)| format!("{} {v:.2}", k.trim_start_matches("val/")))
                .collect();
            if parts.is_empty() {
                format!("overall {overall:.3}")
            } else {
                format!("overall {overall:.3} ({})", parts.join(", "))
            }
        }
        None => format!("{clips} clips"),
    };
    format!("validation @ step {step}: {scores} -> {}", sheet.display())
}

/// The contact-sheet label of a clip: its overall score (when the data source scores clips)
/// and its caption, e.g. `0.88 - a red circle moving left`.
pub fn sheet_label(caption: &str, score: Option<&ClipScore>) -> String {
    match score {
        Some(s) => format!("{:.2} - {caption}", s.overall),
        None => caption.to_string(),
    }
}

/// Write one GIF per clip (named by [`clip_file_name`]) and the contact sheet
/// [`SHEET_FILE`] into `dir`, its rows labelled by `labels` (see [`sheet_label`]); returns
/// the files, GIFs first.
pub fn write_clips(
    dir: &Path,
    clips: &[Vec<f32>],
    captions: &[String],
    labels: &[String],
    spec: &DataSpec,
) -> Result<Vec<PathBuf>, CallbackError> {
    let scale = display_scale(spec);
    let media = |e: MediaError| CallbackError::Other(format!("validation: {e}"));
    let mut files = Vec::new();
    let mut frames_all = Vec::with_capacity(clips.len());
    for (i, (clip, caption)) in clips.iter().zip(captions).enumerate() {
        let frames = clip_to_rgb(clip, spec);
        let path = dir.join(clip_file_name(i, caption));
        write_gif(&path, &frames, spec.width, spec.height, scale, GIF_DELAY_CS).map_err(media)?;
        files.push(path);
        frames_all.push(frames);
    }
    let (sheet, w, h) = contact_sheet(&frames_all, labels, spec.width, spec.height, scale);
    let sheet_path = dir.join(SHEET_FILE);
    write_png(&sheet_path, &sheet, w, h).map_err(media)?;
    files.push(sheet_path);
    Ok(files)
}

/// Write `path` (`scores.json`): the step, the mean metrics and, per clip, its caption, GIF
/// file name, overall score and criteria.
pub fn write_scores(
    path: &Path,
    step: u64,
    metrics: &[(String, f64)],
    captions: &[String],
    files: &[PathBuf],
    scores: &[ClipScore],
) -> Result<(), CallbackError> {
    let per_clip: Vec<serde_json::Value> = (scores.iter().zip(captions).zip(files))
        .map(|((s, caption), file)| {
            serde_json::json!({
                "caption": caption,
                "file": file.file_name().map(|f| f.to_string_lossy()),
                "overall": s.overall,
                "criteria": s.criteria.iter().cloned().collect::<BTreeMap<String, f32>>(),
            })
        })
        .collect();
    let metrics: BTreeMap<String, f64> = metrics.iter().cloned().collect();
    let doc = serde_json::json!({ "step": step, "metrics": metrics, "clips": per_clip });
    let text = serde_json::to_string_pretty(&doc).expect("scores serialize");
    std::fs::write(path, text).map_err(|e| io_error(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_scale_and_means() {
        assert_eq!(
            clip_file_name(3, "a red square moving left"),
            "3-a_red_square_moving_left.gif"
        );
        assert_eq!(clip_file_name(0, "../x/y?"), "0-..xy.gif");
        assert_eq!(clip_file_name(1, ""), "1-clip.gif");
        let spec = |h, w| DataSpec {
            channels: 4,
            frames: 4,
            height: h,
            width: w,
            text_len: 8,
            text_dim: 32,
        };
        assert_eq!(display_scale(&spec(16, 16)), 8);
        assert_eq!(display_scale(&spec(60, 104)), 2);
        assert_eq!(display_scale(&spec(512, 512)), 1);
        let score = |c: f32, s: f32, overall: f32| ClipScore {
            criteria: vec![("colour".into(), c), ("shape".into(), s)],
            overall,
        };
        let m = mean_scores(&[score(1.0, 1.0, 1.0), score(1.0, 0.0, 0.0)]);
        assert_eq!(
            m,
            [
                ("val/overall".to_string(), 0.5),
                ("val/colour".to_string(), 1.0),
                ("val/shape".to_string(), 0.5)
            ]
        );
        let line = summary_line(4, &m, 2, Path::new("runs/x/samples/step-4/sheet.png"));
        assert_eq!(
            line,
            "validation @ step 4: overall 0.500 (colour 1.00, shape 0.50) -> runs/x/samples/step-4/sheet.png"
        );
        assert!(summary_line(4, &[], 2, Path::new("s.png")).contains("2 clips"));
    }

    #[test]
    fn writes_gifs_sheet_and_scores() {
        let dir = tempfile::tempdir().unwrap();
        let spec = DataSpec {
            channels: 4,
            frames: 3,
            height: 12,
            width: 12,
            text_len: 8,
            text_dim: 32,
        };
        let clips = vec![vec![0.0; spec.latent_numel()]; 2];
        let captions = vec!["a red square moving up".to_string(), String::new()];
        let labels: Vec<String> = captions.iter().map(|c| sheet_label(c, None)).collect();
        let files = write_clips(dir.path(), &clips, &captions, &labels, &spec).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().to_string())
            .collect();
        assert_eq!(
            names,
            ["0-a_red_square_moving_up.gif", "1-clip.gif", "sheet.png"]
        );
        assert!(files.iter().all(|f| f.is_file()));
        let score = ClipScore {
            criteria: vec![("colour".into(), 1.0)],
            overall: 0.0,
        };
        let path = dir.path().join(SCORES_FILE);
        let metrics = mean_scores(&[score.clone(), score.clone()]);
        write_scores(
            &path,
            7,
            &metrics,
            &captions,
            &files,
            &[score.clone(), score],
        )
        .unwrap();
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(doc["metrics"]["val/colour"], 1.0);
        assert_eq!(doc["clips"][1]["file"], "1-clip.gif");
        assert_eq!(doc["clips"][0]["criteria"]["colour"], 1.0);
        let scored = ClipScore {
            criteria: vec![],
            overall: 0.875,
        };
        assert_eq!(
            sheet_label("a red square", Some(&scored)),
            "0.88 - a red square"
        );
        assert_eq!(sheet_label("a red square", None), "a red square");
    }
}
