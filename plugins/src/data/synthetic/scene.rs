//! Rendering of one synthetic clip directly in latent form (there is no VAE: the latent is the
//! clip).
//!
//! Latent layout `[C=4, F, H, W]`: channels 0..3 hold the colour code of the pixel (an RGB-like
//! vector, `±COLOUR_AMPLITUDE` per channel, 0 on the plain background) and channel 3 marks
//! object (`OBJECT_VALUE`) versus background (`BACKGROUND_OBJECT_VALUE`). Over the data set
//! every channel has mean ≈ 0 and standard deviation ≈ 1.

use rand::Rng;
use reel_core::data::DataSpec;

use super::captions::{Caption, Colour, Direction, Shape};

/// Latent channels of the synthetic data (3 colour channels + 1 object channel).
pub const CHANNELS: usize = 4;
/// Magnitude of each colour-channel value inside the object.
pub const COLOUR_AMPLITUDE: f32 = 2.5;
/// Object-channel value inside the object.
pub const OBJECT_VALUE: f32 = 2.4;
/// Object-channel value on the background.
pub const BACKGROUND_OBJECT_VALUE: f32 = -0.4;
/// Colour-channel values of the plain background (decodes to mid grey).
pub const BACKGROUND_COLOUR: [f32; 3] = [0.0; 3];

/// Colour code of a colour in latent channels 0..3 (`+A` where the RGB colour has the
/// primary, `-A` where it does not).
pub fn colour_code(colour: Colour) -> [f32; 3] {
    let a = COLOUR_AMPLITUDE;
    match colour {
        Colour::Red => [a, -a, -a],
        Colour::Green => [-a, a, -a],
        Colour::Blue => [-a, -a, a],
        Colour::Yellow => [a, a, -a],
    }
}

/// Local `size × size` mask (row-major) of a shape: a full square, or a disc of diameter
/// `size` (pixel centres within `size / 2` of the centre), whose corners are clearly missing.
pub fn shape_mask(shape: Shape, size: usize) -> Vec<bool> {
    match shape {
        Shape::Square => vec![true; size * size],
        Shape::Circle => {
            let c = size as f32 / 2.0;
            let r2 = c * c;
            (0..size * size)
                .map(|i| {
                    let dy = (i / size) as f32 + 0.5 - c;
                    let dx = (i % size) as f32 + 0.5 - c;
                    dx * dx + dy * dy <= r2
                })
                .collect()
        }
    }
}

/// Sizes and motion ranges derived from the clip shape; shared by the renderer and the
/// evaluator so both agree on what a valid clip looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Frames `F`.
    pub frames: usize,
    /// Height `H`.
    pub height: usize,
    /// Width `W`.
    pub width: usize,
    /// Base object size: `round(0.4 · min(H, W))` by default (6 px at 16×16).
    pub base: usize,
    /// Motion speed in pixels per frame (default 1); the path is clamped to the frame.
    pub speed: usize,
}

impl Geometry {
    /// Geometry of clips of `spec`'s frames, height and width, with the default object size
    /// and a speed of 1 px/frame.
    pub fn new(spec: &DataSpec) -> Self {
        Self::with_motion(spec, None, 1)
    }

    /// Geometry with an explicit base object size (`None`: `round(0.4 · min(H, W))`, at
    /// least 3) and speed in pixels per frame (at least 1).
    pub fn with_motion(spec: &DataSpec, object_size: Option<usize>, speed: usize) -> Self {
        let min_side = spec.height.min(spec.width);
        let default_base = (min_side as f32 * 0.4).round() as usize;
        Geometry {
            frames: spec.frames,
            height: spec.height,
            width: spec.width,
            base: object_size.unwrap_or(default_base).max(3),
            speed: speed.max(1),
        }
    }

    /// The sizes a shape is drawn at: squares `base, base+1`, discs `base+1, base+2` (so both
    /// cover about the same area).
    pub fn sizes(&self, shape: Shape) -> [usize; 2] {
        match shape {
            Shape::Square => [self.base, self.base + 1],
            Shape::Circle => [self.base + 1, self.base + 2],
        }
    }

    /// Largest object size.
    pub fn max_size(&self) -> usize {
        self.base + 2
    }

    /// Extent of the frame along the direction's axis.
    pub fn extent(&self, direction: Direction) -> usize {
        if direction.horizontal() {
            self.width
        } else {
            self.height
        }
    }

