//! The caption grammar of the synthetic data set and its frozen "text encoder".
//!
//! Every caption reads `a <colour> <shape> moving <direction>`, e.g. `a red circle moving
//! left`: 4 colours × 2 shapes × 4 directions = 32 captions. A fixed embedding table stands in
//! for a frozen text encoder: each word maps to a fixed pseudo-random vector derived from a hash
//! of the word and [`EMBEDDING_SEED`] (never from the run's seed, so checkpoints trained on one
//! seed stay valid for another).

use std::fmt;

use reel_core::data::TextCondition;

/// Seed of the word-embedding table. Fixed forever: changing it invalidates every checkpoint.
pub const EMBEDDING_SEED: u64 = 0x5EE1_7E47_C0DE_2024;

/// Words of a caption (`a red circle moving left` has 5).
pub const CAPTION_WORDS: usize = 5;

/// Colour of the moving shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Colour {
    /// `red`.
    Red,
    /// `green`.
    Green,
    /// `blue`.
    Blue,
    /// `yellow`.
    Yellow,
}

/// Shape of the moving object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Shape {
    /// `square`: a filled axis-aligned square.
    Square,
    /// `circle`: a filled disc.
    Circle,
}

/// Direction of motion (image coordinates: `up` is towards row 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// `left`: x decreases.
    Left,
    /// `right`: x increases.
    Right,
    /// `up`: y decreases.
    Up,
    /// `down`: y increases.
    Down,
}

macro_rules! named_enum {
    ($ty:ident, $($variant:ident => $name:literal),+ $(,)?) => {
        impl $ty {
            /// Every value, in a fixed order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];
            /// The caption word.
            pub fn name(self) -> &'static str {
                match self { $($ty::$variant => $name),+ }
            }
            /// Parse the caption word (lower case).
            pub fn from_name(word: &str) -> Option<Self> {
                match word { $($name => Some($ty::$variant),)+ _ => None }
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

named_enum!(Colour, Red => "red", Green => "green", Blue => "blue", Yellow => "yellow");
named_enum!(Shape, Square => "square", Circle => "circle");
named_enum!(Direction, Left => "left", Right => "right", Up => "up", Down => "down");

impl Direction {
    /// Whether the motion is along x (left/right) rather than y (up/down).
    pub fn horizontal(self) -> bool {
        matches!(self, Direction::Left | Direction::Right)
    }
    /// Whether the coordinate along the motion axis decreases over time (left/up).
    pub fn decreasing(self) -> bool {
        matches!(self, Direction::Left | Direction::Up)
    }
}

/// A parsed caption: colour, shape and direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Caption {
    /// Colour of the shape.
    pub colour: Colour,
    /// The shape.
    pub shape: Shape,
    /// Its direction of motion.
    pub direction: Direction,
}

impl Caption {
    /// Number of distinct captions (4 colours × 2 shapes × 4 directions).
    pub const COUNT: usize = 32;

    /// Caption number `index % 32` (colour-major, then shape, then direction).
    pub fn from_index(index: usize) -> Self {
        let i = index % Self::COUNT;
        Caption {
            colour: Colour::ALL[i / 8],
            shape: Shape::ALL[(i / 4) % 2],
            direction: Direction::ALL[i % 4],
        }
    }

    /// Position of this caption in [`Caption::all`].
    pub fn index(self) -> usize {
        self.colour as usize * 8 + self.shape as usize * 4 + self.direction as usize
    }

    /// All 32 captions, in index order.
    pub fn all() -> Vec<Caption> {
        (0..Self::COUNT).map(Self::from_index).collect()
    }

    /// Parse `a <colour> <shape> moving <direction>` (case and extra spaces or punctuation
    /// ignored). `None` for anything outside the grammar.
    pub fn parse(text: &str) -> Option<Caption> {
        let words = tokenize(text);
        match words.as_slice() {
            [a, colour, shape, moving, direction] if a == "a" && moving == "moving" => {
                Some(Caption {
                    colour: Colour::from_name(colour)?,
                    shape: Shape::from_name(shape)?,
                    direction: Direction::from_name(direction)?,
                })
            }
            _ => None,
        }
    }
}

impl fmt::Display for Caption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a {} {} moving {}",
            self.colour, self.shape, self.direction
        )
    }
}

/// The fixed validation captions: every colour, shape and direction appears twice or more,
/// every colour with both shapes.
pub fn validation_captions() -> Vec<Caption> {
    use Colour::*;
    use Direction::*;
    use Shape::*;
    [
        (Red, Square, Right),
        (Green, Circle, Left),
        (Blue, Square, Up),
        (Yellow, Circle, Down),
        (Red, Circle, Down),
        (Green, Square, Up),
        (Blue, Circle, Right),
        (Yellow, Square, Left),
    ]
    .into_iter()
    .map(|(colour, shape, direction)| Caption {
        colour,
        shape,
        direction,
    })
    .collect()
}

