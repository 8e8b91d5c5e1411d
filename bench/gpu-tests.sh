#!/usr/bin/env bash
# The CUDA test suite on the GPU machine, from test binaries built here: the GPU machine
# reaches no network, so cargo cannot fetch crates or build there.
#
#   BUILD_ONLY=1 bench/gpu-tests.sh   # here: builds the `--features cuda` test binaries of
#                                     # reel-core and reel-models, strips them and packs
#                                     # bench/bin/reel-cuda-tests.tar.xz (16.5 MB, 2026-12-04;
#                                     # carry it; the commit it was built from is in
#                                     # cuda-tests/REV)
#   bench/gpu-tests.sh                # there: unpacks them and runs every CUDA test
#
# BUILD_ONLY packs every binary that holds a test named `cuda`, whatever FILTER says (a FILTER
# set here must not make a narrow tarball, which bench/bin-cache.sh would keep for the
# commit). It refuses (exit 1, no REV, no tarball) when the crates have uncommitted changes or
# change while cargo builds (bench/source-rev.sh before and after): the binaries would then be
# of no one commit.
#
# The CUDA tests are the ones whose name contains `cuda` (the `cuda` modules and the
# `cuda_*` functions): the fused attention and tiled tensor-core kernels, cubek's flash
# forward, the fused AdamW/EMA kernels, the diffusers parity tests at the TF32 bar and the
# bf16 model checks. FILTER replaces that filter (several space-separated names: the tests
# matching any of them); OUT_LOG (default $OUT/gpu-tests.log when
# $OUT is set) receives the whole log. Each binary gets at most TEST_TIMEOUT_S seconds
# (default 240) per name of FILTER that it holds tests for, so that a hung or slow kernel
# cannot take the whole device session nor the other names' results, and all of them
# together at most TESTS_BUDGET_S (default 300, from this script's start: one 600-s device
# command then leaves the session plan about 280 s); a binary that finds less than 15 s of it
# left is not started, and listed as skipped. Exits non-zero when a test binary fails, times
# out or is skipped, or when a name of FILTER matches no test in any binary (a typo would
# otherwise run nothing and pass), or no test ran at all.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
BIN_DIR=${BIN_DIR:-bench/bin}
TEST_DIR=$BIN_DIR/cuda-tests
FILTER=${FILTER:-cuda}
TEST_TIMEOUT_S=${TEST_TIMEOUT_S:-240}
TESTS_BUDGET_S=${TESTS_BUDGET_S:-300}

if [[ -n ${BUILD_ONLY:-} ]]; then
  set -e
  # The crates' commit before the build (compared after it, below): dirty sources are refused
  # now, before 35 minutes of building, since their binaries would be of no one commit.
  rev=$(bench/source-rev.sh)
  if [[ $rev == *-dirty ]]; then
    echo "gpu-tests: the crates' sources are '$rev': commit them first (no binaries built)" >&2
    exit 1
  fi
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
    # Only binaries that hold a CUDA test, whatever FILTER is (the listing is read whole:
    # `grep -q` would stop the binary with SIGPIPE, a failed pipeline under pipefail).
    tests=$("$path" --list 2>/dev/null)
    if grep -qF cuda <<<"$tests"; then
      strip -o "$TEST_DIR/$name" "$path"
    fi
  done <"$TEST_DIR/list"
  rm "$TEST_DIR/list"
  # The sources must not have changed while cargo built: else the binaries are a mix.
  after=$(bench/source-rev.sh)
  if [[ $after != "$rev" ]]; then
    echo "gpu-tests: the crates' sources changed during the build ('$rev' before, '$after'" \
      "after): no REV written and no tarball packed; build again once they are committed" >&2
    # An older tarball is not of these sources either: it is not left to be carried.
    rm -f "$BIN_DIR/reel-cuda-tests.tar.xz"
    exit 1
  fi
  # The commit the binaries come from, printed at the top of the log there.
  echo "$rev" >"$TEST_DIR/REV"
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
out=$(mktemp); trap 'rm -f "$out"' EXIT
failed=() skipped=() unmatched=()
declare -A matched=()
ran=0
for t in "$TEST_DIR"/*; do
  [[ -x $t ]] || continue
  for f in $FILTER; do
    # The tests of this binary that libtest's filter selects (a substring of the name); a
    # binary that cannot even list them (a missing library) fails here, not as "no match".
    listing=$("$t" "$f" --list 2>&1) || {
      failed+=("$(basename "$t") (--list failed: $(tail -1 <<<"$listing"))")
      break
    }
    count=$(grep -c ': test$' <<<"$listing")
    ((count > 0)) || continue
    matched[$f]=$((${matched[$f]:-0} + count))
    # At most TEST_TIMEOUT_S, and no more than TESTS_BUDGET_S leaves.
    limit=$((TESTS_BUDGET_S - (SECONDS - start)))
    if ((limit < 15)); then
      echo "=== $(basename "$t") ($f, $count tests): skipped, $limit s of TESTS_BUDGET_S left" | tee -a "$log"
      skipped+=("$(basename "$t") $f")
      continue
    fi
    stop="stopped: TESTS_BUDGET_S spent"
    if ((limit >= TEST_TIMEOUT_S)); then limit=$TEST_TIMEOUT_S stop="timed out"; fi
    echo "=== $(basename "$t") ($f, $count tests, at most $limit s)" | tee -a "$log"
    # Tests of one binary share the GPU; one thread keeps their memory and timings apart.
    : >"$out"
    timeout -k 5 "$limit" "$t" "$f" --test-threads 1 --nocapture 2>&1 | tee -a "$log" "$out"
    rc=${PIPESTATUS[0]}
    # The tests that ran and passed, from libtest's summary line.
    ran=$((ran + $(grep -oE 'test result: [A-Za-z]+\. [0-9]+ passed' "$out" | awk '{s += $4} END {print s + 0}')))
    case $rc in
      0) ;;
      124 | 137) failed+=("$(basename "$t") $f ($stop)") ;;
      *) failed+=("$(basename "$t") $f") ;;
    esac
  done
done
for f in $FILTER; do ((${matched[$f]:-0} > 0)) || unmatched+=("$f"); done
status=0
if ((${#unmatched[@]})); then
  echo "NO TEST MATCHES (FILTER) in $TEST_DIR: ${unmatched[*]}" | tee -a "$log"
  status=1
fi
if ((${#skipped[@]})); then
  echo "SKIPPED (TESTS_BUDGET_S=$TESTS_BUDGET_S spent): ${skipped[*]}" | tee -a "$log"
  status=1
fi
if ((${#failed[@]})); then
  echo "FAILED: ${failed[*]}" | tee -a "$log"
  status=1
fi
if ((status == 0 && ran == 0)); then
  echo "no test ran (FILTER='$FILTER' matched only ignored tests?)" | tee -a "$log"
  status=1
fi
if ((status == 0)); then
  echo "all $ran CUDA tests passed (FILTER='$FILTER', $((SECONDS - start)) s)" | tee -a "$log"
fi
exit $status
