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
//! Shared memory holds only the staged `q`, `k` and `v` tiles (`34 + 34` KiB for 64 rows and
//! 64 keys at head dim 128 in bf16, against 111 KiB for the cooperative-matrix forward), so
//! more cubes fit a multiprocessor. The cube meets twice per key tile, around the staging.
//!
//! CUDA only (manual MMA exists on no other CubeCL target); elsewhere the launcher runs the
//! strips kernel instead. The lane layouts below are those of PTX's `mma.m16n8k16` (A and
//! accumulator: lane `4g + t` holds rows `g`, `g + 8` and columns `2t`, `2t + 1` of each
//! 8-column half; B: columns `g`, rows `2t`, `2t + 1` and `2t + 8`, `2t + 9`).

// The `#[cube(launch_unchecked)]` macro generates undocumented launch modules and structs.
#![allow(missing_docs)]

use cubecl::cmma::MmaDefinition;
use cubecl::ir::MatrixIdent;
use cubecl::prelude::*;

use super::kernels::{offset, stat_offset, NEG_BIG};
use super::rows::STALE_MAX;
use super::staging::{stage, stream, streamed};
use super::tile_ops::{ALIGN, PAD_OPERAND, TILE};

/// Two adjacent elements of one lane: one 32-bit register of an operand (16-bit `F`) or half
/// of a 16×8 accumulator's four float32 values.
type Pair<E> = Vector<E, Const<2>>;
/// One lane's registers of an `m16n8k16` operand or accumulator.
type Regs<E> = Array<Pair<E>>;

/// The 16×8×16 product with bf16/f16 operands and float32 accumulators.
#[cube]
fn mma_shape<F: Float>() -> MmaDefinition<F, F, f32> {
    MmaDefinition::<F, F, f32>::new(TILE, 8usize, TILE)
}

/// The A operand of rows `r0 .. r0 + 16`, columns `c0 .. c0 + 16` of `a` (row-major, `ld`
/// elements per row): `ldmatrix.x4`, lane `l` naming row `r0 + l % 16` at column
/// `c0 + 8 (l / 16)` (the four 8×8 blocks in the A register order).
#[cube]
fn load_a<F: Float>(
    a: &SharedMemory<F>,
    r0: usize,
    c0: usize,
    lane: usize,
    #[comptime] ld: usize,
) -> Regs<F> {
    let at = (r0 + lane % 16) * ld + c0 + (lane / 16) * 8;
    mma_shape::<F>().load_matrix::<F, Const<2>>(&a.slice(at, at + 8), MatrixIdent::A, 4usize, false)
}

/// The B operands of two 8-column blocks `n0 .. n0 + 16` for the 16-deep step `k0 ..` of
/// `bᵀ`, with `b` stored `n`-major (`b[n][k]`, as `k` is for `q·kᵀ`): `ldmatrix.x4`, lane `l`
/// naming row `n0 + 8 (l / 16) + l % 8` at column `k0 + 8 (l / 8 % 2)`. Registers 0–1 are
/// the first block's operand, 2–3 the second's.
#[cube]
fn load_b_rows<F: Float>(
    b: &SharedMemory<F>,
    n0: usize,
    k0: usize,
    lane: usize,
    #[comptime] ld: usize,
) -> Regs<F> {
    let at = (n0 + (lane / 16) * 8 + lane % 8) * ld + k0 + (lane / 8 % 2) * 8;
    mma_shape::<F>().load_matrix::<F, Const<2>>(&b.slice(at, at + 8), MatrixIdent::B, 4usize, false)
}

/// The B operands of two 8-column blocks `n0 .. n0 + 16` for the 16-deep step `k0 ..` of
/// `b` stored `k`-major (`b[k][n]`, as `v` is for `P·v`): `ldmatrix.x4.trans`, lane `l`
/// naming row `k0 + 8 (l / 8 % 2) + l % 8` at column `n0 + 8 (l / 16)`.
#[cube]
fn load_b_cols<F: Float>(
    b: &SharedMemory<F>,
    k0: usize,
    n0: usize,
    lane: usize,
    #[comptime] ld: usize,
) -> Regs<F> {
    let at = (k0 + (lane / 8 % 2) * 8 + lane % 8) * ld + n0 + (lane / 16) * 8;
    mma_shape::<F>().load_matrix::<F, Const<2>>(&b.slice(at, at + 8), MatrixIdent::B, 4usize, true)
}

