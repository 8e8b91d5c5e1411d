//! Per-row work of the tiled attention kernels, outside the tile products: the forward's
//! online softmax over a key tile (the cube's rows, or each plane's strip) and the backward's
//! per-row statistics (`Δ = Σ dO∘O` and the saved log-sum-exp).

use cubecl::prelude::*;

use super::kernels::{offset, stat_offset, POS_BIG};
use super::tile_ops::{sync_strip, PAD_FLOAT, PAD_OPERAND, TILE};

/// How far a row's maximum may grow over the one its output was accumulated against before
/// the forward rescales: probabilities stay below `e⁸ ≈ 2981` (finite in f16 and bf16, with
/// their full relative precision; the float32 sums lose nothing), and the output is rescaled
/// only when a row's scores rise that far, mostly never after the first key tiles
/// (FlashAttention-3's conditional rescaling, Shah et al. 2024).
pub(super) const STALE_MAX: f32 = 8.0;

/// One key tile of the forward's online softmax: from the scores `s` (`rows × cols`, padded
/// rows `ls`) of the first `valid` keys, the probabilities `p` (in `F`) against the running row
/// maxima `m`, the running sums `l` and the factors `corr` that rescale the output so far:
/// exactly 1 where the row keeps its maximum, which it does until the tile's scores exceed it
/// by more than [`STALE_MAX`] (and on the first tile, whose output so far is zero).
/// `units / rows` units share a row (`units` a multiple of `rows`), each sweeping every
/// `units / rows`-th column from a column that differs by row (so that the units of a plane
/// read different memory banks), and combine their maxima and sums through `red` (`units`
/// floats). Starts and ends with the cube in step (the caller syncs before and after).
///
/// With `strips`, each plane does this for its own 16 rows (`rows / 16` planes; two units per
/// row), in step with itself only (`sync_strip`), for the kernels of `strips.rs`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn online_softmax<F: Float>(
    s: &SharedMemory<f32>,
    p: &mut SharedMemory<F>,
    m: &mut SharedMemory<f32>,
    l: &mut SharedMemory<f32>,
    corr: &mut SharedMemory<f32>,
    red: &mut SharedMemory<f32>,
    scale: f32,
    valid: usize,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] units: usize,
    #[comptime] strips: bool,
    #[comptime] tc: bool,
) {
    // The units that share the work, and the rows they own: the cube's, or a plane's strip.
    let (group, group_rows) = comptime![if strips { (32, TILE) } else { (units, rows) }];
    let share = comptime![group / group_rows];
    let sweep = comptime![cols / share];
    let (ls, lp) = comptime![(cols + PAD_FLOAT, cols + PAD_OPERAND)];
    let in_strip = comptime![if strips { 1usize } else { 0usize }];
    let first = in_strip * UNIT_POS_Y as usize * 32;
    let unit = UNIT_POS as usize - first;
    let (r, part) = (
        in_strip * UNIT_POS_Y as usize * TILE + unit / share,
        unit % share,
    );
    let strip_sync = comptime![strips && tc];
    let old = m[r];
    let mut mx = old;
    for step in 0..sweep {
        let j = ((step + r) % sweep) * share + part;
        if j < valid {
            mx = f32::max(mx, s[r * ls + j] * scale);
        }
    }
    red[first + unit] = mx;
    sync_strip(strip_sync);
    for x in 0..share {
        mx = f32::max(mx, red[first + (unit / share) * share + x]);
    }
    // Every unit of the row reads the same maxima, so they agree on keeping the old one.
    let keep = mx <= old + STALE_MAX;
    if keep {
        mx = old;
    }
    sync_strip(strip_sync);
    let mut sum = 0.0f32;
    for step in 0..sweep {
        let j = ((step + r) % sweep) * share + part;
        let mut pj = 0.0f32;
        if j < valid {
            pj = f32::exp(s[r * ls + j] * scale - mx);
        }
        p[r * lp + j] = F::cast_from(pj);
        sum += pj;
    }
    red[first + unit] = sum;
    sync_strip(strip_sync);
    if part == 0 {
        let mut total = 0.0f32;
        for x in 0..share {
            total += red[first + (unit / share) * share + x];
        }
        let mut c = 1.0f32;
        if !keep && l[r] > 0.0 {
            c = f32::exp(old - mx);
        }
        l[r] = l[r] * c + total;
        m[r] = mx;
        corr[r] = c;
    }
}

