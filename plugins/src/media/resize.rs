//! Fitting frames to a training size: resize so the frame covers the target, then crop the
//! centre (FastVideo's and diffusers' centre-crop rule), and choosing which frames of a
//! longer clip to keep.
//!
//! Resizing is separable bilinear with antialiasing: when shrinking, the triangle filter is
//! widened by the scale factor, so every source pixel contributes (as PIL and torchvision's
//! `antialias=True` do); when enlarging it is plain bilinear interpolation.

/// Filter taps of one output coordinate: the first source index and the weights after it.
struct Taps {
    start: usize,
    weights: Vec<f32>,
}

/// Taps mapping `src` samples onto `dst` samples along one axis, for the output samples in
/// `range`.
fn taps(src: usize, dst: usize, range: std::ops::Range<usize>) -> Vec<Taps> {
    let scale = src as f64 / dst as f64;
    let support = scale.max(1.0);
    range
        .map(|i| {
            let centre = (i as f64 + 0.5) * scale;
            let lo = ((centre - support).floor().max(0.0)) as usize;
            let hi = ((centre + support).ceil() as usize).min(src);
            let mut weights: Vec<f32> = (lo..hi)
                .map(|j| {
                    let d = ((j as f64 + 0.5 - centre) / support).abs();
                    (1.0 - d).max(0.0) as f32
                })
                .collect();
            let sum: f32 = weights.iter().sum();
            if sum > 0.0 {
                weights.iter_mut().for_each(|w| *w /= sum);
            } else {
                // Degenerate (exact zero-weight window): take the nearest pixel.
                weights = vec![1.0];
                return Taps {
                    start: (centre as usize).min(src - 1),
                    weights,
                };
            }
            Taps { start: lo, weights }
        })
        .collect()
}

/// Resize a `w × h` RGB image to `new_w × new_h` (see the module docs for the filter).
/// Sizes of zero give an empty image.
pub fn resize(img: &[[u8; 3]], w: usize, h: usize, new_w: usize, new_h: usize) -> Vec<[u8; 3]> {
    let whole = Window {
        x0: 0,
        y0: 0,
        w: new_w,
        h: new_h,
    };
    resize_window(img, (w, h), (new_w, new_h), whole)
}

/// A rectangle of a resized image: its top-left corner and size.
#[derive(Debug, Clone, Copy)]
struct Window {
    x0: usize,
    y0: usize,
    w: usize,
    h: usize,
}

/// The `win` part of a `size` RGB image resized to `to`, computing only that part (a thin
/// image scaled to cover a frame would otherwise be built whole, many times the frame).
fn resize_window(
    img: &[[u8; 3]],
    (w, h): (usize, usize),
    to: (usize, usize),
    win: Window,
) -> Vec<[u8; 3]> {
    if w == 0 || h == 0 || win.w == 0 || win.h == 0 {
        return Vec::new();
    }
    let tx = taps(w, to.0, win.x0..win.x0 + win.w);
    let ty = taps(h, to.1, win.y0..win.y0 + win.h);
    let mut rows = vec![[0f32; 3]; win.w * h];
    for y in 0..h {
        for (x, t) in tx.iter().enumerate() {
            let mut acc = [0f32; 3];
            for (k, wt) in t.weights.iter().enumerate() {
                let p = img[y * w + t.start + k];
                (0..3).for_each(|c| acc[c] += wt * p[c] as f32);
            }
            rows[y * win.w + x] = acc;
        }
    }
    let mut out = vec![[0u8; 3]; win.w * win.h];
    for (y, t) in ty.iter().enumerate() {
        for x in 0..win.w {
            let mut acc = [0f32; 3];
            for (k, wt) in t.weights.iter().enumerate() {
                let p = rows[(t.start + k) * win.w + x];
                (0..3).for_each(|c| acc[c] += wt * p[c]);
            }
            out[y * win.w + x] = acc.map(|v| v.round().clamp(0.0, 255.0) as u8);
        }
    }
    out
}

/// Resize `img` (`w × h`) by one factor so that it covers `tw × th`, then cut the centre
/// `tw × th` out of it. Only the centre is computed.
pub fn cover_and_crop(img: &[[u8; 3]], w: usize, h: usize, tw: usize, th: usize) -> Vec<[u8; 3]> {
    let scale = (tw as f64 / w as f64).max(th as f64 / h as f64);
    let rw = ((w as f64 * scale).round() as usize).max(tw);
    let rh = ((h as f64 * scale).round() as usize).max(th);
    let centre = Window {
        x0: (rw - tw) / 2,
        y0: (rh - th) / 2,
        w: tw,
        h: th,
    };
    resize_window(img, (w, h), (rw, rh), centre)
}

