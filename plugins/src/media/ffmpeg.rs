//! Videos through the `ffmpeg` and `ffprobe` binaries (installed by
//! `scripts/install-ffmpeg.sh`; optional): probing a stream's display size and rate, and
//! decoding its leading frames to RGB. Every error names the file.

use std::io::Read;
use std::path::Path;
use std::process::Command;

use super::decode::{invalid, Clip, FrameNeed};
use super::MediaError;

/// Whether the `ffmpeg` and `ffprobe` binaries run.
pub fn ffmpeg_available() -> bool {
    ["ffmpeg", "ffprobe"].iter().all(|b| {
        Command::new(b)
            .arg("-version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// For tests that need FFmpeg: whether it runs. Without it such a test is skipped (with a
/// line on stderr), unless `REEL_REQUIRE_FFMPEG` is set, as CI sets it: then this panics.
pub fn ffmpeg_for_tests() -> bool {
    let available = ffmpeg_available();
    if !available {
        assert!(
            std::env::var_os("REEL_REQUIRE_FFMPEG").is_none(),
            "REEL_REQUIRE_FFMPEG is set but ffmpeg/ffprobe do not run"
        );
        eprintln!("skipped: no ffmpeg (scripts/install-ffmpeg.sh)");
    }
    available
}

/// A video through the `ffmpeg` binary: the first video stream as RGB frames at its own
/// frame rate and display size (FFmpeg turns a video with a rotation, as phones record, upright;
/// its frames are then as high as the stream is wide). Frames past what `need` says are not
/// decoded.
pub fn read_video(path: &Path, need: FrameNeed) -> Result<Clip, MediaError> {
    if !ffmpeg_available() {
        return Err(invalid(
            path,
            "videos are decoded with FFmpeg: install it (scripts/install-ffmpeg.sh) or \
             convert the clip to a GIF or a folder of PNG frames",
        ));
    }
    let (w, h, fps) = probe(path)?;
    let mut decode = Command::new("ffmpeg");
    decode
        .args(["-v", "error", "-i"])
        .arg(path)
        .args(["-map", "0:v:0"]);
    let count = need.count(fps);
    if count != usize::MAX {
        decode.args(["-frames:v", &count.to_string()]);
    }
    let raw = run(
        path,
        decode.args(["-f", "rawvideo", "-pix_fmt", "rgb24", "-"]),
    )?;
    let frame_bytes = w * h * 3;
    if frame_bytes == 0 || raw.len() < frame_bytes {
        return Err(invalid(path, "FFmpeg decoded no frame"));
    }
    if raw.len() % frame_bytes != 0 {
        return Err(invalid(
            path,
            format!("FFmpeg's frames are not {w}x{h} as the stream says"),
        ));
    }
    let frames = raw
        .chunks_exact(frame_bytes)
        .map(|f| f.chunks_exact(3).map(|p| [p[0], p[1], p[2]]).collect())
        .collect();
    Ok(Clip {
        frames,
        width: w,
        height: h,
        fps,
    })
}

/// The first video stream's display size (width and height swapped for a quarter-turn
/// rotation) and frame rate, from `ffprobe`.
fn probe(path: &Path) -> Result<(usize, usize, Option<f64>), MediaError> {
    let entries = "stream=width,height,r_frame_rate:stream_side_data=rotation";
    let out = run(
        path,
        Command::new("ffprobe")
            .args(["-v", "error", "-select_streams", "v:0"])
            .args(["-show_entries", entries, "-of", "json"])
            .arg(path),
    )?;
    let json: serde_json::Value = serde_json::from_slice(&out)
        .map_err(|e| invalid(path, format!("unreadable ffprobe output: {e}")))?;
    let Some(stream) = json["streams"].get(0) else {
        return Err(invalid(path, "no video stream"));
    };
    let size = |key: &str| stream[key].as_u64().filter(|&v| v > 0).map(|v| v as usize);
    let (Some(w), Some(h)) = (size("width"), size("height")) else {
        return Err(invalid(
            path,
            format!(
                "unreadable stream size `{}x{}`",
                stream["width"], stream["height"]
            ),
        ));
    };
    let rotation = stream["side_data_list"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|d| d["rotation"].as_f64())
        .unwrap_or(0.0);
    let quarter_turn = (rotation.round() as i64).rem_euclid(180) == 90;
    let fps = stream["r_frame_rate"].as_str().and_then(parse_rate);
    Ok(if quarter_turn {
        (h, w, fps)
    } else {
        (w, h, fps)
    })
}

/// `30000/1001` or `25` as frames per second.
fn parse_rate(rate: &str) -> Option<f64> {
    let fps = match rate.split_once('/') {
        Some((n, d)) => n.trim().parse::<f64>().ok()? / d.trim().parse::<f64>().ok()?,
        None => rate.trim().parse().ok()?,
    };
    (fps.is_finite() && fps > 0.0).then_some(fps)
}

/// Run a command on `path` and return its stdout; a failure is an error naming the file
/// with FFmpeg's first line of stderr.
fn run(path: &Path, cmd: &mut Command) -> Result<Vec<u8>, MediaError> {
    let out = cmd.output().map_err(|error| MediaError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    if !out.status.success() {
        let mut err = String::new();
        let _ = out.stderr.as_slice().read_to_string(&mut err);
        let first = err.lines().next().unwrap_or("failed").to_string();
        return Err(invalid(path, format!("FFmpeg: {first}")));
    }
    Ok(out.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::decode::read_clip;

    #[test]
    fn frame_rates_parse() {
        assert_eq!(
            parse_rate("30000/1001").map(|r| (r * 100.0).round()),
            Some(2997.0)
        );
        assert_eq!(parse_rate("25"), Some(25.0));
        assert_eq!(parse_rate("0/0"), None);
    }

    /// Through FFmpeg (skipped without it, unless `REEL_REQUIRE_FFMPEG` is set, as CI does):
    /// a video with a quarter-turn rotation is read upright at its display size, and only the
    /// frames needed are decoded.
    #[test]
    fn videos_are_read_upright_and_only_as_far_as_needed() {
        if !ffmpeg_for_tests() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (plain, turned) = (dir.path().join("a.mp4"), dir.path().join("r.mp4"));
        let ffmpeg = |args: &[&str]| {
            let out = Command::new("ffmpeg")
                .args(["-v", "error", "-y"])
                .args(args)
                .output();
            assert!(out.unwrap().status.success(), "ffmpeg {args:?}");
        };
        let src = "testsrc=size=64x32:rate=8";
        let plain_s = plain.to_str().unwrap();
        ffmpeg(&[
            "-f",
            "lavfi",
            "-i",
            src,
            "-frames:v",
            "9",
            "-pix_fmt",
            "yuv420p",
            plain_s,
        ]);
        let meta = "-metadata:s:v:0";
        ffmpeg(&[
            "-i",
            plain_s,
            "-c",
            "copy",
            meta,
            "rotate=90",
            turned.to_str().unwrap(),
        ]);

        let a = read_clip(&plain, FrameNeed::ALL).unwrap();
        assert_eq!(
            (a.width, a.height, a.frames.len(), a.fps),
            (64, 32, 9, Some(8.0))
        );
        let r = read_clip(&turned, FrameNeed::ALL).unwrap();
        assert_eq!((r.width, r.height, r.frames.len()), (32, 64, 9));
        // The same decoded pixels, turned a quarter one way or the other.
        let at = |x: usize, y: usize| a.frames[4][y * 64 + x];
        let left = (0..64 * 32).all(|i| r.frames[4][i] == at(63 - i / 32, i % 32));
        let right = (0..64 * 32).all(|i| r.frames[4][i] == at(i / 32, 31 - i % 32));
        assert!(
            left || right,
            "the rotated frames are not the frames turned"
        );

        let need = FrameNeed {
            frames: 2,
            fps: Some(4.0),
        };
        assert_eq!(
            read_clip(&plain, need).unwrap().frames,
            a.frames[..3].to_vec()
        );
    }
}
