//! Reading clips for preprocessing: animated GIFs, PNG and JPEG images through the `gif`,
//! `png` and `zune-jpeg` crates, folders of PNG or JPEG frames, and (when the `ffmpeg` binary
//! is installed, see `scripts/install-ffmpeg.sh`) any video FFmpeg reads. Every error names
//! the file.

use std::cmp::Ordering;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

pub use super::ffmpeg::{ffmpeg_available, ffmpeg_for_tests, read_video};
use image::metadata::Orientation;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;

use super::resize::frame_indices;
use super::MediaError;

/// Decoded frames of one clip, RGB, row-major, all `width × height`.
#[derive(Debug, Clone, PartialEq)]
pub struct Clip {
    /// The frames, in display order. A frame that the reader's [`FrameNeed`] does not pick
    /// is empty (decoded past, never kept), so a 60 fps clip sampled at 16 fps holds about a
    /// quarter of its leading frames' pixels.
    pub frames: Vec<Vec<[u8; 3]>>,
    /// Frame width in pixels.
    pub width: usize,
    /// Frame height in pixels.
    pub height: usize,
    /// Frames per second, when the file says (GIF delays, video streams).
    pub fps: Option<f64>,
}

/// The leading frames a reader decodes: enough to sample `frames` frames at `fps` from the
/// clip's own rate, as [`frame_indices`] picks them (from the first frame on). Later frames
/// are never decoded, so a long video costs only the frames used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FrameNeed {
    /// Frames sampled.
    pub frames: usize,
    /// The rate they are sampled at (`None`: every frame).
    pub fps: Option<f64>,
}

impl FrameNeed {
    /// Every frame of the clip.
    pub const ALL: Self = Self {
        frames: usize::MAX,
        fps: None,
    };

    /// How many leading frames of a clip at `src_fps` the sampling reads (`usize::MAX`: all).
    pub fn count(&self, src_fps: Option<f64>) -> usize {
        match self.picked(src_fps) {
            Some(idx) => idx.last().map_or(usize::MAX, |last| last + 1),
            None => usize::MAX,
        }
    }

    /// The frames of a clip at `src_fps` that the sampling picks, in order (a frame twice
    /// where the clip is slower than the sampling); `None`: every frame.
    pub fn picked(&self, src_fps: Option<f64>) -> Option<Vec<usize>> {
        if self.frames == usize::MAX {
            return None;
        }
        frame_indices(usize::MAX, self.frames, src_fps, self.fps)
    }
}

/// Whether frame `i` is among `picked` ([`FrameNeed::picked`]; `None`: every frame).
pub(super) fn is_picked(picked: Option<&[usize]>, i: usize) -> bool {
    picked.is_none_or(|p| p.binary_search(&i).is_ok())
}

/// What kind of media a path holds, by extension (a folder is a frame folder).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaKind {
    /// An animated or still GIF.
    Gif,
    /// A PNG or JPEG image (one frame).
    Image,
    /// A folder of PNG or JPEG frames, in file-name order.
    FrameFolder,
    /// A video file, decoded by FFmpeg.
    Video,
}

/// JPEG extensions (any case), read by [`read_jpeg`].
pub const JPEG_EXTENSIONS: [&str; 2] = ["jpg", "jpeg"];

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
            e if JPEG_EXTENSIONS.contains(&e) => Some(Self::Image),
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

/// The most pixels a frame may have (8192 × 8192): a header claiming more is refused before
/// anything is allocated for it.
pub const MAX_FRAME_PIXELS: usize = 8192 * 8192;

/// The most bytes of decoded RGB frames one clip may hold (8 GiB).
pub const MAX_CLIP_BYTES: usize = 8 << 30;

