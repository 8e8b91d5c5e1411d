//! The tiled backward with each plane (warp) owning 16 of the cube's rows (`w` in a tile spec,
//! `tiles.rs`), as the forward of `strips.rs`: the plane computes its strip of every product
//! and of the score gradients, in step with itself only, so the cube meets twice per streamed
//! tile (around staging it) instead of four times; with tensor-core products the plane keeps
//! its strip of both left operands of the score products (`q` and `dO` on the query side, `k`
//! and `v` on the key side) as fragments in registers. The sums (`dQ`, `dK`, `dV`) are the
//! strip's rows of float32 matrices in shared memory or, with `r`, the plane's accumulator
//! fragments (`fragments.rs`). Same results as
//! [`tiled_backward_q`](fn@super::tiled_kernels::tiled_backward_q) and
//! [`tiled_backward_kv`](fn@super::tiled_kernels::tiled_backward_kv).

// The `#[cube(launch_unchecked)]` macro generates undocumented launch modules and structs.
#![allow(missing_docs)]

use cubecl::prelude::*;

use super::fragments::{accumulate, accumulators, store_sums};
use super::rows::{query_stats, streamed_stats};
use super::staging::{fill, stage_pair, store_rows, stream, streamed};
use super::strips::{strip_fragments, strip_scores};
use super::tile_ops::{strip_product, sync_strip, ALIGN, PAD_FLOAT, PAD_OPERAND, TILE};

/// Backward, query side, with plane-owned strips: `delta` (`Δ` per query row) and
/// `dq = scale·dS·k`, `dS = P∘(dO·vᵀ − Δ)`; `rows = 16 × units / 32`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn tiled_backward_q_strips<F: Float, N: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    out: &Tensor<Vector<F, N>>,
    d_out: &Tensor<Vector<F, N>>,
    lse: &Tensor<f32>,
    dq: &mut Tensor<F>,
    delta: &mut Tensor<f32>,
    scale: f32,
    #[comptime] dp: usize,
    #[comptime] dvp: usize,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] units: usize,
    #[comptime] tc: bool,
    #[comptime] regs: bool,
    #[comptime] prefetch: bool,
    #[define(F)] _dtype: StorageType,
) {
    let bh = CUBE_POS_Y as usize;
    let seq_k = k.shape(2);
    let row0 = CUBE_POS_X as usize * rows;
    let strip = UNIT_POS_Y as usize * TILE;
    let lane = UNIT_POS_X as usize;

    let (ls, lp, lq) = comptime![(cols + PAD_FLOAT, cols + PAD_OPERAND, dp + PAD_FLOAT)];
    let mut qs = SharedMemory::<F>::new_aligned(rows * (dp + PAD_OPERAND), ALIGN);
    let mut dos = SharedMemory::<F>::new_aligned(rows * (dvp + PAD_OPERAND), ALIGN);
    let mut ks = SharedMemory::<F>::new_aligned(cols * (dp + PAD_OPERAND), ALIGN);
    let mut vs = SharedMemory::<F>::new_aligned(cols * (dvp + PAD_OPERAND), ALIGN);
    let mut s = SharedMemory::<f32>::new_aligned(rows * ls, ALIGN);
    let mut dpm = SharedMemory::<f32>::new_aligned(rows * ls, ALIGN);
    let mut ds = SharedMemory::<F>::new_aligned(rows * lp, ALIGN);
    // With `regs` (tensor cores only) the plane's strip of `dQ` sums in register fragments
    // and leaves through the score matrix, else in `dqs`.
    let regs = comptime![tc && regs];
    let mut dqs =
        SharedMemory::<f32>::new_aligned(comptime![if regs { 1 } else { rows * lq }], ALIGN);
    let dq_acc = accumulators(rows, comptime![if regs { dp } else { 0 }], units, true);
    let mut lses = SharedMemory::<f32>::new_aligned(rows, ALIGN);
    let mut deltas = SharedMemory::<f32>::new_aligned(rows, ALIGN);
    stage_pair(q, d_out, &mut qs, &mut dos, bh, row0, rows, dp, dvp, units);
    if comptime![!regs] {
        fill(&mut dqs, 0.0f32, rows * lq, units);
    }
    query_stats(
        out,
        d_out,
        lse,
        delta,
        &mut lses,
        &mut deltas,
        bh,
        row0,
        rows,
    );
    sync_cube();
    let qf = strip_fragments::<F>(&qs, strip, dp, tc);
    let dof = strip_fragments::<F>(&dos, strip, dvp, tc);
    let (mut kr, mut vr) = streamed(k, v, bh, cols, dp, dvp, units, prefetch);

    for t in 0..seq_k.div_ceil(cols) {
        let key0 = t * cols;
        stream(k, &mut kr, &mut ks, bh, key0, cols, dp, units, prefetch);
        stream(v, &mut vr, &mut vs, bh, key0, cols, dvp, units, prefetch);
        sync_cube();
        strip_scores::<F>(&qs, &qf, &ks, &mut s, strip, cols, dp, tc);
        strip_scores::<F>(&dos, &dof, &vs, &mut dpm, strip, cols, dvp, tc);
        sync_strip(tc);
        let mut idx = lane;
        while idx < comptime![TILE * cols] {
            let (r, j) = (strip + idx / cols, idx % cols);
            let mut g = 0.0f32;
            if key0 + j < seq_k {
                let p = f32::exp(s[r * ls + j] * scale - lses[r]);
                g = p * (dpm[r * ls + j] - deltas[r]);
            }
            ds[r * lp + j] = F::cast_from(g);
            idx += 32;
        }
        sync_strip(tc);
        if comptime![regs] {
            accumulate::<F>(&ds, &ks, &dq_acc, rows, dp, cols, false, units, true);
        } else {
            strip_product::<F>(&ds, &ks, &mut dqs, strip, dp, cols, false, true, tc);
        }
        // Every plane is done with this `k`/`v` tile before the next one is staged.
        sync_cube();
    }
    if comptime![regs] {
        // Strips' scores always hold the sums' way out (16 rows of 20 floats at least per
        // plane): `dqs` is a placeholder.
        let sc = &mut dqs;
        store_sums(
            dq, &dq_acc, &mut s, sc, bh, row0, scale, rows, dp, cols, units, true,
        );
    } else {
        store_rows(dq, &dqs, bh, row0, scale, rows, lq, units);
    }
}

