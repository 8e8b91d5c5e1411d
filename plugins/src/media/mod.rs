//! Media for people and for preprocessing: writing animated GIFs, PNGs and contact sheets;
//! reading GIFs, PNGs, JPEGs, frame folders and (through FFmpeg) videos; resizing and cropping.
//!
//! Pixels are `[u8; 3]` RGB, row-major. Clips come from
//! [`clip_to_rgb`](crate::data::clip_to_rgb) or any other decoder.

pub mod decode;
mod ffmpeg;
pub mod font;
mod gif;
mod png;
pub mod resize;
pub mod video;

use std::path::{Path, PathBuf};

pub use self::gif::write_gif;
pub use self::png::write_png;

/// Gutter colour of contact sheets.
pub const GUTTER: [u8; 3] = [0, 0, 0];
/// Colour of contact-sheet row labels.
pub const LABEL: [u8; 3] = [255, 255, 255];

/// Errors of the media writers; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    /// Creating or writing the file failed.
    #[error("{path}: {error}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error (printed in the message, so not returned as the source).
        error: std::io::Error,
    },
    /// The encoder rejected the image.
    #[error("{path}: encoding failed: {reason}")]
    Encode {
        /// The file.
        path: PathBuf,
        /// The encoder's message.
        reason: String,
    },
    /// A file that cannot be decoded (a corrupt or cut image or video), or pixels that do not
    /// match the stated size, or a size out of the format's range.
    #[error("{path}: invalid media: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// Write `bytes` to `path` whole ([`reel_core::io::replace_file`]): a full disk leaves the
/// previous file (or none), never a cut one, and no temporary file.
pub fn save(path: &Path, bytes: &[u8]) -> Result<(), MediaError> {
    reel_core::io::replace_file(path, bytes).map_err(|error| MediaError::Io {
        path: path.to_path_buf(),
        error,
    })
}

/// Nearest-neighbour upscaling of a `width × height` image by an integer `scale` (`0` is
/// treated as 1). Returns `width·scale × height·scale` pixels.
pub fn upscale(rgb: &[[u8; 3]], width: usize, height: usize, scale: u32) -> Vec<[u8; 3]> {
    let s = scale.max(1) as usize;
    let out_w = width * s;
    let mut out = Vec::with_capacity(out_w * height * s);
    for y in 0..height * s {
        let row = &rgb[(y / s) * width..(y / s + 1) * width];
        out.extend((0..out_w).map(|x| row[x / s]));
    }
    out
}