/// Refuse `frames` frames of `w × h` pixels when one frame is over [`MAX_FRAME_PIXELS`] or
/// the frames together over [`MAX_CLIP_BYTES`] (a header or a frame count asking for more
/// memory than any training clip needs), naming the file.
pub(super) fn check_size(path: &Path, w: usize, h: usize, frames: usize) -> Result<(), MediaError> {
    let pixels = w.saturating_mul(h);
    if pixels > MAX_FRAME_PIXELS {
        return Err(invalid(
            path,
            format!("{w}x{h} frames: more than the {MAX_FRAME_PIXELS} pixels (8192x8192) a frame may have"),
        ));
    }
    if pixels.saturating_mul(3).saturating_mul(frames) > MAX_CLIP_BYTES {
        let gib = MAX_CLIP_BYTES >> 30;
        return Err(invalid(
            path,
            format!("{frames} frames of {w}x{h} pixels: more than the {gib} GiB a clip may decode to; use fewer --frames or a smaller clip"),
        ));
    }
    Ok(())
}

pub(super) fn invalid(path: &Path, reason: impl Into<String>) -> MediaError {
    MediaError::Invalid {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Refuse a named pipe or a device (a frame `0001.png` that is a FIFO): reading one would
/// block, or never end.
fn not_special(path: &Path) -> Result<(), MediaError> {
    match reel_core::io::is_special(path) {
        true => Err(invalid(path, "not a regular file or folder")),
        false => Ok(()),
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

/// Read any supported media (see [`MediaKind`]), decoding the frames `need` says.
pub fn read_clip(path: &Path, need: FrameNeed) -> Result<Clip, MediaError> {
    not_special(path)?;
    match MediaKind::of(path) {
        Some(MediaKind::Gif) => read_gif(path, need),
        Some(MediaKind::Image) => {
            let (frame, width, height) = read_image(path)?;
            Ok(Clip {
                frames: vec![frame],
                width,
                height,
                fps: None,
            })
        }
        Some(MediaKind::FrameFolder) => read_frame_folder(path, need),
        Some(MediaKind::Video) => read_video(path, need),
        None => Err(invalid(path, "not a GIF, PNG, JPEG, video or frame folder")),
    }
}

/// A PNG or JPEG image (by extension) as RGB pixels: `(pixels, width, height)`.
pub fn read_image(path: &Path) -> Result<(Vec<[u8; 3]>, usize, usize), MediaError> {
    not_special(path)?;
    let ext = path.extension().and_then(|e| e.to_str());
    let jpeg = ext.is_some_and(|e| JPEG_EXTENSIONS.iter().any(|j| e.eq_ignore_ascii_case(j)));
    match jpeg {
        true => read_jpeg(path),
        false => read_png(path),
    }
}

/// A JPEG as RGB pixels (greyscale and CMYK images are converted). Returns `(pixels, width,
/// height)`.
pub fn read_jpeg(path: &Path) -> Result<(Vec<[u8; 3]>, usize, usize), MediaError> {
    let bytes = std::fs::read(path).map_err(|error| MediaError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    if !jpeg_complete(&bytes) {
        return Err(invalid(
            path,
            "cut short: it ends before its end-of-image marker",
        ));
    }
    let side = (MAX_FRAME_PIXELS as f64).sqrt() as usize;
    let options = DecoderOptions::default()
        .jpeg_set_out_colorspace(ColorSpace::RGB)
        .set_max_width(side)
        .set_max_height(side);
    let mut decoder = JpegDecoder::new_with_options(std::io::Cursor::new(&bytes), options);
    let bytes = decoder.decode().map_err(|e| invalid(path, e.to_string()))?;
    let info = decoder
        .info()
        .ok_or_else(|| invalid(path, "no JPEG header"))?;
    let (w, h) = (info.width as usize, info.height as usize);
    if bytes.len() != w * h * 3 {
        let got = bytes.len();
        return Err(invalid(path, format!("{got} bytes for {w}x{h} RGB pixels")));
    }
    let pixels = bytes.chunks_exact(3).map(|p| [p[0], p[1], p[2]]).collect();
    // Phones store a photo as the sensor saw it and say in EXIF how to turn it upright.
    let orientation = decoder.exif().and_then(|e| Orientation::from_exif_chunk(e));
    Ok(upright(
        pixels,
        w,
        h,
        orientation.unwrap_or(Orientation::NoTransforms),
    ))
}

/// `w × h` pixels turned as an EXIF `orientation` says (quarter turns clockwise, then a
/// horizontal flip): `(pixels, width, height)`.
fn upright(
    px: Vec<[u8; 3]>,
    w: usize,
    h: usize,
    orientation: Orientation,
) -> (Vec<[u8; 3]>, usize, usize) {
    use Orientation::*;
    let (turns, flip) = match orientation {
        NoTransforms => return (px, w, h),
        Rotate90 => (1, false),
        Rotate180 => (2, false),
        Rotate270 => (3, false),
        FlipHorizontal => (0, true),
        FlipVertical => (2, true),
        Rotate90FlipH => (1, true),
        Rotate270FlipH => (3, true),
    };
    let (nw, nh) = if turns % 2 == 1 { (h, w) } else { (w, h) };
    let source = |x: usize, y: usize| {
        let x = if flip { nw - 1 - x } else { x };
        let (sx, sy) = match turns {
            0 => (x, y),
            1 => (y, h - 1 - x),
            2 => (w - 1 - x, h - 1 - y),
            _ => (w - 1 - y, x),
        };
        px[sy * w + sx]
    };
    let out = (0..nh).flat_map(|y| (0..nw).map(move |x| (x, y)));
    (out.map(|(x, y)| source(x, y)).collect(), nw, nh)
}

/// Whether a JPEG's bytes run, marker by marker, from its start-of-image marker (`FF D8`) to
/// its end-of-image marker (`FF D9`): a file cut short does not reach one (the decoder would
/// fill the missing part with grey rather than fail). Segments are skipped by their lengths
/// (an EXIF thumbnail's markers inside one are not seen), and a scan's entropy-coded data
/// ends at the first `FF` that is neither a stuffed `FF 00` nor a restart marker. What
/// follows the image's end is not looked at: phones append a whole video there (Motion
/// Photos), whose bytes hold `FF D9` and `FF DA` pairs anywhere.
fn jpeg_complete(bytes: &[u8]) -> bool {
    if !bytes.starts_with(&[0xFF, 0xD8]) {
        return false;
    }
    let mut i = 2;
    loop {
        // A marker: `FF` (any number: fill bytes), then its code. Stray bytes before it are
        // skipped, as decoders do ("extraneous bytes before marker").
        match bytes
            .get(i..)
            .and_then(|rest| rest.iter().position(|&b| b == 0xFF))
        {
            Some(skip) => i += skip,
            None => return false,
        }
        while bytes.get(i) == Some(&0xFF) {
            i += 1;
        }
        let Some(&code) = bytes.get(i) else {
            return false;
        };
        i += 1;
        match code {
            0xD9 => return true,
            0x01 | 0xD0..=0xD7 => continue, // no length
            _ => {}
        }
        let Some(len) = bytes
            .get(i..i + 2)
            .map(|b| usize::from(b[0]) << 8 | usize::from(b[1]))
        else {
            return false;
        };
        if len < 2 {
            return false;
        }
        i += len;
        if code == 0xDA {
            match scan_end(bytes, i) {
                Some(end) => i = end,
                None => return false,
            }
        }
    }
}

/// Where the entropy-coded data starting at `from` ends: the `FF` of the next marker that is
/// not a stuffed byte (`FF 00`) or a restart (`FF D0`..`FF D7`); `None` when the bytes end
/// first.
fn scan_end(bytes: &[u8], mut from: usize) -> Option<usize> {
    loop {
        from += bytes.get(from..)?.iter().position(|&b| b == 0xFF)?;
        match *bytes.get(from + 1)? {
            0x00 | 0xD0..=0xD7 => from += 2,
            0xFF => from += 1,
            _ => return Some(from),
        }
    }
}

/// A PNG as RGB pixels (grey, palette, alpha and 16-bit images are converted; alpha is
/// dropped). Returns `(pixels, width, height)`.
pub fn read_png(path: &Path) -> Result<(Vec<[u8; 3]>, usize, usize), MediaError> {
    let bad = |e: ::png::DecodingError| invalid(path, e.to_string());
    let mut decoder = ::png::Decoder::new(open(path)?);
    decoder.set_transformations(::png::Transformations::EXPAND | ::png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().map_err(bad)?;
    let header = reader.info();
    check_size(path, header.width as usize, header.height as usize, 1)?;
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
/// first frame's delay. Frames past what `need` says are not decoded.
pub fn read_gif(path: &Path, need: FrameNeed) -> Result<Clip, MediaError> {
    let bad = |e: ::gif::DecodingError| invalid(path, e.to_string());
    let mut options = ::gif::DecodeOptions::new();
    options.set_color_output(::gif::ColorOutput::RGBA);
    let mut decoder = options.read_info(open(path)?).map_err(bad)?;
    let (w, h) = (decoder.width() as usize, decoder.height() as usize);
    if w == 0 || h == 0 {
        return Err(invalid(path, format!("a {w}x{h} GIF has no pixels")));
    }
    check_size(path, w, h, 1)?;
    let mut canvas = vec![[0u8; 3]; w * h];
    let (mut frames, mut delay, mut kept) = (Vec::new(), None, 0);
    let fps = |delay: Option<u16>| delay.filter(|d| *d > 0).map(|d| 100.0 / d as f64);
    while frames.len() < need.count(fps(delay)) {
        let Some(frame) = decoder.read_next_frame().map_err(bad)? else {
            break;
        };
        delay.get_or_insert(frame.delay);
        let keep = is_picked(need.picked(fps(delay)).as_deref(), frames.len());
        if keep {
            kept += 1;
            check_size(path, w, h, kept)?;
        }
        let before = canvas.clone();
        let (left, top) = (frame.left as usize, frame.top as usize);
        let (fw, fh) = (frame.width as usize, frame.height as usize);
        for (i, px) in frame.buffer.chunks_exact(4).enumerate() {
            let (x, y) = (left + i % fw, top + i / fw);
            if px[3] != 0 && x < w && y < h {
                canvas[y * w + x] = [px[0], px[1], px[2]];
            }
        }
        frames.push(if keep { canvas.clone() } else { vec![] });
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
    Ok(Clip {
        frames,
        width: w,
        height: h,
        fps: fps(delay),
    })
}

/// A folder of PNG or JPEG frames in file-name order, numbers by value (`2.png` before
/// `10.png`, as `ffmpeg -i clip.mp4 %d.png` writes them); hidden files (macOS's `._0001.png`)
/// are not frames. Every frame must have the first one's size. Only the frames `need` says
/// are read.
pub fn read_frame_folder(dir: &Path, need: FrameNeed) -> Result<Clip, MediaError> {
    let entries = std::fs::read_dir(dir).map_err(|error| MediaError::Io {
        path: dir.to_path_buf(),
        error,
    })?;
    let mut files: Vec<(String, PathBuf)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| MediaKind::of(p) == Some(MediaKind::Image))
        .filter_map(|p| Some((p.file_name()?.to_string_lossy().into_owned(), p)))
        .filter(|(name, _)| !name.starts_with('.'))
        .collect();
    files.sort_by(|(a, _), (b, _)| natural_order(a, b));
    let mut files: Vec<PathBuf> = files.into_iter().map(|(_, p)| p).collect();
    files.truncate(need.count(None));
    let mut clip = Clip {
        frames: Vec::with_capacity(files.len()),
        width: 0,
        height: 0,
        fps: None,
    };
    for file in &files {
        let (frame, w, h) = read_image(file)?;
        if clip.frames.is_empty() {
            (clip.width, clip.height) = (w, h);
        } else if (w, h) != (clip.width, clip.height) {
            let want = format!("{}x{}", clip.width, clip.height);
            return Err(invalid(file, format!("{w}x{h} frame, the first is {want}")));
        }
        check_size(dir, w, h, clip.frames.len() + 1)?;
        clip.frames.push(frame);
    }
    if clip.frames.is_empty() {
        return Err(invalid(dir, "a frame folder without PNG or JPEG frames"));
    }
    Ok(clip)
}

/// File names compared with their digit runs as numbers (`f2` < `f10`; `007` and `7` tie and
/// fall back to the names as text), the rest as text.
fn natural_order(a: &str, b: &str) -> Ordering {
    /// A digit run by value (its length without leading zeros, then its digits) sorts before
    /// text, as digits do in ASCII.
    #[derive(PartialEq, Eq, PartialOrd, Ord)]
    enum Run<'a> {
        Number(usize, &'a str),
        Text(&'a str),
    }
    fn runs(name: &str) -> Vec<Run<'_>> {
        let mut out = Vec::new();
        let mut rest = name;
        while let Some(first) = rest.chars().next() {
            let digits = first.is_ascii_digit();
            let end = rest
                .find(|c: char| c.is_ascii_digit() != digits)
                .unwrap_or(rest.len());
            let (run, tail) = rest.split_at(end);
            out.push(if digits {
                let value = run.trim_start_matches('0');
                Run::Number(value.len(), value)
            } else {
                Run::Text(run)
            });
            rest = tail;
        }
        out
    }
    runs(a).cmp(&runs(b)).then_with(|| a.cmp(b))
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
        let clip = read_clip(&gif, FrameNeed::ALL).unwrap();
        assert_eq!((clip.width, clip.height, clip.frames.len()), (5, 3, 3));
        assert_eq!(clip.frames, frames, "few colours are stored exactly");
        assert_eq!(clip.fps, Some(10.0));

        let png = dir.path().join("b.png");
        write_png(&png, &frames[1], 5, 3).unwrap();
        let img = read_clip(&png, FrameNeed::ALL).unwrap();
        assert_eq!(img.frames, vec![frames[1].clone()]);
        assert_eq!(MediaKind::of(&png).unwrap().media_type(), "image");
    }

    #[test]
    fn frame_folders_are_read_in_name_order_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("clip");
        std::fs::create_dir(&folder).unwrap();
        // Numbers by value, as `ffmpeg -i clip.mp4 f%d.png` names them, padded or not.
        let names = [
            ("f10.png", 40u8),
            ("f2.png", 20),
            ("f1.png", 10),
            ("f03.png", 30),
        ];
        for (name, v) in names {
            write_png(&folder.join(name), &frame(v, 4, 2), 4, 2).unwrap();
        }
        std::fs::write(folder.join("notes.txt"), "ignored").unwrap();
        std::fs::write(folder.join("._f1.png"), "macOS metadata, not a PNG").unwrap();
        let clip = read_clip(&folder, FrameNeed::ALL).unwrap();
        let firsts: Vec<u8> = clip.frames.iter().map(|f| f[0][0]).collect();
        assert_eq!(firsts, [10, 20, 30, 40]);
        let mut sorted = ["b", "a10", "a2", "a02", "a", "7", "10", "x1y20", "x1y3"];
        sorted.sort_by(|a, b| natural_order(a, b));
        let want = ["7", "10", "a", "a02", "a2", "a10", "b", "x1y3", "x1y20"];
        assert_eq!(sorted, want);

        write_png(&folder.join("f11.png"), &frame(0, 3, 2), 3, 2).unwrap();
        let err = read_clip(&folder, FrameNeed::ALL).unwrap_err().to_string();
        assert!(err.contains("f11.png") && err.contains("3x2"), "{err}");
    }

    #[test]
    fn bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let gif = dir.path().join("broken.gif");
        std::fs::write(&gif, b"GIF89a nonsense").unwrap();
        let err = read_clip(&gif, FrameNeed::ALL).unwrap_err().to_string();
        assert!(err.contains("broken.gif"), "{err}");
        let txt = dir.path().join("caption.txt");
        assert_eq!(MediaKind::of(&txt), None);
    }

    /// A 16x8 JPEG whose left half is red and right half blue (made here with `ffmpeg -f lavfi
    /// -i color=c=red:s=8x8 -f lavfi -i color=c=blue:s=8x8 -filter_complex hstack`, 4:4:4,
    /// quality 1): decoded alone, as a frame folder beside a PNG frame, and cut short.
    #[test]
    fn jpeg_images_and_frames_are_read() {
        let jpeg = include_bytes!("testdata/red_blue_16x8.jpg");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("photo.JPG");
        std::fs::write(&path, jpeg).unwrap();
        assert_eq!(MediaKind::of(&path), Some(MediaKind::Image));
        let clip = read_clip(&path, FrameNeed::ALL).unwrap();
        assert_eq!((clip.width, clip.height, clip.frames.len()), (16, 8, 1));
        // JPEG is lossy: away from the edge between the halves the colours are near exact.
        let near =
            |px: [u8; 3], want: [u8; 3]| px.iter().zip(want).all(|(a, b)| a.abs_diff(b) <= 12);
        for y in 0..8 {
            let row = &clip.frames[0][y * 16..(y + 1) * 16];
            assert!(
                row[..6].iter().all(|&p| near(p, [255, 0, 0])),
                "row {y}: {row:?}"
            );
            assert!(
                row[10..].iter().all(|&p| near(p, [0, 0, 255])),
                "row {y}: {row:?}"
            );
        }

        let folder = dir.path().join("frames");
        std::fs::create_dir(&folder).unwrap();
        std::fs::write(folder.join("0001.jpeg"), jpeg).unwrap();
        write_png(&folder.join("0002.png"), &frame(7, 16, 8), 16, 8).unwrap();
        let frames = read_clip(&folder, FrameNeed::ALL).unwrap();
        assert_eq!(frames.frames.len(), 2);
        assert_eq!(frames.frames[0], clip.frames[0]);
        assert_eq!(frames.frames[1], frame(7, 16, 8));

        // Cut anywhere in its scan it is refused (the decoder alone would fill the rest with
        // grey); bytes after its end marker are allowed (cameras append some).
        let cut = dir.path().join("cut.jpg");
        let sos = jpeg.windows(2).rposition(|w| w == [0xFF, 0xDA]).unwrap();
        for end in [
            sos + 4,
            (sos + jpeg.len()) / 2,
            jpeg.len() - 2,
            jpeg.len() / 2,
        ] {
            std::fs::write(&cut, &jpeg[..end]).unwrap();
            let err = read_clip(&cut, FrameNeed::ALL).unwrap_err().to_string();
            assert!(
                err.contains("cut.jpg") && err.contains("cut short"),
                "{end}: {err}"
            );
        }
        std::fs::write(&cut, [&jpeg[..], b"trailer"].concat()).unwrap();
        assert_eq!(read_clip(&cut, FrameNeed::ALL).unwrap().frames, clip.frames);
        // A Motion Photo: a video appended after the image, whose bytes hold marker-like
        // pairs (a scan start after the last end-of-image pair, here) is read as the image.
        let appended = [0xFF, 0xD9, 0x12, 0xFF, 0xDA, 0x00, 0x08, 0x34];
        std::fs::write(&cut, [&jpeg[..], &appended[..]].concat()).unwrap();
        assert_eq!(read_clip(&cut, FrameNeed::ALL).unwrap().frames, clip.frames);
        // Stray bytes between two segments (decoders skip them) are allowed too.
        let stray = [&jpeg[..2], &[0x00, 0x12][..], &jpeg[2..]].concat();
        std::fs::write(&cut, stray).unwrap();
        assert_eq!(read_clip(&cut, FrameNeed::ALL).unwrap().frames, clip.frames);
        let not_jpeg = dir.path().join("text.jpeg");
        std::fs::write(&not_jpeg, "not an image").unwrap();
        let err = read_clip(&not_jpeg, FrameNeed::ALL)
            .unwrap_err()
            .to_string();
        assert!(err.contains("text.jpeg"), "{err}");
    }

    /// Readers stop at the frames the sampling uses and keep only those: a 10 fps GIF
    /// sampled at 5 fps for 2 frames reads frames 0..=2 and keeps 0 and 2 (frame 1 is
    /// decoded, to compose the next, but left empty); a frame folder (no rate) its first 2
    /// files.
    #[test]
    fn readers_decode_only_the_frames_needed() {
        let need = FrameNeed {
            frames: 3,
            fps: Some(15.0),
        };
        assert_eq!(need.count(Some(30.0)), 5);
        assert_eq!(need.count(None), 3);
        assert_eq!(FrameNeed::ALL.count(Some(30.0)), usize::MAX);

        let dir = tempfile::tempdir().unwrap();
        let frames: Vec<_> = (0..6).map(|i| frame(40 * i, 5, 3)).collect();
        let gif = dir.path().join("a.gif");
        write_gif(&gif, &frames, 5, 3, 1, 10).unwrap();
        let half_rate = FrameNeed {
            frames: 2,
            fps: Some(5.0),
        };
        let clip = read_clip(&gif, half_rate).unwrap();
        assert_eq!(clip.frames, [frames[0].clone(), vec![], frames[2].clone()]);
        assert_eq!(read_clip(&gif, FrameNeed::ALL).unwrap().frames.len(), 6);

        let folder = dir.path().join("clip");
        std::fs::create_dir(&folder).unwrap();
        for (i, f) in frames.iter().enumerate() {
            write_png(&folder.join(format!("f{i}.png")), f, 5, 3).unwrap();
        }
        let clip = read_clip(&folder, half_rate).unwrap();
        assert_eq!(clip.frames, frames[..2].to_vec());
    }

    /// A photo with an EXIF orientation is turned upright: the red-left, blue-right test
    /// image marked "rotate 90° clockwise" (orientation 6) reads as 8 wide, 16 high, red on
    /// top; every orientation keeps the pixels, only moved.
    #[test]
    fn jpeg_exif_orientation_is_applied() {
        let jpeg = include_bytes!("testdata/red_blue_16x8.jpg");
        // APP1: "Exif\0\0", a little-endian TIFF header, one IFD entry: tag 0x0112 (SHORT) = 6.
        let mut tiff = b"Exif\0\0II*\0\x08\0\0\0\x01\0\x12\x01\x03\0\x01\0\0\0\x06\0\0\0".to_vec();
        tiff.extend_from_slice(&[0, 0, 0, 0]);
        let mut app1 = vec![0xFF, 0xE1];
        app1.extend_from_slice(&((tiff.len() + 2) as u16).to_be_bytes());
        app1.extend_from_slice(&tiff);
        let turned = [&jpeg[..2], &app1[..], &jpeg[2..]].concat();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("phone.jpg");
        std::fs::write(&path, turned).unwrap();
        let (px, w, h) = read_image(&path).unwrap();
        assert_eq!((w, h), (8, 16));
        let red = |p: [u8; 3]| p[0] > 200 && p[2] < 60;
        let blue = |p: [u8; 3]| p[2] > 200 && p[0] < 60;
        assert!(px[..8 * 6].iter().all(|&p| red(p)), "top is red");
        assert!(px[8 * 10..].iter().all(|&p| blue(p)), "bottom is blue");

        let img: Vec<[u8; 3]> = (0..6).map(|i| [i as u8; 3]).collect(); // 3 wide, 2 high
        let cases = [
            (Orientation::Rotate90, 2, vec![3, 0, 4, 1, 5, 2]),
            (Orientation::Rotate180, 3, vec![5, 4, 3, 2, 1, 0]),
            (Orientation::Rotate270, 2, vec![2, 5, 1, 4, 0, 3]),
            (Orientation::FlipHorizontal, 3, vec![2, 1, 0, 5, 4, 3]),
            (Orientation::FlipVertical, 3, vec![3, 4, 5, 0, 1, 2]),
            (Orientation::Rotate90FlipH, 2, vec![0, 3, 1, 4, 2, 5]),
            (Orientation::Rotate270FlipH, 2, vec![5, 2, 4, 1, 3, 0]),
        ];
        for (o, width, want) in cases {
            let (out, w, h) = upright(img.clone(), 3, 2, o);
            assert_eq!((w, w * h), (width, 6), "{o:?}");
            assert_eq!(out.iter().map(|p| p[0]).collect::<Vec<_>>(), want, "{o:?}");
        }
    }

    /// Headers claiming more pixels than a frame may have are refused before anything is
    /// allocated for them (a 200-byte GIF of a 65535² screen would ask for 13 GB per frame),
    /// and so is a clip whose frames together would pass the clip budget.
    #[test]
    fn huge_claimed_sizes_are_refused_before_allocating() {
        let dir = tempfile::tempdir().unwrap();
        let gif = dir.path().join("huge.gif");
        write_gif(&gif, &[frame(9, 1, 1)], 1, 1, 1, 10).unwrap();
        let mut bytes = std::fs::read(&gif).unwrap();
        bytes[6..8].copy_from_slice(&u16::MAX.to_le_bytes());
        bytes[8..10].copy_from_slice(&u16::MAX.to_le_bytes());
        std::fs::write(&gif, bytes).unwrap();
        let err = read_clip(&gif, FrameNeed::ALL).unwrap_err().to_string();
        assert!(
            err.contains("huge.gif") && err.contains("65535x65535"),
            "{err}"
        );

        // A PNG's IHDR claiming 60000², its checksum made right.
        let png = dir.path().join("huge.png");
        write_png(&png, &frame(9, 2, 2), 2, 2).unwrap();
        let mut bytes = std::fs::read(&png).unwrap();
        bytes[16..20].copy_from_slice(&60000u32.to_be_bytes());
        bytes[20..24].copy_from_slice(&60000u32.to_be_bytes());
        let crc = crc32(&bytes[12..29]);
        bytes[29..33].copy_from_slice(&crc.to_be_bytes());
        std::fs::write(&png, bytes).unwrap();
        let err = read_clip(&png, FrameNeed::ALL).unwrap_err().to_string();
        assert!(
            err.contains("huge.png") && err.contains("60000x60000"),
            "{err}"
        );

        let side = 8192;
        assert!(check_size(&png, side, side, 1).is_ok());
        let frames = MAX_CLIP_BYTES / (side * side * 3) + 1;
        let err = check_size(&png, side, side, frames)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("GiB") && err.contains(&format!("{frames} frames")),
            "{err}"
        );
    }

    /// PNG's chunk checksum (CRC-32, the zlib polynomial).
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = u32::MAX;
        for &b in bytes {
            crc ^= b as u32;
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    /// A named pipe is refused at once: reading it would wait for a writer forever.
    #[cfg(unix)]
    #[test]
    fn a_named_pipe_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("clip.gif");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let err = read_clip(&fifo, FrameNeed::ALL).unwrap_err().to_string();
        assert!(
            err.contains("clip.gif") && err.contains("not a regular file"),
            "{err}"
        );
        // A frame of a frame folder that is a pipe is refused the same way.
        let frames = dir.path().join("scene");
        std::fs::create_dir(&frames).unwrap();
        write_png(&frames.join("0001.png"), &frame(1, 4, 4), 4, 4).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(frames.join("0002.png"))
            .status()
            .unwrap();
        assert!(made.success());
        let err = read_clip(&frames, FrameNeed::ALL).unwrap_err().to_string();
        assert!(
            err.contains("0002.png") && err.contains("not a regular file"),
            "{err}"
        );
    }

    /// A GIF whose logical screen has no pixels is refused, naming the file.
    #[test]
    fn an_empty_gif_screen_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let gif = dir.path().join("flat.gif");
        write_gif(&gif, &[frame(9, 5, 3)], 5, 3, 1, 10).unwrap();
        let mut bytes = std::fs::read(&gif).unwrap();
        bytes[6..8].copy_from_slice(&0u16.to_le_bytes()); // the screen width
        std::fs::write(&gif, bytes).unwrap();
        let err = read_clip(&gif, FrameNeed::ALL).unwrap_err().to_string();
        assert!(err.contains("flat.gif") && err.contains("0x3"), "{err}");
    }
}
