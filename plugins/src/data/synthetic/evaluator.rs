//! The synthetic data's quality metric: score a generated latent clip against its caption.
//!
//! Rules (see [`SyntheticEvaluator::detect`]):
//! - **object**: per frame, pixels whose object channel exceeds [`OBJECT_THRESHOLD`] (the
//!   midpoint of object and background values); the largest 4-connected blob is the object
//!   when its area lies in `[0.3·base², 3·(base+2)²]`. At least half the frames (and 2) must
//!   hold an object, otherwise nothing is found and every criterion scores 0.
//! - **colour**: the mean colour-channel vector over the object pixels, nearest colour code.
//! - **shape**: the best IoU of the blob with the square and disc templates the generator
//!   draws (its sizes, placed around the blob's centroid), summed over frames; the larger sum
//!   wins, provided the winner's mean IoU is at least [`MIN_SHAPE_IOU`].
//! - **direction**: least-squares slope of the blob centroid over frames, times `F-1`; the
//!   dominant axis and its sign give the direction, provided the displacement is at least
//!   `max(1, travel/2)` pixels and the other axis moved less than half as much.
//! - **overall**: 1 when colour, shape and direction are all correct.

use reel_core::data::{ClipEvaluator, ClipScore, DataSpec};

use super::captions::{Caption, Colour, Direction, Shape};
use super::scene::{
    colour_code, shape_mask, Geometry, BACKGROUND_OBJECT_VALUE, CHANNELS, OBJECT_VALUE,
};

/// Object-channel threshold: midpoint of object and background values.
pub const OBJECT_THRESHOLD: f32 = 0.5 * (OBJECT_VALUE + BACKGROUND_OBJECT_VALUE);
/// Minimum mean template IoU for a shape to be recognised at all.
pub const MIN_SHAPE_IOU: f32 = 0.5;

/// What the evaluator sees in a clip.
#[derive(Debug, Clone, PartialEq)]
pub struct Detection {
    /// Nearest colour code of the object's mean colour.
    pub colour: Colour,
    /// Recognised shape (`None` when neither template fits).
    pub shape: Option<Shape>,
    /// Recognised direction (`None` when the object barely moves or moves diagonally).
    pub direction: Option<Direction>,
    /// Frames in which an object was found.
    pub object_frames: usize,
    /// Mean best IoU of the recognised (or best) shape's templates.
    pub shape_iou: f32,
    /// Centroid displacement `(dx, dy)` in pixels over the clip (least-squares fit).
    pub displacement: (f32, f32),
}

impl Detection {
    /// The caption this clip shows, when every attribute was recognised.
    pub fn caption(&self) -> Option<Caption> {
        Some(Caption {
            colour: self.colour,
            shape: self.shape?,
            direction: self.direction?,
        })
    }
}

/// Scores clips of the `synthetic` source against captions of its grammar. Holds the
/// source's object size and speed so that the evaluator and the renderer agree on sizes and
/// on the expected displacement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyntheticEvaluator {
    /// Base object size (`None`: the default, 40% of the smaller side).
    pub object_size: Option<usize>,
    /// Motion speed in pixels per frame.
    pub speed: usize,
}

impl Default for SyntheticEvaluator {
    fn default() -> Self {
        SyntheticEvaluator {
            object_size: None,
            speed: 1,
        }
    }
}

/// The object found in one frame.
struct Blob {
    pixels: Vec<(usize, usize)>,
    cx: f32,
    cy: f32,
}

/// Largest 4-connected component of `mask` (`h × w`).
fn largest_blob(mask: &[bool], h: usize, w: usize) -> Option<Blob> {
    let mut seen = vec![false; h * w];
    let mut best: Vec<(usize, usize)> = Vec::new();
    let mut stack = Vec::new();
    for start in 0..h * w {
        if !mask[start] || seen[start] {
            continue;
        }
        seen[start] = true;
        stack.push(start);
        let mut pixels = Vec::new();
        while let Some(p) = stack.pop() {
            let (y, x) = (p / w, p % w);
            pixels.push((x, y));
            let mut visit = |q: usize| {
                if mask[q] && !seen[q] {
                    seen[q] = true;
                    stack.push(q);
                }
            };
            if x > 0 {
                visit(p - 1);
            }
            if x + 1 < w {
                visit(p + 1);
            }
            if y > 0 {
                visit(p - w);
            }
            if y + 1 < h {
                visit(p + w);
            }
        }
        if pixels.len() > best.len() {
            best = pixels;
        }
    }
    if best.is_empty() {
        return None;
    }
    let n = best.len() as f32;
    let cx = best.iter().map(|&(x, _)| x as f32 + 0.5).sum::<f32>() / n;
    let cy = best.iter().map(|&(_, y)| y as f32 + 0.5).sum::<f32>() / n;
    Some(Blob {
        pixels: best,
        cx,
        cy,
    })
}

/// Best IoU of `blob` with `shape` drawn at any of the generator's sizes, top-left within
/// one pixel of the position its centroid implies.
fn best_iou(blob: &Blob, shape: Shape, geometry: &Geometry) -> f32 {
    let (h, w) = (geometry.height, geometry.width);
    let mut blob_mask = vec![false; h * w];
    for &(x, y) in &blob.pixels {
        blob_mask[y * w + x] = true;
    }
    let mut best = 0.0f32;
    for size in geometry.sizes(shape) {
        if size > h || size > w {
            continue;
        }
        let template = shape_mask(shape, size);
        let area = template.iter().filter(|&&m| m).count();
        let x_mid = (blob.cx - size as f32 / 2.0).round() as i64;
        let y_mid = (blob.cy - size as f32 / 2.0).round() as i64;
        for y0 in y_mid - 1..=y_mid + 1 {
            for x0 in x_mid - 1..=x_mid + 1 {
                if x0 < 0 || y0 < 0 || x0 as usize + size > w || y0 as usize + size > h {
                    continue;
                }
                let (x0, y0) = (x0 as usize, y0 as usize);
                let inter = (0..size * size)
                    .filter(|&i| template[i] && blob_mask[(y0 + i / size) * w + x0 + i % size])
                    .count();
                let union = area + blob.pixels.len() - inter;
                best = best.max(inter as f32 / union as f32);
            }
        }
    }
    best
}

