//! The tiled backward on NVIDIA's warp-level `mma` instruction (`m` in a tile spec,
//! `tiles.rs`): the same two passes as [`super::strips_backward`] (FlashAttention-2's
//! backward, Dao 2023, Algorithm 2, with `dQ` in its own pass instead of atomics), with each
//! plane's scores, score gradients and sums in registers (`mma.rs`).
//!
//! Per streamed tile a plane computes its strip of the scores and of `dO·vᵀ` (or their
//! transposes on the key side) as accumulators, turns them into `dS = P∘(dP − Δ)` (and `P`)
//! on its registers, and feeds those straight into the accumulating products as their left
//! operands. Shared memory holds only the staged tiles and the streamed rows' statistics, so
//! at head dim 128 in bf16 a 64-row cube with 32-row tiles takes 51 KiB where the strips
//! kernels take 110 to 190. The left operands of the score products are read from shared
//! memory by `ldmatrix` for each tile (a plane's own rows, 16 KiB per tile at head dim 128),
//! which leaves the registers to the scores and the sums. With `copy_async` (`p` in the spec)
//! the streamed tiles are copied asynchronously (`cp.async`) into two buffers, as in the
//! forward ([`super::mma_forward`]). CUDA only; elsewhere the launcher runs the strips
//! kernels.

// The `#[cube(launch_unchecked)]` macro generates undocumented launch modules and structs.
#![allow(missing_docs)]

use cubecl::prelude::*;

use super::mma::{accumulate, store_strip, strip_product_bt, zeroed, Pair, Regs};
use super::rows::{query_stats, streamed_stats};
use super::staging::{stage_pair, tile_barrier, turn};
use super::tile_ops::{ALIGN, PAD_OPERAND, TILE};

/// Backward, query side: `delta` (`Δ` per query row) and `dq = scale·dS·k`,
/// `dS = P∘(dO·vᵀ − Δ)`, for `rows = 16 × units / 32`; the arguments of
/// [`tiled_backward_q_strips`](fn@super::strips_backward::tiled_backward_q_strips) (`tc` and
/// `regs` mean nothing here; `copy_async`: the key and value tiles copied asynchronously into
/// two buffers, as in [`tiled_forward_mma`](fn@super::mma_forward::tiled_forward_mma)).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn tiled_backward_q_mma<F: Float, N: Size>(
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
    #[comptime] _tc: bool,
    #[comptime] _regs: bool,
    #[comptime] copy_async: bool,
    #[define(F)] _dtype: StorageType,
) {
    let bh = CUBE_POS_Y as usize;
    let seq_k = k.shape(2);
    let row0 = CUBE_POS_X as usize * rows;
    let strip = UNIT_POS_Y as usize * TILE;
    let lane = UNIT_POS_X as usize;
    let g = lane / 4;

    let (lq, lv) = comptime![(dp + PAD_OPERAND, dvp + PAD_OPERAND)];
    // Asynchronous copies fill one buffer of each streamed tile while the other is used.
    let buffers = comptime![if copy_async { 2usize } else { 1usize }];
    let mut qs = SharedMemory::<F>::new_aligned(rows * lq, ALIGN);
    let mut dos = SharedMemory::<F>::new_aligned(rows * lv, ALIGN);
    let mut ks = SharedMemory::<F>::new_aligned(buffers * cols * lq, ALIGN);
    let mut vs = SharedMemory::<F>::new_aligned(buffers * cols * lv, ALIGN);
    let mut lses = SharedMemory::<f32>::new_aligned(rows, ALIGN);
    let mut deltas = SharedMemory::<f32>::new_aligned(rows, ALIGN);
    stage_pair(q, d_out, &mut qs, &mut dos, bh, row0, rows, dp, dvp, units);
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
    // The lane's rows' statistics, rows `g` and `g + 8` of the strip.
    let mut row_lse = Pair::<f32>::empty();
    let mut row_delta = Pair::<f32>::empty();
    #[unroll]
    for h in 0..2usize {
        row_lse[h] = lses[strip + g + h * 8];
        row_delta[h] = deltas[strip + g + h * 8];
    }
    let mut dq_acc = zeroed(comptime![dp / 8]);
    let tiles = seq_k.div_ceil(cols);

    if comptime![copy_async] {
        let even = tile_barrier();
        let odd = tile_barrier();
        for tile in 0..tiles {
            let base = turn(
                k, v, &mut ks, &mut vs, &even, &odd, tile, tiles, bh, cols, dp, dvp, units,
            );
            let valid = seq_k - tile * cols;
            query_tile::<F>(
                &qs,
                &dos,
                &ks,
                &vs,
                base,
                &mut dq_acc,
                row_lse,
                row_delta,
                scale,
                valid,
                strip,
                lane,
                cols,
                dp,
                dvp,
            );
        }
    } else {
        for tile in 0..tiles {
            stage_pair(
                k,
                v,
                &mut ks,
                &mut vs,
                bh,
                tile * cols,
                cols,
                dp,
                dvp,
                units,
            );
            sync_cube();
            let valid = seq_k - tile * cols;
            query_tile::<F>(
                &qs,
                &dos,
                &ks,
                &vs,
                0,
                &mut dq_acc,
                row_lse,
                row_delta,
                scale,
                valid,
                strip,
                lane,
                cols,
                dp,
                dvp,
            );
            // Every plane is done with this `k`/`v` tile before the next one is staged.
            sync_cube();
        }
    }
    let factor = Pair::<f32>::empty().fill(scale);
    store_strip::<F>(
        dq,
        &dq_acc,
        factor,
        bh,
        row0 + strip,
        lane,
        comptime![dp / 8],
    );
}

