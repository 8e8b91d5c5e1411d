//! The building blocks of the manual-MMA attention kernels (`m` in a tile spec;
//! [`super::mma_forward`], [`super::mma_backward`]): NVIDIA's warp-level `mma.m16n8k16` with
//! bf16/f16 operands and float32 accumulators in each lane's registers (CubeCL's
//! `cmma::MmaDefinition`), operands read from padded shared-memory tiles by `ldmatrix`.
//!
//! A plane (warp) owns a strip of 16 rows. Its products are kept as `n / 8` accumulators of
//! 16×8 ([`Regs`] of two [`Pair`]s). The lane layouts are PTX's: lane `4g + t` holds, of an
//! accumulator and of the A operand, rows `g` (pair 0) and `g + 8` (pair 1) at columns `2t`,
//! `2t + 1` of each 8-column block; so an accumulator's rows reduce over the 4 lanes of a
//! quad ([`quad_reduce`]), and two adjacent accumulators are, element for element, the A
//! operand of a 16-deep step ([`accumulate`]): a product's result feeds the next product
//! without leaving the lane. CUDA only (no other CubeCL target has manual MMA).

use cubecl::cmma::MmaDefinition;
use cubecl::ir::MatrixIdent;
use cubecl::prelude::*;

use super::kernels::offset;
use super::tile_ops::TILE;

/// Two adjacent elements of one lane: one 32-bit register of an operand (16-bit `F`) or half
/// of a 16×8 accumulator's four float32 values.
pub(super) type Pair<E> = Vector<E, Const<2>>;
/// One lane's registers of an `m16n8k16` operand or accumulator.
pub(super) type Regs<E> = Array<Pair<E>>;

/// The 16×8×16 product with bf16/f16 operands and float32 accumulators.
#[cube]
fn mma_shape<F: Float>() -> MmaDefinition<F, F, f32> {
    MmaDefinition::<F, F, f32>::new(TILE, 8usize, TILE)
}

/// `ldmatrix.x4` (`.trans` with `trans`) of `src`: this lane names the 16-byte row at `at`;
/// register `i` of every lane receives its part of the 8×8 block named by lanes `8i .. 8i + 8`.
#[cube]
fn ldmatrix_x4<F: Float>(
    src: &SharedMemory<F>,
    at: usize,
    #[comptime] ident: MatrixIdent,
    #[comptime] trans: bool,
) -> Regs<F> {
    mma_shape::<F>().load_matrix::<F, Const<2>>(&src.slice(at, at + 8), ident, 4usize, trans)
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
    ldmatrix_x4::<F>(a, at, MatrixIdent::A, false)
}

/// The A operands of the strip `r0 .. r0 + 16` of `a` (`kd` columns used), one per 16-deep
/// step.
#[cube]
pub(super) fn strip_operands<F: Float>(
    a: &SharedMemory<F>,
    r0: usize,
    lane: usize,
    #[comptime] kd: usize,
    #[comptime] ld: usize,
) -> Sequence<Regs<F>> {
    let mut ops = Sequence::<Regs<F>>::new();
    #[unroll]
    for step in 0..comptime![kd / TILE] {
        ops.push(load_a::<F>(a, r0, step * TILE, lane, ld));
    }
    ops
}

/// The B operands of two 8-column blocks `n0 .. n0 + 16` for the 16-deep step `k0 ..`, with
/// `b` stored `n`-major (`b[n][k]`: the product is `a·bᵀ`): `ldmatrix.x4`, lane `l` naming row
/// `n0 + 8 (l / 16) + l % 8` at column `k0 + 8 (l / 8 % 2)`. Registers 0–1 are the first
/// block's operand, 2–3 the second's.
#[cube]
fn load_b_rows<F: Float>(
    b: &SharedMemory<F>,
    n0: usize,
    k0: usize,
    lane: usize,
    #[comptime] ld: usize,
) -> Regs<F> {
    let at = (n0 + (lane / 16) * 8 + lane % 8) * ld + k0 + (lane / 8 % 2) * 8;
    ldmatrix_x4::<F>(b, at, MatrixIdent::B, false)
}

/// As [`load_b_rows`] with `b` stored `k`-major (`b[k][n]`: the product is `a·b`):
/// `ldmatrix.x4.trans`, lane `l` naming row `k0 + 8 (l / 8 % 2) + l % 8` at column
/// `n0 + 8 (l / 16)`.
#[cube]
fn load_b_cols<F: Float>(
    b: &SharedMemory<F>,
    k0: usize,
    n0: usize,
    lane: usize,
    #[comptime] ld: usize,
) -> Regs<F> {
    let at = (k0 + (lane / 8 % 2) * 8 + lane % 8) * ld + n0 + (lane / 16) * 8;
    ldmatrix_x4::<F>(b, at, MatrixIdent::B, true)
}

