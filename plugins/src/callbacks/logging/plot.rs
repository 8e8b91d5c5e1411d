//! `<run>/loss.png`: the loss curves of a run, drawn without a plotting library.
//!
//! One series per loss key of the training lines of `metrics.jsonl` (keys other than `step`,
//! `step_seconds`, `samples_seen`, `skipped` and those with a `/`, such as `lr/student`), in name
//! order. Each series is drawn twice in its colour: the raw values faintly, a centred moving
//! average (window `n/20`, at least 1) boldly. Axes with a light grid and tick labels; the y axis
//! is logarithmic when every value is positive and they span more than [`LOG_SPAN`]×. A legend box
//! per series, with its name, sits in the top-right corner.

use std::path::Path;

use super::jsonl::{is_validation, record_step, Record};
use crate::media::font::{draw_text, text_width, GLYPH_H};
use crate::media::{write_png, MediaError};

/// Image width in pixels.
pub const WIDTH: usize = 800;
/// Image height in pixels.
pub const HEIGHT: usize = 480;
/// Ratio of largest to smallest value above which the y axis is logarithmic.
pub const LOG_SPAN: f64 = 50.0;
/// Series colours, in order.
pub const PALETTE: [[u8; 3]; 6] = [
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [214, 39, 40],
    [148, 103, 189],
    [140, 86, 75],
];

const WHITE: [u8; 3] = [255, 255, 255];
const BLACK: [u8; 3] = [0, 0, 0];
const GRID: [u8; 3] = [225, 225, 225];
const TEXT_SCALE: usize = 1;
const LEFT: usize = 80;
const RIGHT: usize = 20;
const TOP: usize = 20;
const BOTTOM: usize = 40;

/// A named series of `(step, value)` points, in step order.
pub type Series = (String, Vec<(f64, f64)>);

