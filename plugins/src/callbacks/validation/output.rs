//! What one validation writes and reports: a GIF (and, with FFmpeg, an MP4) per clip, the
//! contact sheet, the scores file and the printed summary line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use reel_core::callback::CallbackError;
use reel_core::data::{ClipScore, DataSpec};

use crate::callbacks::logging::progress::format_duration;
use crate::callbacks::{io_error, print_line};
use crate::media::resize::resize;
use crate::media::video::{pick_frames, write_mp4, Frames};
use crate::media::{contact_sheet, write_gif, write_png, MediaError};

/// Frame delay of the GIFs, in hundredths of a second.
pub const GIF_DELAY_CS: u16 = 12;
/// File name of the contact sheet.
pub const SHEET_FILE: &str = "sheet.png";
/// File name of the per-clip scores.
pub const SCORES_FILE: &str = "scores.json";

/// Most bytes of a clip file name's caption part: with the index, an extension and the
/// temporary name's `.`, `.tmp<pid>` the name stays far below the 255 bytes file systems allow,
/// whatever the script (a CJK character takes 3 bytes).
pub const STEM_BYTES: usize = 96;

/// File name of clip `i`: `<i>-<caption>.gif`, spaces as `_`, other characters that are not
/// alphanumeric, `-` or `.` dropped, cut to [`STEM_BYTES`] on a character boundary (`clip`
/// for an empty caption).
pub fn clip_file_name(i: usize, caption: &str) -> String {
    let mut stem = String::new();
    let kept = caption.trim().chars().filter_map(|c| match c {
        ' ' => Some('_'),
        c if c.is_alphanumeric() || c == '-' || c == '_' || c == '.' => Some(c),
        _ => None,
    });
    for c in kept {
        if stem.len() + c.len_utf8() > STEM_BYTES {
            break;
        }
        stem.push(c);
    }
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

/// The printed summary line of one validation that took `seconds`.
pub fn summary_line(
    step: u64,
    metrics: &[(String, f64)],
    clips: usize,
    seconds: f64,
    sheet: &Path,
) -> String {
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
    format!(
        "validation @ step {step}: {scores} in {} -> {}",
        format_duration(seconds),
        sheet.display()
    )
}

/// The contact-sheet label of a clip: its overall score (when the data source scores clips)
/// and its caption, e.g. `0.88 - a red circle moving left`.
pub fn sheet_label(caption: &str, score: Option<&ClipScore>) -> String {
    match score {
        Some(s) => format!("{:.2} - {caption}", s.overall),
        None => caption.to_string(),
    }
}

/// How clips are written: GIF upscaling and frame delay, whether an MP4 is also written,
/// and how many frames (of at most what width) a contact-sheet row shows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClipStyle {
    /// Integer upscaling of GIFs and sheet cells (latent previews are tiny).
    pub scale: u32,
    /// GIF frame delay in hundredths of a second.
    pub delay_cs: u16,
    /// Also write `<clip>.mp4` (decoded videos, when FFmpeg is installed).
    pub mp4_fps: Option<f64>,
    /// Frames per sheet row (evenly spaced).
    pub sheet_frames: usize,
    /// Sheet cells are shrunk to at most this width in pixels.
    pub sheet_width: usize,
}

impl ClipStyle {
    /// Latent previews (the synthetic data's 4-channel clips): every frame, upscaled.
    pub fn preview(spec: &DataSpec) -> Self {
        Self {
            scale: display_scale(spec),
            delay_cs: GIF_DELAY_CS,
            mp4_fps: None,
            sheet_frames: spec.frames,
            sheet_width: usize::MAX,
        }
    }

    /// Decoded videos at `fps`: full size, 8 frames per sheet row of at most 160 px. The GIF's
    /// frame delay is `fps`'s, in hundredths of a second, from 2 (viewers play a delay of 1
    /// at 10 fps, so above 50 fps the GIF plays at 50) to the format's longest.
    pub fn video(fps: f64) -> Self {
        Self {
            scale: 1,
            delay_cs: (100.0 / fps).round().clamp(2.0, u16::MAX as f64) as u16,
            mp4_fps: Some(fps),
            sheet_frames: 8,
            sheet_width: 160,
        }
    }
}

/// Check what a method's `sample` returned: one clip per prompt, each of `spec`'s latent size
/// (a plugin method may get either wrong); the error says which.
pub fn check_clips(clips: &[Vec<f32>], prompts: usize, spec: &DataSpec) -> Result<(), String> {
    if clips.len() != prompts {
        return Err(format!(
            "the method returned {} clips for {prompts} prompts",
            clips.len()
        ));
    }
    match clips.iter().position(|c| c.len() != spec.latent_numel()) {
        Some(i) => Err(format!(
            "clip {i} has {} values, expected {} ({spec:?})",
            clips[i].len(),
            spec.latent_numel()
        )),
        None => Ok(()),
    }
}