/// Lay clips out as one image: one row per clip, one column per frame, each frame upscaled by
/// `scale`, with 1-pixel [`GUTTER`] lines between and around the cells. When `labels` is not
/// empty, each row is preceded by a band with its label (`labels[r]`, e.g. the caption and
/// its score) in [`LABEL`] colour, cut with `..` to the sheet's width. Every frame is
/// `w × h`; rows with fewer frames leave their trailing cells as gutter colour. Returns
/// `(pixels, width, height)`.
///
/// # Panics
/// If a frame does not hold `w·h` pixels.
pub fn contact_sheet(
    clips: &[Vec<Vec<[u8; 3]>>],
    labels: &[String],
    w: usize,
    h: usize,
    scale: u32,
) -> (Vec<[u8; 3]>, usize, usize) {
    let s = scale.max(1) as usize;
    let (cell_w, cell_h) = (w * s, h * s);
    let cols = clips.iter().map(Vec::len).max().unwrap_or(0);
    let width = cols * (cell_w + 1) + 1;
    let band = if labels.is_empty() {
        0
    } else {
        font::GLYPH_H + 2
    };
    let pitch = band + cell_h + 1;
    let height = clips.len() * pitch + 1;
    let mut sheet = vec![GUTTER; width * height];
    for (r, clip) in clips.iter().enumerate() {
        let top = 1 + r * pitch;
        if let Some(label) = labels.get(r) {
            let text = font::fit_text(label, width.saturating_sub(4), 1);
            font::draw_text(&mut sheet, width, 2, top + 1, &text, 1, LABEL);
        }
        for (c, frame) in clip.iter().enumerate() {
            assert_eq!(frame.len(), w * h, "contact_sheet: frame {c} of clip {r}");
            let big = upscale(frame, w, h, scale);
            let (x0, y0) = (1 + c * (cell_w + 1), top + band);
            for y in 0..cell_h {
                let dst = (y0 + y) * width + x0;
                sheet[dst..dst + cell_w].copy_from_slice(&big[y * cell_w..(y + 1) * cell_w]);
            }
        }
    }
    (sheet, width, height)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write that fails leaves the previous file as it was and no temporary file.
    #[test]
    fn save_replaces_a_file_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sheet.png");
        save(&path, b"first").unwrap();
        save(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        let entries = |d: &Path| std::fs::read_dir(d).unwrap().count();
        assert_eq!(entries(dir.path()), 1);

        // The temporary name is taken by a folder: the write fails, the file stays.
        std::fs::create_dir(reel_core::io::tmp_sibling(&path)).unwrap();
        let err = save(&path, b"third").unwrap_err().to_string();
        assert!(err.contains("sheet.png"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"second");

        let nowhere = dir.path().join("missing/sheet.png");
        assert!(save(&nowhere, b"x").is_err());
        assert!(!dir.path().join("missing").exists());
    }

    #[test]
    fn upscale_repeats_pixels() {
        let img = [[1, 1, 1], [2, 2, 2], [3, 3, 3], [4, 4, 4]];
        let big = upscale(&img, 2, 2, 2);
        assert_eq!(big.len(), 16);
        assert_eq!(big[0..4], [img[0], img[0], img[1], img[1]]);
        assert_eq!(big[4..8], [img[0], img[0], img[1], img[1]]);
        assert_eq!(big[12..16], [img[2], img[2], img[3], img[3]]);
        assert_eq!(upscale(&img, 2, 2, 0), img);
    }

    #[test]
    fn contact_sheet_layout() {
        let frame = |v: u8| vec![[v, v, v]; 6];
        let clips = vec![vec![frame(10), frame(20), frame(30)], vec![frame(40)]];
        let (sheet, width, height) = contact_sheet(&clips, &[], 3, 2, 2);
        assert_eq!((width, height), (3 * 7 + 1, 2 * 5 + 1));
        assert_eq!(sheet.len(), width * height);
        let at = |x: usize, y: usize| sheet[y * width + x];
        assert_eq!(at(0, 0), GUTTER);
        assert_eq!(at(1, 1), [10; 3]);
        assert_eq!(at(6, 4), [10; 3]);
        assert_eq!(at(7, 1), GUTTER);
        assert_eq!(at(8, 1), [20; 3]);
        assert_eq!(at(15, 4), [30; 3]);
        assert_eq!(at(1, 5), GUTTER);
        assert_eq!(at(1, 6), [40; 3]);
        assert_eq!(at(8, 6), GUTTER);
        assert_eq!(contact_sheet(&[], &[], 3, 2, 2), (vec![GUTTER], 1, 1));
    }

    #[test]
    fn labelled_rows_carry_their_text_above_the_frames() {
        let frame = |v: u8| vec![[v, v, v]; 16];
        let clips = vec![vec![frame(10)], vec![frame(40)], vec![frame(70)]];
        let labels = [
            "0.88 red".to_string(),
            "0.12 blue".into(),
            "0.88 red".into(),
        ];
        let (sheet, width, height) = contact_sheet(&clips, &labels, 16, 1, 4);
        let band = font::GLYPH_H + 2;
        let pitch = band + 4 + 1;
        assert_eq!((width, height), (16 * 4 + 2, 3 * pitch + 1));
        let at = |x: usize, y: usize| sheet[y * width + x];
        // The frames sit below their bands.
        for (r, v) in [10u8, 40, 70].into_iter().enumerate() {
            let top = 1 + r * pitch;
            assert_eq!(at(1, top + band), [v; 3], "row {r}");
            assert_eq!(
                at(1, top + band - 1),
                GUTTER,
                "row {r}: band above the frame"
            );
        }
        let band_pixels = |r: usize| -> Vec<[u8; 3]> {
            let top = 1 + r * pitch;
            sheet[top * width..(top + band) * width].to_vec()
        };
        assert!(band_pixels(0).contains(&LABEL), "the label is drawn");
        assert_eq!(band_pixels(0), band_pixels(2), "same text, same pixels");
        assert_ne!(
            band_pixels(0),
            band_pixels(1),
            "each row shows its own label"
        );
    }
}
