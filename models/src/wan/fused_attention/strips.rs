//! The tiled forward with each plane (warp) owning 16 query rows (`w` in a tile spec,
//! `tiles.rs`): FlashAttention-2's split of a cube's rows among its warps (Dao 2023, §3.3).
//!
//! In [`tiled_forward`](fn@super::tiled_kernels::tiled_forward) every product spreads its
//! output tiles over all planes, so each phase of a key tile (scores, softmax, rescale, `P·v`)
//! ends with the whole cube waiting at a barrier: five per key tile. Here plane `p` owns rows
//! `16p .. 16p + 16` of the cube's `rows = 16 × planes`: it computes its strip of the scores,
//! its rows' softmax, rescales and accumulates its strip of the output, in step with itself
//! only; the cube meets twice per key tile, around the staging of the shared `k`/`v` tiles.
//! With tensor-core products the plane also keeps its 16 query rows as `dp / 16` operand
//! fragments in registers for the whole kernel, so the score product loads only `k` from
//! shared memory; with `r` it also keeps its strip of the output as accumulator fragments
//! (`fragments.rs`). With unit products (any device) the same kernel runs with cube barriers in
//! place of the plane's (`sync_strip`), which is what the tests check on lavapipe.

// The `#[cube(launch_unchecked)]` macro generates undocumented launch modules and structs.
#![allow(missing_docs)]

use cubecl::prelude::*;

use super::fragments::{accumulate, accumulators, rescale_accumulators, spill_accumulators};
use super::kernels::{offset, stat_offset, NEG_BIG};
use super::rows::{online_softmax, rescale_rows};
use super::staging::{fill, stage, stream, streamed};
use super::tile_ops::{
    a_fragment, b_fragment, fragment, store_tile, strip_product, sync_strip, ALIGN, PAD_FLOAT,
    PAD_OPERAND, TILE,
};

/// The plane's 16 rows `row0 ..` of `a` (`rows × kd`, padded rows) as `kd / 16` tensor-core
/// operand fragments (tensor-core products only; none otherwise).
#[cube]
pub(super) fn strip_fragments<F: Float>(
    a: &SharedMemory<F>,
    row0: usize,
    #[comptime] kd: usize,
    #[comptime] tc: bool,
) -> Sequence<cmma::Matrix<F>> {
    let mut frags = Sequence::new();
    #[unroll]
    for step in 0..comptime![if tc { kd / TILE } else { 0 }] {
        frags.push(a_fragment::<F>(a, row0, step * TILE, kd));
    }
    frags
}

/// The plane's strip of `c = a·bᵀ`: `c[row0 .. row0 + 16, ..cols]` (float32, overwritten)
/// with `a`'s strip as its operand fragments `af` ([`strip_fragments`], tensor cores) or its
/// rows of `a` (`rows × kd`, units), `b` a `cols × kd` tile.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn strip_scores<F: Float>(
    a: &SharedMemory<F>,
    af: &Sequence<cmma::Matrix<F>>,
    b: &SharedMemory<F>,
    c: &mut SharedMemory<f32>,
    row0: usize,
    #[comptime] cols: usize,
    #[comptime] kd: usize,
    #[comptime] tc: bool,
) {
    if comptime![tc] {
        let lc = comptime![cols + PAD_FLOAT];
        #[unroll]
        for col in 0..comptime![cols / TILE] {
            let acc = fragment::<f32>(
                cmma::MatrixIdent::Accumulator,
                cmma::MatrixLayout::Undefined,
            );
            cmma::fill(&acc, 0.0f32);
            #[unroll]
            for step in 0..comptime![kd / TILE] {
                let bf = b_fragment::<F>(b, step * TILE, col * TILE, cols, kd, true);
                cmma::execute::<F, F, f32, f32>(af.index(step), &bf, &acc, &acc);
            }
            store_tile(c, &acc, row0 * lc + col * TILE, lc);
        }
    } else {
        strip_product::<F>(a, b, c, row0, cols, kd, true, false, false);
    }
}

