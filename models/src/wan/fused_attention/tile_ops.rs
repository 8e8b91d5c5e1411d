//! Shared-memory building blocks of the tiled attention kernels ([`super::tiled_kernels`]):
//! staging rows of a `[B, H, S, C]` tensor into padded shared-memory tiles, storing float32
//! rows back, and the tile products `c (+)= a·b` / `a·bᵀ`, as cooperative-matrix (`cmma`,
//! tensor-core) instructions, one plane (warp) per 16×16 output tile, or as plain unit loops
//! over the same shared memory (the same kernels on devices without tensor cores, which the
//! tests run on a software Vulkan driver).

use cubecl::prelude::*;

use super::kernels::offset;

/// Side of a tile product (the cmma shape is 16×16×16).
pub const TILE: usize = 16;
/// Byte alignment of every shared-memory array: tensor-core loads and stores need 32-byte
/// aligned tile pointers (16 padded rows of any array are a multiple of 32 bytes, so every
/// tile's offset keeps the alignment).
pub(super) const ALIGN: usize = 32;
/// Padding of an operand row (`F`) in shared memory, in elements: 16 bytes for 16-bit types,
/// the smallest row step tensor-core loads accept.
pub const PAD_OPERAND: usize = 8;
/// Padding of a float32 row in shared memory, in elements (16 bytes).
pub const PAD_FLOAT: usize = 4;

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
    regs: &mut Array<Vector<F, N>>,
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
) -> Array<Vector<F, N>> {
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
    regs: &mut Array<Vector<F, N>>,
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
    regs: &Array<Vector<F, N>>,
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

/// `c (+)= a·b` in shared memory, row-major with padded rows: `a` is `m × kd`, `b` is `kd × n`
/// or, with `b_t`, `n × kd` (the product is then `a·bᵀ`), `c` is `m × n` float32. Without
/// `accumulate`, `c` is overwritten. All units of the cube take part; the caller syncs.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn product<F: Float>(
    a: &SharedMemory<F>,
    b: &SharedMemory<F>,
    c: &mut SharedMemory<f32>,
    #[comptime] m: usize,
    #[comptime] n: usize,
    #[comptime] kd: usize,
    #[comptime] b_t: bool,
    #[comptime] accumulate: bool,
    #[comptime] tc: bool,
    #[comptime] units: usize,
) {
    if comptime![tc] {
        let tiles = comptime![(m / TILE) * (n / TILE)];
        let first = UNIT_POS_Y as usize;
        tensor_core_product::<F>(a, b, c, first, tiles, units / 32, n, kd, b_t, accumulate);
    } else {
        let unit = UNIT_POS as usize;
        unit_product::<F>(a, b, c, 0, unit, m, n, kd, b_t, accumulate, units);
    }
}

/// [`product`] for the 16 rows `row0 ..` of `a` and `c` alone, by one plane (32 units; the
/// caller syncs the plane, `sync_strip`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn strip_product<F: Float>(
    a: &SharedMemory<F>,
    b: &SharedMemory<F>,
    c: &mut SharedMemory<f32>,
    row0: usize,
    #[comptime] n: usize,
    #[comptime] kd: usize,
    #[comptime] b_t: bool,
    #[comptime] accumulate: bool,
    #[comptime] tc: bool,
) {
    if comptime![tc] {
        let first = (row0 / TILE) * comptime![n / TILE];
        let end = first + comptime![n / TILE];
        tensor_core_product::<F>(a, b, c, first, end, 1usize, n, kd, b_t, accumulate);
    } else {
        let lane = UNIT_POS_X as usize;
        unit_product::<F>(a, b, c, row0, lane, TILE, n, kd, b_t, accumulate, 32usize);
    }
}

/// Synchronise the units that share a 16-row strip: its plane with tensor-core products
/// (planes of 32 units, which `tiled::check` requires), else the whole cube (devices whose
/// hardware planes are narrower than 32 units, such as lavapipe's; every unit of the cube
/// reaches the same syncs).
#[cube]
pub(super) fn sync_strip(#[comptime] tc: bool) {
    if comptime![tc] {
        sync_plane();
    } else {
        sync_cube();
    }
}

/// An uninitialised 16×16×16 fragment of the tile product.
#[cube]
pub(super) fn fragment<E: Numeric>(
    #[comptime] ident: cmma::MatrixIdent,
    #[comptime] layout: cmma::MatrixLayout,
) -> cmma::Matrix<E> {
    unsafe { cmma::Matrix::<E>::uninitialized(ident, TILE, TILE, TILE, layout) }
}

/// The 16×16 tile at element `at` of a shared-memory matrix with `ld` elements per row.
#[cube]
pub(super) fn tile_of<E: Numeric>(
    smem: &SharedMemory<E>,
    at: usize,
    #[comptime] ld: usize,
) -> Slice<E> {
    smem.slice(at, at + (TILE - 1) * ld + TILE)
}

