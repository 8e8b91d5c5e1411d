//! CubeCL kernels of the tiled attention ([`super::tiled`]): the FlashAttention-2 forward
//! (output and log-sum-exp) and backward (`dQ` per query tile, `dK`/`dV` per key tile) built
//! from 16×16 tile products, so that every product runs on tensor cores.
//!
//! Each cube owns `rows` rows of one `(b, h)` and streams tiles of `cols` rows of the other
//! sequence through shared memory. Operands (`q`, `k`, `v`, `dO`, probabilities, score
//! gradients) sit in shared memory in the input dtype `F`; scores, softmax statistics and the
//! accumulators are float32. Head dims are padded with zeros to multiples of 16, and rows past
//! a sequence's end are zero (keys) or masked (probability 0). A shared-memory matrix of width
//! `w` keeps `w + PAD_OPERAND` (`F`) or `w + PAD_FLOAT` (float32) elements per row, so that
//! consecutive rows start in different memory banks.
//!
//! Staging and storing are in the `staging` module, the softmax and the backward's row
//! statistics in `rows`, the tile products in `tile_ops`: a product runs either as
//! cooperative-matrix (tensor-core) instructions or, with `tc = false`, as plain unit loops
//! over the same shared memory. `strips.rs` and `strips_backward.rs` hold the variants whose
//! planes own 16-row strips (`w`).

// The `#[cube(launch_unchecked)]` macro generates undocumented launch modules and structs.
#![allow(missing_docs)]

use cubecl::prelude::*;

use super::fragments::{
    accumulate, accumulators, exit_scratch, rescale_accumulators, spill_accumulators, store_sums,
};
use super::kernels::{offset, stat_offset, NEG_BIG};
use super::rows::{online_softmax, query_stats, rescale_rows, streamed_stats};
use super::staging::{fill, stage, stage_pair, store_rows, stream, streamed};
use super::tile_ops::{product, ALIGN};
pub use super::tile_ops::{PAD_FLOAT, PAD_OPERAND, TILE};

/// Forward: `out = softmax(scale·q·kᵀ)·v` and `lse [B, H, Sq]` (float32, of the scaled
/// scores). Cube `(x, bh)` owns query rows `x·rows ..`; key tiles of `cols` rows stream by.
/// `dp`, `dvp`: the head dims rounded up to 16.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn tiled_forward<F: Float, N: Size>(
    q: &Tensor<Vector<F, N>>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    out: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
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
    let heads = q.shape(1);
    let seq_q = q.shape(2);
    let seq_k = k.shape(2);
    let dv = v.shape(3);
    let row0 = CUBE_POS_X as usize * rows;

    // Row steps of the padded matrices.
    let (ls, lp) = comptime![(cols + PAD_FLOAT, cols + PAD_OPERAND)];
    let lo = comptime![dvp + PAD_FLOAT];
    let mut qs = SharedMemory::<F>::new_aligned(rows * (dp + PAD_OPERAND), ALIGN);
    let mut ks = SharedMemory::<F>::new_aligned(cols * (dp + PAD_OPERAND), ALIGN);
    let mut vs = SharedMemory::<F>::new_aligned(cols * (dvp + PAD_OPERAND), ALIGN);
    let mut s = SharedMemory::<f32>::new_aligned(rows * ls, ALIGN);
    let mut p = SharedMemory::<F>::new_aligned(rows * lp, ALIGN);
    let mut o = SharedMemory::<f32>::new_aligned(rows * lo, ALIGN);
    let mut m = SharedMemory::<f32>::new_aligned(rows, ALIGN);
    let mut l = SharedMemory::<f32>::new_aligned(rows, ALIGN);
    let mut corr = SharedMemory::<f32>::new_aligned(rows, ALIGN);
    let mut red = SharedMemory::<f32>::new_aligned(units, ALIGN);
    // With `regs` (tensor cores only) the output sums in register fragments and `o` serves
    // only their rescaling and their way out.
    let regs = comptime![tc && regs];
    let o_acc = accumulators(rows, comptime![if regs { dvp } else { 0 }], units, false);
    stage(q, &mut qs, bh, row0, rows, dp, units);
    if comptime![!regs] {
        // (With `regs` every tile of `o` is stored before it is read.)
        fill(&mut o, 0.0f32, rows * lo, units);
    }
    fill(&mut m, f32::new(NEG_BIG), rows, units);
    fill(&mut l, 0.0f32, rows, units);
    let (mut kr, mut vr) = streamed(k, v, bh, cols, dp, dvp, units, prefetch);

    for t in 0..seq_k.div_ceil(cols) {
        let key0 = t * cols;
        stream(k, &mut kr, &mut ks, bh, key0, cols, dp, units, prefetch);
        stream(v, &mut vr, &mut vs, bh, key0, cols, dvp, units, prefetch);
        sync_cube();
        product::<F>(&qs, &ks, &mut s, rows, cols, dp, true, false, tc, units);
        sync_cube();
        online_softmax::<F>(
            &s,
            &mut p,
            &mut m,
            &mut l,
            &mut corr,
            &mut red,
            scale,
            seq_k - key0,
            rows,
            cols,
            units,
            false,
            tc,
        );
        sync_cube();
        if comptime![regs] {
            rescale_accumulators(&o_acc, &mut o, &corr, rows, dvp, units, false);
            accumulate::<F>(&p, &vs, &o_acc, rows, dvp, cols, false, units, false);
        } else {
            rescale_rows(&mut o, &corr, 0, rows, lo, UNIT_POS as usize, units);
            sync_cube();
            product::<F>(&p, &vs, &mut o, rows, dvp, cols, false, true, tc, units);
        }
        sync_cube();
    }
    if comptime![regs] {
        spill_accumulators(&o_acc, &mut o, rows, dvp, units, false);
        sync_cube();
    }

    let mut idx = UNIT_POS as usize;
    while idx < rows * dv {
        let r = idx / dv;
        let c = idx % dv;
        if row0 + r < seq_q {
            out[offset(out, bh, heads, row0 + r, c)] = F::cast_from(o[r * lo + c] / l[r]);
        }
        idx += units;
    }
    let r = UNIT_POS as usize;
    if r < rows && row0 + r < seq_q {
        lse[stat_offset(lse, bh, heads, row0 + r)] = m[r] + f32::ln(l[r]);
    }
}

