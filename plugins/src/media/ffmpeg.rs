//! Videos through the `ffmpeg` and `ffprobe` binaries (installed by
//! `scripts/install-ffmpeg.sh`; optional): probing a stream's display size and rate,
//! decoding its leading frames to RGB, and encoding frames as an MP4. Every error names the
//! file.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::decode::{check_size, invalid, is_picked, Clip, FrameNeed};
use super::video::Frames;
use super::MediaError;

/// Whether the `ffmpeg` and `ffprobe` binaries run (asked once per process: every video read
/// and MP4 written checks it, which started both binaries each time).
pub fn ffmpeg_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        ["ffmpeg", "ffprobe"].iter().all(|b| {
            Command::new(b)
                .arg("-version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
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
/// (average) frame rate and display size (FFmpeg turns a video with a rotation, as phones record, upright;
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
        .arg(file_url(path))
        .args(["-map", "0:v:0"]);
    if let Some(fps) = fps {
        // FFmpeg writes raw frames at a constant rate: the probed one, so that frame `i` is
        // at `i / fps` seconds as `FrameNeed` and the resampling count them.
        decode.args(["-r", &format!("{fps}")]);
    }
    let picked = need.picked(fps);
    // One frame's size before any buffer for it: the header's sizes are not to be trusted.
    check_size(path, w, h, 1)?;
    if let Some(idx) = &picked {
        check_size(path, w, h, idx.len())?;
        let count = idx.last().map_or(0, |last| last + 1);
        decode.args(["-frames:v", &count.to_string()]);
    }
    decode.args(["-f", "rawvideo", "-pix_fmt", "rgb24", "-"]);
    let frames = decode_frames(path, &mut decode, (w, h), picked.as_deref())?;
    Ok(Clip {
        frames,
        width: w,
        height: h,
        fps,
    })
}

/// Write `clip` as an H.264 MP4 (yuv420p, so an odd width or height is padded by one black
/// column or row) at `fps` through the `ffmpeg` binary. Returns `Ok(None)` when FFmpeg is not
/// installed (nothing is written), else the file. The clip is encoded to a temporary file
/// beside `path` and renamed over it only when FFmpeg succeeds, so a failed encode leaves
/// neither a truncated MP4 nor the temporary file.
pub fn write_mp4(path: &Path, clip: &Frames, fps: f64) -> Result<Option<PathBuf>, MediaError> {
    let pixels = clip.width * clip.height;
    if pixels == 0 || clip.frames.is_empty() || clip.frames.iter().any(|f| f.len() != pixels) {
        let sizes: Vec<usize> = clip.frames.iter().map(Vec::len).collect();
        return Err(MediaError::Invalid {
            path: path.to_path_buf(),
            reason: format!(
                "{} frames of {sizes:?} pixels are not frames of {}x{}",
                sizes.len(),
                clip.width,
                clip.height
            ),
        });
    }
    if !ffmpeg_available() {
        return Ok(None);
    }
    let io = |error| MediaError::Io {
        path: path.to_path_buf(),
        error,
    };
    reel_core::io::replace_file_with(path, |tmp| encode_mp4(path, tmp, clip, fps), io)?;
    Ok(Some(path.to_path_buf()))
}

/// Pipe `clip`'s frames into FFmpeg, writing MP4 to `out`; errors name `path`, the file it
/// becomes. When FFmpeg stops early (the pipe breaks) its own message is the error.
fn encode_mp4(path: &Path, out: &Path, clip: &Frames, fps: f64) -> Result<(), MediaError> {
    let io = |error| MediaError::Io {
        path: path.to_path_buf(),
        error,
    };
    let mut child = Command::new("ffmpeg")
        .args(["-v", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24"])
        .args(["-s", &format!("{}x{}", clip.width, clip.height)])
        .args(["-r", &format!("{fps}"), "-i", "-"])
        .args(["-c:v", "libx264", "-pix_fmt", "yuv420p"])
        .args(["-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2", "-f", "mp4"])
        .arg(file_url(out))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io)?;
    let mut written = Ok(());
    if let Some(mut stdin) = child.stdin.take() {
        written = clip
            .frames
            .iter()
            .try_for_each(|frame| stdin.write_all(frame.as_flattened()));
    }
    let done = child.wait_with_output().map_err(io)?;
    if !done.status.success() {
        let err = String::from_utf8_lossy(&done.stderr);
        return Err(MediaError::Encode {
            path: path.to_path_buf(),
            reason: format!("FFmpeg: {}", err.lines().next().unwrap_or("failed")),
        });
    }
    written.map_err(io)
}

/// `path` as FFmpeg is to read or write it: behind `file:`, so that a name holding a `:`
/// (`clips:v2/a.mp4`) is not taken for a protocol.
fn file_url(path: &Path) -> std::ffi::OsString {
    let mut url = std::ffi::OsString::from("file:");
    url.push(path.as_os_str());
    url
}

/// The first video stream's display size (width and height swapped for a quarter-turn
/// rotation) and frame rate (the average rate, for variable-rate streams), from `ffprobe`.
fn probe(path: &Path) -> Result<(usize, usize, Option<f64>), MediaError> {
    let entries = "stream=width,height,avg_frame_rate,r_frame_rate:stream_side_data=rotation";
    let out = run(
        path,
        Command::new("ffprobe")
            .args(["-v", "error", "-select_streams", "v:0"])
            .args(["-show_entries", entries, "-of", "json"])
            .arg(file_url(path)),
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
    // A variable-rate stream's `r_frame_rate` is a guess at a rate fine enough for every
    // timestamp (often 1000 for WebM); its average rate is the one to resample at.
    let rate = |key: &str| stream[key].as_str().and_then(parse_rate);
    let fps = rate("avg_frame_rate").or_else(|| rate("r_frame_rate"));
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

/// Run the decoding `cmd` (raw RGB frames of `w`×`h` on its stdout) and turn each frame that
/// `picked` names (`None`: every frame) into pixels as it arrives, leaving the others empty:
/// the raw bytes are never held whole beside the frames (a 4K clip's leading frames are
/// gigabytes), and a clip is refused once its kept frames pass
/// [`MAX_CLIP_BYTES`](super::decode::MAX_CLIP_BYTES). FFmpeg's stderr is read on a thread
/// meanwhile, so that neither pipe can fill and stall it.
fn decode_frames(
    path: &Path,
    cmd: &mut Command,
    (w, h): (usize, usize),
    picked: Option<&[usize]>,
) -> Result<Vec<Vec<[u8; 3]>>, MediaError> {
    let io = |error| MediaError::Io {
        path: path.to_path_buf(),
        error,
    };
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io)?;
    let mut stderr = child.stderr.take().expect("stderr is piped");
    // As bytes: FFmpeg echoes the file's name, which need not be UTF-8.
    let messages = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stderr.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    });
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let frame_bytes = w * h * 3;
    let mut buf = vec![0u8; frame_bytes];
    let (mut frames, mut kept) = (Vec::new(), 0);
    let tail = loop {
        match read_full(&mut stdout, &mut buf) {
            Ok(n) if n == frame_bytes && n > 0 => {
                if !is_picked(picked, frames.len()) {
                    frames.push(vec![]);
                    continue;
                }
                // Every frame wanted (no count to bound it up front): bounded as it comes.
                kept += 1;
                if let Err(e) = check_size(path, w, h, kept) {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(e);
                }
                frames.push(buf.chunks_exact(3).map(|p| [p[0], p[1], p[2]]).collect());
            }
            other => break other,
        }
    };
    drop(stdout);
    let status = child.wait().map_err(io)?;
    let messages = messages.join().unwrap_or_default();
    if !status.success() {
        return Err(ffmpeg_failed(path, &messages));
    }
    match tail.map_err(io)? {
        0 if frames.is_empty() => Err(invalid(path, "FFmpeg decoded no frame")),
        0 => Ok(frames),
        _ => Err(invalid(
            path,
            format!("FFmpeg's frames are not {w}x{h} as the stream says"),
        )),
    }
}

/// Read from `from` until `buf` is full or the stream ends; the bytes read.
fn read_full(from: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match from.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// FFmpeg's failure as an error naming `path`: the last line of its `messages` is the
/// conclusion ("Invalid data found when processing input"); the ones before it are what it
/// met on the way.
fn ffmpeg_failed(path: &Path, messages: &str) -> MediaError {
    let last = messages.lines().rfind(|l| !l.trim().is_empty());
    invalid(path, format!("FFmpeg: {}", last.unwrap_or("failed")))
}

/// Run a command on `path` and return its stdout; a failure is an error naming the file
/// with FFmpeg's last line of stderr.
fn run(path: &Path, cmd: &mut Command) -> Result<Vec<u8>, MediaError> {
    let out = cmd.output().map_err(|error| MediaError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    if !out.status.success() {
        return Err(ffmpeg_failed(path, &String::from_utf8_lossy(&out.stderr)));
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
        // Frames 0 and 2 of the 8 fps clip, and nothing of frame 1 (decoded past) or later.
        let picked = read_clip(&plain, need).unwrap().frames;
        assert_eq!(picked, [a.frames[0].clone(), vec![], a.frames[2].clone()]);
    }

    /// Through FFmpeg: a variable-rate video (20 frames 100 ms apart, every other one late
    /// by 37 ms; ffprobe guesses `r_frame_rate` 80) is read at its average rate, with as many
    /// frames as that rate gives its duration, not 8 times as many.
    #[test]
    fn variable_rate_videos_are_read_at_their_average_rate() {
        if !ffmpeg_for_tests() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vfr.mp4");
        let jitter = "setpts='(N*100+if(mod(N,2),37,0))/1000/TB'";
        let out = Command::new("ffmpeg")
            .args(["-v", "error", "-y", "-f", "lavfi", "-i"])
            .args([
                "testsrc=size=64x32:rate=1000",
                "-frames:v",
                "20",
                "-vf",
                jitter,
            ])
            .args(["-fps_mode", "passthrough", "-pix_fmt", "yuv420p"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let clip = read_clip(&path, FrameNeed::ALL).unwrap();
        let fps = clip.fps.unwrap();
        assert!((9.0..12.0).contains(&fps), "{fps} fps");
        let n = clip.frames.len();
        assert!((19..=23).contains(&n), "{n} frames at {fps} fps");
    }

    /// Through FFmpeg: an MP4 written from frames reads back with their count, size (an odd
    /// side padded to even) and colours (H.264 is lossy: within a few levels on flat frames);
    /// a failed encode names the file and leaves nothing behind.
    #[test]
    fn mp4s_read_back_as_written() {
        if !ffmpeg_for_tests() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let colours = [
            [200u8, 30, 30],
            [30, 200, 30],
            [30, 30, 200],
            [128, 128, 128],
        ];
        let (w, h) = (32, 15);
        let clip = Frames {
            frames: colours.iter().map(|c| vec![*c; w * h]).collect(),
            width: w,
            height: h,
        };
        let path = dir.path().join("clip.mp4");
        assert_eq!(write_mp4(&path, &clip, 8.0).unwrap(), Some(path.clone()));
        let back = read_clip(&path, FrameNeed::ALL).unwrap();
        assert_eq!(
            (back.width, back.height, back.frames.len(), back.fps),
            (w, h + 1, colours.len(), Some(8.0))
        );
        for (frame, colour) in back.frames.iter().zip(colours) {
            let centre = frame[(h / 2) * w + w / 2];
            let off = (0..3).map(|c| centre[c].abs_diff(colour[c])).max().unwrap();
            assert!(off <= 6, "{centre:?} read back for {colour:?}");
        }
        let names = |d: &Path| std::fs::read_dir(d).unwrap().count();
        assert_eq!(names(dir.path()), 1, "the temporary file is left");

        let nowhere = dir.path().join("missing/clip.mp4");
        let err = write_mp4(&nowhere, &clip, 8.0).unwrap_err().to_string();
        assert!(err.contains("missing/clip.mp4"), "{err}");
        let short = Frames {
            frames: vec![vec![[0; 3]; w]],
            ..clip
        };
        let err = write_mp4(&path, &short, 8.0).unwrap_err().to_string();
        assert!(err.contains("not frames of 32x15"), "{err}");
        assert_eq!(names(dir.path()), 1);
    }
}