/// [`product`] with cooperative-matrix instructions: the plane computes the 16×16 output
/// tiles `first, first + step, …` before `end` (tile `t` at row `t / (n / 16)` and column
/// `t % (n / 16)` of the output's tiles), accumulating in float32 over `kd / 16` steps.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn tensor_core_product<F: Float>(
    a: &SharedMemory<F>,
    b: &SharedMemory<F>,
    c: &mut SharedMemory<f32>,
    first: usize,
    end: usize,
    #[comptime] step: usize,
    #[comptime] n: usize,
    #[comptime] kd: usize,
    #[comptime] b_t: bool,
    #[comptime] accumulate: bool,
) {
    let ldc = comptime![n + PAD_FLOAT];
    let tiles_n = comptime![n / TILE];
    let mut t = first;
    while t < end {
        let row0 = (t / tiles_n) * TILE;
        let col0 = (t % tiles_n) * TILE;
        let c_at = row0 * ldc + col0;
        let acc = fragment::<f32>(
            cmma::MatrixIdent::Accumulator,
            cmma::MatrixLayout::Undefined,
        );
        if comptime![accumulate] {
            let tile = tile_of(c, c_at, ldc);
            cmma::load_with_layout(&acc, &tile, ldc as u32, cmma::MatrixLayout::RowMajor);
        } else {
            cmma::fill(&acc, 0.0f32);
        }
        tile_steps::<F>(a, b, &acc, row0, col0, n, kd, b_t);
        let mut out = c.slice_mut(c_at, c_at + (TILE - 1) * ldc + TILE);
        cmma::store(&mut out, &acc, ldc as u32, cmma::MatrixLayout::RowMajor);
        t += step;
    }
}

/// `acc += a·b` (or `a·bᵀ` with `b_t`) for the 16×16 output tile at `(row0, col0)`, over
/// `kd / 16` tensor-core steps; operands as for [`product`] (`n` columns of output).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn tile_steps<F: Float>(
    a: &SharedMemory<F>,
    b: &SharedMemory<F>,
    acc: &cmma::Matrix<f32>,
    row0: usize,
    col0: usize,
    #[comptime] n: usize,
    #[comptime] kd: usize,
    #[comptime] b_t: bool,
) {
    let lda = comptime![kd + PAD_OPERAND];
    let ldb = comptime![n + PAD_OPERAND];
    for step in 0..kd / TILE {
        let k0 = step * TILE;
        let a_tile = fragment::<F>(cmma::MatrixIdent::A, cmma::MatrixLayout::RowMajor);
        cmma::load(&a_tile, &tile_of(a, row0 * lda + k0, lda), lda as u32);
        if comptime![b_t] {
            // `bᵀ` (`kd × n`) is `b` (`n × kd`, padded rows) read column-major.
            let b_tile = fragment::<F>(cmma::MatrixIdent::B, cmma::MatrixLayout::ColMajor);
            cmma::load(&b_tile, &tile_of(b, col0 * lda + k0, lda), lda as u32);
            cmma::execute::<F, F, f32, f32>(&a_tile, &b_tile, acc, acc);
        } else {
            let b_tile = fragment::<F>(cmma::MatrixIdent::B, cmma::MatrixLayout::RowMajor);
            cmma::load(&b_tile, &tile_of(b, k0 * ldb + col0, ldb), ldb as u32);
            cmma::execute::<F, F, f32, f32>(&a_tile, &b_tile, acc, acc);
        }
    }
}

/// [`product`] on plain units for rows `row0 .. row0 + m` of `a` and `c`: unit `unit` of
/// `units` computes every `units`-th output value, float32 sums.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn unit_product<F: Float>(
    a: &SharedMemory<F>,
    b: &SharedMemory<F>,
    c: &mut SharedMemory<f32>,
    row0: usize,
    unit: usize,
    #[comptime] m: usize,
    #[comptime] n: usize,
    #[comptime] kd: usize,
    #[comptime] b_t: bool,
    #[comptime] accumulate: bool,
    #[comptime] units: usize,
) {
    let lda = comptime![kd + PAD_OPERAND];
    let ldb = comptime![n + PAD_OPERAND];
    let ldc = comptime![n + PAD_FLOAT];
    let mut idx = unit;
    while idx < m * n {
        let i = row0 + idx / n;
        let j = idx % n;
        let mut sum = 0.0f32;
        if comptime![accumulate] {
            sum = c[i * ldc + j];
        }
        for x in 0..kd {
            let bv = if comptime![b_t] {
                b[j * lda + x]
            } else {
                b[x * ldb + j]
            };
            sum += f32::cast_from(a[i * lda + x]) * f32::cast_from(bv);
        }
        c[i * ldc + j] = sum;
        idx += units;
    }
}