/// Backward, key side, with plane-owned strips: cube `(x, bh)` owns key rows `x·rows ..`
/// (`rows = 16 × units / 32`) and streams query tiles: `dv = Pᵀ·dO`, `dk = scale·dSᵀ·q`, with
/// `Δ` from [`tiled_backward_q_strips`](fn@tiled_backward_q_strips) or
/// [`tiled_backward_q`](fn@super::tiled_kernels::tiled_backward_q) (launched first on the
/// same stream).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn tiled_backward_kv_strips<F: Float, N: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    d_out: &Tensor<Vector<F, N>>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    dk: &mut Tensor<F>,
    dv_out: &mut Tensor<F>,
    scale: f32,
    #[comptime] dp: usize,
    #[comptime] dvp: usize,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] units: usize,
    #[comptime] tc: bool,
    #[comptime] regs: bool,
    #[comptime] prefetch: bool,
    #[define(F)] _dtype: StorageType,
) {
    let bh = CUBE_POS_Y as usize;
    let seq_q = q.shape(2);
    let row0 = CUBE_POS_X as usize * rows;
    let strip = UNIT_POS_Y as usize * TILE;
    let lane = UNIT_POS_X as usize;

    let (ls, lp) = comptime![(cols + PAD_FLOAT, cols + PAD_OPERAND)];
    let (lk, lv) = comptime![(dp + PAD_FLOAT, dvp + PAD_FLOAT)];
    let mut ks = SharedMemory::<F>::new_aligned(rows * (dp + PAD_OPERAND), ALIGN);
    let mut vs = SharedMemory::<F>::new_aligned(rows * (dvp + PAD_OPERAND), ALIGN);
    let mut qs = SharedMemory::<F>::new_aligned(cols * (dp + PAD_OPERAND), ALIGN);
    let mut dos = SharedMemory::<F>::new_aligned(cols * (dvp + PAD_OPERAND), ALIGN);
    let mut st = SharedMemory::<f32>::new_aligned(rows * ls, ALIGN);
    let mut dpt = SharedMemory::<f32>::new_aligned(rows * ls, ALIGN);
    let mut pt = SharedMemory::<F>::new_aligned(rows * lp, ALIGN);
    let mut dst = SharedMemory::<F>::new_aligned(rows * lp, ALIGN);
    // With `regs` (tensor cores only) the plane's strips of `dK` and `dV` sum in register
    // fragments and leave through the score matrix, else in `dks` and `dvs`.
    let regs = comptime![tc && regs];
    let mut dks =
        SharedMemory::<f32>::new_aligned(comptime![if regs { 1 } else { rows * lk }], ALIGN);
    let mut dvs =
        SharedMemory::<f32>::new_aligned(comptime![if regs { 1 } else { rows * lv }], ALIGN);
    let dk_acc = accumulators(rows, comptime![if regs { dp } else { 0 }], units, true);
    let dv_acc = accumulators(rows, comptime![if regs { dvp } else { 0 }], units, true);
    let mut lses = SharedMemory::<f32>::new_aligned(cols, ALIGN);
    let mut deltas = SharedMemory::<f32>::new_aligned(cols, ALIGN);
    stage_pair(k, v, &mut ks, &mut vs, bh, row0, rows, dp, dvp, units);
    if comptime![!regs] {
        fill(&mut dks, 0.0f32, rows * lk, units);
        fill(&mut dvs, 0.0f32, rows * lv, units);
    }
    sync_cube();
    let kf = strip_fragments::<F>(&ks, strip, dp, tc);
    let vf = strip_fragments::<F>(&vs, strip, dvp, tc);
    let (mut qr, mut dor) = streamed(q, d_out, bh, cols, dp, dvp, units, prefetch);

    for t in 0..seq_q.div_ceil(cols) {
        let q0 = t * cols;
        stream(q, &mut qr, &mut qs, bh, q0, cols, dp, units, prefetch);
        stream(
            d_out, &mut dor, &mut dos, bh, q0, cols, dvp, units, prefetch,
        );
        streamed_stats(lse, delta, &mut lses, &mut deltas, 0, bh, q0, cols);
        sync_cube();
        strip_scores::<F>(&ks, &kf, &qs, &mut st, strip, cols, dp, tc);
        strip_scores::<F>(&vs, &vf, &dos, &mut dpt, strip, cols, dvp, tc);
        sync_strip(tc);
        let mut idx = lane;
        while idx < comptime![TILE * cols] {
            let (r, j) = (strip + idx / cols, idx % cols);
            let p = f32::exp(st[r * ls + j] * scale - lses[j]);
            pt[r * lp + j] = F::cast_from(p);
            dst[r * lp + j] = F::cast_from(p * (dpt[r * ls + j] - deltas[j]));
            idx += 32;
        }
        sync_strip(tc);
        if comptime![regs] {
            accumulate::<F>(&pt, &dos, &dv_acc, rows, dvp, cols, false, units, true);
            accumulate::<F>(&dst, &qs, &dk_acc, rows, dp, cols, false, units, true);
        } else {
            strip_product::<F>(&pt, &dos, &mut dvs, strip, dvp, cols, false, true, tc);
            strip_product::<F>(&dst, &qs, &mut dks, strip, dp, cols, false, true, tc);
        }
        // Every plane is done with this query tile before the next one is staged.
        sync_cube();
    }
    if comptime![regs] {
        // As in the query side: `dks` is a placeholder.
        let sc = &mut dks;
        store_sums(
            dk, &dk_acc, &mut st, sc, bh, row0, scale, rows, dp, cols, units, true,
        );
        store_sums(
            dv_out, &dv_acc, &mut st, sc, bh, row0, 1.0, rows, dvp, cols, units, true,
        );
    } else {
        store_rows(dk, &dks, bh, row0, scale, rows, lk, units);
        store_rows(dv_out, &dvs, bh, row0, 1.0f32, rows, lv, units);
    }
}