/// Backward, query side: `delta = Δ = Σ dO∘O` per query row (float32 `[B, H, Sq]`, read by
/// [`tiled_backward_kv`](fn@tiled_backward_kv)) and `dq = scale·dS·k` with `dS = P∘(dO·vᵀ − Δ)`,
/// `P` recomputed from the saved log-sum-exp.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn tiled_backward_q<F: Float, N: Size>(
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

    let (ls, lp) = comptime![(cols + PAD_FLOAT, cols + PAD_OPERAND)];
    let lq = comptime![dp + PAD_FLOAT];
    let mut qs = SharedMemory::<F>::new_aligned(rows * (dp + PAD_OPERAND), ALIGN);
    let mut dos = SharedMemory::<F>::new_aligned(rows * (dvp + PAD_OPERAND), ALIGN);
    let mut ks = SharedMemory::<F>::new_aligned(cols * (dp + PAD_OPERAND), ALIGN);
    let mut vs = SharedMemory::<F>::new_aligned(cols * (dvp + PAD_OPERAND), ALIGN);
    let mut s = SharedMemory::<f32>::new_aligned(rows * ls, ALIGN);
    let mut dpm = SharedMemory::<f32>::new_aligned(rows * ls, ALIGN);
    let mut ds = SharedMemory::<F>::new_aligned(rows * lp, ALIGN);
    // With `regs` (tensor cores only) `dQ` sums in register fragments, else in `dqs`.
    let regs = comptime![tc && regs];
    let mut dqs =
        SharedMemory::<f32>::new_aligned(comptime![if regs { 1 } else { rows * lq }], ALIGN);
    // The sums leave through the score matrix when it is large enough (free by then).
    let mut scratch = exit_scratch(regs, rows, cols, units);
    let dq_acc = accumulators(rows, comptime![if regs { dp } else { 0 }], units, false);
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

    let (mut kr, mut vr) = streamed(k, v, bh, cols, dp, dvp, units, prefetch);
    for t in 0..seq_k.div_ceil(cols) {
        let key0 = t * cols;
        stream(k, &mut kr, &mut ks, bh, key0, cols, dp, units, prefetch);
        stream(v, &mut vr, &mut vs, bh, key0, cols, dvp, units, prefetch);
        sync_cube();
        product::<F>(&qs, &ks, &mut s, rows, cols, dp, true, false, tc, units);
        product::<F>(&dos, &vs, &mut dpm, rows, cols, dvp, true, false, tc, units);
        sync_cube();
        let mut idx = UNIT_POS as usize;
        while idx < rows * cols {
            let (r, j) = (idx / cols, idx % cols);
            let mut g = 0.0f32;
            if key0 + j < seq_k {
                let p = f32::exp(s[r * ls + j] * scale - lses[r]);
                g = p * (dpm[r * ls + j] - deltas[r]);
            }
            ds[r * lp + j] = F::cast_from(g);
            idx += units;
        }
        sync_cube();
        if comptime![regs] {
            accumulate::<F>(&ds, &ks, &dq_acc, rows, dp, cols, false, units, false);
        } else {
            product::<F>(&ds, &ks, &mut dqs, rows, dp, cols, false, true, tc, units);
        }
        sync_cube();
    }

    if comptime![regs] {
        store_sums(
            dq,
            &dq_acc,
            &mut s,
            &mut scratch,
            bh,
            row0,
            scale,
            rows,
            dp,
            cols,
            units,
            false,
        );
    } else {
        store_rows(dq, &dqs, bh, row0, scale, rows, lq, units);
    }
}