/// `count` zeroed 16×8 accumulators (two pairs each: row `g`, row `g + 8`).
#[cube]
fn zeroed(#[comptime] count: usize) -> Sequence<Regs<f32>> {
    let mut accs = Sequence::new();
    #[unroll]
    for _ in 0..count {
        let mut acc = Regs::<f32>::new(2usize);
        acc[0] = Pair::<f32>::empty().fill(0.0f32);
        acc[1] = Pair::<f32>::empty().fill(0.0f32);
        accs.push(acc);
    }
    accs
}

/// `acc += a·b` for one 16×8 block, with `b`'s operand in registers `i, i + 1` of `b2` (a
/// pair of blocks from [`load_b_rows`] / [`load_b_cols`]).
#[cube]
fn mma_half<F: Float>(a: &Regs<F>, b2: &Regs<F>, acc: &mut Regs<f32>, #[comptime] i: usize) {
    let mut b = Regs::<F>::new(2usize);
    b[0] = b2[i];
    b[1] = b2[i + 1];
    mma_shape::<F>().execute_inplace(a, &b, acc);
}

/// The maximum (`max`) or sum of `x` over the 4 lanes of a quad (the lanes of one row).
#[cube]
fn quad_reduce(x: f32, #[comptime] max: bool) -> f32 {
    let mut r = x;
    #[unroll]
    for i in 0..2u32 {
        let other = plane_shuffle_xor(r, i + 1);
        if comptime![max] {
            r = f32::max(r, other);
        } else {
            r += other;
        }
    }
    r
}

/// Forward with manual MMA: the same results as
/// [`tiled_forward_strips`](fn@super::strips::tiled_forward_strips) (`out =
/// softmax(scale·q·kᵀ)·v` and `lse [B, H, Sq]`), for `rows = 16 × units / 32` and `cols` a
/// multiple of 16; `tc` and `regs` are taken for the launcher's sake and mean nothing here
/// (everything is in registers on tensor cores).
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
    #[comptime] prefetch: bool,
    #[define(F)] _dtype: StorageType,
) {
    let bh = CUBE_POS_Y as usize;
    let heads = q.shape(1);
    let seq_q = q.shape(2);
    let seq_k = k.shape(2);
    let dv = v.shape(3);
    let row0 = CUBE_POS_X as usize * rows;
    let strip = UNIT_POS_Y as usize * TILE;
    let lane = UNIT_POS_X as usize;
    let (g, t) = (lane / 4, lane % 4);

    let (lq, lv) = comptime![(dp + PAD_OPERAND, dvp + PAD_OPERAND)];
    let mut qs = SharedMemory::<F>::new_aligned(rows * lq, ALIGN);
    let mut ks = SharedMemory::<F>::new_aligned(cols * lq, ALIGN);
    let mut vs = SharedMemory::<F>::new_aligned(cols * lv, ALIGN);
    stage(q, &mut qs, bh, row0, rows, dp, units);
    sync_cube();
    let mut qf = Sequence::<Regs<F>>::new();
    #[unroll]
    for step in 0..comptime![dp / TILE] {
        qf.push(load_a::<F>(&qs, strip, step * TILE, lane, lq));
    }
    // The strip's output (`dvp / 8` blocks), running maxima and this lane's share of the
    // running sums, for rows `g` and `g + 8`.
    let mut o = zeroed(comptime![dvp / 8]);
    let mut m = Pair::<f32>::empty().fill(f32::new(NEG_BIG));
    let mut l = Pair::<f32>::empty().fill(0.0f32);
    let (mut kr, mut vr) = streamed(k, v, bh, cols, dp, dvp, units, prefetch);

    for tile in 0..seq_k.div_ceil(cols) {
        let key0 = tile * cols;
        stream(k, &mut kr, &mut ks, bh, key0, cols, dp, units, prefetch);
        stream(v, &mut vr, &mut vs, bh, key0, cols, dvp, units, prefetch);
        sync_cube();
        let mut s = zeroed(comptime![cols / 8]);
        scores::<F>(&qf, &ks, &mut s, lane, cols, dp, lq);
        let corr = softmax_tile(&mut s, &mut m, &mut l, scale, seq_k - key0, t, cols);
        #[unroll]
        for j in 0..comptime![dvp / 8] {
            let acc = o.index_mut(j);
            #[unroll]
            for h in 0..2usize {
                acc[h] = acc[h] * Pair::<f32>::empty().fill(corr[h]);
            }
        }
        accumulate_pv::<F>(&s, &vs, &mut o, lane, cols, dvp, lv);
        // Every plane is done with this `k`/`v` tile before the next one is staged.
        sync_cube();
    }

    // Rows `g` and `g + 8`: the quad's sums, then each lane's two columns per block.
    #[unroll]
    for h in 0..2usize {
        let r = row0 + strip + g + h * 8;
        let sum = quad_reduce(l[h], false);
        if r < seq_q {
            #[unroll]
            for j in 0..comptime![dvp / 8] {
                let pair = o.index(j)[h];
                #[unroll]
                for e in 0..2usize {
                    let c = j * 8 + 2 * t + e;
                    if c < dv {
                        out[offset(out, bh, heads, r, c)] = F::cast_from(pair[e] / sum);
                    }
                }
            }
            if t == 0 {
                lse[stat_offset(lse, bh, heads, r)] = m[h] + f32::ln(sum);
            }
        }
    }
}

