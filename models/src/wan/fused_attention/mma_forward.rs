//! The tiled forward on NVIDIA's warp-level `mma` instruction with register operands (`m` in
//! a tile spec, `tiles.rs`): FlashAttention-2's forward (Dao 2023, Algorithm 1 and §3.3) with
//! the scores, the probabilities and the output in registers for the whole key loop.
//!
//! The cooperative-matrix kernels ([`super::strips`]) keep their fragments opaque, so every
//! row-wise step (the softmax, the rescale) goes through shared memory, and NVRTC loads each
//! `wmma` fragment with generic (not shared-memory) loads. Here each plane (warp) owns 16
//! query rows and does everything for them in registers, with CubeCL's manual MMA
//! (`cmma::MmaDefinition`, the PTX shape `m16n8k16`):
//!
//! - the plane's 16 query rows are loaded once as `dp / 16` A operands (`ldmatrix.x4`);
//! - per key tile of `cols` keys, the scores `q·kᵀ` are `cols / 8` accumulators of 16×8, with
//!   `k`'s operands read by `ldmatrix` (two 8-key blocks per instruction);
//! - each lane holds two rows of the strip (`g = lane / 4` and `g + 8`) and two adjacent
//!   columns per 8-key block, so a row's maximum and sum combine over the 4 lanes of a quad
//!   (`plane_shuffle_xor` by 1 and 2) and the rescale of the output is a multiply per register;
//! - an accumulator pair of two 8-key blocks is, element for element, the A operand of the
//!   16-key step of `P·v` (the accumulator and A layouts of `m16n8k16` agree), so the
//!   probabilities go from the scores to the product without leaving the lane;
//! - `v`'s operands are read by `ldmatrix.trans` (`v` is key-major, the B operand key-minor).
//!
//! Shared memory holds only the staged `q`, `k` and `v` tiles (51 KiB for 64 rows and 64 keys
//! at head dim 128 in bf16, against 111 KiB for the cooperative-matrix forward), so
//! more cubes fit a multiprocessor. The cube meets twice per key tile, around the staging;
//! with asynchronous copies (`cp.async`, `p` in the spec) into a second buffer of each tile
//! (85 KiB at those shapes), once, at the barrier that both says the tile has landed and
//! frees the other buffer for the next tile's copies, which then run during the products.
//!
//! CUDA only (manual MMA exists on no other CubeCL target); elsewhere the launcher runs the
//! strips kernel instead. The products and the lane layouts are in `mma.rs`.

// The `#[cube(launch_unchecked)]` macro generates undocumented launch modules and structs.
#![allow(missing_docs)]

use cubecl::prelude::*;

use super::kernels::{stat_offset, NEG_BIG};
use super::mma::{
    accumulate, product_bt, quad_reduce, store_strip, strip_operands, zeroed, Pair, Regs,
};
use super::rows::STALE_MAX;
use super::staging::{stage, stage_pair, tile_barrier, turn};
use super::tile_ops::{ALIGN, PAD_OPERAND, TILE};

