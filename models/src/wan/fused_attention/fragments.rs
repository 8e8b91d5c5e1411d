//! Accumulators that stay in registers for a whole tiled kernel (tensor-core products only):
//! the forward's output and the backward's `dQ`, `dK` and `dV` sums over the streamed tiles,
//! kept as cooperative-matrix accumulator fragments instead of float32 matrices in shared
//! memory. Each product then skips loading and storing its accumulator tiles; the backward
//! needs `rows × (head dim + 4) × 4` bytes less shared memory per accumulator (more cubes per
//! multiprocessor). Opt-in per launch shape (the `r` suffix of a tile spec, `tiles.rs`).
//!
//! Plane `p` of `planes` owns output tiles `p, p + planes, …` of an `m × n` output, as
//! [`tensor_core_product`](super::tile_ops::tensor_core_product) assigns them; its fragment
//! `i` holds tile `p + i·planes`. With `strips` (the kernels of `strips.rs` and
//! `strips_backward.rs`) it owns the `n / 16` tiles of its 16-row strip instead, in order.
//!
//! The forward's output is rescaled whenever a row's running maximum moves
//! ([`rescale_accumulators`]): the plane's opaque fragments pass through shared memory for
//! it, which the softmax makes rare by keeping a row's maximum until it grows by more than
//! `rows::STALE_MAX`.

use cubecl::prelude::*;

use super::kernels::offset;
use super::tile_ops::{
    a_fragment, b_fragment, fragment, store_tile, tile_of, tile_steps, ALIGN, PAD_FLOAT, TILE,
};

/// Fragments per plane for an `m × n` output on `units` units: its share of the output's
/// tiles, or with `strips` the tiles of its own 16-row strip.
pub fn fragments_per_plane(m: usize, n: usize, units: usize, strips: bool) -> usize {
    match strips {
        true => n / TILE,
        false => ((m / TILE) * (n / TILE)).div_ceil(units / 32),
    }
}

/// The output tile that the plane's fragment `i` holds (tile `t` at row `t / (n / 16)` and
/// column `t % (n / 16)` of the output's tiles; past the last tile for planes with fewer).
#[cube]
fn owned_tile(
    i: usize,
    #[comptime] n: usize,
    #[comptime] units: usize,
    #[comptime] strips: bool,
) -> usize {
    let plane = UNIT_POS_Y as usize;
    if comptime![strips] {
        plane * comptime![n / TILE] + i
    } else {
        plane + i * comptime![units / 32]
    }
}

/// Float32 elements of the shared-memory scratch that [`store_accumulators`] writes each
/// plane's tiles through: one padded 16×16 tile per plane.
pub fn scratch_len(units: usize) -> usize {
    (units / 32) * TILE * (TILE + PAD_FLOAT)
}

/// Whether the score matrix (`rows × (cols + PAD_FLOAT)` floats, free once the last tile has
/// streamed by) holds [`scratch_len`] floats, so the sums can leave through it instead of a
/// scratch array of their own. The kernels and the shared-memory accounting (`tiles.rs`) both
/// ask here.
pub fn scores_hold_scratch(rows: usize, cols: usize, units: usize) -> bool {
    rows * (cols + PAD_FLOAT) >= scratch_len(units)
}

/// The scratch array the register sums (`regs`) leave through when the score matrix cannot
/// serve ([`scores_hold_scratch`]); a one-float placeholder otherwise.
#[cube]
pub(super) fn exit_scratch(
    #[comptime] regs: bool,
    #[comptime] rows: usize,
    #[comptime] cols: usize,
    #[comptime] units: usize,
) -> SharedMemory<f32> {
    let own = comptime![regs && !scores_hold_scratch(rows, cols, units)];
    SharedMemory::<f32>::new_aligned(comptime![if own { scratch_len(units) } else { 1 }], ALIGN)
}