/// Backward, key side: cube `(x, bh)` owns key rows `x·rows ..` and streams query tiles: `dv =
/// Pᵀ·dO` and `dk = scale·dSᵀ·q`, with `Δ` from [`tiled_backward_q`](fn@tiled_backward_q) (launched
/// first on the same stream). Scores are computed transposed (`k·qᵀ`) so every product keeps its
/// left operand row-major.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn tiled_backward_kv<F: Float, N: Size>(
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
    // With `regs` (tensor cores only) `dK` and `dV` sum in register fragments, else in
    // `dks` and `dvs`.
    let regs = comptime![tc && regs];
    let mut dks =
        SharedMemory::<f32>::new_aligned(comptime![if regs { 1 } else { rows * lk }], ALIGN);
    let mut dvs =
        SharedMemory::<f32>::new_aligned(comptime![if regs { 1 } else { rows * lv }], ALIGN);
    // The sums leave through the score matrix when it is large enough (free by then).
    let mut scratch = exit_scratch(regs, rows, cols, units);
    let dk_acc = accumulators(rows, comptime![if regs { dp } else { 0 }], units, false);
    let dv_acc = accumulators(rows, comptime![if regs { dvp } else { 0 }], units, false);
    let mut lses = SharedMemory::<f32>::new_aligned(cols, ALIGN);
    let mut deltas = SharedMemory::<f32>::new_aligned(cols, ALIGN);
    stage_pair(k, v, &mut ks, &mut vs, bh, row0, rows, dp, dvp, units);
    if comptime![!regs] {
        fill(&mut dks, 0.0f32, rows * lk, units);
        fill(&mut dvs, 0.0f32, rows * lv, units);
    }

    let (mut qr, mut dor) = streamed(q, d_out, bh, cols, dp, dvp, units, prefetch);
    for t in 0..seq_q.div_ceil(cols) {
        let q0 = t * cols;
        stream(q, &mut qr, &mut qs, bh, q0, cols, dp, units, prefetch);
        stream(
            d_out, &mut dor, &mut dos, bh, q0, cols, dvp, units, prefetch,
        );
        streamed_stats(lse, delta, &mut lses, &mut deltas, 0, bh, q0, cols);
        sync_cube();
        product::<F>(&ks, &qs, &mut st, rows, cols, dp, true, false, tc, units);
        product::<F>(&vs, &dos, &mut dpt, rows, cols, dvp, true, false, tc, units);
        sync_cube();
        let mut idx = UNIT_POS as usize;
        while idx < rows * cols {
            let (r, j) = (idx / cols, idx % cols);
            let p = f32::exp(st[r * ls + j] * scale - lses[j]);
            pt[r * lp + j] = F::cast_from(p);
            dst[r * lp + j] = F::cast_from(p * (dpt[r * ls + j] - deltas[j]));
            idx += units;
        }
        sync_cube();
        if comptime![regs] {
            accumulate::<F>(&pt, &dos, &dv_acc, rows, dvp, cols, false, units, false);
            accumulate::<F>(&dst, &qs, &dk_acc, rows, dp, cols, false, units, false);
        } else {
            product::<F>(&pt, &dos, &mut dvs, rows, dvp, cols, false, true, tc, units);
            product::<F>(&dst, &qs, &mut dks, rows, dp, cols, false, true, tc, units);
        }
        sync_cube();
    }

    if comptime![regs] {
        let sc = &mut scratch;
        store_sums(
            dk, &dk_acc, &mut st, sc, bh, row0, scale, rows, dp, cols, units, false,
        );
        store_sums(
            dv_out, &dv_acc, &mut st, sc, bh, row0, 1.0, rows, dvp, cols, units, false,
        );
    } else {
        store_rows(dk, &dks, bh, row0, scale, rows, lk, units);
        store_rows(dv_out, &dvs, bh, row0, 1.0f32, rows, lv, units);
    }
}