/// Write one GIF per clip (named by [`clip_file_name`]; plus an MP4 when the style asks and
/// FFmpeg is installed, a failed MP4 being a warning) and the contact sheet [`SHEET_FILE`]
/// into `dir`, its rows labelled by `labels` (see [`sheet_label`]); returns the files, clips
/// first. `clips` is read one clip at a time, each written (and dropped but for its sheet
/// row) before the next is made: a VAE decodes them as they are asked for.
pub fn write_clips(
    dir: &Path,
    clips: impl IntoIterator<Item = Result<Frames, CallbackError>>,
    captions: &[String],
    labels: &[String],
    style: &ClipStyle,
) -> Result<Vec<PathBuf>, CallbackError> {
    let media = |e: MediaError| CallbackError::Other(e.to_string());
    let mut files = Vec::new();
    let mut rows = Vec::with_capacity(captions.len());
    for (i, (clip, caption)) in clips.into_iter().zip(captions).enumerate() {
        let clip = clip?;
        let (w, h, s) = (clip.width, clip.height, style.scale);
        let path = dir.join(clip_file_name(i, caption));
        write_gif(&path, &clip.frames, w, h, s, style.delay_cs).map_err(media)?;
        files.push(path.clone());
        if let Some(fps) = style.mp4_fps {
            // The MP4 is an extra beside the GIF: an FFmpeg without H.264 must not end a run.
            match write_mp4(&path.with_extension("mp4"), &clip, fps) {
                Ok(mp4) => files.extend(mp4),
                Err(e) => print_line(&format!("reel: warning: no MP4 written: {e}")),
            }
        }
        rows.push(sheet_row(&clip, style));
    }
    let (cw, ch) = rows.first().map_or((1, 1), |r| (r.width, r.height));
    let frames: Vec<_> = rows.into_iter().map(|r| r.frames).collect();
    let (sheet, w, h) = contact_sheet(&frames, labels, cw, ch, style.scale);
    let sheet_path = dir.join(SHEET_FILE);
    write_png(&sheet_path, &sheet, w, h).map_err(media)?;
    files.push(sheet_path);
    Ok(files)
}

/// The frames one sheet row shows: evenly spaced, shrunk to the style's cell width.
fn sheet_row(clip: &Frames, style: &ClipStyle) -> Frames {
    let picked = pick_frames(&clip.frames, style.sheet_frames);
    if clip.width <= style.sheet_width {
        return Frames {
            frames: picked,
            ..clip.clone()
        };
    }
    let w = style.sheet_width;
    let h = (clip.height * w / clip.width).max(1);
    Frames {
        frames: picked
            .iter()
            .map(|f| resize(f, clip.width, clip.height, w, h))
            .collect(),
        width: w,
        height: h,
    }
}

/// Write `path` (`scores.json`): the step, the mean metrics and, per clip, its caption, GIF
/// file name ([`clip_file_name`]), overall score and criteria.
pub fn write_scores(
    path: &Path,
    step: u64,
    metrics: &[(String, f64)],
    captions: &[String],
    scores: &[ClipScore],
) -> Result<(), CallbackError> {
    let per_clip: Vec<serde_json::Value> = (scores.iter().zip(captions).enumerate())
        .map(|(i, (s, caption))| {
            serde_json::json!({
                "caption": caption,
                "file": clip_file_name(i, caption),
                "overall": s.overall,
                "criteria": s.criteria.iter().cloned().collect::<BTreeMap<String, f32>>(),
            })
        })
        .collect();
    let metrics: BTreeMap<String, f64> = metrics.iter().cloned().collect();
    let doc = serde_json::json!({ "step": step, "metrics": metrics, "clips": per_clip });
    let text = serde_json::to_string_pretty(&doc).expect("scores serialize");
    reel_core::io::replace_file(path, text.as_bytes()).map_err(|e| io_error(path, e))
}