/// [`store_accumulators`] of the `rows × n` sums through the score matrix `scores`
/// (`rows × cols`) where it holds the scratch, else through `scratch` ([`exit_scratch`]).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn store_sums<F: Float>(
    dst: &mut Tensor<F>,
    accs: &Sequence<cmma::Matrix<f32>>,
    scores: &mut SharedMemory<f32>,
    scratch: &mut SharedMemory<f32>,
    bh: usize,
    row0: usize,
    factor: f32,
    #[comptime] rows: usize,
    #[comptime] n: usize,
    #[comptime] cols: usize,
    #[comptime] units: usize,
    #[comptime] strips: bool,
) {
    if comptime![scores_hold_scratch(rows, cols, units)] {
        store_accumulators(dst, accs, scores, bh, row0, factor, rows, n, units, strips);
    } else {
        store_accumulators(dst, accs, scratch, bh, row0, factor, rows, n, units, strips);
    }
}

/// Zeroed accumulators for the plane's tiles of an `m × n` output.
#[cube]
pub(super) fn accumulators(
    #[comptime] m: usize,
    #[comptime] n: usize,
    #[comptime] units: usize,
    #[comptime] strips: bool,
) -> Sequence<cmma::Matrix<f32>> {
    let mut accs = Sequence::new();
    #[unroll]
    for _ in 0..comptime![fragments_per_plane(m, n, units, strips)] {
        let acc = fragment::<f32>(
            cmma::MatrixIdent::Accumulator,
            cmma::MatrixLayout::Undefined,
        );
        cmma::fill(&acc, 0.0f32);
        accs.push(acc);
    }
    accs
}

/// `accs += a·b` (or `a·bᵀ` with `b_t`) for the plane's tiles of the `m × n` output: `a` is
/// `m × kd` and `b` `kd × n` (or `n × kd`), row-major in shared memory with padded rows, as
/// for [`product`](super::tile_ops::product). Plane-local: no cube sync inside. With
/// `strips` the plane's tiles share its 16 rows of `a`: each of their `kd / 16` operand
/// fragments is loaded once and serves every tile.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn accumulate<F: Float>(
    a: &SharedMemory<F>,
    b: &SharedMemory<F>,
    accs: &Sequence<cmma::Matrix<f32>>,
    #[comptime] m: usize,
    #[comptime] n: usize,
    #[comptime] kd: usize,
    #[comptime] b_t: bool,
    #[comptime] units: usize,
    #[comptime] strips: bool,
) {
    let tiles_n = comptime![n / TILE];
    let tiles = comptime![(m / TILE) * (n / TILE)];
    if comptime![strips] {
        let row0 = UNIT_POS_Y as usize * TILE;
        for step in 0..kd / TILE {
            let a_tile = a_fragment::<F>(a, row0, step * TILE, kd);
            #[unroll]
            for i in 0..comptime![n / TILE] {
                let b_tile = b_fragment::<F>(b, step * TILE, i * TILE, n, kd, b_t);
                cmma::execute::<F, F, f32, f32>(&a_tile, &b_tile, accs.index(i), accs.index(i));
            }
        }
    } else {
        #[unroll]
        for i in 0..comptime![fragments_per_plane(m, n, units, false)] {
            let t = owned_tile(i, n, units, false);
            if t < tiles {
                let row0 = (t / tiles_n) * TILE;
                let col0 = (t % tiles_n) * TILE;
                tile_steps::<F>(a, b, accs.index(i), row0, col0, n, kd, b_t);
            }
        }
    }
}

