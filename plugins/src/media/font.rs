//! Text for plot labels and contact-sheet captions, drawn with GNU Unifont's bitmap glyphs
//! (the `unifont` crate: every character of Unicode's Basic Multilingual Plane, 8×16 pixels,
//! 16×16 for CJK and other wide characters), so a Chinese or accented prompt reads as
//! written. A character outside the plane (an emoji) draws as U+FFFD `�`. Why a bitmap font
//! rather than TrueType: see `docs/architecture.md`.

/// Glyph height in font pixels.
pub const GLYPH_H: usize = 16;

/// The glyph drawn for `c`: Unifont's, or U+FFFD's where it has none.
fn glyph(c: char) -> &'static unifont::Glyph {
    unifont::get_glyph(c)
        .or_else(|| unifont::get_glyph(char::REPLACEMENT_CHARACTER))
        .unwrap_or_else(|| panic!("Unifont has no U+FFFD glyph (asked for {c:?})"))
}

/// Width in font pixels of `c` (8, or 16 for a wide character); control characters (a
/// newline in a caption) draw as a space.
fn advance(c: char) -> usize {
    glyph(shown(c)).get_width()
}

/// The character drawn for `c`: control characters as a space.
fn shown(c: char) -> char {
    if c.is_control() {
        ' '
    } else {
        c
    }
}

/// Width in pixels of `text` drawn at `scale` (the glyphs carry their own spacing).
pub fn text_width(text: &str, scale: usize) -> usize {
    text.chars().map(advance).sum::<usize>() * scale
}

/// The longest prefix of `text` that fits in `max_width` pixels at `scale`, ending in `..`
/// when it was cut.
pub fn fit_text(text: &str, max_width: usize, scale: usize) -> String {
    if text_width(text, scale) <= max_width {
        return text.to_string();
    }
    let dots = text_width("..", scale);
    let mut out = String::new();
    let mut width = 0;
    for c in text.chars() {
        let w = advance(c) * scale;
        if width + w + dots > max_width {
            break;
        }
        out.push(c);
        width += w;
    }
    let out = out.trim_end();
    if out.is_empty() {
        String::new()
    } else {
        format!("{out}..")
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
    let mut gx = x;
    for c in text.chars().map(shown) {
        let g = glyph(c);
        for row in 0..GLYPH_H {
            for col in (0..g.get_width()).filter(|&col| g.get_pixel(col, row)) {
                for (dx, dy) in (0..scale).flat_map(|dy| (0..scale).map(move |dx| (dx, dy))) {
                    let (px, py) = (gx + col * scale + dx, y + row * scale + dy);
                    if px < width && py < height {
                        img[py * width + px] = colour;
                    }
                }
            }
        }
        gx += g.get_width() * scale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pixels `text` sets in an image of its own size, as rows of `#` and `.`.
    fn render(text: &str) -> Vec<String> {
        let w = text_width(text, 1);
        let mut img = vec![[255u8; 3]; w * GLYPH_H];
        draw_text(&mut img, w, 0, 0, text, 1, [0; 3]);
        img.chunks(w)
            .map(|row| {
                row.iter()
                    .map(|p| if *p == [0; 3] { '#' } else { '.' })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn draws_glyph_pixels_and_clips() {
        // `-` and `|` in an 8-pixel cell: a horizontal and a vertical stroke.
        let dash = render("-");
        let rows: Vec<usize> = (0..GLYPH_H).filter(|&r| dash[r].contains('#')).collect();
        assert!(!rows.is_empty() && rows.len() <= 2, "{dash:?}");
        assert!(dash[rows[0]].matches('#').count() >= 4, "{dash:?}");
        let bar = render("|");
        let cols: Vec<usize> = (0..8)
            .filter(|&c| bar.iter().any(|r| r.as_bytes()[c] == b'#'))
            .collect();
        assert!(cols.len() <= 2, "{bar:?}");
        assert!(
            bar.iter().filter(|r| r.contains('#')).count() >= 10,
            "{bar:?}"
        );
        // Glyphs follow one another: `--` is `-` twice.
        let twice: Vec<String> = dash.iter().map(|r| r.repeat(2)).collect();
        assert_eq!(render("--"), twice);
        assert_eq!(text_width("1-", 2), 32);
        // Scaled glyphs fill `scale × scale` blocks; clipped at the border without panicking.
        let mut img = vec![[255u8; 3]; 12 * 6];
        draw_text(&mut img, 12, 10, 4, "88", 2, [0; 3]);
    }

    #[test]
    fn prompts_in_any_script_draw_their_own_glyphs() {
        // A CJK character is 16 pixels wide, an accented Latin one 8; each draws its own
        // glyph, not the stand-in for a missing one.
        assert_eq!(text_width("猫", 1), 16);
        assert_eq!(text_width("é", 1), 8);
        let missing = render("\u{1F600}");
        for text in ["猫", "狗", "é", "ж"] {
            let drawn = render(text);
            assert!(drawn.iter().any(|r| r.contains('#')), "{text}");
            assert_ne!(drawn, missing, "{text} draws as a missing glyph");
        }
        assert_ne!(render("猫"), render("狗"));
        // A newline in a caption is a space, not a glyph of its own.
        assert_eq!(render("a\nb"), render("a b"));
    }

    #[test]
    fn fit_text_cuts_with_dots() {
        assert_eq!(fit_text("abc", 100, 1), "abc");
        let cut = fit_text("a red circle moving left", text_width("a red circ..", 2), 2);
        assert_eq!(cut, "a red circ..");
        assert!(text_width(&cut, 2) <= text_width("a red circ..", 2));
        assert_eq!(fit_text("abc", 1, 1), "");
        // Wide characters count as wide.
        assert_eq!(fit_text("一只猫在跑", text_width("一只..", 1), 1), "一只..");
    }
}
