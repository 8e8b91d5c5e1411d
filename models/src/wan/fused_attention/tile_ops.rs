//! The tile products of the tiled attention kernels ([`super::tiled_kernels`],
//! [`super::strips`]) and the layout of their shared memory: `c (+)= a·b` / `a·bᵀ` on padded
//! shared-memory matrices, as cooperative-matrix (`cmma`, tensor-core) instructions, one plane
//! (warp) per 16×16 output tile, or as plain unit loops over the same shared memory (the same
//! kernels on devices without tensor cores, which the tests run on a software Vulkan driver);
//! for the whole cube or for one plane's 16-row strip. Moving tiles in and out is in
//! `staging.rs`.

use cubecl::prelude::*;

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

/// Store the accumulator `acc` as the 16×16 tile at element `at` of `smem` (float32, `ld`
/// elements per row), row-major.
#[cube]
pub(super) fn store_tile(
    smem: &mut SharedMemory<f32>,
    acc: &cmma::Matrix<f32>,
    at: usize,
    #[comptime] ld: usize,
) {
    let mut tile = smem.slice_mut(at, at + (TILE - 1) * ld + TILE);
    cmma::store(&mut tile, acc, ld as u32, cmma::MatrixLayout::RowMajor);
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
        store_tile(c, &acc, c_at, ldc);
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
    for step in 0..kd / TILE {
        let a_tile = a_fragment::<F>(a, row0, step * TILE, kd);
        let b_tile = b_fragment::<F>(b, step * TILE, col0, n, kd, b_t);
        cmma::execute::<F, F, f32, f32>(&a_tile, &b_tile, acc, acc);
    }
}

/// The left operand's 16×16 tile at `(row0, k0)` of `a` (`m × kd`, padded rows), as for
/// [`product`].
#[cube]
pub(super) fn a_fragment<F: Float>(
    a: &SharedMemory<F>,
    row0: usize,
    k0: usize,
    #[comptime] kd: usize,
) -> cmma::Matrix<F> {
    let lda = comptime![kd + PAD_OPERAND];
    let frag = fragment::<F>(cmma::MatrixIdent::A, cmma::MatrixLayout::RowMajor);
    cmma::load(&frag, &tile_of(a, row0 * lda + k0, lda), lda as u32);
    frag
}

/// The right operand's 16×16 tile at `(k0, col0)` of `b` (`kd × n`) or, with `b_t`, of `bᵀ`
/// (`b` is then `n × kd`, read column-major), padded rows, as for [`product`].
#[cube]
pub(super) fn b_fragment<F: Float>(
    b: &SharedMemory<F>,
    k0: usize,
    col0: usize,
    #[comptime] n: usize,
    #[comptime] kd: usize,
    #[comptime] b_t: bool,
) -> cmma::Matrix<F> {
    if comptime![b_t] {
        let ld = comptime![kd + PAD_OPERAND];
        let frag = fragment::<F>(cmma::MatrixIdent::B, cmma::MatrixLayout::ColMajor);
        cmma::load(&frag, &tile_of(b, col0 * ld + k0, ld), ld as u32);
        frag
    } else {
        let ld = comptime![n + PAD_OPERAND];
        let frag = fragment::<F>(cmma::MatrixIdent::B, cmma::MatrixLayout::RowMajor);
        cmma::load(&frag, &tile_of(b, k0 * ld + col0, ld), ld as u32);
        frag
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
