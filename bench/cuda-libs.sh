# Sourced by bench/gpu.sh and bench/gpu-tests.sh on the GPU machine: makes NVIDIA's cuBLAS
# loadable for `REEL_MATMUL=cublas` (Reel loads `libcublas.so.*` at run time, as CubeCL loads
# NVRTC). The loader's own path first; else the CUDA toolkit's lib64; else the `nvidia-*`
# wheels of the Python that holds PyTorch (`nvidia/cublas/lib`, or `nvidia/cu13/lib`).
cuda_libs() {
  local d dirs=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib)
  if ldconfig -p 2>/dev/null | grep -q 'libcublas\.so'; then return 0; fi
  mapfile -t -O ${#dirs[@]} dirs < <("${PYTHON:-python3}" -c '
import os, nvidia
for p in nvidia.__path__:
    for s in sorted(os.listdir(p)):
        print(os.path.join(p, s, "lib"))' 2>/dev/null)
  for d in "${dirs[@]}"; do
    if compgen -G "$d/libcublas.so*" >/dev/null; then
      export LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
      echo "cuBLAS from $d" >&2
      return 0
    fi
  done
  echo "no libcublas found: REEL_MATMUL=cublas falls back to Burn's matmul" >&2
}
cuda_libs