    /// Total displacement in pixels from the first to the last frame: `min(speed·(F-1),
    /// extent - max_size)`, i.e. `speed` px/frame when the frame is large enough.
    pub fn travel(&self, direction: Direction) -> usize {
        (self.speed * self.frames.saturating_sub(1))
            .min(self.extent(direction).saturating_sub(self.max_size()))
    }

    /// Displacement after `t` frames (`round(travel · t / (F-1))`).
    pub fn offset(&self, direction: Direction, t: usize) -> usize {
        let steps = self.frames.saturating_sub(1).max(1);
        (self.travel(direction) * t * 2 + steps) / (2 * steps)
    }
}

/// One clip: a caption plus its random placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scene {
    /// What the clip shows.
    pub caption: Caption,
    /// Object size in pixels (square side or disc diameter).
    pub size: usize,
    /// Start of the path along the motion axis (smallest coordinate the top-left corner takes).
    pub along: usize,
    /// Fixed coordinate of the top-left corner across the motion axis.
    pub across: usize,
}

impl Scene {
    /// Draw a random placement (size and start position) that keeps the object inside the
    /// frame for the whole clip. With `jitter = None` the path may lie anywhere in the frame;
    /// with `Some(j)` it is the centred path (the object crosses the middle of the frame)
    /// shifted by at most `j` pixels along and across the motion axis.
    pub fn sample<R: Rng + ?Sized>(
        caption: Caption,
        geometry: &Geometry,
        jitter: Option<usize>,
        rng: &mut R,
    ) -> Self {
        let sizes = geometry.sizes(caption.shape);
        let size = sizes[rng.random_range(0..sizes.len())];
        let d = caption.direction;
        let along_max = geometry.extent(d) - size - geometry.travel(d);
        let across_extent = if d.horizontal() {
            geometry.height
        } else {
            geometry.width
        };
        let across_max = across_extent - size;
        // Inclusive range of start positions: the whole frame, or centre ± jitter.
        let range = |max: usize| match jitter {
            None => (0, max),
            Some(j) => {
                let centre = max / 2;
                (centre.saturating_sub(j), (centre + j).min(max))
            }
        };
        let (along_lo, along_hi) = range(along_max);
        let (across_lo, across_hi) = range(across_max);
        Scene {
            caption,
            size,
            along: rng.random_range(along_lo..=along_hi),
            across: rng.random_range(across_lo..=across_hi),
        }
    }

    /// Top-left corner `(x, y)` of the object at frame `t`.
    pub fn top_left(&self, geometry: &Geometry, t: usize) -> (usize, usize) {
        let d = self.caption.direction;
        let off = geometry.offset(d, t);
        let along = if d.decreasing() {
            self.along + geometry.travel(d) - off
        } else {
            self.along + off
        };
        if d.horizontal() {
            (along, self.across)
        } else {
            (self.across, along)
        }
    }

