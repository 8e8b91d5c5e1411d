//! Writes the CUDA C++ source of the tiled tensor-core attention kernels, as CubeCL's CUDA
//! compiler generates it, without a GPU: the kernels are defined on any CubeCL client (here
//! the wgpu one, which the tests' software Vulkan driver provides) and compiled to source by
//! `CudaCompiler`. `bench/cuda-compile.sh` then compiles the sources for sm_80/sm_90 with
//! NVRTC and `ptxas` and prints each kernel's registers, spills and shared memory, so that
//! a kernel change is checked for compile errors and register pressure before a GPU session.
//!
//! Usage: `cargo run --release -p reel-models --features cuda,wgpu --example cuda_sources --
//! OUT_DIR [HEAD_DIM [TILE_SPEC...]]` (head dim 128, Wan's, by default). One `.cu` file per
//! kernel, dtype and tile spec (`REEL_TILED_TILES`' syntax, `tiles.rs`); without a spec, the
//! shapes the kernels get by default on an H100 (227 KiB of shared memory per cube).

use std::path::PathBuf;

use cubecl::cuda::CudaCompiler;
use cubecl::ir::{ElemType, FloatKind, UIntKind};
use cubecl::prelude::*;
use cubecl::wgpu::{WgpuDevice, WgpuRuntime};
use cubecl::{Compiler, CubeTask};
use reel_models::wan::fused_attention::tiled_kernels as k;
use reel_models::wan::fused_attention::tiles::{
    padded, set_tiles, tile_shape, Cores, Kernel, TileChoice, Tiles,
};
use reel_models::wan::fused_attention::{mma_backward, mma_forward, strips, strips_backward};

/// Elements per global load when staging tiles: 16 bytes of bf16/f16, what the kernels get for
/// a contiguous head dim that 8 divides (Wan's q/k/v).
const VECTOR: usize = 8;

/// Shared memory per cube on an H100/H200 (`MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`).
const HOPPER_SHARED: usize = 227 << 10;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: cuda_sources OUT_DIR [HEAD_DIM [TILE_SPEC...]]";
    let out = PathBuf::from(args.next().ok_or(usage)?);
    let d: usize = args.next().map_or(Ok(128), |s| s.parse())?;
    // No spec: the default shapes (an empty choice).
    let mut specs: Vec<TileChoice> = args.map(|s| s.parse()).collect::<Result<_, _>>()?;
    if specs.is_empty() {
        specs.push(TileChoice::default());
    }
    std::fs::create_dir_all(&out)?;
    let client = WgpuRuntime::client(&WgpuDevice::default());
    for spec in specs {
        set_tiles(spec);
        for (name, kind, elem) in [("bf16", FloatKind::BF16, 2), ("f16", FloatKind::F16, 2)] {
            let dtype = StorageType::Scalar(ElemType::Float(kind));
            for kernel in Kernel::ALL {
                let tiles = tile_shape(kernel, d, d, elem, HOPPER_SHARED, Cores::Mma)
                    .ok_or("no tile shape fits an H100's shared memory")?;
                let source = source(&client, kernel, tiles, padded(d), dtype)?;
                let file = out.join(format!("{}-{name}-d{d}-{tiles}.cu", kernel.name()));
                std::fs::write(&file, source)?;
                println!("{}", file.display());
            }
        }
    }
    Ok(())
}

/// The CUDA source of `kernel` launched with `tiles`, head dims padded to `dp`, in `dtype`.
fn source(
    client: &ComputeClient<WgpuRuntime>,
    kernel: Kernel,
    tiles: Tiles,
    dp: usize,
    dtype: StorageType,
) -> Result<String, Box<dyn std::error::Error>> {
    let settings = KernelSettings::default()
        .cube_dim(CubeDim::new_2d(32, (tiles.units / 32) as u32))
        .address_type(AddressType::U32);
    let t = || TensorCompilationArg { inplace: None };
    let (
        client,
        Tiles {
            rows,
            cols,
            units,
            registers,
            prefetch,
            strips,
            mma,
        },
    ) = (client.clone(), tiles);
    // Every kernel takes its tensors, the scale (a runtime scalar) and the same comptime
    // arguments (tensor-core products).
    macro_rules! define {
        ($kernel:ty, [$($tensor:expr),+]) => {
            compile(<$kernel>::new(
                settings, client, $($tensor,)+ (), VECTOR, dp, dp, rows, cols, units, true,
                registers, prefetch, dtype,
            ))
        };
    }
    match (kernel, strips) {
        (Kernel::Forward, _) if mma => define!(
            mma_forward::tiled_forward_mma::TiledForwardMma<WgpuRuntime>,
            [t(), t(), t(), t(), t()]
        ),
        (Kernel::Forward, true) => define!(
            strips::tiled_forward_strips::TiledForwardStrips<WgpuRuntime>,
            [t(), t(), t(), t(), t()]
        ),
        (Kernel::Forward, false) => define!(
            k::tiled_forward::TiledForward<WgpuRuntime>,
            [t(), t(), t(), t(), t()]
        ),
        (Kernel::BackwardQ, _) if mma => define!(
            mma_backward::tiled_backward_q_mma::TiledBackwardQMma<WgpuRuntime>,
            [t(), t(), t(), t(), t(), t(), t(), t()]
        ),
        (Kernel::BackwardKv, _) if mma => define!(
            mma_backward::tiled_backward_kv_mma::TiledBackwardKvMma<WgpuRuntime>,
            [t(), t(), t(), t(), t(), t(), t(), t()]
        ),
        (Kernel::BackwardQ, true) => define!(
            strips_backward::tiled_backward_q_strips::TiledBackwardQStrips<WgpuRuntime>,
            [t(), t(), t(), t(), t(), t(), t(), t()]
        ),
        (Kernel::BackwardQ, false) => define!(
            k::tiled_backward_q::TiledBackwardQ<WgpuRuntime>,
            [t(), t(), t(), t(), t(), t(), t(), t()]
        ),
        (Kernel::BackwardKv, true) => define!(
            strips_backward::tiled_backward_kv_strips::TiledBackwardKvStrips<WgpuRuntime>,
            [t(), t(), t(), t(), t(), t(), t(), t()]
        ),
        (Kernel::BackwardKv, false) => define!(
            k::tiled_backward_kv::TiledBackwardKv<WgpuRuntime>,
            [t(), t(), t(), t(), t(), t(), t(), t()]
        ),
    }
}

/// The CUDA C++ source `CudaCompiler` generates for `kernel`, headed by a comment with its
/// shared memory per cube and its units (`// reel: shared_bytes=N units=U`), which
/// `bench/cuda_compile.py` reads for its occupancy column.
fn compile<K: CubeKernel>(kernel: K) -> Result<String, Box<dyn std::error::Error>> {
    let task = KernelTask::<CudaCompiler, K>::new(kernel);
    // As the CUDA runtime compiles kernels (`cubecl-cuda`'s device setup).
    let mut options = <CudaCompiler as Compiler>::CompilationOptions::default();
    options.supports_features.fast_math = true;
    let u32_type = StorageType::Scalar(ElemType::UInt(UIntKind::U32));
    let compiled = task
        .compile(
            &mut Default::default(),
            &options,
            ExecutionMode::Unchecked,
            u32_type,
        )
        .map_err(|e| format!("{e:?}"))?;
    let shared = compiled.repr.as_ref().map_or(0, |k| k.shared_memory_size());
    let units = compiled.cube_dim.num_elems();
    Ok(format!(
        "// reel: shared_bytes={shared} units={units}\n{}",
        compiled.source
    ))
}
