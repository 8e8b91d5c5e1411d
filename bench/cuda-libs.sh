# shellcheck shell=bash
# Sourced by bench/gpu.sh and bench/gpu-tests.sh on the GPU machine: makes the NVIDIA
# libraries that Reel loads at run time (as CubeCL loads NVRTC) loadable:
# - `libcublas.so.*`, for the `cublas*` matmul kernels (the `cuda` default);
# - `libcupti.so.*`, with which `cublas-stream` finds CubeCL's stream;
# - `libcudnn.so.*`, for the attention on cuDNN (the `cuda` default of `flash`; cuDNN 9 loads
#   its engine libraries from the same directory);
# - `libnvrtc.so.*`, with which cuDNN compiles its runtime-fusion engines (the attention
#   graphs' engines are of that kind); CubeCL finds NVRTC by its own search, cuDNN only
#   through the loader, so a machine where CubeCL runs can still leave cuDNN without it.
# For each: the loader's own path first; else the CUDA toolkit's lib64 (and CUPTI's
# extras/CUPTI/lib64); else the `nvidia-*` wheels of the Python that holds PyTorch
# (`nvidia/cublas/lib`, `nvidia/cuda_cupti/lib`, `nvidia/cudnn/lib`, `nvidia/cuda_nvrtc/lib`,
# or `nvidia/cu13/lib`).
cuda_libs() {
  local lib d dirs=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib
    /usr/local/cuda/extras/CUPTI/lib64)
  mapfile -t -O ${#dirs[@]} dirs < <("${PYTHON:-python3}" -c '
import os, nvidia
for p in nvidia.__path__:
    for s in sorted(os.listdir(p)):
        print(os.path.join(p, s, "lib"))' 2>/dev/null)
  for lib in libcublas libcupti libcudnn libnvrtc; do
    # Not `grep -q`: it would stop ldconfig with SIGPIPE, a failed pipeline under pipefail.
    if ldconfig -p 2>/dev/null | grep "$lib\.so" >/dev/null; then continue; fi
    for d in "${dirs[@]}" ""; do
      if [[ -z $d ]]; then
        echo "no $lib.so found: Reel falls back without it" >&2
      elif compgen -G "$d/$lib.so*" >/dev/null; then
        export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        echo "$lib from $d" >&2
        break
      fi
    done
  done
  # The versions of the NVIDIA wheels (PyTorch's), cuDNN's above all: which attention calls
  # Reel hands to cuDNN depends on it (docs/performance.md, "cuDNN versions").
  "${PYTHON:-python3}" -c '
import importlib.metadata as m
names = ("nvidia-cudnn", "nvidia-cublas", "nvidia-cuda-cupti", "nvidia-cuda-nvrtc", "torch")
for d in m.distributions():
    n = d.metadata["Name"] or ""
    if n.startswith(names):
        print(f"{n} {d.version}")' 2>/dev/null | sort >&2 || true
}
cuda_libs