/// One key tile of the query side for the plane's strip (rows `strip ..` of `qs`, `dos`):
/// `S` and `dP = dO·vᵀ` against the tile in rows `base ..` of `ks` and `vs`,
/// `dS = P∘(dP − Δ)` on the lane's registers (keys from `valid` on get none), and
/// `dq_acc += dS·k`. `row_lse`, `row_delta`: the lane's rows' statistics (`g`, `g + 8`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn query_tile<F: Float>(
    qs: &SharedMemory<F>,
    dos: &SharedMemory<F>,
    ks: &SharedMemory<F>,
    vs: &SharedMemory<F>,
    base: usize,
    dq_acc: &mut Sequence<Regs<f32>>,
    row_lse: Pair<f32>,
    row_delta: Pair<f32>,
    scale: f32,
    valid: usize,
    strip: usize,
    lane: usize,
    #[comptime] cols: usize,
    #[comptime] dp: usize,
    #[comptime] dvp: usize,
) {
    let (lq, lv) = comptime![(dp + PAD_OPERAND, dvp + PAD_OPERAND)];
    let t = lane % 4;
    let mut s = zeroed(comptime![cols / 8]);
    let mut dpm = zeroed(comptime![cols / 8]);
    strip_product_bt::<F>(qs, strip, ks, base, &mut s, lane, cols, dp, lq);
    strip_product_bt::<F>(dos, strip, vs, base, &mut dpm, lane, cols, dvp, lv);
    // `dS` into `s`.
    #[unroll]
    for j in 0..comptime![cols / 8] {
        let sj = s.index_mut(j);
        let dj = dpm.index(j);
        #[unroll]
        for h in 0..2usize {
            let mut pair = sj[h];
            #[unroll]
            for e in 0..2usize {
                let p = f32::exp(pair[e] * scale - row_lse[h]);
                let inside = j * 8 + 2 * t + e < valid;
                pair[e] = select(inside, p * (dj[h][e] - row_delta[h]), 0.0f32);
            }
            sj[h] = pair;
        }
    }
    accumulate::<F>(&s, ks, base, dq_acc, lane, cols, dp, lq);
}

/// Backward, key side: cube `(x, bh)` owns key rows `x·rows ..` (`rows = 16 × units / 32`)
/// and streams query tiles: `dv = Pᵀ·dO`, `dk = scale·dSᵀ·q`, with `Δ` from the query side
/// (launched first on the same stream); the arguments of
/// [`tiled_backward_kv_strips`](fn@super::strips_backward::tiled_backward_kv_strips)
/// (`copy_async`: the query and output-gradient tiles copied asynchronously into two buffers,
/// their statistics double-buffered beside them).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn tiled_backward_kv_mma<F: Float, N: Size>(
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
    #[comptime] _tc: bool,
    #[comptime] _regs: bool,
    #[comptime] copy_async: bool,
    #[define(F)] _dtype: StorageType,
) {
    let bh = CUBE_POS_Y as usize;
    let seq_q = q.shape(2);
    let row0 = CUBE_POS_X as usize * rows;
    let strip = UNIT_POS_Y as usize * TILE;
    let lane = UNIT_POS_X as usize;

    let (lq, lv) = comptime![(dp + PAD_OPERAND, dvp + PAD_OPERAND)];
    // Asynchronous copies fill one buffer of each streamed tile while the other is used.
    let buffers = comptime![if copy_async { 2usize } else { 1usize }];
    let mut ks = SharedMemory::<F>::new_aligned(rows * lq, ALIGN);
    let mut vs = SharedMemory::<F>::new_aligned(rows * lv, ALIGN);
    let mut qs = SharedMemory::<F>::new_aligned(buffers * cols * lq, ALIGN);
    let mut dos = SharedMemory::<F>::new_aligned(buffers * cols * lv, ALIGN);
    let mut lses = SharedMemory::<f32>::new_aligned(buffers * cols, ALIGN);
    let mut deltas = SharedMemory::<f32>::new_aligned(buffers * cols, ALIGN);
    stage_pair(k, v, &mut ks, &mut vs, bh, row0, rows, dp, dvp, units);
    let mut dk_acc = zeroed(comptime![dp / 8]);
    let mut dv_acc = zeroed(comptime![dvp / 8]);
    let tiles = seq_q.div_ceil(cols);

    if comptime![copy_async] {
        let even = tile_barrier();
        let odd = tile_barrier();
        // The first tile's statistics (its rows' copies are issued by its `turn`).
        streamed_stats(lse, delta, &mut lses, &mut deltas, 0, bh, 0, cols);
        for tile in 0..tiles {
            // The barrier also publishes the staged key rows and the statistics' stores.
            let base = turn(
                q, d_out, &mut qs, &mut dos, &even, &odd, tile, tiles, bh, cols, dp, dvp, units,
            );
            if tile + 1 < tiles {
                let (next, q0) = (cols - base, (tile + 1) * cols);
                streamed_stats(lse, delta, &mut lses, &mut deltas, next, bh, q0, cols);
            }
            key_tile::<F>(
                &ks,
                &vs,
                &qs,
                &dos,
                &lses,
                &deltas,
                base,
                &mut dk_acc,
                &mut dv_acc,
                scale,
                strip,
                lane,
                cols,
                dp,
                dvp,
            );
        }
    } else {
        for tile in 0..tiles {
            let q0 = tile * cols;
            stage_pair(q, d_out, &mut qs, &mut dos, bh, q0, cols, dp, dvp, units);
            streamed_stats(lse, delta, &mut lses, &mut deltas, 0, bh, q0, cols);
            sync_cube();
            key_tile::<F>(
                &ks,
                &vs,
                &qs,
                &dos,
                &lses,
                &deltas,
                0,
                &mut dk_acc,
                &mut dv_acc,
                scale,
                strip,
                lane,
                cols,
                dp,
                dvp,
            );
            // Every plane is done with this query tile before the next one is staged.
            sync_cube();
        }
    }
    let row = row0 + strip;
    let scaled = Pair::<f32>::empty().fill(scale);
    store_strip::<F>(dk, &dk_acc, scaled, bh, row, lane, comptime![dp / 8]);
    let one = Pair::<f32>::empty().fill(1.0f32);
    store_strip::<F>(dv_out, &dv_acc, one, bh, row, lane, comptime![dvp / 8]);
}