/// Rescale rows `row0 .. row0 + n` of the output sums `o` (float32, `lo` per padded row) by
/// their factors `corr` from [`online_softmax`], skipping the rows whose factor is 1 (most,
/// after the first key tiles): unit `unit` of `units` takes every `units`-th element.
#[cube]
pub(super) fn rescale_rows(
    o: &mut SharedMemory<f32>,
    corr: &SharedMemory<f32>,
    row0: usize,
    #[comptime] n: usize,
    #[comptime] lo: usize,
    unit: usize,
    #[comptime] units: usize,
) {
    let mut idx = unit;
    while idx < comptime![n * lo] {
        let c = corr[row0 + idx / lo];
        if c != 1.0 {
            o[row0 * lo + idx] *= c;
        }
        idx += units;
    }
}

/// The backward's statistics of the cube's query rows `row0 .. row0 + rows`, one unit per row:
/// `Δ = Σ dO∘O` (written to `delta`, float32 `[B, H, Sq]`, and `deltas`) and the saved
/// log-sum-exp (into `lses`); rows past the sequence's end get `Δ = 0` and a log-sum-exp that
/// zeroes their probabilities.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn query_stats<F: Float, N: Size>(
    out: &Tensor<Vector<F, N>>,
    d_out: &Tensor<Vector<F, N>>,
    lse: &Tensor<f32>,
    delta: &mut Tensor<f32>,
    lses: &mut SharedMemory<f32>,
    deltas: &mut SharedMemory<f32>,
    bh: usize,
    row0: usize,
    #[comptime] rows: usize,
) {
    let heads = out.shape(1);
    let seq_q = out.shape(2);
    let dv = out.shape(3);
    let r = UNIT_POS as usize;
    if r < rows {
        let row = row0 + r;
        let mut row_lse = f32::new(POS_BIG);
        let mut dlt = 0.0f32;
        if row < seq_q {
            // `N` divides `dv` (the launcher's choice).
            let n = out.vector_size();
            for c in 0..dv / n {
                let o_rc = out[offset(out, bh, heads, row, c * n) / n];
                let g_rc = d_out[offset(d_out, bh, heads, row, c * n) / n];
                #[unroll]
                for j in 0..n {
                    dlt += f32::cast_from(g_rc[j]) * f32::cast_from(o_rc[j]);
                }
            }
            row_lse = lse[stat_offset(lse, bh, heads, row)];
            delta[stat_offset(delta, bh, heads, row)] = dlt;
        }
        lses[r] = row_lse;
        deltas[r] = dlt;
    }
}

/// The saved log-sum-exp and `Δ` of the streamed query rows `q0 .. q0 + cols` into `lses` and
/// `deltas` from index `at`, one unit per row (rows past the sequence's end: probabilities 0).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn streamed_stats(
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    lses: &mut SharedMemory<f32>,
    deltas: &mut SharedMemory<f32>,
    at: usize,
    bh: usize,
    q0: usize,
    #[comptime] cols: usize,
) {
    let heads = lse.shape(1);
    let seq_q = lse.shape(2);
    let j = UNIT_POS as usize;
    if j < cols {
        let mut lv = f32::new(POS_BIG);
        let mut dl = 0.0f32;
        if q0 + j < seq_q {
            lv = lse[stat_offset(lse, bh, heads, q0 + j)];
            dl = delta[stat_offset(delta, bh, heads, q0 + j)];
        }
        lses[at + j] = lv;
        deltas[at + j] = dl;
    }
}