/// Indices of the `want` frames kept from a clip of `available` frames shot at `src_fps`,
/// sampled at `target_fps` from the first frame as FastVideo's preprocessing does
/// (`np.arange(0, available, src_fps / target_fps).astype(int)[:want]`): frame
/// `⌊i · src_fps / target_fps⌋`, so a clip shot slower than `target_fps` repeats frames.
/// Every frame when either rate is unknown. `None` when the clip is too short (FastVideo
/// drops such clips too).
pub fn frame_indices(
    available: usize,
    want: usize,
    src_fps: Option<f64>,
    target_fps: Option<f64>,
) -> Option<Vec<usize>> {
    let stride = match (src_fps, target_fps) {
        (Some(s), Some(t)) if s > 0.0 && t > 0.0 => s / t,
        _ => 1.0,
    };
    let idx: Vec<usize> = (0..want)
        .map(|i| (i as f64 * stride).floor() as usize)
        .collect();
    (want > 0 && idx.last().is_some_and(|&l| l < available)).then_some(idx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resize_keeps_flat_images_flat_and_averages_when_shrinking() {
        let flat = vec![[40u8, 80, 120]; 6 * 4];
        assert!(resize(&flat, 6, 4, 3, 2)
            .iter()
            .all(|p| *p == [40, 80, 120]));
        assert!(resize(&flat, 6, 4, 13, 9)
            .iter()
            .all(|p| *p == [40, 80, 120]));
        // A 1-pixel checkerboard halved becomes its mean grey (antialiased).
        let checker: Vec<[u8; 3]> = (0..8 * 8)
            .map(|i| {
                if (i % 8 + i / 8) % 2 == 0 {
                    [0; 3]
                } else {
                    [200; 3]
                }
            })
            .collect();
        for p in resize(&checker, 8, 8, 4, 4) {
            assert!((p[0] as i32 - 100).abs() <= 2, "{p:?}");
        }
        assert_eq!(resize(&flat, 6, 4, 6, 4), flat, "same size is the identity");
    }

    #[test]
    fn cover_and_crop_takes_the_centre() {
        // A 8×4 image whose left and right quarters are red, the middle green.
        let img: Vec<[u8; 3]> = (0..8 * 4)
            .map(|i| {
                if (2..6).contains(&(i % 8)) {
                    [0, 255, 0]
                } else {
                    [255, 0, 0]
                }
            })
            .collect();
        let out = cover_and_crop(&img, 8, 4, 4, 4);
        assert_eq!(out.len(), 16);
        assert!(out.iter().all(|p| *p == [0, 255, 0]), "{out:?}");
        // Enlarging a tall image to a wide target covers it (no black bars).
        let tall = vec![[9u8; 3]; 2 * 6];
        assert!(cover_and_crop(&tall, 2, 6, 8, 4)
            .iter()
            .all(|p| *p == [9; 3]));
    }

    /// Only the centre is computed, and it is the centre of the whole resized image: a
    /// 2000×1 line covering 16×8 would be 16000×8 whole.
    #[test]
    fn cover_and_crop_computes_the_centre_of_the_whole_resize() {
        let line: Vec<[u8; 3]> = (0..2000)
            .map(|i| [(i % 256) as u8, (i / 8) as u8, 7])
            .collect();
        let whole = resize(&line, 2000, 1, 16000, 8);
        let want: Vec<[u8; 3]> = (0..8)
            .flat_map(|y| whole[y * 16000 + 7992..y * 16000 + 8008].to_vec())
            .collect();
        assert_eq!(cover_and_crop(&line, 2000, 1, 16, 8), want);
        let img: Vec<[u8; 3]> = (0..30 * 20)
            .map(|i| [(i * 7 % 256) as u8, 3, (i % 13) as u8])
            .collect();
        let whole = resize(&img, 30, 20, 15, 10);
        let want: Vec<[u8; 3]> = (0..10)
            .flat_map(|y| whole[y * 15 + 2..y * 15 + 13].to_vec())
            .collect();
        assert_eq!(cover_and_crop(&img, 30, 20, 11, 10), want);
    }

    #[test]
    fn frame_indices_follow_the_frame_rates() {
        assert_eq!(frame_indices(10, 5, None, None), Some(vec![0, 1, 2, 3, 4]));
        assert_eq!(
            frame_indices(10, 5, Some(30.0), Some(15.0)),
            Some(vec![0, 2, 4, 6, 8])
        );
        assert_eq!(
            frame_indices(8, 5, Some(30.0), Some(15.0)),
            None,
            "too short"
        );
        // FastVideo's rule: truncated fractional strides, repeats below the target rate.
        assert_eq!(
            frame_indices(5, 5, Some(10.0), Some(16.0)),
            Some(vec![0, 0, 1, 1, 2])
        );
        assert_eq!(
            frame_indices(20, 5, Some(24.0), Some(16.0)),
            Some(vec![0, 1, 3, 4, 6])
        );
        assert_eq!(frame_indices(3, 0, None, None), None);
    }
}
