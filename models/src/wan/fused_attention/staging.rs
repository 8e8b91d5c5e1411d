//! Moving tiles between device memory and shared memory for the tiled attention kernels:
//! staging rows of a `[B, H, S, C]` tensor into padded shared-memory tiles (through each
//! unit's registers, which lets a streamed tile's loads be issued a tile ahead, or by
//! asynchronous copies into a second buffer), storing float32 rows back, and filling.

use cubecl::prelude::barrier::{copy_async_checked, Barrier};
use cubecl::prelude::*;

use super::kernels::offset;
use super::tile_ops::PAD_OPERAND;

/// A unit's share of a tile, in registers ([`tile_registers`]).
pub(super) type Registers<F, N> = Array<Vector<F, N>>;

/// Stage rows `row0 .. row0 + rows` of `t` (`[B, H, S, C]`) into `dst` (`rows × cp`, padded
/// rows), zero past the sequence's end and in the padding columns `C .. cp`: [`load`] into
/// the unit's registers, then [`put`].
#[cube]
pub(super) fn stage<F: Float, N: Size>(
    t: &Tensor<Vector<F, N>>,
    dst: &mut SharedMemory<F>,
    bh: usize,
    row0: usize,
    #[comptime] rows: usize,
    #[comptime] cp: usize,
    #[comptime] units: usize,
) {
    let mut regs = tile_registers(t, rows, cp, units);
    load(t, &mut regs, bh, row0, rows, cp, units);
    put(&regs, dst, rows, cp, units);
}

/// Stage the streamed tile `row0 .. row0 + rows` of `t` into `dst` through the unit's
/// registers `regs` ([`tile_registers`]). With `prefetch`, `regs` already holds the tile
/// (loaded while the previous tile was computed; the caller loads the first before its
/// loop), and the next tile is loaded into them right after: its global loads stay in flight
/// through the cube sync and the products that follow, and are waited on only when the next
/// call stores them. Without, it is [`stage`].
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn stream<F: Float, N: Size>(
    t: &Tensor<Vector<F, N>>,
    regs: &mut Registers<F, N>,
    dst: &mut SharedMemory<F>,
    bh: usize,
    row0: usize,
    #[comptime] rows: usize,
    #[comptime] cp: usize,
    #[comptime] units: usize,
    #[comptime] prefetch: bool,
) {
    if comptime![!prefetch] {
        load(t, regs, bh, row0, rows, cp, units);
    }
    put(regs, dst, rows, cp, units);
    if comptime![prefetch] {
        load(t, regs, bh, row0 + rows, rows, cp, units);
    }
}

/// The unit's registers for one `rows × cp` tile of `t`: its share of the tile's vectors.
#[cube]
pub(super) fn tile_registers<F: Float, N: Size>(
    t: &Tensor<Vector<F, N>>,
    #[comptime] rows: usize,
    #[comptime] cp: usize,
    #[comptime] units: usize,
) -> Registers<F, N> {
    let n = t.vector_size();
    Array::new(comptime![(rows * (cp / n)).div_ceil(units)])
}

/// Read the unit's vectors of rows `row0 .. row0 + rows` of `t` into `regs`, zero past the
/// sequence's end and in the padding columns `C .. cp` (no global access there).
///
/// `t` is read in vectors of `N` elements (16 bytes for bf16/f16 at `N = 8`: one load
/// instruction per vector instead of eight); the launcher picks `N = 1` unless the last dim is
/// contiguous and `N` divides `C`, the other strides and the buffer's offset. The loop over a
/// unit's vectors is unrolled (its trip count is known when the kernel is compiled), so that
/// a unit issues all its global loads before it waits on the first, and `regs` is indexed by
/// constants (registers, not local memory). The `(b, h)` offset is computed once.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn load<F: Float, N: Size>(
    t: &Tensor<Vector<F, N>>,
    regs: &mut Registers<F, N>,
    bh: usize,
    row0: usize,
    #[comptime] rows: usize,
    #[comptime] cp: usize,
    #[comptime] units: usize,
) {
    let n = t.vector_size();
    let heads = t.shape(1);
    let len = t.shape(2);
    let cols = t.shape(3);
    let base = (bh / heads) * t.stride(0) + (bh % heads) * t.stride(1);
    let (row_step, col_step) = (t.stride(2), t.stride(3));
    let unit = UNIT_POS as usize;
    // Vectors per padded row (`cp` is a multiple of 16, `n` at most 8).
    let per_row = comptime![cp / n];
    #[unroll]
    for i in 0..comptime![(rows * per_row).div_ceil(units)] {
        let idx = unit + i * units;
        let (r, col) = (idx / per_row, (idx % per_row) * n);
        let row = row0 + r;
        let mut val = Vector::<F, N>::empty().fill(F::new(0.0));
        if idx < comptime![rows * per_row] && row < len && col < cols {
            val = t[(base + row * row_step + col * col_step) / n];
        }
        regs[i] = val;
    }
}

