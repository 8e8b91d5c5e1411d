//! Tiled attention for training on tensor cores: the forward (output and log-sum-exp) and
//! backward of [`super::kernels`], rebuilt from 16×16 tile products ([`super::tiled_kernels`])
//! so that `q·kᵀ`, `P·v`, `dO·vᵀ`, `dS·k`, `Pᵀ·dO` and `dSᵀ·q` run as cooperative-matrix
//! (tensor-core) instructions with float32 accumulation (FlashAttention-2, Dao 2023,
//! Algorithms 1 and 2, with `dQ` in its own pass instead of atomics).
//!
//! `attention = "flash"` runs it for the tracked forwards and the backward of bf16/f16
//! attention on devices with 16×16×16 tensor-core products for that dtype and 32-unit planes
//! (NVIDIA GPUs); elsewhere [`forward`] says why not and the SIMT fused kernels run. The
//! same kernels with unit loops in place of the tile instructions ([`Products::Units`]) run on
//! any CubeCL device and are what the tests check on a software Vulkan driver.

use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::features::MmaConfig;
use cubecl::prelude::*;

use super::tiled_kernels::{self as kernels, TILE};
use super::tiles::{
    padded, shape_with, shared_bytes, tile_shape, Cores, Kernel, TileChoice, Tiles, DEFAULT_SHAPES,
};
use super::{mma_backward, mma_forward, strips, strips_backward};

/// How the tile products run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Products {
    /// Cooperative-matrix (tensor-core) instructions; needs f16/bf16 inputs.
    TensorCores,
    /// Plain unit loops over the same shared-memory tiles (any device, any float dtype).
    Units,
}

/// Why the tiled kernels cannot run a problem on a device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// Tensor-core products need half-precision inputs.
    #[error("tensor-core products need bf16 or f16 inputs, got {0:?}")]
    Dtype(DType),
    /// The device has no 16×16×16 cooperative-matrix product for the dtype.
    #[error("the device has no 16x16x16 tensor-core product for {0:?}")]
    NoInstruction(DType),
    /// The kernels assume planes (warps) of 32 units.
    #[error("the device's planes have {min}..{max} units, not 32")]
    PlaneSize {
        /// Smallest plane size.
        min: u32,
        /// Largest plane size.
        max: u32,
    },
    /// Not even the smallest tiles fit the device's shared memory.
    #[error("head dims {d}/{dv} need {need} bytes of shared memory, the device has {have}")]
    SharedMemory {
        /// Query/key head dim.
        d: usize,
        /// Value head dim.
        dv: usize,
        /// Bytes the smallest tiles need.
        need: usize,
        /// Bytes the device gives a cube.
        have: usize,
    },
}

/// `(q, k, v)` or their gradients.
pub type Qkv<R> = (CubeTensor<R>, CubeTensor<R>, CubeTensor<R>);

/// Whether `products` can run for inputs like `q` on its device.
pub fn check<R: CubeRuntime>(q: &CubeTensor<R>, products: Products) -> Result<(), Unavailable> {
    if products == Products::Units {
        return Ok(());
    }
    if !matches!(q.dtype, DType::BF16 | DType::F16) {
        return Err(Unavailable::Dtype(q.dtype));
    }
    let props = q.client.properties();
    let (min, max) = (props.hardware.plane_size_min, props.hardware.plane_size_max);
    if (min, max) != (32, 32) {
        return Err(Unavailable::PlaneSize { min, max });
    }
    // bf16 fragments exist from compute capability 8.0 on, where CubeCL also registers the
    // 16×8×16 `mma` shape; before it the `cmma` check alone passes and compilation would fail.
    let bf16_ok = q.dtype != DType::BF16 || manual_mma(q);
    if !props.features.matmul.cmma.contains(&product(q.dtype, TILE)) || !bf16_ok {
        return Err(Unavailable::NoInstruction(q.dtype));
    }
    Ok(())
}

/// The `16 × n × 16` tensor-core product of `dtype` operands with float32 accumulators.
fn product(dtype: DType, n: usize) -> MmaConfig {
    let elem: StorageType = dtype.into();
    MmaConfig {
        a_type: elem,
        b_type: elem,
        cd_type: DType::F32.into(),
        m: TILE as u32,
        n: n as u32,
        k: TILE as u32,
    }
}

/// Whether `q`'s device has the warp-level `m16n8k16` product for its dtype with float32
/// accumulators that [`mma_forward`] and [`mma_backward`] are built on (CUDA from compute
/// capability 8.0).
fn manual_mma<R: CubeRuntime>(q: &CubeTensor<R>) -> bool {
    let product = product(q.dtype, 8);
    q.client.properties().features.matmul.mma.contains(&product)
}

