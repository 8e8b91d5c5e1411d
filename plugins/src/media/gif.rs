//! Animated, looping GIFs.

use std::path::Path;

use super::{save, upscale, MediaError};

/// Write `frames` (each `width × height` RGB pixels, row-major) as an animated GIF that loops
/// forever, each frame upscaled by `scale` (nearest neighbour; e.g. 8 turns 16 px into 128 px)
/// and shown for `delay_cs` hundredths of a second. Frames with at most 256 colours are stored
/// exactly; others are quantised (NeuQuant). The file appears whole or not at all
/// ([`save`](super::save)).
pub fn write_gif(
    path: &Path,
    frames: &[Vec<[u8; 3]>],
    width: usize,
    height: usize,
    scale: u32,
    delay_cs: u16,
) -> Result<(), MediaError> {
    let invalid = |reason: String| MediaError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let s = scale.max(1) as usize;
    let (out_w, out_h) = (width * s, height * s);
    let (gw, gh) = match (u16::try_from(out_w), u16::try_from(out_h)) {
        (Ok(gw), Ok(gh)) if gw > 0 && gh > 0 => (gw, gh),
        _ => return Err(invalid(format!("size {out_w}x{out_h} outside 1..=65535"))),
    };
    if frames.is_empty() {
        return Err(invalid("no frames".into()));
    }
    if let Some(i) = frames.iter().position(|f| f.len() != width * height) {
        return Err(invalid(format!(
            "frame {i} has {} pixels, expected {width}x{height}",
            frames[i].len()
        )));
    }
    let encode = |e: ::gif::EncodingError| MediaError::Encode {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let mut encoder = ::gif::Encoder::new(Vec::new(), gw, gh, &[]).map_err(encode)?;
    encoder
        .set_repeat(::gif::Repeat::Infinite)
        .map_err(encode)?;
    for frame in frames {
        let bytes: Vec<u8> = upscale(frame, width, height, scale).concat();
        let mut f = ::gif::Frame::from_rgb_speed(gw, gh, &bytes, 10);
        f.delay = delay_cs;
        encoder.write_frame(&f).map_err(encode)?;
    }
    save(path, &encoder.into_inner().map_err(encode)?)
}

#[cfg(test)]
mod tests {
    use std::fs::File;

    use super::*;

    fn decode(path: &Path) -> (u16, u16, Vec<Vec<u8>>) {
        let mut options = ::gif::DecodeOptions::new();
        options.set_color_output(::gif::ColorOutput::RGBA);
        let mut decoder = options.read_info(File::open(path).unwrap()).unwrap();
        let (w, h) = (decoder.width(), decoder.height());
        let mut frames = Vec::new();
        while let Some(frame) = decoder.read_next_frame().unwrap() {
            assert_eq!((frame.width, frame.height), (w, h));
            assert_eq!(frame.delay, 12);
            frames.push(frame.buffer.to_vec());
        }
        (w, h, frames)
    }

    #[test]
    fn gif_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("clip.gif");
        let frames: Vec<Vec<[u8; 3]>> = (0..5u8)
            .map(|t| {
                (0..16 * 12)
                    .map(|p| {
                        if p % 16 == t as usize {
                            [255, 0, 0]
                        } else {
                            [128, 128, 128]
                        }
                    })
                    .collect()
            })
            .collect();
        write_gif(&path, &frames, 16, 12, 8, 12).unwrap();
        let (w, h, decoded) = decode(&path);
        assert_eq!((w, h), (128, 96));
        assert_eq!(decoded.len(), 5);
        // Exact palette: frame 2 has red in column 2 (pixels 16..24 of each row).
        let px =
            |f: &Vec<u8>, x: usize, y: usize| f[(y * 128 + x) * 4..(y * 128 + x) * 4 + 3].to_vec();
        assert_eq!(px(&decoded[2], 17, 50), [255, 0, 0]);
        assert_eq!(px(&decoded[2], 30, 50), [128, 128, 128]);
        // Many colours are quantised but still decode.
        let noisy: Vec<Vec<[u8; 3]>> = (0..2)
            .map(|t| {
                (0..64 * 64)
                    .map(|p: usize| [(p * 7 + t) as u8, (p / 64 * 4) as u8, (p % 64 * 4) as u8])
                    .collect()
            })
            .collect();
        write_gif(&path, &noisy, 64, 64, 1, 12).unwrap();
        assert_eq!(decode(&path).2.len(), 2);
    }

    #[test]
    fn gif_errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.gif");
        let err = write_gif(&path, &[vec![[0; 3]; 3]], 2, 2, 1, 10).unwrap_err();
        assert!(matches!(err, MediaError::Invalid { .. }));
        assert!(err.to_string().contains("bad.gif"), "{err}");
        assert!(write_gif(&path, &[], 2, 2, 1, 10).is_err());
        let missing = dir.path().join("no/such/dir.gif");
        let err = write_gif(&missing, &[vec![[0; 3]; 4]], 2, 2, 1, 10).unwrap_err();
        assert!(matches!(err, MediaError::Io { .. }) && err.to_string().contains("dir.gif"));
    }
}