/// Write the unit's vectors `regs` ([`load`]) of a `rows × cp` tile into `dst` (padded rows).
#[cube]
pub(super) fn put<F: Float, N: Size>(
    regs: &Registers<F, N>,
    dst: &mut SharedMemory<F>,
    #[comptime] rows: usize,
    #[comptime] cp: usize,
    #[comptime] units: usize,
) {
    let n = regs.vector_size();
    let unit = UNIT_POS as usize;
    let per_row = comptime![cp / n];
    #[unroll]
    for i in 0..comptime![(rows * per_row).div_ceil(units)] {
        let idx = unit + i * units;
        if idx < comptime![rows * per_row] {
            let val = regs[i];
            let at = (idx / per_row) * comptime![cp + PAD_OPERAND] + (idx % per_row) * n;
            #[unroll]
            for j in 0..n {
                dst[at + j] = val[j];
            }
        }
    }
}

/// Issue the unit's asynchronous copies (`cp.async`, one vector of 16 bytes each) of rows
/// `row0 .. row0 + rows` of `t` (`[B, H, S, C]`) into the padded rows `at ..` of `dst`, zeros
/// past the sequence's end and in the padding columns `C .. cp` (copies of no bytes, which
/// fill). The copies land later: [`commit`] makes a barrier's phase wait for them.
///
/// Needs vectors of 16 bytes (`N = 8` in bf16/f16; the launcher asks for this staging only
/// then) and CUDA from compute capability 8.0 (`cp.async`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn copy_tile<F: Float, N: Size>(
    t: &Tensor<Vector<F, N>>,
    dst: &mut SharedMemory<F>,
    at: usize,
    bh: usize,
    row0: usize,
    #[comptime] rows: usize,
    #[comptime] cp: usize,
    #[comptime] units: usize,
) {
    let n = t.vector_size();
    let heads = t.shape(1);
    let len = t.shape(2);
    let cols = t.shape(3);
    let base = (bh / heads) * t.stride(0) + (bh % heads) * t.stride(1);
    let (row_step, col_step) = (t.stride(2), t.stride(3));
    let unit = UNIT_POS as usize;
    let per_row = comptime![cp / n];
    #[unroll]
    for i in 0..comptime![(rows * per_row).div_ceil(units)] {
        let idx = unit + i * units;
        if idx < comptime![rows * per_row] {
            let (r, col) = (idx / per_row, (idx % per_row) * n);
            let row = row0 + r;
            let inside = row < len && col < cols;
            // Outside the tensor: a copy of no bytes (from its first vector), all zeros.
            let src = select(inside, (base + row * row_step + col * col_step) / n, 0usize);
            let length = select(inside, 1usize, 0usize);
            let to = (at + r) * comptime![cp + PAD_OPERAND] + col;
            // SAFETY (of the cast): the copy moves `n` elements of `F`, whatever the slice's
            // element type says; the destination's offset stays in elements of `F`.
            let mut dst_vector = unsafe {
                dst.slice_mut(to, to + n)
                    .downcast_unchecked::<Vector<F, N>>()
            };
            copy_async_checked(
                &t.slice(src, src + length),
                &mut dst_vector,
                comptime![n as u32],
            );
        }
    }
}

/// A cube-wide barrier for the asynchronous copies of one of two tile buffers, initialised
/// for every unit of the cube.
#[cube]
pub(super) fn tile_barrier() -> Shared<Barrier> {
    Barrier::shared(CUBE_DIM, UNIT_POS == 0)
}

/// Make the open phase of buffer `tile % 2`'s barrier (`even` or `odd`), the one [`wait`]
/// completes for `tile`, also wait for every copy the unit has issued so far
/// (`cp.async.mbarrier.arrive`, which adds a pending arrival until they land).
#[cube]
fn commit(even: &Shared<Barrier>, odd: &Shared<Barrier>, tile: usize) {
    if tile % 2 == 1 {
        odd.commit_copy_async();
    } else {
        even.commit_copy_async();
    }
}

/// Wait until every unit of the cube has arrived at buffer `tile % 2`'s barrier and the
/// copies committed to it ([`commit`]) have landed: the tile is in shared memory for every
/// plane, and every plane is done with the tile before it (its buffer may be refilled).
#[cube]
fn wait(even: &Shared<Barrier>, odd: &Shared<Barrier>, tile: usize) {
    if tile % 2 == 1 {
        odd.arrive_and_wait();
    } else {
        even.arrive_and_wait();
    }
}

/// Stage rows `row0 .. row0 + rows` of `a` and `b` (head dims padded to `da`, `db`) into `sa`
/// and `sb` ([`stage`]).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn stage_pair<F: Float, N: Size>(
    a: &Tensor<Vector<F, N>>,
    b: &Tensor<Vector<F, N>>,
    sa: &mut SharedMemory<F>,
    sb: &mut SharedMemory<F>,
    bh: usize,
    row0: usize,
    #[comptime] rows: usize,
    #[comptime] da: usize,
    #[comptime] db: usize,
    #[comptime] units: usize,
) {
    stage(a, sa, bh, row0, rows, da, units);
    stage(b, sb, bh, row0, rows, db, units);
}

