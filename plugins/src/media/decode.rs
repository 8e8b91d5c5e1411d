//! Reading clips for preprocessing: animated GIFs and PNG images through the `gif` and `png`
//! crates, folders of PNG frames, and (when the `ffmpeg` binary is installed, see
//! `scripts/install-ffmpeg.sh`) any video FFmpeg reads. Every error names the file.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::MediaError;

/// Decoded frames of one clip, RGB, row-major, all `width × height`.
#[derive(Debug, Clone, PartialEq)]
pub struct Clip {
    /// The frames, in display order.
    pub frames: Vec<Vec<[u8; 3]>>,
    /// Frame width in pixels.
    pub width: usize,
    /// Frame height in pixels.
    pub height: usize,
    /// Frames per second, when the file says (GIF delays, video streams).
    pub fps: Option<f64>,
}

/// What kind of media a path holds, by extension (a folder is a frame folder).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaKind {
    /// An animated or still GIF.
    Gif,
    /// A PNG image (one frame).
    Image,
    /// A folder of PNG frames, in file-name order.
    FrameFolder,
    /// A video file, decoded by FFmpeg.
    Video,
}

/// Video extensions handed to FFmpeg.
pub const VIDEO_EXTENSIONS: [&str; 7] = ["mp4", "mov", "webm", "mkv", "avi", "m4v", "mpg"];

impl MediaKind {
    /// The kind of `path`, `None` for files that are not media (captions, ...).
    pub fn of(path: &Path) -> Option<Self> {
        if path.is_dir() {
            return Some(Self::FrameFolder);
        }
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "gif" => Some(Self::Gif),
            "png" => Some(Self::Image),
            e if VIDEO_EXTENSIONS.contains(&e) => Some(Self::Video),
            _ => None,
        }
    }

    /// `"video"` or `"image"`, FastVideo's `media_type` column.
    pub fn media_type(self) -> &'static str {
        match self {
            Self::Image => "image",
            _ => "video",
        }
    }
}