/// One query tile of the key side for the plane's strip (rows `strip ..` of `ks`, `vs`):
/// `Sᵀ = k·qᵀ` and `dPᵀ = v·dOᵀ` against the tile in rows `base ..` of `qs`, `dos` (its
/// statistics from `base` in `lses`, `deltas`), then `dv_acc += Pᵀ·dO`, `dk_acc += dSᵀ·q`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn key_tile<F: Float>(
    ks: &SharedMemory<F>,
    vs: &SharedMemory<F>,
    qs: &SharedMemory<F>,
    dos: &SharedMemory<F>,
    lses: &SharedMemory<f32>,
    deltas: &SharedMemory<f32>,
    base: usize,
    dk_acc: &mut Sequence<Regs<f32>>,
    dv_acc: &mut Sequence<Regs<f32>>,
    scale: f32,
    strip: usize,
    lane: usize,
    #[comptime] cols: usize,
    #[comptime] dp: usize,
    #[comptime] dvp: usize,
) {
    let (lq, lv) = comptime![(dp + PAD_OPERAND, dvp + PAD_OPERAND)];
    let mut st = zeroed(comptime![cols / 8]);
    let mut dpt = zeroed(comptime![cols / 8]);
    strip_product_bt::<F>(ks, strip, qs, base, &mut st, lane, cols, dp, lq);
    strip_product_bt::<F>(vs, strip, dos, base, &mut dpt, lane, cols, dvp, lv);
    transposed_grads(&mut st, &mut dpt, lses, deltas, base, scale, lane, cols);
    accumulate::<F>(&st, dos, base, dv_acc, lane, cols, dvp, lv);
    accumulate::<F>(&dpt, qs, base, dk_acc, lane, cols, dp, lq);
}

/// The key side's `Pᵀ` (into `st`, from the scores `Sᵀ`) and `dSᵀ = Pᵀ∘(dPᵀ − Δ)` (into
/// `dpt`) on the lane's registers, with the streamed queries' log-sum-exp `lses` and `Δ`
/// `deltas` from `base` (queries past the sequence's end have probabilities 0).
#[cube]
#[allow(clippy::too_many_arguments)]
fn transposed_grads(
    st: &mut Sequence<Regs<f32>>,
    dpt: &mut Sequence<Regs<f32>>,
    lses: &SharedMemory<f32>,
    deltas: &SharedMemory<f32>,
    base: usize,
    scale: f32,
    lane: usize,
    #[comptime] cols: usize,
) {
    let t = lane % 4;
    #[unroll]
    for j in 0..comptime![cols / 8] {
        let sj = st.index_mut(j);
        let dj = dpt.index_mut(j);
        #[unroll]
        for e in 0..2usize {
            let col = j * 8 + 2 * t + e;
            let (q_lse, q_delta) = (lses[base + col], deltas[base + col]);
            #[unroll]
            for h in 0..2usize {
                let mut p = sj[h];
                let mut ds = dj[h];
                p[e] = f32::exp(p[e] * scale - q_lse);
                ds[e] = p[e] * (ds[e] - q_delta);
                sj[h] = p;
                dj[h] = ds;
            }
        }
    }
}