/// `s = q·kᵀ` for the plane's strip and one key tile: `qf` the strip's A operands, `ks` the
/// staged keys (`cols × dp`, rows of `lq`).
#[cube]
fn scores<F: Float>(
    qf: &Sequence<Regs<F>>,
    ks: &SharedMemory<F>,
    s: &mut Sequence<Regs<f32>>,
    lane: usize,
    #[comptime] cols: usize,
    #[comptime] dp: usize,
    #[comptime] lq: usize,
) {
    #[unroll]
    for step in 0..comptime![dp / TILE] {
        #[unroll]
        for pair in 0..comptime![cols / TILE] {
            let b2 = load_b_rows::<F>(ks, pair * TILE, step * TILE, lane, lq);
            mma_half::<F>(qf.index(step), &b2, s.index_mut(2 * pair), 0usize);
            mma_half::<F>(qf.index(step), &b2, s.index_mut(2 * pair + 1), 2usize);
        }
    }
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

/// `o += P·v` for the plane's strip: the probabilities `p` (the scores' accumulators after
/// [`softmax_tile`]) become the A operands of the 16-key steps, `vs` the staged values
/// (`cols × dvp`, rows of `lv`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn accumulate_pv<F: Float>(
    p: &Sequence<Regs<f32>>,
    vs: &SharedMemory<F>,
    o: &mut Sequence<Regs<f32>>,
    lane: usize,
    #[comptime] cols: usize,
    #[comptime] dvp: usize,
    #[comptime] lv: usize,
) {
    #[unroll]
    for step in 0..comptime![cols / TILE] {
        // A registers: (row g, keys 2t..) (row g + 8, keys 2t..) (row g, keys 8 + 2t..)
        // (row g + 8, keys 8 + 2t..): the two 8-key blocks' accumulator pairs, in that order.
        let mut a = Regs::<F>::new(4usize);
        #[unroll]
        for i in 0..4usize {
            let pair = p.index(2 * step + i / 2)[i % 2];
            a[i] = Pair::<F>::cast_from(pair);
        }
        #[unroll]
        for pair in 0..comptime![dvp / TILE] {
            let b2 = load_b_cols::<F>(vs, step * TILE, pair * TILE, lane, lv);
            mma_half::<F>(&a, &b2, o.index_mut(2 * pair), 0usize);
            mma_half::<F>(&a, &b2, o.index_mut(2 * pair + 1), 2usize);
        }
    }
}