/// Least-squares slope of `v` against `t`.
fn slope(t: &[f32], v: &[f32]) -> f32 {
    let n = t.len() as f32;
    let (mt, mv) = (t.iter().sum::<f32>() / n, v.iter().sum::<f32>() / n);
    let cov: f32 = t.iter().zip(v).map(|(a, b)| (a - mt) * (b - mv)).sum();
    let var: f32 = t.iter().map(|a| (a - mt) * (a - mt)).sum();
    if var > 0.0 {
        cov / var
    } else {
        0.0
    }
}

impl SyntheticEvaluator {
    /// Find the object in a latent clip `[4, F, H, W]` and recognise its colour, shape and
    /// direction. `None` when the clip has the wrong shape or no object is found in at least
    /// half of the frames.
    pub fn detect(&self, clip: &[f32], spec: &DataSpec) -> Option<Detection> {
        if spec.channels != CHANNELS || clip.len() != spec.latent_numel() || spec.frames < 2 {
            return None;
        }
        let g = Geometry::with_motion(spec, self.object_size, self.speed);
        let (f, h, w) = (g.frames, g.height, g.width);
        let plane = f * h * w;
        let min_area = ((0.3 * (g.base * g.base) as f32) as usize).max(3);
        let max_area = 3 * g.max_size() * g.max_size();
        let obj = &clip[3 * plane..];
        let mut blobs = Vec::new();
        for t in 0..f {
            let frame = &obj[t * h * w..(t + 1) * h * w];
            let mask: Vec<bool> = frame.iter().map(|&v| v > OBJECT_THRESHOLD).collect();
            if let Some(b) = largest_blob(&mask, h, w) {
                if (min_area..=max_area).contains(&b.pixels.len()) {
                    blobs.push((t, b));
                }
            }
        }
        if blobs.len() < 2 || blobs.len() * 2 < f {
            return None;
        }

        // Colour: mean colour vector over the object pixels, nearest code.
        let mut mean = [0.0f64; 3];
        let mut count = 0usize;
        for (t, b) in &blobs {
            for &(x, y) in &b.pixels {
                for (c, m) in mean.iter_mut().enumerate() {
                    *m += f64::from(clip[c * plane + (t * h + y) * w + x]);
                }
                count += 1;
            }
        }
        let mean = mean.map(|m| (m / count as f64) as f32);
        let dist = |c: Colour| -> f32 {
            let code = colour_code(c);
            (0..3).map(|i| (code[i] - mean[i]).powi(2)).sum()
        };
        let colour = *Colour::ALL
            .iter()
            .min_by(|a, b| dist(**a).total_cmp(&dist(**b)))
            .expect("colours");

        // Shape: template IoU summed over frames.
        let n = blobs.len() as f32;
        let score = |s: Shape| blobs.iter().map(|(_, b)| best_iou(b, s, &g)).sum::<f32>() / n;
        let (square, circle) = (score(Shape::Square), score(Shape::Circle));
        let (best_shape, shape_iou) = if square >= circle {
            (Shape::Square, square)
        } else {
            (Shape::Circle, circle)
        };
        let shape = (shape_iou >= MIN_SHAPE_IOU).then_some(best_shape);

        // Direction: centroid trajectory.
        let ts: Vec<f32> = blobs.iter().map(|(t, _)| *t as f32).collect();
        let xs: Vec<f32> = blobs.iter().map(|(_, b)| b.cx).collect();
        let ys: Vec<f32> = blobs.iter().map(|(_, b)| b.cy).collect();
        let span = (f - 1) as f32;
        let (dx, dy) = (slope(&ts, &xs) * span, slope(&ts, &ys) * span);
        let candidate = if dx.abs() >= dy.abs() {
            if dx < 0.0 {
                Direction::Left
            } else {
                Direction::Right
            }
        } else if dy < 0.0 {
            Direction::Up
        } else {
            Direction::Down
        };
        let (main, other) = if candidate.horizontal() {
            (dx.abs(), dy.abs())
        } else {
            (dy.abs(), dx.abs())
        };
        let needed = (0.5 * g.travel(candidate) as f32).max(1.0);
        let direction = (main >= needed && other < 0.5 * main).then_some(candidate);

        Some(Detection {
            colour,
            shape,
            direction,
            object_frames: blobs.len(),
            shape_iou,
            displacement: (dx, dy),
        })
    }
}

impl ClipEvaluator for SyntheticEvaluator {
    fn score(&self, clip: &[f32], spec: &DataSpec, caption: &str) -> ClipScore {
        let (colour, shape, direction) = match (Caption::parse(caption), self.detect(clip, spec)) {
            (Some(want), Some(got)) => (
                got.colour == want.colour,
                got.shape == Some(want.shape),
                got.direction == Some(want.direction),
            ),
            _ => (false, false, false),
        };
        let as_f32 = |b: bool| if b { 1.0 } else { 0.0 };
        ClipScore {
            criteria: vec![
                ("colour".to_string(), as_f32(colour)),
                ("shape".to_string(), as_f32(shape)),
                ("direction".to_string(), as_f32(direction)),
            ],
            overall: as_f32(colour && shape && direction),
        }
    }
}