/// Forward with manual MMA: the same results as
/// [`tiled_forward_strips`](fn@super::strips::tiled_forward_strips) (`out =
/// softmax(scale·q·kᵀ)·v` and `lse [B, H, Sq]`), for `rows = 16 × units / 32` and `cols` a
/// multiple of 16; `tc` and `regs` are taken for the launcher's sake and mean nothing here
/// (everything is in registers on tensor cores). With `copy_async` (`p` with `m` in a tile
/// spec, 16-byte vectors), the key and value tiles are copied asynchronously into two
/// buffers, the next tile's copies in flight while this one is used; without, each is staged
/// through the units' registers when its turn comes.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn tiled_forward_mma<F: Float, N: Size>(
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
    #[comptime] _tc: bool,
    #[comptime] _regs: bool,
    #[comptime] copy_async: bool,
    #[define(F)] _dtype: StorageType,
) {
    let bh = CUBE_POS_Y as usize;
    let heads = q.shape(1);
    let seq_q = q.shape(2);
    let seq_k = k.shape(2);
    let row0 = CUBE_POS_X as usize * rows;
    let strip = UNIT_POS_Y as usize * TILE;
    let lane = UNIT_POS_X as usize;
    let (g, t) = (lane / 4, lane % 4);

    let (lq, lv) = comptime![(dp + PAD_OPERAND, dvp + PAD_OPERAND)];
    // Asynchronous copies fill one buffer of each streamed tile while the other is used.
    let buffers = comptime![if copy_async { 2usize } else { 1usize }];
    let mut qs = SharedMemory::<F>::new_aligned(rows * lq, ALIGN);
    let mut ks = SharedMemory::<F>::new_aligned(buffers * cols * lq, ALIGN);
    let mut vs = SharedMemory::<F>::new_aligned(buffers * cols * lv, ALIGN);
    // The strip's output (`dvp / 8` blocks), running maxima and this lane's share of the
    // running sums, for rows `g` and `g + 8`.
    let mut o = zeroed(comptime![dvp / 8]);
    let mut m = Pair::<f32>::empty().fill(f32::new(NEG_BIG));
    let mut l = Pair::<f32>::empty().fill(0.0f32);
    let tiles = seq_k.div_ceil(cols);
    stage(q, &mut qs, bh, row0, rows, dp, units);
    sync_cube();
    let qf = strip_operands::<F>(&qs, strip, lane, dp, lq);

    if comptime![copy_async] {
        let even = tile_barrier();
        let odd = tile_barrier();
        for tile in 0..tiles {
            let base = turn(
                k, v, &mut ks, &mut vs, &even, &odd, tile, tiles, bh, cols, dp, dvp, units,
            );
            let valid = seq_k - tile * cols;
            key_tile::<F>(
                &qf, &ks, &vs, base, &mut o, &mut m, &mut l, scale, valid, lane, cols, dp, dvp,
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
            key_tile::<F>(
                &qf, &ks, &vs, 0, &mut o, &mut m, &mut l, scale, valid, lane, cols, dp, dvp,
            );
            // Every plane is done with this `k`/`v` tile before the next one is staged.
            sync_cube();
        }
    }

    // Rows `g` and `g + 8`: the quad's sums divide the output.
    let mut inv = Pair::<f32>::empty();
    #[unroll]
    for h in 0..2usize {
        let sum = quad_reduce(l[h], false);
        inv[h] = 1.0f32 / sum;
        let r = row0 + strip + g + h * 8;
        if t == 0 && r < seq_q {
            lse[stat_offset(lse, bh, heads, r)] = m[h] + f32::ln(sum);
        }
    }
    store_strip::<F>(out, &o, inv, bh, row0 + strip, lane, comptime![dvp / 8]);
}

/// One key tile of the forward for the plane's strip: the scores `q·kᵀ` of the tile in rows
/// `base ..` of `ks` (`qf` the strip's operands), their online softmax ([`softmax_tile`]; keys
/// from `valid` on get none), the output rescaled and `P·v` (rows `base ..` of `vs`) added.
#[cube]
#[allow(clippy::too_many_arguments)]
fn key_tile<F: Float>(
    qf: &Sequence<Regs<F>>,
    ks: &SharedMemory<F>,
    vs: &SharedMemory<F>,
    base: usize,
    o: &mut Sequence<Regs<f32>>,
    m: &mut Pair<f32>,
    l: &mut Pair<f32>,
    scale: f32,
    valid: usize,
    lane: usize,
    #[comptime] cols: usize,
    #[comptime] dp: usize,
    #[comptime] dvp: usize,
) {
    let (lq, lv) = comptime![(dp + PAD_OPERAND, dvp + PAD_OPERAND)];
    let mut s = zeroed(comptime![cols / 8]);
    product_bt::<F>(qf, ks, base, &mut s, lane, cols, dp, lq);
    let corr = softmax_tile(&mut s, m, l, scale, valid, lane % 4, cols);
    #[unroll]
    for j in 0..comptime![dvp / 8] {
        let acc = o.index_mut(j);
        #[unroll]
        for h in 0..2usize {
            acc[h] = acc[h] * Pair::<f32>::empty().fill(corr[h]);
        }
    }
    accumulate::<F>(&s, vs, base, o, lane, cols, dvp, lv);
}

/// One key tile of the online softmax on the lane's registers: scales the scores `s` in place
/// into probabilities (keys past `valid` get none) against the running maxima `m` of rows
/// `g`, `g + 8`, adds them to the lane's running sums `l`, and returns each row's factor for
/// the output so far: exactly 1 while the row keeps its maximum, which it does until a tile's
/// scores exceed it by more than [`STALE_MAX`] (as in `rows.rs`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn softmax_tile(
    s: &mut Sequence<Regs<f32>>,
    m: &mut Pair<f32>,
    l: &mut Pair<f32>,
    scale: f32,
    valid: usize,
    t: usize,
    #[comptime] cols: usize,
) -> Pair<f32> {
    let mut corr = Pair::<f32>::empty().fill(1.0f32);
    #[unroll]
    for h in 0..2usize {
        let mut mx = m[h];
        #[unroll]
        for j in 0..comptime![cols / 8] {
            let acc = s.index_mut(j);
            let mut pair = acc[h];
            #[unroll]
            for e in 0..2usize {
                pair[e] = select(
                    j * 8 + 2 * t + e < valid,
                    pair[e] * scale,
                    f32::new(NEG_BIG),
                );
                mx = f32::max(mx, pair[e]);
            }
            acc[h] = pair;
        }
        mx = quad_reduce(mx, true);
        // The quad's lanes read the same maxima, so they agree on keeping the old one.
        let old = m[h];
        if mx <= old + STALE_MAX {
            mx = old;
        }
        corr[h] = f32::exp(old - mx);
        m[h] = mx;
        let mut sum = 0.0f32;
        #[unroll]
        for j in 0..comptime![cols / 8] {
            let acc = s.index_mut(j);
            let mut pair = acc[h];
            #[unroll]
            for e in 0..2usize {
                pair[e] = f32::exp(pair[e] - mx);
                sum += pair[e];
            }
            acc[h] = pair;
        }
        l[h] = l[h] * corr[h] + sum;
    }
    corr
}