/// Forward with plane-owned query strips: the same results as
/// [`tiled_forward`](fn@super::tiled_kernels::tiled_forward) (`out = softmax(scale·q·kᵀ)·v`
/// and `lse [B, H, Sq]`), for `rows = 16 × units / 32`. Cube `(x, bh)` owns query rows
/// `x·rows ..`; key tiles of `cols` rows stream by.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn tiled_forward_strips<F: Float, N: Size>(
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
    // The plane's strip of the cube's rows, and its unit in the plane.
    let strip = UNIT_POS_Y as usize * TILE;
    let lane = UNIT_POS_X as usize;

    let (lp, lo) = comptime![(cols + PAD_OPERAND, dvp + PAD_FLOAT)];
    let mut qs = SharedMemory::<F>::new_aligned(rows * (dp + PAD_OPERAND), ALIGN);
    let mut ks = SharedMemory::<F>::new_aligned(cols * (dp + PAD_OPERAND), ALIGN);
    let mut vs = SharedMemory::<F>::new_aligned(cols * (dvp + PAD_OPERAND), ALIGN);
    let mut s = SharedMemory::<f32>::new_aligned(rows * (cols + PAD_FLOAT), ALIGN);
    let mut p = SharedMemory::<F>::new_aligned(rows * lp, ALIGN);
    let mut o = SharedMemory::<f32>::new_aligned(rows * lo, ALIGN);
    let mut m = SharedMemory::<f32>::new_aligned(rows, ALIGN);
    let mut l = SharedMemory::<f32>::new_aligned(rows, ALIGN);
    let mut corr = SharedMemory::<f32>::new_aligned(rows, ALIGN);
    let mut red = SharedMemory::<f32>::new_aligned(units, ALIGN);
    // With `regs` (tensor cores only) the plane's strip of the output sums in register
    // fragments and `o` serves only their rescaling and their way out.
    let regs = comptime![tc && regs];
    let o_acc = accumulators(rows, comptime![if regs { dvp } else { 0 }], units, true);
    stage(q, &mut qs, bh, row0, rows, dp, units);
    if comptime![!regs] {
        // (With `regs` every tile of `o` is stored before it is read.)
        fill(&mut o, 0.0f32, rows * lo, units);
    }
    fill(&mut m, f32::new(NEG_BIG), rows, units);
    fill(&mut l, 0.0f32, rows, units);
    sync_cube();
    let qf = strip_fragments::<F>(&qs, strip, dp, tc);
    let (mut kr, mut vr) = streamed(k, v, bh, cols, dp, dvp, units, prefetch);

    for t in 0..seq_k.div_ceil(cols) {
        let key0 = t * cols;
        stream(k, &mut kr, &mut ks, bh, key0, cols, dp, units, prefetch);
        stream(v, &mut vr, &mut vs, bh, key0, cols, dvp, units, prefetch);
        sync_cube();
        strip_scores::<F>(&qs, &qf, &ks, &mut s, strip, cols, dp, tc);
        sync_strip(tc);
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
            true,
            tc,
        );
        sync_strip(tc);
        if comptime![regs] {
            rescale_accumulators(&o_acc, &mut o, &corr, rows, dvp, units, true);
            accumulate::<F>(&p, &vs, &o_acc, rows, dvp, cols, false, units, true);
        } else {
            rescale_rows(&mut o, &corr, strip, TILE, lo, lane, 32usize);
            sync_strip(tc);
            strip_product::<F>(&p, &vs, &mut o, strip, dvp, cols, false, true, tc);
        }
        // Every plane is done with this `k`/`v` tile before the next one is staged.
        sync_cube();
    }
    if comptime![regs] {
        spill_accumulators(&o_acc, &mut o, rows, dvp, units, true);
        sync_strip(tc);
    }

    let mut idx = lane;
    while idx < TILE * dv {
        let r = strip + idx / dv;
        let c = idx % dv;
        if row0 + r < seq_q {
            out[offset(out, bh, heads, row0 + r, c)] = F::cast_from(o[r * lo + c] / l[r]);
        }
        idx += 32;
    }
    let r = strip + lane;
    if lane < TILE && row0 + r < seq_q {
        lse[stat_offset(lse, bh, heads, row0 + r)] = m[r] + f32::ln(l[r]);
    }
}