/// The loss series of metrics records (training lines only; non-finite values dropped).
pub fn loss_series(records: &[Record]) -> Vec<Series> {
    const NOT_LOSSES: [&str; 4] = ["step", "step_seconds", "samples_seen", "skipped"];
    let mut out: Vec<Series> = Vec::new();
    for r in records.iter().filter(|r| !is_validation(r)) {
        let Some(step) = record_step(r) else { continue };
        for (k, v) in r {
            if NOT_LOSSES.contains(&k.as_str()) || k.contains('/') {
                continue;
            }
            let Some(v) = v.as_f64().filter(|v| v.is_finite()) else {
                continue;
            };
            match out.iter_mut().find(|(name, _)| name == k) {
                Some((_, pts)) => pts.push((step as f64, v)),
                None => out.push((k.clone(), vec![(step as f64, v)])),
            }
        }
    }
    for (_, pts) in &mut out {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// Centred moving average with a window of `n/20` points (at least 1).
pub fn smooth(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let half = (points.len() / 20).max(1) / 2;
    (0..points.len())
        .map(|i| {
            let (lo, hi) = (i.saturating_sub(half), (i + half + 1).min(points.len()));
            let mean = points[lo..hi].iter().map(|p| p.1).sum::<f64>() / (hi - lo) as f64;
            (points[i].0, mean)
        })
        .collect()
}

/// A tick label: plain for moderate values, `1.2E-3` style otherwise.
pub fn tick_label(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 {
        "0".into()
    } else if (0.01..1e5).contains(&a) {
        let s = format!("{v:.3}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_string()
    } else {
        format!("{v:.1e}").to_uppercase()
    }
}

/// Round tick values (1, 2 or 5 × 10^k apart, as close to `target` of them as such steps
/// allow) inside `[lo, hi]`.
pub fn nice_ticks(lo: f64, hi: f64, target: usize) -> Vec<f64> {
    let raw = (hi - lo) / target.max(1) as f64;
    if !(raw.is_finite() && raw > 0.0) {
        return vec![lo];
    }
    let mag = 10f64.powf(raw.log10().floor());
    let count = |step: f64| ((hi - lo) / step - target as f64).abs();
    let step = [0.5, 1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .min_by(|a, b| count(*a).total_cmp(&count(*b)))
        .unwrap_or(mag);
    let (first, last) = ((lo / step).ceil() as i64, (hi / step).floor() as i64);
    (first..=last).map(|i| i as f64 * step).collect()
}

/// Pixels of a `WIDTH × HEIGHT` loss plot of `series` (an empty frame when there is none).
pub fn render(series: &[Series]) -> Vec<[u8; 3]> {
    let mut img = vec![WHITE; WIDTH * HEIGHT];
    let (x0, x1, y0, y1) = (LEFT, WIDTH - RIGHT, TOP, HEIGHT - BOTTOM);
    let all: Vec<(f64, f64)> = series.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    let (mut smin, mut smax) = all
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.0), b.max(p.0))
        });
    let (mut vmin, mut vmax) = all
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
            (a.min(p.1), b.max(p.1))
        });
    if all.is_empty() {
        (smin, smax, vmin, vmax) = (0.0, 1.0, 0.0, 1.0);
    }
    if smax <= smin {
        smax = smin + 1.0;
    }
    let log = vmin > 0.0 && vmax / vmin > LOG_SPAN;
    let fy = |v: f64| if log { v.log10() } else { v };
    let (mut lo, mut hi) = (fy(vmin), fy(vmax));
    if hi <= lo {
        (lo, hi) = (lo - 0.5, hi + 0.5);
    }
    let pad = 0.05 * (hi - lo);
    (lo, hi) = (lo - pad, hi + pad);
    let px = |s: f64| x0 as f64 + (s - smin) / (smax - smin) * (x1 - x0) as f64;
    let ty = |t: f64| y1 as f64 - (t - lo) / (hi - lo) * (y1 - y0) as f64;
    let py = |v: f64| ty(fy(v));

    // Grid and tick labels: round values; powers of ten on a log axis.
    let th = GLYPH_H * TEXT_SCALE;
    let decades: Vec<f64> = (lo.ceil() as i64..=hi.floor() as i64)
        .map(|e| e as f64)
        .collect();
    let yticks = if log && decades.len() >= 2 {
        decades
    } else {
        nice_ticks(lo, hi, 5)
    };
    for t in yticks {
        let gy = ty(t).round();
        line(&mut img, (x0 as f64, gy), (x1 as f64, gy), GRID, 1);
        let label = tick_label(if log { 10f64.powf(t) } else { t });
        let lx = x0.saturating_sub(text_width(&label, TEXT_SCALE) + 6);
        let ly = (gy as usize).saturating_sub(th / 2);
        draw_text(&mut img, WIDTH, lx, ly, &label, TEXT_SCALE, BLACK);
    }
    for s in nice_ticks(smin, smax, 6)
        .into_iter()
        .filter(|s| s.fract() == 0.0)
    {
        let gx = px(s).round();
        line(&mut img, (gx, y0 as f64), (gx, y1 as f64), GRID, 1);
        let label = format!("{}", s as i64);
        let lx = (gx as usize).saturating_sub(text_width(&label, TEXT_SCALE) / 2);
        draw_text(&mut img, WIDTH, lx, y1 + 8, &label, TEXT_SCALE, BLACK);
    }
    line(
        &mut img,
        (x0 as f64, y0 as f64),
        (x0 as f64, y1 as f64),
        BLACK,
        2,
    );
    line(
        &mut img,
        (x0 as f64, y1 as f64),
        (x1 as f64, y1 as f64),
        BLACK,
        2,
    );

    for (i, (_, pts)) in series.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let faint = colour.map(|c| (c as u16 + 2 * 255).div_euclid(3) as u8);
        polyline(&mut img, pts, &px, &py, faint, 1);
        polyline(&mut img, &smooth(pts), &px, &py, colour, 2);
    }

    // Legend, top right: a colour box and the name per series.
    let mut ly = y0 + 8;
    for (i, (name, _)) in series.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let lx = x1.saturating_sub(text_width(name, TEXT_SCALE) + 30);
        fill(&mut img, lx, ly, 12, 12, colour);
        draw_text(
            &mut img,
            WIDTH,
            lx + 18,
            ly.saturating_sub(2),
            name,
            TEXT_SCALE,
            BLACK,
        );
        ly += 20;
    }
    img
}

/// Read `metrics` and write the loss plot to `out`. Returns `false` (and writes nothing)
/// when there are no loss values.
pub fn write_loss_plot(metrics: &[Record], out: &Path) -> Result<bool, MediaError> {
    let series = loss_series(metrics);
    if series.iter().all(|(_, p)| p.is_empty()) {
        return Ok(false);
    }
    write_png(out, &render(&series), WIDTH, HEIGHT)?;
    Ok(true)
}

