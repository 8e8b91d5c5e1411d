//! A 3×5 pixel bitmap font for plot labels and contact-sheet captions: digits, upper-case
//! letters (lower case is drawn upper case) and `. - _ / + : ( ) % , = '`; anything else
//! draws as `?`. Written here rather than through a font crate: see `docs/architecture.md`.

/// Glyph width in font pixels.
pub const GLYPH_W: usize = 3;
/// Glyph height in font pixels.
pub const GLYPH_H: usize = 5;

/// Rows of a glyph, top first; bit 2 is the left column.
fn glyph(c: char) -> [u8; 5] {
    match c.to_ascii_uppercase() {
        '0' => [0b111, 0b101, 0b101, 0b101, 0b111],
        '1' => [0b010, 0b110, 0b010, 0b010, 0b111],
        '2' => [0b111, 0b001, 0b111, 0b100, 0b111],
        '3' => [0b111, 0b001, 0b111, 0b001, 0b111],
        '4' => [0b101, 0b101, 0b111, 0b001, 0b001],
        '5' => [0b111, 0b100, 0b111, 0b001, 0b111],
        '6' => [0b111, 0b100, 0b111, 0b101, 0b111],
        '7' => [0b111, 0b001, 0b001, 0b010, 0b010],
        '8' => [0b111, 0b101, 0b111, 0b101, 0b111],
        '9' => [0b111, 0b101, 0b111, 0b001, 0b111],
        'A' => [0b010, 0b101, 0b111, 0b101, 0b101],
        'B' => [0b110, 0b101, 0b110, 0b101, 0b110],
        'C' => [0b011, 0b100, 0b100, 0b100, 0b011],
        'D' => [0b110, 0b101, 0b101, 0b101, 0b110],
        'E' => [0b111, 0b100, 0b110, 0b100, 0b111],
        'F' => [0b111, 0b100, 0b110, 0b100, 0b100],
        'G' => [0b011, 0b100, 0b101, 0b101, 0b011],
        'H' => [0b101, 0b101, 0b111, 0b101, 0b101],
        'I' => [0b111, 0b010, 0b010, 0b010, 0b111],
        'J' => [0b001, 0b001, 0b001, 0b101, 0b010],
        'K' => [0b101, 0b101, 0b110, 0b101, 0b101],
        'L' => [0b100, 0b100, 0b100, 0b100, 0b111],
        'M' => [0b101, 0b111, 0b111, 0b101, 0b101],
        'N' => [0b110, 0b101, 0b101, 0b101, 0b101],
        'O' => [0b010, 0b101, 0b101, 0b101, 0b010],
        'P' => [0b110, 0b101, 0b110, 0b100, 0b100],
        'Q' => [0b010, 0b101, 0b101, 0b110, 0b011],
        'R' => [0b110, 0b101, 0b110, 0b101, 0b101],
        'S' => [0b011, 0b100, 0b010, 0b001, 0b110],
        'T' => [0b111, 0b010, 0b010, 0b010, 0b010],
        'U' => [0b101, 0b101, 0b101, 0b101, 0b111],
        'V' => [0b101, 0b101, 0b101, 0b101, 0b010],
        'W' => [0b101, 0b101, 0b111, 0b111, 0b101],
        'X' => [0b101, 0b101, 0b010, 0b101, 0b101],
        'Y' => [0b101, 0b101, 0b010, 0b010, 0b010],
        'Z' => [0b111, 0b001, 0b010, 0b100, 0b111],
        '.' => [0b000, 0b000, 0b000, 0b000, 0b010],
        '-' => [0b000, 0b000, 0b111, 0b000, 0b000],
        '_' => [0b000, 0b000, 0b000, 0b000, 0b111],
        '/' => [0b001, 0b001, 0b010, 0b100, 0b100],
        '+' => [0b000, 0b010, 0b111, 0b010, 0b000],
        ':' => [0b000, 0b010, 0b000, 0b010, 0b000],
        '(' => [0b001, 0b010, 0b010, 0b010, 0b001],
        ')' => [0b100, 0b010, 0b010, 0b010, 0b100],
        '%' => [0b101, 0b001, 0b010, 0b100, 0b101],
        ',' => [0b000, 0b000, 0b000, 0b010, 0b100],
        '=' => [0b000, 0b111, 0b000, 0b111, 0b000],
        '\'' => [0b010, 0b010, 0b000, 0b000, 0b000],
        ' ' => [0; 5],
        _ => [0b111, 0b001, 0b010, 0b000, 0b010],
    }
}

/// Width in pixels of `text` drawn at `scale` (one font pixel of spacing between glyphs).
pub fn text_width(text: &str, scale: usize) -> usize {
    let n = text.chars().count();
    if n == 0 {
        0
    } else {
        (n * (GLYPH_W + 1) - 1) * scale
    }
}

/// The longest prefix of `text` that fits in `max_width` pixels at `scale`, ending in `..`
/// when it was cut.
pub fn fit_text(text: &str, max_width: usize, scale: usize) -> String {
    if text_width(text, scale) <= max_width {
        return text.to_string();
    }
    let mut out: String = text.chars().collect();
    while !out.is_empty() && text_width(&format!("{out}.."), scale) > max_width {
        out.pop();
    }
    if out.is_empty() {
        String::new()
    } else {
        format!("{}..", out.trim_end())
    }
}

/// Draw `text` with its top-left corner at `(x, y)` into a `width`-wide image; pixels outside
/// the image are clipped.
pub fn draw_text(
    img: &mut [[u8; 3]],
    width: usize,
    x: usize,
    y: usize,
    text: &str,
    scale: usize,
    colour: [u8; 3],
) {
    let height = img.len() / width.max(1);
    for (i, c) in text.chars().enumerate() {
        let gx = x + i * (GLYPH_W + 1) * scale;
        for (row, bits) in glyph(c).iter().enumerate() {
            for col in 0..GLYPH_W {
                if bits & (0b100 >> col) == 0 {
                    continue;
                }
                for dy in 0..scale {
                    for dx in 0..scale {
                        let (px, py) = (gx + col * scale + dx, y + row * scale + dy);
                        if px < width && py < height {
                            img[py * width + px] = colour;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_glyph_pixels_and_clips() {
        let (w, h) = (12, 6);
        let mut img = vec![[255u8; 3]; w * h];
        draw_text(&mut img, w, 0, 0, "1-", 1, [0; 3]);
        let dark = |x: usize, y: usize| img[y * w + x] == [0; 3];
        // `1`: column 1 is set in every row.
        assert!((0..5).all(|y| dark(1, y)));
        assert!(!dark(0, 0) && dark(0, 1));
        // `-` starts at x = 4, middle row only.
        assert!(dark(4, 2) && dark(6, 2) && !dark(4, 1));
        assert_eq!(text_width("1-", 2), 14);
        // Clipped at the border without panicking.
        draw_text(&mut img, w, 10, 4, "88", 2, [0; 3]);
    }

    #[test]
    fn fit_text_cuts_with_dots() {
        assert_eq!(fit_text("abc", 100, 1), "abc");
        let cut = fit_text("a red circle moving left", text_width("a red circ..", 2), 2);
        assert_eq!(cut, "a red circ..");
        assert!(text_width(&cut, 2) <= text_width("a red circ..", 2));
        assert_eq!(fit_text("abc", 1, 1), "");
    }
}
