//! Writes the CUDA C++ source of the tiled tensor-core attention kernels, as CubeCL's CUDA
//! compiler generates it, without a GPU: the kernels are defined on any CubeCL client (here
//! the wgpu one, which the tests' software Vulkan driver provides) and compiled to source by
//! `CudaCompiler`. `bench/cuda-compile.sh` then compiles the sources for sm_80/sm_90 with
//! NVRTC and `ptxas` and prints each kernel's registers, spills and shared memory, so that
//! a kernel change is checked for compile errors and register pressure before a GPU session.
//!
//! Usage: `cargo run --release -p reel-models --features cuda,wgpu --example cuda_sources --
//! OUT_DIR [HEAD_DIM]` (head dim 128, Wan's, by default). One `.cu` file per kernel and
//! dtype; the tile shapes are those the kernels get on an H100 (227 KiB of shared memory per
//! cube).

use std::path::PathBuf;

use cubecl::cuda::CudaCompiler;
use cubecl::ir::{ElemType, FloatKind, UIntKind};
use cubecl::prelude::*;
use cubecl::wgpu::{WgpuDevice, WgpuRuntime};
use cubecl::{Compiler, CubeTask};
use reel_models::wan::fused_attention::tiled::{self, Kernel};
use reel_models::wan::fused_attention::tiled_kernels as k;

/// Elements per global load when staging tiles: 16 bytes of bf16/f16, what the kernels get for
/// a contiguous head dim that 8 divides (Wan's q/k/v).
const VECTOR: usize = 8;

/// Shared memory per cube on an H100/H200 (`MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`).
const HOPPER_SHARED: usize = 227 << 10;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(
        args.next()
            .ok_or("usage: cuda_sources OUT_DIR [HEAD_DIM]")?,
    );
    let d: usize = args.next().map_or(Ok(128), |s| s.parse())?;
    std::fs::create_dir_all(&out)?;
    let client = WgpuRuntime::client(&WgpuDevice::default());
    let dp = d.div_ceil(k::TILE) * k::TILE;
    for (name, dtype, elem) in [
        (
            "bf16",
            StorageType::Scalar(ElemType::Float(FloatKind::BF16)),
            2,
        ),
        (
            "f16",
            StorageType::Scalar(ElemType::Float(FloatKind::F16)),
            2,
        ),
    ] {
        for kernel in [Kernel::Forward, Kernel::BackwardQ, Kernel::BackwardKv] {
            let (rows, cols) = tiled::tile_shape(kernel, d, d, elem, HOPPER_SHARED)?;
            let settings = KernelSettings::default()
                .cube_dim(CubeDim::new_2d(32, (tiled::UNITS / 32) as u32))
                .address_type(AddressType::U32);
            let t = || TensorCompilationArg { inplace: None };
            let units = tiled::UNITS;
            let source = match kernel {
                Kernel::Forward => compile(k::tiled_forward::TiledForward::<WgpuRuntime>::new(
                    settings,
                    client.clone(),
                    t(),
                    t(),
                    t(),
                    t(),
                    t(),
                    (),
                    VECTOR,
                    dp,
                    dp,
                    rows,
                    cols,
                    units,
                    true,
                    dtype,
                ))?,
                Kernel::BackwardQ => {
                    compile(k::tiled_backward_q::TiledBackwardQ::<WgpuRuntime>::new(
                        settings,
                        client.clone(),
                        t(),
                        t(),
                        t(),
                        t(),
                        t(),
                        t(),
                        t(),
                        t(),
                        (),
                        VECTOR,
                        dp,
                        dp,
                        rows,
                        cols,
                        units,
                        true,
                        dtype,
                    ))?
                }
                Kernel::BackwardKv => {
                    compile(k::tiled_backward_kv::TiledBackwardKv::<WgpuRuntime>::new(
                        settings,
                        client.clone(),
                        t(),
                        t(),
                        t(),
                        t(),
                        t(),
                        t(),
                        t(),
                        t(),
                        (),
                        VECTOR,
                        dp,
                        dp,
                        rows,
                        cols,
                        units,
                        true,
                        dtype,
                    ))?
                }
            };
            let file = out.join(format!("{kernel:?}-{name}-d{d}-{rows}x{cols}.cu"));
            std::fs::write(&file, source)?;
            println!("{}", file.display());
        }
    }
    Ok(())
}

/// The CUDA C++ source `CudaCompiler` generates for `kernel`.
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
    Ok(compiled.source)
}