fn fill(img: &mut [[u8; 3]], x: usize, y: usize, w: usize, h: usize, colour: [u8; 3]) {
    for yy in y..(y + h).min(HEIGHT) {
        for xx in x..(x + w).min(WIDTH) {
            img[yy * WIDTH + xx] = colour;
        }
    }
}

fn polyline(
    img: &mut [[u8; 3]],
    pts: &[(f64, f64)],
    px: &dyn Fn(f64) -> f64,
    py: &dyn Fn(f64) -> f64,
    colour: [u8; 3],
    thickness: usize,
) {
    let mapped: Vec<(f64, f64)> = pts.iter().map(|&(s, v)| (px(s), py(v))).collect();
    match mapped.as_slice() {
        [] => {}
        [p] => line(img, *p, *p, colour, thickness + 2),
        many => {
            for w in many.windows(2) {
                line(img, w[0], w[1], colour, thickness);
            }
        }
    }
}

/// A straight line of square dots (`thickness` pixels wide), clipped to the image.
fn line(img: &mut [[u8; 3]], a: (f64, f64), b: (f64, f64), colour: [u8; 3], thickness: usize) {
    let n = (b.0 - a.0).abs().max((b.1 - a.1).abs()).ceil().max(1.0) as usize;
    let off = thickness as f64 / 2.0;
    for i in 0..=n {
        let t = i as f64 / n as f64;
        let (x, y) = (a.0 + t * (b.0 - a.0) - off, a.1 + t * (b.1 - a.1) - off);
        if x < -(thickness as f64) || y < -(thickness as f64) {
            continue;
        }
        let (x, y) = (x.round().max(0.0) as usize, y.round().max(0.0) as usize);
        fill(img, x, y, thickness, thickness, colour);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn records() -> Vec<Record> {
        let mut out = Vec::new();
        for s in 1..=60u64 {
            let r = json!({"step": s, "loss": 1.0 / s as f64, "critic_loss": 0.5,
                "lr/student": 1e-3, "step_seconds": 0.1, "samples_seen": s, "skipped": false});
            out.push(r.as_object().unwrap().clone());
        }
        out.push(
            json!({"step": 60, "val/overall": 0.5})
                .as_object()
                .unwrap()
                .clone(),
        );
        out.push(
            json!({"step": 61, "loss": null})
                .as_object()
                .unwrap()
                .clone(),
        );
        out
    }

    #[test]
    fn series_smoothing_and_labels() {
        let s = loss_series(&records());
        let names: Vec<&str> = s.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["critic_loss", "loss"]); // name order
        assert_eq!(s[0].1.len(), 60);
        let sm = smooth(&[(0.0, 0.0), (1.0, 3.0), (2.0, 0.0)]);
        assert_eq!(sm, [(0.0, 0.0), (1.0, 3.0), (2.0, 0.0)]); // window 1 for 3 points
        let flat: Vec<(f64, f64)> = (0..40).map(|i| (i as f64, (i % 2) as f64)).collect();
        assert!(smooth(&flat)[10].1 > 0.0 && smooth(&flat)[10].1 < 1.0);
        assert_eq!(tick_label(0.5), "0.5");
        assert_eq!(tick_label(12.0), "12");
        assert_eq!(tick_label(0.00123), "1.2E-3");
        assert_eq!(nice_ticks(1.4, 4.2, 5), [1.5, 2.0, 2.5, 3.0, 3.5, 4.0]);
        assert_eq!(
            nice_ticks(1.0, 60.0, 6),
            [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
        );
        assert_eq!(nice_ticks(0.0, 0.0, 5), [0.0]);
    }

    #[test]
    fn plot_draws_axes_series_and_legend() {
        let img = render(&loss_series(&records()));
        assert_eq!(img.len(), WIDTH * HEIGHT);
        let count = |c: [u8; 3]| img.iter().filter(|p| **p == c).count();
        assert!(count(PALETTE[0]) > 200, "first series drawn");
        assert!(count(PALETTE[1]) > 200, "second series drawn");
        assert_eq!(count(PALETTE[2]), 0, "only two series");
        assert!(count(BLACK) > 1000, "axes and labels");
        // Axis corner.
        assert_eq!(img[(HEIGHT - BOTTOM) * WIDTH + LEFT], BLACK);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("loss.png");
        assert!(write_loss_plot(&records(), &path).unwrap());
        assert!(path.is_file());
        assert!(!write_loss_plot(&[], &dir.path().join("none.png")).unwrap());
        // An empty plot still renders.
        assert_eq!(render(&[]).len(), WIDTH * HEIGHT);
    }
}
