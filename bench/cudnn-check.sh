#!/usr/bin/env bash
# cuDNN's attention graphs (the `cuda` default of `flash`, models/src/wan/fused_attention/cudnn/) checked
# without a GPU: cuDNN's heuristics must propose engines for the forward and backward graphs on
# an H100 described by its properties (`cuda_cudnn_heuristics_take_the_graphs`), and so must
# the VAE's convolution graphs (`REEL_VAE_CONV=cudnn`; `..._take_the_conv_graphs`). A graph whose
# pattern cuDNN's fused attention engines do not recognise gets none, which here costs a CPU
# build instead of a GPU session. Making the plans needs the device: on the GPU machine,
# `bench/gpu-tests.sh` runs the rest (`cuda_cudnn_attention_matches_naive`).
#
#   bench/cudnn-check.sh                    # first run: ~1.3 GB of wheels, and the `cuda`
#                                           # test build
#   CUDNN=9.14.0.64 bench/cudnn-check.sh    # another cuDNN: the GPU machine's PyTorch wheel
#                                           # shipped 9.14.0 (2026-11-30), which needs the
#                                           # backward's padding mask off the 128 grid
#
# What it installs, once per cuDNN version, under CACHE (default ~/.cache/reel-cudnn-$CUDNN):
# - the PyPI wheels of cuDNN 9 and of the cuBLAS and NVRTC that cuDNN's heuristics and
#   engines load (NVIDIA's own packages, the ones PyTorch installs), unpacked into lib/;
# - stub/libcuda.so.1: every CUDA driver function those libraries name, each returning
#   CUDA_ERROR_NO_DEVICE. cuDNN links the driver, which a machine without a GPU lacks; the
#   graph checks never reach a device, and a plan's first driver call fails cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
# The versions checked on 2026-11-28 (cuDNN 9.28, CUDA 12.9's cuBLAS and NVRTC); cuDNN 9.14
# too on 2026-11-30. Describing a device to cuDNN (what the check does) needs cuDNN 9.8.
CUDNN=${CUDNN:-9.28.0.42}
CACHE=${CACHE:-$HOME/.cache/reel-cudnn-$CUDNN}
WHEELS=${WHEELS:-"nvidia-cudnn-cu12==$CUDNN nvidia-cublas-cu12==12.9.3.13 nvidia-cuda-nvrtc-cu12==12.9.86"}

if [[ ! -e $CACHE/lib/libcudnn.so.9 ]]; then
  mkdir -p "$CACHE/wheels" "$CACHE/lib"
  # shellcheck disable=SC2086 # a list of requirements
  "${PYTHON:-python3}" -m pip download --no-deps --only-binary=:all: -d "$CACHE/wheels" $WHEELS
  "${PYTHON:-python3}" - "$CACHE" <<'PY'
import glob, os, sys, zipfile
cache = sys.argv[1]
for wheel in glob.glob(os.path.join(cache, "wheels", "*.whl")):
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if "/lib/" in name and ".so" in name:
                with z.open(name) as src, open(os.path.join(cache, "lib", os.path.basename(name)), "wb") as dst:
                    dst.write(src.read())
PY
fi

if [[ ! -e $CACHE/stub/libcuda.so.1 ]]; then
  mkdir -p "$CACHE/stub"
  for lib in "$CACHE"/lib/*.so*; do strings -n 4 "$lib" | grep -x 'cu[A-Z][A-Za-z0-9_]*' || true; done |
    grep -v '^cudnn\|^cublas\|^cuda[A-Z]' | sort -u |
    sed 's/.*/int &(void) { return 100; }/' >"$CACHE/stub/stub.c"
  gcc -shared -fPIC -o "$CACHE/stub/libcuda.so.1" "$CACHE/stub/stub.c"
fi

export LD_LIBRARY_PATH=$CACHE/lib:$CACHE/stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cargo test --release -p reel-models --features cuda --lib -- \
  cuda_cudnn_heuristics_take_the --nocapture