/// Store the plane's accumulators of the `m × n` output times `factor` as rows `row0 ..` of
/// `dst` (`[B, H, S, C]`), up to the sequence's end and `C`, through the plane's tile of
/// `scratch` ([`scratch_len`] floats).
#[cube]
#[allow(clippy::too_many_arguments)]
fn store_accumulators<F: Float>(
    dst: &mut Tensor<F>,
    accs: &Sequence<cmma::Matrix<f32>>,
    scratch: &mut SharedMemory<f32>,
    bh: usize,
    row0: usize,
    factor: f32,
    #[comptime] m: usize,
    #[comptime] n: usize,
    #[comptime] units: usize,
    #[comptime] strips: bool,
) {
    let heads = dst.shape(1);
    let len = dst.shape(2);
    let cols = dst.shape(3);
    let ld = comptime![TILE + PAD_FLOAT];
    let tiles_n = comptime![n / TILE];
    let tiles = comptime![(m / TILE) * (n / TILE)];
    let lane = UNIT_POS_X as usize;
    let base = UNIT_POS_Y as usize * comptime![TILE * (TILE + PAD_FLOAT)];
    #[unroll]
    for i in 0..comptime![fragments_per_plane(m, n, units, strips)] {
        let t = owned_tile(i, n, units, strips);
        if t < tiles {
            let r0 = row0 + (t / tiles_n) * TILE;
            let c0 = (t % tiles_n) * TILE;
            store_tile(scratch, accs.index(i), base, ld);
            sync_plane();
            #[unroll]
            for j in 0..comptime![TILE * TILE / 32] {
                let e = lane + j * 32;
                let (r, c) = (e / TILE, e % TILE);
                if r0 + r < len && c0 + c < cols {
                    let at = offset(dst, bh, heads, r0 + r, c0 + c);
                    dst[at] = F::cast_from(scratch[base + r * ld + c] * factor);
                }
            }
            sync_plane();
        }
    }
}

/// Rescale the rows of the plane's accumulators of the `m × n` output by `corr` (one factor
/// per row, 1 for a row whose maximum did not move) where any row of a tile has a factor
/// other than 1: the tile goes through its own place in `o` (`m × n` float32, padded rows),
/// is scaled there and loaded back. The factors are the same for every unit of the plane, so
/// the plane takes each branch together. Plane-local: the caller syncs the cube before (the
/// factors written) and nothing else uses `o` meanwhile.
#[cube]
pub(super) fn rescale_accumulators(
    accs: &Sequence<cmma::Matrix<f32>>,
    o: &mut SharedMemory<f32>,
    corr: &SharedMemory<f32>,
    #[comptime] m: usize,
    #[comptime] n: usize,
    #[comptime] units: usize,
    #[comptime] strips: bool,
) {
    let ld = comptime![n + PAD_FLOAT];
    let tiles_n = comptime![n / TILE];
    let tiles = comptime![(m / TILE) * (n / TILE)];
    let lane = UNIT_POS_X as usize;
    #[unroll]
    for i in 0..comptime![fragments_per_plane(m, n, units, strips)] {
        let t = owned_tile(i, n, units, strips);
        if t < tiles {
            let (row0, col0) = ((t / tiles_n) * TILE, (t % tiles_n) * TILE);
            let mut moved = false;
            for r in 0..TILE {
                moved = moved || corr[row0 + r] != 1.0;
            }
            if moved {
                let at = row0 * ld + col0;
                store_tile(o, accs.index(i), at, ld);
                sync_plane();
                #[unroll]
                for j in 0..comptime![TILE * TILE / 32] {
                    let (r, c) = ((lane + j * 32) / TILE, (lane + j * 32) % TILE);
                    o[at + r * ld + c] *= corr[row0 + r];
                }
                sync_plane();
                let tile = tile_of(o, at, ld);
                cmma::load_with_layout(
                    accs.index(i),
                    &tile,
                    ld as u32,
                    cmma::MatrixLayout::RowMajor,
                );
            }
        }
    }
}

/// Store the plane's accumulators of the `m × n` output into their places in `o` (`m × n`
/// float32, padded rows). The caller syncs the cube before reading `o`.
#[cube]
pub(super) fn spill_accumulators(
    accs: &Sequence<cmma::Matrix<f32>>,
    o: &mut SharedMemory<f32>,
    #[comptime] m: usize,
    #[comptime] n: usize,
    #[comptime] units: usize,
    #[comptime] strips: bool,
) {
    let ld = comptime![n + PAD_FLOAT];
    let tiles_n = comptime![n / TILE];
    let tiles = comptime![(m / TILE) * (n / TILE)];
    #[unroll]
    for i in 0..comptime![fragments_per_plane(m, n, units, strips)] {
        let t = owned_tile(i, n, units, strips);
        if t < tiles {
            let at = (t / tiles_n) * TILE * ld + (t % tiles_n) * TILE;
            store_tile(o, accs.index(i), at, ld);
        }
    }
}
