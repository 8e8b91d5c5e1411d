#!/usr/bin/env bash
# The tiled tensor-core attention kernels compiled for NVIDIA GPUs, without a GPU: registers,
# spills and PTX size per kernel, and NVRTC's errors if the generated CUDA does not compile.
#
#   bench/cuda-compile.sh [HEAD_DIM [TILE_SPEC...]]
#
# HEAD_DIM defaults to 128 (Wan's); each TILE_SPEC (REEL_TILED_TILES' syntax, e.g. 64x64x128
# or forward=32x64) adds a set of kernels, the default shapes when none is given; ARCHS
# defaults to "sm_90a sm_80".
#
# 1. `models/examples/cuda_sources.rs` defines each kernel (forward, backward_q, backward_kv;
#    bf16 and f16, tensor-core products, the tile shapes an H100 gets) and writes the CUDA
#    C++ that CubeCL's CUDA compiler generates from it. It needs a CubeCL client of any kind
#    to define kernels on: the wgpu one, on a Vulkan driver (Mesa's lavapipe, as the tests).
# 2. NVIDIA's NVRTC, `ptxas` and CUDA headers (with CCCL's, for `cuda/barrier`) come from their PyPI wheels, downloaded once
#    into $CUDA_TOOLS (default ~/.cache/reel-cuda-tools); they compile each source to PTX as
#    CubeCL does at run time (the PTX is kept beside each source, NAME.ARCH.ptx, to read which
#    instructions a change produced), then `ptxas -v` assembles it for each architecture.
# 3. From each kernel's registers, shared memory and units: the cubes a multiprocessor holds
#    (H100/H200 for sm_90a, A100 for sm_80); and from its machine code (`nvdisasm`, NAME.cubin
#    beside the PTX) the instructions of its hottest loop, the loop over key tiles: HMMA
#    (tensor-core products), LDSM (`ldmatrix`), shared-memory and generic loads and stores,
#    barriers (bench/sass_stats.py).
#
# A kernel with spills, or more than 128 registers per unit at 128 units per cube (fewer
# than four cubes' worth of registers per multiprocessor), is worth a look before a GPU
# session measures it. Exits non-zero when a kernel fails to compile.
set -euo pipefail
cd "$(dirname "$0")/.."
HEAD_DIM=${1:-128}
SPECS=("${@:2}")
CUDA_TOOLS=${CUDA_TOOLS:-$HOME/.cache/reel-cuda-tools}
OUT=${OUT_DIR:-${TMPDIR:-/tmp}/reel-cuda-sources}
export ARCHS=${ARCHS:-"sm_90a sm_80"}

if [[ ! -x $CUDA_TOOLS/nvidia/cuda_nvcc/bin/ptxas || ! -d $CUDA_TOOLS/nvidia/cuda_cccl ]]; then
  mkdir -p "$CUDA_TOOLS/wheels"
  python3 -m pip download -q --no-deps -d "$CUDA_TOOLS/wheels" \
    'nvidia-cuda-nvrtc-cu12==12.8.*' 'nvidia-cuda-nvcc-cu12==12.8.*' \
    'nvidia-cuda-runtime-cu12==12.8.*' 'nvidia-cuda-cccl-cu12==12.8.*'
  for w in "$CUDA_TOOLS"/wheels/*.whl; do
    python3 -m zipfile -e "$w" "$CUDA_TOOLS"
  done
  chmod +x "$CUDA_TOOLS/nvidia/cuda_nvcc/bin/ptxas"
fi
# NVIDIA's disassembler (its CUDA 13 wheel reads sm_80/sm_90 machine code) for the hot-loop
# columns; without it (no registry) those columns stay empty.
if [[ ! -x $CUDA_TOOLS/nvidia/cu13/bin/nvdisasm ]]; then
  mkdir -p "$CUDA_TOOLS/wheels"
  if python3 -m pip download -q --no-deps -d "$CUDA_TOOLS/wheels" 'nvidia-cuda-nvdisasm==13.2.86'; then
    python3 -m zipfile -e "$CUDA_TOOLS"/wheels/nvidia_cuda_nvdisasm-*.whl "$CUDA_TOOLS"
    chmod +x "$CUDA_TOOLS/nvidia/cu13/bin/nvdisasm"
  fi
fi

# A Vulkan driver for the client the kernels are defined on (see .ci/run).
if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then
  sudo_=$([[ $(id -u) == 0 ]] || echo sudo)
  $sudo_ apt-get install -y -q mesa-vulkan-drivers >/dev/null
fi
rm -rf "$OUT" && mkdir -p "$OUT"
XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)} \
  cargo run -q --release -p reel-models --features cuda,wgpu --example cuda_sources -- \
  "$OUT" "$HEAD_DIM" "${SPECS[@]}" >/dev/null
python3 bench/cuda_compile.py "$CUDA_TOOLS" "$OUT"/*.cu