/// Move the sample folders of `samples` (`step-M/`) of steps after `step` (a resume from an
/// earlier checkpoint leaves that timeline; a killed run got past its last checkpoint) into
/// `samples/dropped-after-step-<step>[-k]/`, so that the new timeline's validations do not
/// replace them. Returns that folder when something was moved.
pub fn set_aside_later_samples(samples: &Path, step: u64) -> std::io::Result<Option<PathBuf>> {
    let Ok(entries) = std::fs::read_dir(samples) else {
        return Ok(None);
    };
    let mut later = vec![];
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let of_step = name
            .strip_prefix("step-")
            .and_then(|n| n.parse::<u64>().ok());
        if of_step.is_some_and(|m| m > step) && entry.file_type()?.is_dir() {
            later.push(entry.path());
        }
    }
    if later.is_empty() {
        return Ok(None);
    }
    let base = format!("dropped-after-step-{step}");
    let aside = (1..)
        .map(|k| match k {
            1 => samples.join(&base),
            k => samples.join(format!("{base}-{k}")),
        })
        .find(|p| std::fs::symlink_metadata(p).is_err())
        .expect("an unused name");
    std::fs::create_dir(&aside)?;
    for dir in later {
        let name = dir.file_name().expect("a step folder's name").to_owned();
        std::fs::rename(&dir, aside.join(name))?;
    }
    Ok(Some(aside))
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
        // A long caption in a 3-byte script: the name (and its temporary sibling) stays short.
        let long = clip_file_name(12, &"视频中的一只猫".repeat(30));
        let stem = long
            .strip_prefix("12-")
            .unwrap()
            .strip_suffix(".gif")
            .unwrap();
        assert!(
            stem.len() <= STEM_BYTES && stem.len() > STEM_BYTES - 4,
            "{long}"
        );
        assert!("视频中的一只猫".repeat(30).starts_with(stem));
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
        let s = spec(2, 3);
        let clip = vec![0.0; s.latent_numel()];
        assert_eq!(check_clips(&[clip.clone(), clip.clone()], 2, &s), Ok(()));
        let err = check_clips(std::slice::from_ref(&clip), 2, &s).unwrap_err();
        assert!(err.contains("1 clips for 2 prompts"), "{err}");
        let err = check_clips(&[clip, vec![0.0; 5]], 2, &s).unwrap_err();
        assert!(err.contains("clip 1 has 5 values, expected 96"), "{err}");
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
        let line = summary_line(4, &m, 2, 41.2, Path::new("runs/x/samples/step-4/sheet.png"));
        assert_eq!(
            line,
            "validation @ step 4: overall 0.500 (colour 1.00, shape 0.50) in 00:41 -> runs/x/samples/step-4/sheet.png"
        );
        assert!(summary_line(4, &[], 2, 1.0, Path::new("s.png")).contains("2 clips"));
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
        let clips: Vec<Frames> = clips
            .iter()
            .map(|c| Frames {
                frames: crate::data::clip_to_rgb(c, &spec),
                width: spec.width,
                height: spec.height,
            })
            .collect();
        let style = ClipStyle::preview(&spec);
        let each = clips.clone().into_iter().map(Ok);
        let files = write_clips(dir.path(), each, &captions, &labels, &style).unwrap();
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
        write_scores(&path, 7, &metrics, &captions, &[score.clone(), score]).unwrap();
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

    #[test]
    fn decoded_videos_get_gifs_and_a_sheet_of_eight_shrunk_frames() {
        let dir = tempfile::tempdir().unwrap();
        let clip = Frames {
            frames: (0..17u8).map(|i| vec![[i * 10, 0, 0]; 320 * 96]).collect(),
            width: 320,
            height: 96,
        };
        let row = sheet_row(&clip, &ClipStyle::video(16.0));
        assert_eq!((row.frames.len(), row.width, row.height), (8, 160, 48));
        assert_eq!(
            row.frames[7][0],
            [160, 0, 0],
            "the last frame closes the row"
        );
        // The GIF delay follows the rate, 2 to 65535 hundredths of a second.
        let delays = [0.5, 16.0, 100.0, 1e-9].map(|fps| ClipStyle::video(fps).delay_cs);
        assert_eq!(delays, [200, 6, 2, u16::MAX]);
        let style = ClipStyle::video(16.0);
        let caps = vec!["a cat".to_string()];
        let files = write_clips(dir.path(), [Ok(clip)], &caps, &caps, &style).unwrap();
        let gif = &files[0];
        assert!(gif.ends_with("0-a_cat.gif") && gif.is_file());
        assert!(files.last().unwrap().ends_with(SHEET_FILE));
        if crate::media::decode::ffmpeg_for_tests() {
            assert!(files[1].ends_with("0-a_cat.mp4") && files[1].is_file());
        }
    }

    #[test]
    fn later_samples_are_set_aside_not_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let samples = tmp.path().join("samples");
        assert_eq!(set_aside_later_samples(&samples, 2).unwrap(), None);
        for step in [2, 4, 6] {
            std::fs::create_dir_all(samples.join(format!("step-{step}"))).unwrap();
            std::fs::write(samples.join(format!("step-{step}/sheet.png")), [step as u8]).unwrap();
        }
        std::fs::write(samples.join("step-8"), "a file, not a sample folder").unwrap();
        let aside = set_aside_later_samples(&samples, 2).unwrap().unwrap();
        assert_eq!(aside, samples.join("dropped-after-step-2"));
        assert!(samples.join("step-2/sheet.png").is_file());
        assert!(samples.join("step-8").is_file());
        for step in [4u8, 6] {
            let kept = aside.join(format!("step-{step}/sheet.png"));
            assert_eq!(std::fs::read(&kept).unwrap(), [step]);
            assert!(!samples.join(format!("step-{step}")).exists());
        }
        // Again from step 2: a second folder, the first kept as it was.
        std::fs::create_dir_all(samples.join("step-4")).unwrap();
        let again = set_aside_later_samples(&samples, 2).unwrap().unwrap();
        assert_eq!(again, samples.join("dropped-after-step-2-2"));
        assert!(aside.join("step-6").is_dir() && again.join("step-4").is_dir());
        assert_eq!(set_aside_later_samples(&samples, 2).unwrap(), None);
    }
}