fn invalid(path: &Path, reason: impl Into<String>) -> MediaError {
    MediaError::Invalid {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn open(path: &Path) -> Result<BufReader<File>, MediaError> {
    File::open(path)
        .map(BufReader::new)
        .map_err(|error| MediaError::Io {
            path: path.to_path_buf(),
            error,
        })
}

/// Read any supported media (see [`MediaKind`]).
pub fn read_clip(path: &Path) -> Result<Clip, MediaError> {
    match MediaKind::of(path) {
        Some(MediaKind::Gif) => read_gif(path),
        Some(MediaKind::Image) => {
            let (frame, width, height) = read_png(path)?;
            Ok(Clip {
                frames: vec![frame],
                width,
                height,
                fps: None,
            })
        }
        Some(MediaKind::FrameFolder) => read_frame_folder(path),
        Some(MediaKind::Video) => read_video(path),
        None => Err(invalid(path, "not a GIF, PNG, video or frame folder")),
    }
}

/// A PNG as RGB pixels (grey, palette, alpha and 16-bit images are converted; alpha is
/// dropped). Returns `(pixels, width, height)`.
pub fn read_png(path: &Path) -> Result<(Vec<[u8; 3]>, usize, usize), MediaError> {
    let bad = |e: ::png::DecodingError| invalid(path, e.to_string());
    let mut decoder = ::png::Decoder::new(open(path)?);
    decoder.set_transformations(::png::Transformations::EXPAND | ::png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().map_err(bad)?;
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| invalid(path, "image too large"))?;
    let mut buf = vec![0u8; size];
    let info = reader.next_frame(&mut buf).map_err(bad)?;
    let channels = info.color_type.samples();
    let (w, h) = (info.width as usize, info.height as usize);
    let pixels = buf[..w * h * channels]
        .chunks_exact(channels)
        .map(|p| match channels {
            1 | 2 => [p[0]; 3],
            _ => [p[0], p[1], p[2]],
        })
        .collect();
    Ok((pixels, w, h))
}

/// An animated GIF, frames composited onto the logical screen as a viewer shows them
/// (partial frames, transparency and the disposal methods honoured). `fps` comes from the
/// first frame's delay.
pub fn read_gif(path: &Path) -> Result<Clip, MediaError> {
    let bad = |e: ::gif::DecodingError| invalid(path, e.to_string());
    let mut options = ::gif::DecodeOptions::new();
    options.set_color_output(::gif::ColorOutput::RGBA);
    let mut decoder = options.read_info(open(path)?).map_err(bad)?;
    let (w, h) = (decoder.width() as usize, decoder.height() as usize);
    let mut canvas = vec![[0u8; 3]; w * h];
    let (mut frames, mut delay) = (Vec::new(), None);
    while let Some(frame) = decoder.read_next_frame().map_err(bad)? {
        delay.get_or_insert(frame.delay);
        let before = canvas.clone();
        let (left, top) = (frame.left as usize, frame.top as usize);
        let (fw, fh) = (frame.width as usize, frame.height as usize);
        for (i, px) in frame.buffer.chunks_exact(4).enumerate() {
            let (x, y) = (left + i % fw, top + i / fw);
            if px[3] != 0 && x < w && y < h {
                canvas[y * w + x] = [px[0], px[1], px[2]];
            }
        }
        frames.push(canvas.clone());
        match frame.dispose {
            ::gif::DisposalMethod::Background => {
                for y in top..(top + fh).min(h) {
                    for x in left..(left + fw).min(w) {
                        canvas[y * w + x] = [0; 3];
                    }
                }
            }
            ::gif::DisposalMethod::Previous => canvas = before,
            _ => {}
        }
    }
    if frames.is_empty() {
        return Err(invalid(path, "no frames"));
    }
    let fps = delay.filter(|d| *d > 0).map(|d| 100.0 / d as f64);
    Ok(Clip {
        frames,
        width: w,
        height: h,
        fps,
    })
}

/// A folder of PNG frames in file-name order; every frame must have the first one's size.
pub fn read_frame_folder(dir: &Path) -> Result<Clip, MediaError> {
    let entries = std::fs::read_dir(dir).map_err(|error| MediaError::Io {
        path: dir.to_path_buf(),
        error,
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| MediaKind::of(p) == Some(MediaKind::Image))
        .collect();
    files.sort();
    let mut clip = Clip {
        frames: Vec::with_capacity(files.len()),
        width: 0,
        height: 0,
        fps: None,
    };
    for file in &files {
        let (frame, w, h) = read_png(file)?;
        if clip.frames.is_empty() {
            (clip.width, clip.height) = (w, h);
        } else if (w, h) != (clip.width, clip.height) {
            let want = format!("{}x{}", clip.width, clip.height);
            return Err(invalid(file, format!("{w}x{h} frame, the first is {want}")));
        }
        clip.frames.push(frame);
    }
    if clip.frames.is_empty() {
        return Err(invalid(dir, "a frame folder without PNG frames"));
    }
    Ok(clip)
}

/// Whether the `ffmpeg` and `ffprobe` binaries run.
pub fn ffmpeg_available() -> bool {
    ["ffmpeg", "ffprobe"].iter().all(|b| {
        Command::new(b)
            .arg("-version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// A video through the `ffmpeg` binary: the first video stream as RGB frames at its own
/// size and frame rate.
pub fn read_video(path: &Path) -> Result<Clip, MediaError> {
    if !ffmpeg_available() {
        return Err(invalid(
            path,
            "videos are decoded with FFmpeg: install it (scripts/install-ffmpeg.sh) or \
             convert the clip to a GIF or a folder of PNG frames",
        ));
    }
    let probe = run(
        path,
        Command::new("ffprobe")
            .args(["-v", "error", "-select_streams", "v:0"])
            .args([
                "-show_entries",
                "stream=width,height,r_frame_rate",
                "-of",
                "csv=p=0",
            ]),
    )?;
    let text = String::from_utf8_lossy(&probe);
    let fields: Vec<&str> = text.trim().split(',').collect();
    let (w, h, rate) = match fields.as_slice() {
        [w, h, rate, ..] => (w.parse::<usize>(), h.parse::<usize>(), *rate),
        _ => return Err(invalid(path, format!("no video stream ({})", text.trim()))),
    };
    let (Ok(w), Ok(h)) = (w, h) else {
        return Err(invalid(
            path,
            format!("unreadable stream size `{}`", text.trim()),
        ));
    };
    let fps = parse_rate(rate);
    let raw = run(
        path,
        Command::new("ffmpeg")
            .args(["-v", "error", "-i"])
            .arg(path)
            .args(["-map", "0:v:0", "-f", "rawvideo", "-pix_fmt", "rgb24", "-"]),
    )?;
    let frame_bytes = w * h * 3;
    if frame_bytes == 0 || raw.len() < frame_bytes {
        return Err(invalid(path, "FFmpeg decoded no frame"));
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
    use crate::media::{write_gif, write_png};

    fn frame(v: u8, w: usize, h: usize) -> Vec<[u8; 3]> {
        (0..w * h).map(|i| [v, (i % 251) as u8, 255 - v]).collect()
    }

    #[test]
    fn gif_and_png_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let frames = vec![frame(0, 5, 3), frame(100, 5, 3), frame(200, 5, 3)];
        let gif = dir.path().join("a.gif");
        write_gif(&gif, &frames, 5, 3, 1, 10).unwrap();
        let clip = read_clip(&gif).unwrap();
        assert_eq!((clip.width, clip.height, clip.frames.len()), (5, 3, 3));
        assert_eq!(clip.frames, frames, "few colours are stored exactly");
        assert_eq!(clip.fps, Some(10.0));

        let png = dir.path().join("b.png");
        write_png(&png, &frames[1], 5, 3).unwrap();
        let img = read_clip(&png).unwrap();
        assert_eq!(img.frames, vec![frames[1].clone()]);
        assert_eq!(MediaKind::of(&png).unwrap().media_type(), "image");
    }

    #[test]
    fn frame_folders_are_read_in_name_order_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("clip");
        std::fs::create_dir(&folder).unwrap();
        for (name, v) in [("f10.png", 30u8), ("f02.png", 20), ("f01.png", 10)] {
            write_png(&folder.join(name), &frame(v, 4, 2), 4, 2).unwrap();
        }
        std::fs::write(folder.join("notes.txt"), "ignored").unwrap();
        let clip = read_clip(&folder).unwrap();
        let firsts: Vec<u8> = clip.frames.iter().map(|f| f[0][0]).collect();
        assert_eq!(firsts, [10, 20, 30]);

        write_png(&folder.join("f11.png"), &frame(0, 3, 2), 3, 2).unwrap();
        let err = read_clip(&folder).unwrap_err().to_string();
        assert!(err.contains("f11.png") && err.contains("3x2"), "{err}");
    }

    #[test]
    fn bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let gif = dir.path().join("broken.gif");
        std::fs::write(&gif, b"GIF89a nonsense").unwrap();
        let err = read_clip(&gif).unwrap_err().to_string();
        assert!(err.contains("broken.gif"), "{err}");
        let txt = dir.path().join("caption.txt");
        assert_eq!(MediaKind::of(&txt), None);
        assert_eq!(
            parse_rate("30000/1001").map(|r| (r * 100.0).round()),
            Some(2997.0)
        );
        assert_eq!(parse_rate("0/0"), None);
    }
}