/// `count` zeroed 16×8 accumulators.
#[cube]
pub(super) fn zeroed(#[comptime] count: usize) -> Sequence<Regs<f32>> {
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

/// `acc[2·pair + h] += a·b` for the two 16×8 blocks `h` of a pair, with `b`'s operands in
/// registers `2h, 2h + 1` of `b2` (from [`load_b_rows`] / [`load_b_cols`]).
#[cube]
fn mma_pair<F: Float>(
    a: &Regs<F>,
    b2: &Regs<F>,
    acc: &mut Sequence<Regs<f32>>,
    #[comptime] pair: usize,
) {
    #[unroll]
    for h in 0..2usize {
        let mut b = Regs::<F>::new(2usize);
        b[0] = b2[2 * h];
        b[1] = b2[2 * h + 1];
        mma_shape::<F>().execute_inplace(a, &b, acc.index_mut(2 * pair + h));
    }
}

/// `acc += a·bᵀ` for the strip: `a` its A operands ([`strip_operands`], `kd / 16` steps),
/// `b` a `n × kd` tile from row `base` (rows of `ld`), `acc` `n / 8` accumulators.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn product_bt<F: Float>(
    a: &Sequence<Regs<F>>,
    b: &SharedMemory<F>,
    base: usize,
    acc: &mut Sequence<Regs<f32>>,
    lane: usize,
    #[comptime] n: usize,
    #[comptime] kd: usize,
    #[comptime] ld: usize,
) {
    #[unroll]
    for step in 0..comptime![kd / TILE] {
        #[unroll]
        for pair in 0..comptime![n / TILE] {
            let b2 = load_b_rows::<F>(b, base + pair * TILE, step * TILE, lane, ld);
            mma_pair::<F>(a.index(step), &b2, acc, pair);
        }
    }
}

/// `acc += a[r0 .. r0 + 16]·bᵀ` with the strip's operands read from `a` for this product
/// alone ([`strip_operands`], [`product_bt`] of `b`'s tile from row `base`; `a` and `b` both
/// with rows of `ld`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn strip_product_bt<F: Float>(
    a: &SharedMemory<F>,
    r0: usize,
    b: &SharedMemory<F>,
    base: usize,
    acc: &mut Sequence<Regs<f32>>,
    lane: usize,
    #[comptime] n: usize,
    #[comptime] kd: usize,
    #[comptime] ld: usize,
) {
    let ops = strip_operands::<F>(a, r0, lane, kd, ld);
    product_bt::<F>(&ops, b, base, acc, lane, n, kd, ld);
}

/// `acc += p·b` for the strip, with the left operand `p` in accumulators (`kd / 8` of them:
/// a product's result, converted to `F`), `b` a `kd × n` tile from row `base` (rows of `ld`),
/// `acc` `n / 8` accumulators.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn accumulate<F: Float>(
    p: &Sequence<Regs<f32>>,
    b: &SharedMemory<F>,
    base: usize,
    acc: &mut Sequence<Regs<f32>>,
    lane: usize,
    #[comptime] kd: usize,
    #[comptime] n: usize,
    #[comptime] ld: usize,
) {
    #[unroll]
    for step in 0..comptime![kd / TILE] {
        // A registers: (row g, cols 2t..) (row g + 8, cols 2t..) (row g, cols 8 + 2t..)
        // (row g + 8, cols 8 + 2t..): the two 8-column blocks' pairs, in that order.
        let mut a = Regs::<F>::new(4usize);
        #[unroll]
        for i in 0..4usize {
            a[i] = Pair::<F>::cast_from(p.index(2 * step + i / 2)[i % 2]);
        }
        #[unroll]
        for pair in 0..comptime![n / TILE] {
            let b2 = load_b_cols::<F>(b, base + step * TILE, pair * TILE, lane, ld);
            mma_pair::<F>(&a, &b2, acc, pair);
        }
    }
}

/// The maximum (`max`) or sum of `x` over the 4 lanes of a quad (the lanes of one row).
#[cube]
pub(super) fn quad_reduce(x: f32, #[comptime] max: bool) -> f32 {
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

/// Write the strip's accumulators `acc` (`width` columns of them used) times `factor[h]`
/// (row `g` for `h = 0`, `g + 8` for 1) as rows `row0 ..` of `dst` (`[B, H, S, C]`), up to
/// its sequence's end.
#[cube]
pub(super) fn store_strip<F: Float>(
    dst: &mut Tensor<F>,
    acc: &Sequence<Regs<f32>>,
    factor: Pair<f32>,
    bh: usize,
    row0: usize,
    lane: usize,
    #[comptime] blocks: usize,
) {
    let heads = dst.shape(1);
    let (len, width) = (dst.shape(2), dst.shape(3));
    let (g, t) = (lane / 4, lane % 4);
    #[unroll]
    for h in 0..2usize {
        let r = row0 + g + h * 8;
        if r < len {
            #[unroll]
            for j in 0..blocks {
                let pair = acc.index(j)[h];
                #[unroll]
                for e in 0..2usize {
                    let c = j * 8 + 2 * t + e;
                    if c < width {
                        dst[offset(dst, bh, heads, r, c)] = F::cast_from(pair[e] * factor[h]);
                    }
                }
            }
        }
    }
}