/// Tile shape of `kernel` for `q`'s device and dtype.
fn shape_for<R: CubeRuntime>(
    kernel: Kernel,
    q: &CubeTensor<R>,
    d: usize,
    dv: usize,
    tc: bool,
) -> Result<Tiles, Unavailable> {
    let have = q.client.properties().hardware.max_shared_memory_size;
    let elem = q.dtype.size();
    let unavailable = || {
        let smallest = DEFAULT_SHAPES[DEFAULT_SHAPES.len() - 1];
        Unavailable::SharedMemory {
            d,
            dv,
            need: shared_bytes(kernel, smallest, padded(d), padded(dv), elem, tc),
            have,
        }
    };
    let cores = match tc {
        true if manual_mma(q) => Cores::Mma,
        true => Cores::TensorCores,
        false => Cores::Units,
    };
    let tiles = tile_shape(kernel, d, dv, elem, have, cores).ok_or_else(unavailable)?;
    if !tiles.mma || cores == Cores::Mma {
        return Ok(tiles);
    }
    // An `m` choice without manual MMA here: the strips kernel in its place where it fits,
    // else the default (never `m` on these cores).
    let strips = Tiles {
        mma: false,
        ..tiles.with_strips()
    };
    let bytes = |t| shared_bytes(kernel, t, padded(d), padded(dv), elem, tc);
    if bytes(strips) <= have {
        return Ok(strips);
    }
    shape_with(TileChoice::default(), kernel, d, dv, elem, have, cores).ok_or_else(unavailable)
}

/// The widest vector (in elements, at most 8) that every tensor of `ts` can be read in by the
/// kernels' staging: a contiguous last dim that the vector size divides, as it divides the
/// other strides and the buffer's byte offset (vectors stay aligned). 1 where any cannot.
pub(super) fn vector_size<R: CubeRuntime>(ts: &[&CubeTensor<R>]) -> usize {
    ts.iter()
        .map(|t| {
            let elem = t.dtype.size();
            let sizes = t.client.io_optimized_vector_sizes(elem);
            let mut n =
                cubecl::tensor_vector_size_parallel(sizes, t.meta.shape(), t.meta.strides(), 3)
                    .min(8);
            let offset = t.handle.offset_start.unwrap_or(0) as usize;
            while n > 1 && !offset.is_multiple_of(n * elem) {
                n /= 2;
            }
            n
        })
        .min()
        .unwrap_or(1)
}

/// The kernels' `prefetch` argument for `tiles`: `p` as given, except for the `m` kernels,
/// whose prefetch is asynchronous copies of 16-byte vectors (`vector` elements of `q`'s
/// dtype) on devices that have them; without those they stage each tile in turn.
fn prefetch<R: CubeRuntime>(tiles: Tiles, q: &CubeTensor<R>, vector: usize) -> bool {
    let copies = vector * q.dtype.size() == 16 && q.client.properties().features.copy_async;
    tiles.prefetch && (!tiles.mma || copies)
}

fn launch_dims(tiles: Tiles, seq: usize, batch_heads: usize) -> (CubeCount, CubeDim) {
    (
        CubeCount::Static(seq.div_ceil(tiles.rows) as u32, batch_heads as u32, 1),
        CubeDim::new_2d(32, (tiles.units / 32) as u32),
    )
}

/// Forward: `(o [B, H, Sq, Dv], lse [B, H, Sq] float32)` for `q [B, H, Sq, D]`,
/// `k [B, H, Sk, D]`, `v [B, H, Sk, Dv]` (any strides, one float dtype; shapes checked by
/// the caller; `o` laid out as `q` is), or why `products` cannot run it here.
pub fn forward<R: CubeRuntime>(
    q: CubeTensor<R>,
    k: CubeTensor<R>,
    v: CubeTensor<R>,
    products: Products,
) -> Result<(CubeTensor<R>, CubeTensor<R>), Unavailable> {
    check(&q, products)?;
    let [b, h, sq, d] = q.meta.shape().dims();
    let dv = v.meta.shape()[3];
    let tc = products == Products::TensorCores;
    let tiles = shape_for(Kernel::Forward, &q, d, dv, tc)?;
    let out = super::empty_in_layout_of(&q, [b, h, sq, dv], q.dtype);
    let lse = super::empty_rows(&q);
    let (count, dim) = launch_dims(tiles, sq, b * h);
    let dtype = q.dtype;
    let vector = vector_size(&[&q, &k, &v]);
    let prefetch = prefetch(tiles, &q, vector);
    // Both forwards take the same arguments.
    macro_rules! launch {
        ($kernel:path) => {
            // SAFETY: every global read and write of the kernel is guarded by the tensor's own
            // shape (rows past a sequence's end and columns past a head dim are skipped),
            // shared-memory indices stay inside the arrays sized from the same comptime shapes,
            // and `vector` divides every vectorized tensor's last dim, strides and offset.
            unsafe {
                $kernel(
                    &q.client.clone(),
                    count,
                    dim,
                    vector,
                    q.into_tensor_arg(),
                    k.into_tensor_arg(),
                    v.into_tensor_arg(),
                    out.clone().into_tensor_arg(),
                    lse.clone().into_tensor_arg(),
                    1.0 / (d as f32).sqrt(),
                    padded(d),
                    padded(dv),
                    tiles.rows,
                    tiles.cols,
                    tiles.units,
                    tc,
                    tiles.registers,
                    prefetch,
                    dtype.into(),
                )
            }
        };
    }
    // (`shape_for` kept `m` only where the device has manual MMA.)
    if tiles.mma {
        launch!(mma_forward::tiled_forward_mma::launch_unchecked::<R>);
    } else if tiles.strips {
        launch!(strips::tiled_forward_strips::launch_unchecked::<R>);
    } else {
        launch!(kernels::tiled_forward::launch_unchecked::<R>);
    }
    Ok((out, lse))
}

