#!/usr/bin/env bash
# The CUDA test suite on the GPU machine, from test binaries built here: the GPU machine
# reaches no network, so cargo cannot fetch crates or build there.
#
#   BUILD_ONLY=1 bench/gpu-tests.sh   # here: builds the `--features cuda` test binaries of
#                                     # reel-core and reel-models, strips them and packs
#                                     # bench/bin/reel-cuda-tests.tar.xz (carry it; the
#                                     # commit it was built from is in cuda-tests/REV)
#   bench/gpu-tests.sh                # there: unpacks them and runs every CUDA test
#
# The CUDA tests are the ones whose name contains `cuda` (the `cuda` modules and the
# `cuda_*` functions): the fused attention and tiled tensor-core kernels, cubek's flash
# forward, the fused AdamW/EMA kernels, the diffusers parity tests at the TF32 bar and the
# bf16 model checks. FILTER replaces that filter (several space-separated names: the tests
# matching any of them); OUT_LOG (default $OUT/gpu-tests.log when
# $OUT is set) receives the whole log. Each binary gets at most TEST_TIMEOUT_S seconds
# (default 240) per name of FILTER that it holds tests for, so that a hung or slow kernel
# cannot take the whole device session nor the other names' results. Exits non-zero when a
# test binary fails or times out.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN_DIR=${BIN_DIR:-bench/bin}
TEST_DIR=$BIN_DIR/cuda-tests
FILTER=${FILTER:-cuda}

if [[ -n ${BUILD_ONLY:-} ]]; then
  set -e
  rm -rf "$TEST_DIR" && mkdir -p "$TEST_DIR"
  # One line per test executable: "<package>-<target> <path>". The test command's profile
  # (tests/profile.toml: Reel's crates at opt-level 1, dependencies at 3), as in CI: CubeCL
  # compiles the kernels at run time, and the two crates' test binaries built in 21 min
  # instead of 34 on a 2-core machine (2026-12-01, docs/architecture.md).
  cargo test --release --config tests/profile.toml --features cuda -p reel-core -p reel-models --no-run \
    --message-format=json-render-diagnostics |
    python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    exe = m.get("executable")
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and exe:
        crate = os.path.basename(os.path.dirname(m["manifest_path"]))
        print(crate + "-" + m["target"]["name"], exe)
' >"$TEST_DIR/list"
  while read -r name path; do
    # Only binaries that hold a CUDA test (the listing is read whole: `grep -q` would stop
    # the binary with SIGPIPE, a failed pipeline under pipefail).
    tests=$("$path" --list 2>/dev/null)
    if grep -qE "${FILTER// /|}" <<<"$tests"; then
      strip -o "$TEST_DIR/$name" "$path"
    fi
  done <"$TEST_DIR/list"
  rm "$TEST_DIR/list"
  # The commit the binaries come from, printed at the top of the log there.
  bench/source-rev.sh >"$TEST_DIR/REV"
  # The binaries share most of their code: a 256 MiB window (more than one binary) packs
  # them against each other (xz needs as much memory to unpack them).
  XZ_OPT=${XZ_OPT:-"--lzma2=preset=9,dict=256MiB"} tar -C "$BIN_DIR" -cJf "$BIN_DIR/reel-cuda-tests.tar.xz" cuda-tests
  ls -l "$TEST_DIR" "$BIN_DIR/reel-cuda-tests.tar.xz"
  exit 0
fi

# shellcheck source=bench/unpack.sh
source bench/unpack.sh
unpack "$BIN_DIR/reel-cuda-tests.tar.xz" "$BIN_DIR"
[[ -d $TEST_DIR ]] || { echo "missing $TEST_DIR: run BUILD_ONLY=1 $0 first" >&2; exit 2; }
# shellcheck source=bench/cuda-libs.sh
source bench/cuda-libs.sh
# The fixtures travel with the working tree; the binaries' built-in paths point at the
# machine that built them.
export REEL_WAN_FIXTURES=${REEL_WAN_FIXTURES:-$PWD/tests/fixtures/wan_tiny}
export REEL_VAE_FIXTURES=${REEL_VAE_FIXTURES:-$PWD/tests/fixtures/wan_vae_tiny}
export REEL_T5_FIXTURES=${REEL_T5_FIXTURES:-$PWD/tests/fixtures/umt5_tiny}
log=${OUT_LOG:-${OUT:+$OUT/gpu-tests.log}}
log=${log:-/dev/null}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$log"
echo "test binaries built from commit $(cat "$TEST_DIR/REV" 2>/dev/null || echo unknown)" | tee -a "$log"
failed=()
for t in "$TEST_DIR"/*; do
  [[ -x $t ]] || continue
  tests=$("$t" --list 2>/dev/null)
  for f in $FILTER; do
    grep -qF -- "$f" <<<"$tests" || continue
    echo "=== $(basename "$t") ($f)" | tee -a "$log"
    # Tests of one binary share the GPU; one thread keeps their memory and timings apart.
    timeout -k 5 "${TEST_TIMEOUT_S:-240}" "$t" "$f" --test-threads 1 --nocapture 2>&1 | tee -a "$log"
    case ${PIPESTATUS[0]} in
      0) ;;
      124 | 137) failed+=("$(basename "$t") $f (timed out)") ;;
      *) failed+=("$(basename "$t") $f") ;;
    esac
  done
done
if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}" | tee -a "$log"
  exit 1
fi
echo "all CUDA tests passed" | tee -a "$log"