/// Issue the unit's copies of streamed tile `tile` (rows `tile·rows ..`) of `a` and `b` into
/// buffer `tile % 2` of `sa` and `sb` ([`copy_tile`]; head dims padded to `da`, `db`) and
/// commit them to that buffer's barrier ([`commit`]).
#[cube]
#[allow(clippy::too_many_arguments)]
fn copy_pair<F: Float, N: Size>(
    a: &Tensor<Vector<F, N>>,
    b: &Tensor<Vector<F, N>>,
    sa: &mut SharedMemory<F>,
    sb: &mut SharedMemory<F>,
    even: &Shared<Barrier>,
    odd: &Shared<Barrier>,
    tile: usize,
    bh: usize,
    #[comptime] rows: usize,
    #[comptime] da: usize,
    #[comptime] db: usize,
    #[comptime] units: usize,
) {
    let (at, row0) = ((tile % 2) * rows, tile * rows);
    copy_tile(a, sa, at, bh, row0, rows, da, units);
    copy_tile(b, sb, at, bh, row0, rows, db, units);
    commit(even, odd, tile);
}

/// Streamed tile `tile`'s turn in a loop over `tiles` tiles copied asynchronously: waits
/// until it has landed ([`wait`], which also means every plane is done with the tile before
/// it; tile 0 issues its own copies first), issues the next tile's copies into the buffer
/// that one used ([`copy_pair`]), and returns the first row of `tile`'s buffer in `sa`, `sb`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn turn<F: Float, N: Size>(
    a: &Tensor<Vector<F, N>>,
    b: &Tensor<Vector<F, N>>,
    sa: &mut SharedMemory<F>,
    sb: &mut SharedMemory<F>,
    even: &Shared<Barrier>,
    odd: &Shared<Barrier>,
    tile: usize,
    tiles: usize,
    bh: usize,
    #[comptime] rows: usize,
    #[comptime] da: usize,
    #[comptime] db: usize,
    #[comptime] units: usize,
) -> usize {
    if tile == 0 {
        copy_pair(a, b, sa, sb, even, odd, 0, bh, rows, da, db, units);
    }
    wait(even, odd, tile);
    if tile + 1 < tiles {
        copy_pair(a, b, sa, sb, even, odd, tile + 1, bh, rows, da, db, units);
    }
    (tile % 2) * rows
}

/// Store rows `0 .. rows` of the float32 matrix `src` (padded rows of `ld` elements) times
/// `factor` as rows `row0 ..` of `dst` (`[B, H, S, C]`), up to the sequence's end.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn store_rows<F: Float>(
    dst: &mut Tensor<F>,
    src: &SharedMemory<f32>,
    bh: usize,
    row0: usize,
    factor: f32,
    #[comptime] rows: usize,
    #[comptime] ld: usize,
    #[comptime] units: usize,
) {
    let heads = dst.shape(1);
    let len = dst.shape(2);
    let cols = dst.shape(3);
    let mut idx = UNIT_POS as usize;
    while idx < rows * cols {
        let (r, c) = (idx / cols, idx % cols);
        if row0 + r < len {
            dst[offset(dst, bh, heads, row0 + r, c)] = F::cast_from(src[r * ld + c] * factor);
        }
        idx += units;
    }
}

/// Set the first `len` values of `dst` to `value`.
#[cube]
pub(super) fn fill(
    dst: &mut SharedMemory<f32>,
    value: f32,
    #[comptime] len: usize,
    #[comptime] units: usize,
) {
    let mut idx = UNIT_POS as usize;
    while idx < len {
        dst[idx] = value;
        idx += units;
    }
}

/// The unit's registers for the tiles of `a` (head dim padded to `dp`) and `b` (`dvp`) that
/// a kernel streams, `cols` rows at a time ([`stream`]); with `prefetch`, holding the first
/// tile (rows `0 .. cols`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn streamed<F: Float, N: Size>(
    a: &Tensor<Vector<F, N>>,
    b: &Tensor<Vector<F, N>>,
    bh: usize,
    #[comptime] cols: usize,
    #[comptime] dp: usize,
    #[comptime] dvp: usize,
    #[comptime] units: usize,
    #[comptime] prefetch: bool,
) -> (Registers<F, N>, Registers<F, N>) {
    let mut ar = tile_registers(a, cols, dp, units);
    let mut br = tile_registers(b, cols, dvp, units);
    if comptime![prefetch] {
        load(a, &mut ar, bh, 0, cols, dp, units);
        load(b, &mut br, bh, 0, cols, dvp, units);
    }
    (ar, br)
}