/// Backward: `(dq, dk, dv)` shaped and laid out like `q, k, v` from the saved `o`, `lse` and
/// the output gradient `d_out [B, H, Sq, Dv]` (cast to the inputs' dtype), or why `products`
/// cannot run it here.
pub fn backward<R: CubeRuntime>(
    (q, k, v): Qkv<R>,
    o: CubeTensor<R>,
    lse: CubeTensor<R>,
    d_out: CubeTensor<R>,
    products: Products,
) -> Result<Qkv<R>, Unavailable> {
    check(&q, products)?;
    let [b, h, sq, d] = q.meta.shape().dims();
    let sk = k.meta.shape()[2];
    let dv = v.meta.shape()[3];
    let tc = products == Products::TensorCores;
    let tiles_q = shape_for(Kernel::BackwardQ, &q, d, dv, tc)?;
    let tiles_kv = shape_for(Kernel::BackwardKv, &q, d, dv, tc)?;
    let dtype = q.dtype;
    let d_out = super::as_dtype(d_out, dtype);
    let (dq, dk, dvt) = (
        super::empty_like(&q),
        super::empty_like(&k),
        super::empty_like(&v),
    );
    let delta = super::empty_rows(&q);
    let scale = 1.0 / (d as f32).sqrt();
    let client = q.client.clone();
    let vector = vector_size(&[&q, &k, &v, &o, &d_out]);
    let (prefetch_q, prefetch_kv) = (
        prefetch(tiles_q, &q, vector),
        prefetch(tiles_kv, &q, vector),
    );
    let (dims_q, dims_kv) = (
        launch_dims(tiles_q, sq, b * h),
        launch_dims(tiles_kv, sk, b * h),
    );
    // The kernels with and without plane-owned strips take the same arguments.
    macro_rules! launch_q {
        ($kernel:path) => {
            // SAFETY: as in `forward`: guarded global accesses, shared memory sized from the
            // same comptime shapes, `vector` dividing every vectorized tensor's layout.
            unsafe {
                $kernel(
                    &client,
                    dims_q.0,
                    dims_q.1,
                    vector,
                    q.clone().into_tensor_arg(),
                    k.clone().into_tensor_arg(),
                    v.clone().into_tensor_arg(),
                    o.into_tensor_arg(),
                    d_out.clone().into_tensor_arg(),
                    lse.clone().into_tensor_arg(),
                    dq.clone().into_tensor_arg(),
                    delta.clone().into_tensor_arg(),
                    scale,
                    padded(d),
                    padded(dv),
                    tiles_q.rows,
                    tiles_q.cols,
                    tiles_q.units,
                    tc,
                    tiles_q.registers,
                    prefetch_q,
                    dtype.into(),
                )
            }
        };
    }
    macro_rules! launch_kv {
        ($kernel:path) => {
            // SAFETY: as above.
            unsafe {
                $kernel(
                    &client,
                    dims_kv.0,
                    dims_kv.1,
                    vector,
                    q.into_tensor_arg(),
                    k.into_tensor_arg(),
                    v.into_tensor_arg(),
                    d_out.into_tensor_arg(),
                    lse.into_tensor_arg(),
                    delta.into_tensor_arg(),
                    dk.clone().into_tensor_arg(),
                    dvt.clone().into_tensor_arg(),
                    scale,
                    padded(d),
                    padded(dv),
                    tiles_kv.rows,
                    tiles_kv.cols,
                    tiles_kv.units,
                    tc,
                    tiles_kv.registers,
                    prefetch_kv,
                    dtype.into(),
                )
            }
        };
    }
    if tiles_q.mma {
        launch_q!(mma_backward::tiled_backward_q_mma::launch_unchecked::<R>);
    } else if tiles_q.strips {
        launch_q!(strips_backward::tiled_backward_q_strips::launch_unchecked::<R>);
    } else {
        launch_q!(kernels::tiled_backward_q::launch_unchecked::<R>);
    }
    if tiles_kv.mma {
        launch_kv!(mma_backward::tiled_backward_kv_mma::launch_unchecked::<R>);
    } else if tiles_kv.strips {
        launch_kv!(strips_backward::tiled_backward_kv_strips::launch_unchecked::<R>);
    } else {
        launch_kv!(kernels::tiled_backward_kv::launch_unchecked::<R>);
    }
    Ok((dq, dk, dvt))
}
