//! Still images as 8-bit RGB PNGs.

use std::path::Path;

use super::{save, MediaError};

/// Write a `width × height` RGB image (row-major) as an 8-bit RGB PNG; the file appears whole
/// or not at all ([`save`](super::save)).
pub fn write_png(
    path: &Path,
    rgb: &[[u8; 3]],
    width: usize,
    height: usize,
) -> Result<(), MediaError> {
    let invalid = |reason: String| MediaError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    if rgb.len() != width * height {
        return Err(invalid(format!(
            "{} pixels, expected {width}x{height}",
            rgb.len()
        )));
    }
    let (pw, ph) = match (u32::try_from(width), u32::try_from(height)) {
        (Ok(pw), Ok(ph)) if pw > 0 && ph > 0 => (pw, ph),
        _ => return Err(invalid(format!("size {width}x{height} out of range"))),
    };
    let encode = |e: ::png::EncodingError| MediaError::Encode {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let mut bytes = Vec::new();
    let mut encoder = ::png::Encoder::new(&mut bytes, pw, ph);
    encoder.set_color(::png::ColorType::Rgb);
    encoder.set_depth(::png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(encode)?;
    writer.write_image_data(&rgb.concat()).map_err(encode)?;
    writer.finish().map_err(encode)?;
    save(path, &bytes)
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::io::BufReader;

    use super::*;

    #[test]
    fn png_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sheet.png");
        let (w, h) = (7, 5);
        let img: Vec<[u8; 3]> = (0..w * h)
            .map(|i| [i as u8, (i * 3) as u8, 255 - i as u8])
            .collect();
        write_png(&path, &img, w, h).unwrap();
        let decoder = ::png::Decoder::new(BufReader::new(File::open(&path).unwrap()));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!((info.width, info.height), (7, 5));
        assert_eq!(info.color_type, ::png::ColorType::Rgb);
        assert_eq!(&buf[..info.buffer_size()], img.concat().as_slice());
    }

    #[test]
    fn png_errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let err = write_png(&dir.path().join("short.png"), &[[0; 3]; 5], 2, 3).unwrap_err();
        assert!(err.to_string().contains("short.png"), "{err}");
        let err = write_png(&dir.path().join("x/y.png"), &[[0; 3]; 6], 2, 3).unwrap_err();
        assert!(matches!(err, MediaError::Io { .. }) && err.to_string().contains("y.png"));
        assert!(write_png(&dir.path().join("empty.png"), &[], 0, 3).is_err());
    }
}