/// Split text into lower-case alphanumeric words.
pub fn tokenize(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// FNV-1a 64-bit hash: stable across Rust versions and platforms (unlike `DefaultHasher`).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// SplitMix64 finaliser: a fast, well-mixed, dependency-free 64-bit hash.
pub(crate) fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The fixed embedding of one word: `dim` standard-normal values (Box–Muller over a SplitMix64
/// stream seeded by the word's FNV-1a hash and [`EMBEDDING_SEED`]; no external RNG, so the
/// table cannot change with a dependency upgrade). A word's vector for a smaller `dim` is a
/// prefix of its vector for a larger one.
pub fn word_vector(word: &str, dim: usize) -> Vec<f32> {
    let seed = fnv1a(word.as_bytes()) ^ EMBEDDING_SEED;
    let mut counter = 0u64;
    let mut uniform = || {
        counter += 1;
        // 24 random bits -> [0, 1).
        (splitmix64(seed.wrapping_add(counter.wrapping_mul(0x9E37_79B9_7F4A_7C15))) >> 40) as f32
            / (1u64 << 24) as f32
    };
    let mut out = Vec::with_capacity(dim + 1);
    while out.len() < dim {
        let u1 = 1.0 - uniform(); // (0, 1]
        let u2 = uniform();
        let r = (-2.0 * u1.ln()).sqrt();
        let theta = std::f32::consts::TAU * u2;
        out.push(r * theta.cos());
        out.push(r * theta.sin());
    }
    out.truncate(dim);
    out
}

/// Embed a caption: one row of [`word_vector`] per word (cropped to `text_len` words), zero
/// rows and a `false` mask beyond the words.
pub fn embed_text(text: &str, text_len: usize, text_dim: usize) -> TextCondition {
    let mut cond = empty_text(text_len, text_dim);
    for (i, word) in tokenize(text).iter().take(text_len).enumerate() {
        cond.embedding[i * text_dim..(i + 1) * text_dim]
            .copy_from_slice(&word_vector(word, text_dim));
        cond.mask[i] = true;
    }
    cond
}

/// The empty caption: all-zero embedding, all-`false` mask (the unconditional text).
pub fn empty_text(text_len: usize, text_dim: usize) -> TextCondition {
    TextCondition {
        embedding: vec![0.0; text_len * text_dim],
        mask: vec![false; text_len],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar_round_trips_all_captions() {
        let all = Caption::all();
        assert_eq!(all.len(), 32);
        for (i, c) in all.iter().enumerate() {
            assert_eq!(c.index(), i);
            assert_eq!(Caption::parse(&c.to_string()), Some(*c));
        }
        let unique: std::collections::BTreeSet<_> = all.iter().collect();
        assert_eq!(unique.len(), 32);
        assert_eq!(
            Caption::parse("  A Red  CIRCLE moving left. "),
            Caption::parse("a red circle moving left")
        );
        assert_eq!(
            Caption::from_index(0).to_string(),
            "a red square moving left"
        );
    }

    #[test]
    fn parse_rejects_outside_grammar() {
        for bad in [
            "",
            "a red circle",
            "a purple circle moving left",
            "a red triangle moving left",
            "a red circle moving sideways",
            "the red circle moving left",
            "a red circle moving left fast",
        ] {
            assert_eq!(Caption::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn validation_set_covers_every_attribute() {
        let v = validation_captions();
        assert_eq!(v.len(), 8);
        for c in Colour::ALL {
            for s in Shape::ALL {
                assert!(v.iter().any(|p| p.colour == *c && p.shape == *s));
            }
        }
        for d in Direction::ALL {
            assert!(v.iter().filter(|p| p.direction == *d).count() >= 2);
        }
    }

    #[test]
    fn embeddings_are_fixed_padded_and_distinct() {
        let e = embed_text("a red circle moving left", 8, 32);
        assert_eq!(e.embedding.len(), 8 * 32);
        assert_eq!(e.mask, [true, true, true, true, true, false, false, false]);
        assert!(e.embedding[5 * 32..].iter().all(|&v| v == 0.0));
        assert_eq!(e, embed_text("A red circle, moving LEFT", 8, 32));
        // Same word, same vector, wherever it appears; different words differ.
        let blue = embed_text("a blue circle moving left", 8, 32);
        assert_eq!(e.embedding[..32], blue.embedding[..32]);
        assert_ne!(e.embedding[32..64], blue.embedding[32..64]);
        // Prefix property and rough unit scale.
        let w = word_vector("red", 1000);
        assert_eq!(w[..32], word_vector("red", 32)[..]);
        let mean = w.iter().sum::<f32>() / 1000.0;
        let var = w.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 1000.0;
        assert!(mean.abs() < 0.15 && (var - 1.0).abs() < 0.2, "{mean} {var}");
        // Pinned value: the table must never change silently.
        let pinned = [0.892_810_1, -0.376_637_73, 0.176_304_09];
        for (got, want) in word_vector("red", 3).iter().zip(pinned) {
            assert!(
                (got - want).abs() < 1e-4,
                "embedding table changed: {got} vs {want}"
            );
        }
        // Cropping keeps the first words.
        let short = embed_text("a red circle moving left", 2, 4);
        assert_eq!(short.mask, [true, true]);
        let neg = empty_text(8, 32);
        assert!(neg.mask.iter().all(|m| !m) && neg.embedding.iter().all(|&v| v == 0.0));
    }
}