    /// Render the latent clip `[4, F, H, W]`, row-major.
    pub fn render(&self, geometry: &Geometry) -> Vec<f32> {
        let (f, h, w) = (geometry.frames, geometry.height, geometry.width);
        let plane = f * h * w;
        let mut out = vec![0.0f32; CHANNELS * plane];
        for c in 0..3 {
            out[c * plane..(c + 1) * plane].fill(BACKGROUND_COLOUR[c]);
        }
        out[3 * plane..].fill(BACKGROUND_OBJECT_VALUE);
        let mask = shape_mask(self.caption.shape, self.size);
        let code = colour_code(self.caption.colour);
        for t in 0..f {
            let (x0, y0) = self.top_left(geometry, t);
            for (i, _) in mask.iter().enumerate().filter(|(_, &m)| m) {
                let (y, x) = (y0 + i / self.size, x0 + i % self.size);
                let p = (t * h + y) * w + x;
                for (c, &v) in code.iter().enumerate() {
                    out[c * plane + p] = v;
                }
                out[3 * plane + p] = OBJECT_VALUE;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn spec(frames: usize, height: usize, width: usize) -> DataSpec {
        DataSpec {
            channels: CHANNELS,
            frames,
            height,
            width,
            text_len: 8,
            text_dim: 32,
        }
    }

    #[test]
    fn circle_corners_are_missing_and_areas_match() {
        let c7 = shape_mask(Shape::Circle, 7);
        assert_eq!(c7.iter().filter(|&&m| m).count(), 37);
        for corner in [0, 6, 42, 48, 1, 7] {
            assert!(!c7[corner]);
        }
        assert!(c7[3] && c7[21] && c7[24]);
        assert_eq!(
            shape_mask(Shape::Circle, 8).iter().filter(|&&m| m).count(),
            52
        );
        assert!(shape_mask(Shape::Square, 6).iter().all(|&m| m));
    }

    #[test]
    fn default_geometry_moves_one_pixel_per_frame() {
        let g = Geometry::new(&spec(8, 16, 16));
        assert_eq!(g.base, 6);
        for d in Direction::ALL {
            assert_eq!(g.travel(*d), 7);
            assert_eq!(
                (0..8).map(|t| g.offset(*d, t)).collect::<Vec<_>>(),
                [0, 1, 2, 3, 4, 5, 6, 7]
            );
        }
    }

    #[test]
    fn objects_stay_inside_and_move_the_right_way() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for s in [
            spec(8, 16, 16),
            spec(16, 12, 20),
            spec(2, 32, 12),
            spec(40, 16, 16),
        ] {
            let g = Geometry::new(&s);
            for caption in Caption::all() {
                for _ in 0..20 {
                    let jitter = [None, Some(0), Some(1), Some(50)][rng.random_range(0..4)];
                    let scene = Scene::sample(caption, &g, jitter, &mut rng);
                    let first = scene.top_left(&g, 0);
                    let last = scene.top_left(&g, g.frames - 1);
                    for t in 0..g.frames {
                        let (x, y) = scene.top_left(&g, t);
                        assert!(x + scene.size <= g.width && y + scene.size <= g.height);
                    }
                    let (dx, dy) = (
                        last.0 as i64 - first.0 as i64,
                        last.1 as i64 - first.1 as i64,
                    );
                    let moved = match caption.direction {
                        Direction::Left => dx < 0 && dy == 0,
                        Direction::Right => dx > 0 && dy == 0,
                        Direction::Up => dy < 0 && dx == 0,
                        Direction::Down => dy > 0 && dx == 0,
                    };
                    assert!(moved, "{caption} {scene:?}");
                    let clip = scene.render(&g);
                    assert_eq!(clip.len(), s.latent_numel());
                }
            }
        }
    }

    #[test]
    fn jitter_keeps_the_path_near_the_centre() {
        let g = Geometry::new(&spec(6, 12, 12));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for caption in Caption::all() {
            let mut starts = std::collections::BTreeSet::new();
            for _ in 0..50 {
                let fixed = Scene::sample(caption, &g, Some(0), &mut rng);
                starts.insert((fixed.along + fixed.size / 2, fixed.across + fixed.size / 2));
                let near = Scene::sample(caption, &g, Some(1), &mut rng);
                let centred = Scene {
                    along: (g.extent(caption.direction) - near.size - g.travel(caption.direction))
                        / 2,
                    across: (12 - near.size) / 2,
                    ..near
                };
                assert!(near.along.abs_diff(centred.along) <= 1, "{near:?}");
                assert!(near.across.abs_diff(centred.across) <= 1, "{near:?}");
            }
            // Only the size varies without jitter: at most two start points (one per size).
            assert!(starts.len() <= 2, "{caption}: {starts:?}");
        }
    }

    #[test]
    fn render_writes_codes_inside_and_background_outside() {
        let g = Geometry::new(&spec(8, 16, 16));
        let caption = Caption::parse("a yellow square moving down").unwrap();
        let scene = Scene {
            caption,
            size: 6,
            along: 1,
            across: 4,
        };
        let clip = scene.render(&g);
        let plane = 8 * 16 * 16;
        let at = |c: usize, t: usize, y: usize, x: usize| clip[c * plane + (t * 16 + y) * 16 + x];
        // Frame 2: top-left (4, 3).
        assert_eq!(at(3, 2, 3, 4), OBJECT_VALUE);
        assert_eq!(at(0, 2, 3, 4), COLOUR_AMPLITUDE);
        assert_eq!(at(2, 2, 8, 9), -COLOUR_AMPLITUDE);
        assert_eq!(at(3, 2, 2, 4), BACKGROUND_OBJECT_VALUE);
        assert_eq!(at(1, 2, 9, 4), BACKGROUND_COLOUR[1]);
    }
}
