#!/usr/bin/env bash
# The GPU measurements in one command: Reel's CUDA build variants x attention x dtype x
# gradient checkpointing, with PyTorch + diffusers beside each (shape, dtype, checkpointing)
# in the same run, the `--breakdown` of the fine-tuning and DMD2 steps at ~29k tokens, and the
# Wan VAE (decode/encode of 81x480x832) and UMT5-XXL (512 tokens).
# Writes bench/results/<date>-<gpu>[-<TAG>].{json,md} (RESULTS_DIR; and a copy under $OUT,
# with every run's raw output and stderr as <date>-<gpu>[-<TAG>]-logs.tgz) after every run, so
# a run cut short still leaves what it measured: one row per Reel run with the device, the
# date, the build variant and the Reel/PyTorch `ratio`. Commit the JSON of every GPU run.
#
# GPU minutes are scarce, so build here and only measure there:
#   BUILD_ONLY=1 PLAN=session bench/gpu.sh   # here: bench/bin/reel-cuda-plain, stripped, and
#                                  # bench/bin/reel-cuda.tar.xz (23 MB with diffusers' wheel,
#                                  # 6 MB; 2026-12-04) to carry. Without PLAN=session it builds
#                                  # the matrix's three variants (about 70 minutes more here).
#   PLAN=session bench/gpu.sh      # there: the prioritized runs below, within BUDGET_S
#   bench/gpu.sh                   # there: the whole matrix (unpacks the tarball when needed)
#
# PLAN=session (for a session with 15 device minutes; BUDGET_S defaults to 500 seconds, so one
# 10-minute command holds it): first the self-attention alone at 8190 tokens (every Reel
# kernel and PyTorch's, `reel bench --attention-only`; only when ATTENTION is `pick` or TILES
# lists launch shapes) and the blocks' matrix products alone
# (Burn's matmul and each kernel of MATMUL_KERNELS, `reel bench --matmul-only`); then bf16 with
# ATTENTION (default `pick`: the mode fastest in that run; or name one), in this order, each
# Reel row beside PyTorch's: 8190 tokens with checkpointing for every variant (default
# VARIANTS="plain"), and again with REEL_MATMUL pinning the matmul-alone run's fastest kernels
# (when they are not the `cuda` default, cuBLAS on CubeCL's stream), and with each pin of
# STEP_PINS (default "cublas-queued": cuBLAS on CubeCL's stream, queued on CubeCL's server
# thread), and, with ATTENTION flash, once with
# each value of REEL_FLASH in FLASH_PINS (default "cudnn-queued": cuDNN called from CubeCL's
# server thread, where the `cuda` default calls it from the training thread) and the fastest
# matmul pin so far; then, with the variant (and pins) that was fastest there, one step
# profiled per kernel (CubeCL's profiler, `profile_job`; with autotune, its choices are logged
# too; at PROFILE_SHAPE, default 8,32,32: 2048 tokens, with PROFILE_CKPT, default 0: no
# checkpointing), the fine-tuning step's breakdown (`--breakdown`: each
# phase's time and host time), the 8190-token step with REEL_BLOCK_KERNELS=off,
# 29120 tokens with checkpointing, the breakdown of configs/dmd2_wan.toml at its shipped 29120
# tokens (random weights and data), the 29120-token step again with CubeCL's memory log
# (MEMLOG), 2048 tokens without checkpointing and that step's breakdown, the breakdown of
# configs/finetune_wan.toml, and last the VAE's encode and decode of a small clip profiled per
# kernel (VAE_PROFILE, VAE_PROFILE_VIDEO), then ENCODER_RUNS: the VAE decode/encode of
# 81x480x832 in 256-px tiles, Burn's convolution against gemm on 5x240x416, UMT5 on 512
# tokens (one timed run each, ENCODER_STEPS).
# What the budget leaves out is listed as skipped. PROFILE=0 skips the profiled step and
# BLOCK_KERNELS_OFF=0 the step with REEL_BLOCK_KERNELS=off (both already measured once).
#
# The attention-alone run also times `flash` with each launch shape of TILES (the tiled
# kernels' rows x cols x units per cube, `reel bench --attention-only --tiles`); when one of
# those rows is the fastest, every later run gets it through REEL_TILED_TILES (shown beside
# the attention mode in the tables): the forward kernel's shape from the row with the fastest
# forward, the backward kernels' from the row with the fastest backward. TILES="" times the
# default shapes alone.
#
# If no variant's 8190-token row ran with ATTENTION, the rest of the plan falls back to
# attention=fused (after one fused row at 8190 tokens).
#
# PLAN=matrix (the default) runs the attention alone at each shape, then every combination of
# these axes (space-separated values), so one session can run it in slices:
#   SHAPES="8,32,32 21,30,52 20,56,104"   latent F,H,W: 2048, 8190 and 29120 tokens (patch 1x2x2)
#   VARIANTS="plain fusion fusion+autotune"   ATTENTION="memory_efficient fused flash"
#   DTYPES="f32 bf16"   CKPTS="0 1"   PRESET=wan2.1-t2v-1.3b   BATCH=1   STEPS=3   WARMUP=1
#   BREAKDOWN_SHAPE=20,56,104 (empty: skip)   BREAKDOWN_VARIANT=<first of VARIANTS>   TAG=slice1
#   BREAKDOWN_RUNS="finetune finetune-flash finetune-unfused dmd2 dmd2-flash" (-unfused:
#   optimizer.fused = false; -flash: attention = "flash", tensor-core attention in bf16)
#   TORCH=0 skips PyTorch (rows keep `torch_step_ms: null`); PYTHON picks its interpreter.
#   ENCODERS=0 skips the VAE / UMT5 runs; ENCODER_RUNS="<reel bench args>;..." replaces them
#   (a run's leading NAME=value words are its environment, e.g. REEL_VAE_CONV=burn; each
#   run's arguments also time PyTorch once, bench/pytorch/bench_encoders.py, unless TORCH=0).
# ONLY (session settings) runs one or more of the plan's last parts alone, in the order given,
# as a short second call on the warm machine when the plan's call ran out before them; pass
# the first call's picks as ATTENTION (default flash), REEL_MATMUL and REEL_FLASH:
#   ONLY=configs: 29120 tokens (PyTorch and Reel), configs/dmd2_wan.toml (DMD2_STEPS, default
#     5: the config updates the generator every fifth step) and configs/finetune_wan.toml;
#   ONLY=encoders: the VAE's passes profiled per kernel (VAE_PROFILE), then the VAE and UMT5
#     (ENCODER_RUNS); ENCODERS=only is the same;
#   ONLY=small: 2048 tokens without checkpointing (PyTorch and Reel; Reel again with the
#     `cuda` defaults when REEL_MATMUL or REEL_FLASH pin others, else with each of STEP_PINS,
#     alone and with each of FLASH_PINS), that step profiled per kernel and its breakdown;
#   ONLY=memory: the 29120-token step with CubeCL's memory log (memlog_job);
#   ONLY=host: bench/host-overhead.sh on cuda (the host's cost per step by depth, kernels
#     next to nothing), its table in <results>-host.md, once per GPU_MEMORY mode and once
#     with each of STEP_PINS, alone and with each of FLASH_PINS.
#   GPU_MEMORY (default "exact"): REEL_GPU_MEMORY modes run beside the default `pages`: in
#     `small` a Reel row at 2048 tokens each, in `memory` the 29120-token step each (GPU
#     memory beside pages'), in `host` a table each ("" runs pages alone).
#   e.g. `ONLY="configs encoders" BUDGET_S=240 bench/gpu.sh`; results go to
#   <date>-<gpu>-<ONLY's words joined by '-'> (TAG). ONLY needs BUDGET_S set: the session
#   plan's 500 s would overrun a later call's device time, which only the caller knows.
# BUDGET_S (both plans; empty: none) bounds the whole run: each run gets at most the time
# left, and runs that no longer fit are recorded as skipped.
# 29k tokens without checkpointing do not fit 80 GB for Reel or PyTorch: a run that fails
# (out of memory) is recorded with `error` and the list goes on.
set -uo pipefail
cd "$(dirname "$0")/.."
# The budget counts from this script's start (unpacking and the library search take time too):
# from SECONDS now, not 0, since a caller's exported SECONDS is inherited.
start=$SECONDS
# An empty pin is no pin (REEL_MATMUL="" would not parse, and fall back to Burn's matmul, not
# the `cuda` default).
for pin in REEL_MATMUL REEL_FLASH REEL_TILED_TILES; do
  if [[ -n ${!pin+x} && -z ${!pin} ]]; then unset "$pin"; fi
done
# ONLY: the plan's last parts alone (above); ENCODERS=only is ONLY=encoders.
ONLY=${ONLY:-}
if [[ ${ENCODERS:-1} == only ]]; then ONLY=${ONLY:-encoders}; fi
for part in $ONLY; do
  case $part in
    configs | encoders | small | memory | host) ;;
    *) echo "ONLY takes 'configs', 'encoders', 'small', 'memory' and 'host', not '$part'" >&2; exit 2 ;;
  esac
done
if [[ -n $ONLY ]]; then PLAN=session; fi
# A part run alone is a later, short call: the session plan's default budget (500 s) would
# run past the device time left, which only the caller knows (the device tool's `status`).
if [[ -n $ONLY && -z ${BUDGET_S+x} && -z ${BUILD_ONLY:-} ]]; then
  echo "ONLY='$ONLY' needs BUDGET_S: the seconds this call may take (the device time left less" \
    "a minute for the results to come back, at most 540), e.g. BUDGET_S=240; BUDGET_S= runs" \
    "without a bound" >&2
  exit 2
fi
PLAN=${PLAN:-matrix}
PRESET=${PRESET:-wan2.1-t2v-1.3b}
BATCH=${BATCH:-1}
BIN_DIR=${BIN_DIR:-bench/bin}
PYTHON=${PYTHON:-python3}
TORCH=${TORCH:-1}
GPU_MEMORY=${GPU_MEMORY-exact}
case $PLAN in
  session)
    # `fusion` trained 4x slower than `plain` on an H200 (2026-11-26, 8190 tokens); it stays in
    # the matrix. `autotune` tunes Burn's matmul, which the linear layers no longer use on
    # `cuda` (cuBLAS is the default since the H100 run of 2026-11-27); it stays in the matrix.
    VARIANTS=${VARIANTS:-"plain"}
    # `pick`: the attention mode the attention-alone run found fastest (flash if none ran).
    ATTENTION=${ATTENTION:-pick}
    # Launch shapes beside the defaults (tiles.rs: on CUDA, forward=128x64x256mp,
    # backward_q=64x32x128mp, backward_kv=64x32x128mp, the fastest of 2026-11-27's H100 runs,
    # twice): none by default now; bench/cuda-compile.sh lists candidates (`m`: manual mma,
    # everything in registers; `p`: with it, tiles streamed by asynchronous copies).
    TILES=${TILES-""}
    # The kernels timed on the blocks' products (`reel bench --matmul-only`) beside Burn's
    # matmul: NVIDIA's cuBLAS, ordered by host syncs (`cublas`), by flags
    # on the device (`cublas-async`) and on CubeCL's own stream (`cublas-stream`, the `cuda`
    # default since the H200 run of 2026-11-30; `cublas-queued` from CubeCL's server thread), and
    # the fastest cubek kernel of the H100 run of 2026-11-27 for reference. When the fastest is
    # not the default, the 8190-token step runs again pinned to it.
    MATMUL_KERNELS=${MATMUL_KERNELS-"cublas cublas-async cublas-stream cublas-queued specialized-tma-mma"}
    # The 8190-token and 2048-token steps again with each of these pins: another ordering than
    # the default, which the matmul-alone run cannot rank in a step (it times each product
    # alone). `cublas-async` took 1045 ms against the default's 678 (H200, 2026-11-30);
    # `cublas-queued` spares the host the default's three waits a product for CubeCL's server
    # thread (block_kernels/cublas_queued.rs).
    STEP_PINS=${STEP_PINS-"cublas-queued"}
    # The 8190-token step again with each of these REEL_FLASH values (`flash` attention only):
    # cuDNN called from CubeCL's server thread (`cudnn-queued`), where the `cuda` default calls
    # it from the training thread (Reel's tiled kernels, `reel`, took 678 ms against cuDNN's
    # 646 on the H200, 2026-11-30; the attention alone at 8190 tokens, both libraries, is in
    # that session's results).
    FLASH_PINS=${FLASH_PINS-"cudnn-queued"}
    # Four timed steps: two left medians that were means of 588 and 703 ms (H200, 2026-11-30).
    STEPS=${STEPS:-4}
    WARMUP=${WARMUP:-1}
    # One timed VAE decode/encode of 81x480x832 (after the warm-up) is enough for the table.
    ENCODER_STEPS=${ENCODER_STEPS:-1}
    # Five steps of the DMD2 config: it updates the generator every fifth step.
    DMD2_STEPS=${DMD2_STEPS:-5}
    # The VAE's decode and encode alone on 17x240x416 in 256-px tiles (the encode took over
    # three times the decode's on CUDA, 2026-11-30, where lavapipe's is shorter), the same two
    # on cuDNN's convolutions (REEL_VAE_CONV=cudnn, opt-in until measured), then the decode of
    # 81x480x832 (30.9 s, 2026-11-30), then UMT5; each with PyTorch's run beside it.
    ENCODER_RUNS=${ENCODER_RUNS:-"--vae wan2.1 --video 17 240 416 --vae-tile 256 --vae-op decode;--vae wan2.1 --video 17 240 416 --vae-tile 256 --vae-op encode;REEL_VAE_CONV=cudnn --vae wan2.1 --video 17 240 416 --vae-tile 256 --vae-op decode;REEL_VAE_CONV=cudnn --vae wan2.1 --video 17 240 416 --vae-tile 256 --vae-op encode;--vae wan2.1 --video 81 480 832 --vae-tile 256 --vae-op decode;--text-encoder umt5-xxl --text-len 512 --batch 1"}
    BUDGET_S=${BUDGET_S-500}
    ;;
  matrix)
    SHAPES=${SHAPES:-"8,32,32 21,30,52 20,56,104"}
    VARIANTS=${VARIANTS:-"plain fusion fusion+autotune"}
    ATTENTION=${ATTENTION:-"memory_efficient fused flash"}
    TILES=${TILES-}
    DTYPES=${DTYPES:-"f32 bf16"}
    CKPTS=${CKPTS:-"0 1"}
    STEPS=${STEPS:-3}
    WARMUP=${WARMUP:-1}
    ENCODER_RUNS=${ENCODER_RUNS:-"--vae wan2.1 --video 81 480 832;--vae wan2.1 --video 81 480 832 --vae-tile 256;--text-encoder umt5-xxl --text-len 512 --batch 1"}
    BUDGET_S=${BUDGET_S-}
    BREAKDOWN_SHAPE=${BREAKDOWN_SHAPE-20,56,104}
    BREAKDOWN_VARIANT=${BREAKDOWN_VARIANT:-${VARIANTS%% *}}
    BREAKDOWN_RUNS=${BREAKDOWN_RUNS:-"finetune finetune-flash finetune-unfused dmd2 dmd2-flash"}
    ;;
  *) echo "PLAN must be session or matrix, not '$PLAN'" >&2; exit 2 ;;
esac

if [[ -n ${BUILD_ONLY:-} ]]; then
  set -e
  BACKEND=cuda VARIANTS="$VARIANTS" BIN_DIR="$BIN_DIR" BUILD_ONLY=1 bench/variants.sh
  # The GPU machine's image has PyTorch but not diffusers, and it reaches no network: the
  # tarball carries diffusers' wheel (pure Python; what it requires is in the image).
  rm -rf "$BIN_DIR/wheels"
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$BIN_DIR/wheels" \
    "diffusers==${DIFFUSERS_VERSION:-0.42.1}"
  # The variants share most of their code: a 256 MiB window (more than one binary) packs
  # them against each other (one variant: 16 MB instead of 18).
  # shellcheck disable=SC2046 # one word per binary
  XZ_OPT=${XZ_OPT:-"--lzma2=preset=9,dict=256MiB"} tar -C "$BIN_DIR" -cJf "$BIN_DIR/reel-cuda.tar.xz" wheels $(for v in $VARIANTS; do echo "reel-cuda-$v reel-cuda-$v.rev"; done)
  ls -l "$BIN_DIR"
  exit 0
fi
# shellcheck source=bench/unpack.sh
source bench/unpack.sh
unpack "$BIN_DIR/reel-cuda.tar.xz" "$BIN_DIR"
for v in $VARIANTS; do
  [[ -x $BIN_DIR/reel-cuda-$v ]] || { echo "missing $BIN_DIR/reel-cuda-$v: run BUILD_ONLY=1 $0 first" >&2; exit 2; }
done
# The commit the binaries were built from (bench/variants.sh writes it beside each).
rev=$(cat "$BIN_DIR/reel-cuda-${VARIANTS%% *}.rev" 2>/dev/null || echo unknown)
echo "binaries built from commit $rev" >&2
# shellcheck source=bench/cuda-libs.sh
source bench/cuda-libs.sh
# Each run reuses the kernels the runs before it compiled (Reel's kernel cache, one folder per
# binary and GPU; docs/performance.md, "The kernel cache"): kept beside the binaries, so the
# second call of a session on the warm machine finds it too. REEL_KERNEL_CACHE=off compiles
# every kernel in every run, as before 2026-11-30.
export REEL_KERNEL_CACHE=${REEL_KERNEL_CACHE:-$(cd "$BIN_DIR" && pwd)/kernel-cache}
# diffusers from the carried wheel when the machine lacks it.
if [[ $TORCH == 1 ]] && ! "$PYTHON" -c "import diffusers" 2>/dev/null && compgen -G "$BIN_DIR/wheels/*.whl" >/dev/null; then
  site=$(cd "$BIN_DIR" && pwd)/site
  "$PYTHON" -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile \
    --upgrade --target "$site" "$BIN_DIR"/wheels/*.whl &&
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
fi
if [[ $TORCH == 1 ]] && ! "$PYTHON" -c "import torch, diffusers" 2>/dev/null; then
  echo "no torch + diffusers for $PYTHON: PyTorch columns stay empty (TORCH=0)" >&2
  TORCH=0
fi
# bench/pytorch/bench_encoders.py builds UMT5 with `transformers` (the rest needs only torch and
# diffusers): without it, PyTorch's UMT5 run alone is skipped, and listed with that reason.
TORCH_UMT5=$TORCH
if [[ $TORCH == 1 ]] && ! "$PYTHON" -c "import transformers" 2>/dev/null; then
  echo "no transformers for $PYTHON: PyTorch's UMT5 run is skipped" >&2
  TORCH_UMT5=0
fi

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
gpu=${gpu:-unknown-gpu}
date=$(date -u +%Y-%m-%d)
RESULTS_DIR=${RESULTS_DIR:-bench/results}
# The parts run alone do not overwrite the plan's results of the same day.
if [[ -n $ONLY ]]; then TAG=${TAG:-$(echo $ONLY | tr ' ' '-')}; fi
out=$RESULTS_DIR/$date-$(echo "$gpu" | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//')${TAG:+-$TAG}
mkdir -p "$RESULTS_DIR"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
manifest=$tmp/manifest.jsonl
: >"$manifest"
# (The budget's start is taken at the top of the script.)
n=0

# Seconds this run may still take (a large number without a budget).
left() { if [[ -n $BUDGET_S ]]; then echo $((BUDGET_S - (SECONDS - start))); else echo 999999; fi; }

# Run "$@" with stdout to $1 (stderr to $1.err) while sampling GPU memory, within the time
# left; prints "<rc> <peak MiB>".
peak_run() {
  local file=$1; shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 50 >"$tmp/mem" 2>/dev/null &
  local smi=$!
  timeout -k 5 "$(left)" "$@" >"$file" 2>"$file.err"
  local rc=$?
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  echo "$rc $(sort -n "$tmp/mem" | tail -1 | tr -d ' ')"
}

# One job: `job KIND KEY=VALUE... -- COMMAND...`; records it in the manifest and rewrites the
# results. It is skipped when less of the budget is left than it needs to finish (it would
# only be killed part way). The needs are the wall seconds the H200 session of 2026-11-30 took
# (bench/results/2026-11-30-NVIDIA-H200-late.json's timeline, unless named), with a margin:
#   120: a shipped config (configs/dmd2_wan.toml took 103 s);
#   150: an 81-frame VAE run (the decode of 81x480x832: 73 s of steps, 42 of them the warm-up,
#        plus its start; encode and decode together were stopped at 251 s,
#        2026-11-30-NVIDIA-H200-late-encoders.json);
#    90: the other encoder runs (UMT5-XXL took 62 s, 2026-11-30-NVIDIA-H200-encoders-configs.json);
#    60: PyTorch's steps (38, 48 and 54 s at 8190, 2048 and 29120 tokens) and every run at 8190
#        or 29120 tokens (Reel's steps 37-42 s; 65 s before the kernel cache,
#        2026-11-30-NVIDIA-H200.json; the attention and matmul alone 40-47 s);
#    30: the rest (Reel's 2048-token step 26 s, the 8190-token breakdown 24 s).
job() {
  local kind=$1; shift
  local fields=() need=30
  while [[ $1 != -- ]]; do fields+=("$1"); shift; done
  shift
  case " $kind ${fields[*]} " in
    *" method=configs/"*) need=120 ;;
    " encoder "*"--video 81 "* | " torch-encoder "*"--video 81 "*) need=150 ;;
    " encoder "* | " torch-encoder "*) need=90 ;;
    " torch "* | *" shape=21,30,52 "* | *" shape=20,56,104 "*) need=60 ;;
  esac
  n=$((n + 1))
  local file=$tmp/run.$n.json rc=skipped mem="" began=$SECONDS secs=""
  if (($(left) >= need)); then
    echo "[$((SECONDS - start)) s] $kind ${fields[*]}" >&2
    read -r rc mem < <(peak_run "$file" "$@")
    secs=$((SECONDS - began))
  fi
  record "$kind" "$file" "$rc" "$mem" "$secs" "${fields[@]}"
}

# A job not run for REASON (not the budget): listed among the skipped, with its reason.
skip_job() { # KIND REASON FIELD...
  local kind=$1 reason=$2; shift 2
  n=$((n + 1))
  echo "[$((SECONDS - start)) s] $kind $*: skipped, $reason" >&2
  record "$kind" "$tmp/run.$n.json" skipped "" "" "$@" reason="$reason"
}

# One manifest line (KIND FILE RC MEM SECS FIELD...), then the results rewritten.
record() {
  "$PYTHON" -c 'import json, sys; k, f, rc, mem, secs, *kv = sys.argv[1:]
print(json.dumps(dict(kind=k, file=f, rc=rc, mem=mem, secs=secs, **dict(x.split("=", 1) for x in kv))))' \
    "$@" >>"$manifest"
  summarize >/dev/null
}

# Copy FILE under $OUT (when set) by its own name, through a temporary name: a call killed
# part way leaves the last whole copy, not half of one.
copy_out() { # FILE
  [[ -n ${OUT:-} ]] || return 0
  local to
  to=$OUT/$(basename "$1")
  cp "$1" "$to.part" 2>/dev/null && mv -f "$to.part" "$to"
}

torch_job() { # SHAPE DTYPE CKPT
  [[ $TORCH == 1 ]] || return 0
  local f h w extra=(--dtype "$2"); read -r f h w <<<"${1//,/ }"
  [[ $3 == 1 ]] && extra+=(--gradient-checkpointing)
  job torch shape="$1" dtype="$2" ckpt="$3" -- "$PYTHON" bench/pytorch/bench_wan.py --device cuda \
    --preset "$PRESET" --shape "$f" "$h" "$w" --batch "$BATCH" --steps "$STEPS" --warmup "$WARMUP" \
    "${extra[@]}" --json
}

# MEMORY (optional): the run's REEL_GPU_MEMORY, named in its row; unset, the default (pages).
reel_job() { # VARIANT ATTENTION SHAPE DTYPE CKPT [MEMORY]
  local f h w extra=(--dtype "$4") mem=(); read -r f h w <<<"${3//,/ }"
  [[ $5 == 1 ]] && extra+=(--gradient-checkpointing)
  [[ -n ${6:-} ]] && mem=(memory="$6")
  job reel variant="$1" attention="$(attention_label "$2")" shape="$3" dtype="$4" ckpt="$5" \
    "${mem[@]}" -- env REEL_GPU_MEMORY="${6:-pages}" \
    "$BIN_DIR/reel-cuda-$1" bench --backend cuda --preset "$PRESET" --shape "$f" "$h" "$w" \
    --batch "$BATCH" --steps "$STEPS" --warmup "$WARMUP" --attention "$2" "${extra[@]}" --json
}

# Every kernel's GPU time in one training step, from CubeCL's profiler: a `cubecl.toml` in the
# job's working directory has it time each launch alone (so the step is slower than
# unprofiled; the warm-up's launches include their compilation) and log one line per launch.
# The summary keeps the later half of each kernel's launches (the timed step's, after the
# warm-up step's) and adds them up per kernel.
profile_job() { # VARIANT ATTENTION SHAPE [CKPT, default 1]
  local dir=$tmp/profile-$3 toml
  # With `autotune`: a fresh tuning cache in the job's directory, and the kernel each tuning
  # chose logged (kept as $out-autotune.log).
  toml=$(profiling_toml "$dir/cubecl.log"
    printf '\n[autotune]\ncache = "local"\n[autotune.logger]\nlevel = "minimal"\nfile = "%s"\nappend = false' \
      "$dir/autotune.log")
  step_job kernels "$dir" "$toml" "$1" "$2" "$3" "${4:-1}" log="$dir/cubecl.log"
  if [[ -s $dir/autotune.log ]]; then
    cp "$dir/autotune.log" "$out-autotune.log"
    # Named after the results, so a second gpu.sh in the same call keeps the first's.
    copy_out "$out-autotune.log"
  fi
}

# CubeCL's profiling log (one line per launch, each timed alone) into LOG, as `cubecl.toml`.
profiling_toml() { # LOG
  printf '[profiling.logger]\nlevel = "basic"\nfile = "%s"\nappend = false' "$1"
}

# `reel-cuda-VARIANT bench --backend cuda ARGS...` as job KIND, run from folder DIR with TOML
# as its `cubecl.toml` (CubeCL reads it from the working directory); FIELDS as for `job`.
folder_job() { # KIND DIR TOML VARIANT FIELD... -- ARGS...
  local kind=$1 dir=$2 toml=$3 variant=$4 bin fields=()
  bin=$(realpath "$BIN_DIR/reel-cuda-$variant")
  shift 4
  while [[ $1 != -- ]]; do fields+=("$1"); shift; done
  shift
  mkdir -p "$dir"
  printf '%s\n' "$toml" >"$dir/cubecl.toml"
  job "$kind" variant="$variant" "${fields[@]}" -- bash -c 'cd "$0" && exec "$@"' "$dir" "$bin" \
    bench --backend cuda "$@"
}

# One bf16 training step of the preset at SHAPE (after one warm-up step) as a folder_job.
step_job() { # KIND DIR TOML VARIANT ATTENTION SHAPE CKPT [FIELD...]
  local f h w ckpt=(); read -r f h w <<<"${6//,/ }"
  [[ $7 == 1 ]] && ckpt=(--gradient-checkpointing)
  folder_job "$1" "$2" "$3" "$4" attention="$(attention_label "$5")" shape="$6" ckpt="$7" \
    "${@:8}" -- --preset "$PRESET" --shape "$f" "$h" "$w" --batch "$BATCH" --steps 1 --warmup 1 \
    --attention "$5" --dtype bf16 "${ckpt[@]}" --json
}

# A training step with CubeCL's memory log (`[memory.logger] level = "full"` in a `cubecl.toml`
# in the job's folder): the summary lists its pools' page sizes, the pages the run made and
# the pools' usage report at the last one (bytes in use then, bytes reserved), which tells
# the pools' slack from the step's own need. CubeCL 0.10's CUDA pools take pages of a quarter
# of a quarter of the GPU's memory for allocations up to half that (9 GB on an H200, 5 GB on
# an H100), and Reel cannot configure them (`DeviceService::init` uses the default options).
memlog_job() { # VARIANT ATTENTION SHAPE
  local dir=$tmp/memlog-$3
  step_job memlog "$dir" "$(printf '[memory.logger]\nlevel = "full"\nfile = "%s"\nappend = false' \
    "$dir/memory.log")" "$1" "$2" "$3" 1 log="$dir/memory.log"
}

# The VAE's OP (`encode` or `decode`) of a small clip (VAE_PROFILE_VIDEO, default "9 256 256":
# F H W), profiled per kernel as profile_job profiles a step: where the pass's GPU time goes.
vae_profile_job() { # VARIANT OP
  local dir=$tmp/vae-profile-$2 video=${VAE_PROFILE_VIDEO:-9 256 256}
  # shellcheck disable=SC2086 # the video's three numbers are three arguments
  folder_job kernels "$dir" "$(profiling_toml "$dir/cubecl.log")" "$1" \
    label="the VAE's $2 of ${video// /x} (one pass after one warm-up)" log="$dir/cubecl.log" -- \
    --vae wan2.1 --video $video --vae-op "$2" --steps 1 --warmup 1 --json
}

# `finetune-unfused`: AdamW and EMA as Burn tensor operations (optimizer.fused = false), for
# the `clip + optimizer` and `callbacks` phases side by side; `-flash`: attention = "flash"
# (the tensor-core attention: cuDNN's, or Reel's kernels); `-nockpt`: no checkpointing.
breakdown_job() { # RUN VARIANT SHAPE
  local method=${1%%-*} attention=fused extra=(--gradient-checkpointing) f h w
  read -r f h w <<<"${3//,/ }"
  [[ $1 == *-unfused* ]] && extra+=(--set optimizer.fused=false)
  [[ $1 == *-flash* ]] && attention=flash
  [[ $1 == *-nockpt* ]] && extra=("${extra[@]:1}")
  job breakdown method="$1" variant="$2" -- "$BIN_DIR/reel-cuda-$2" bench --breakdown \
    --backend cuda --method "$method" --preset "$PRESET" --shape "$f" "$h" "$w" --batch "$BATCH" \
    --steps "$STEPS" --warmup "$(breakdown_warmup)" --dtype bf16 \
    --attention "$attention" "${extra[@]}" --json
}

# A breakdown's warm-up steps: at least two. An EMA's first update only copies the weights, so
# its kernel first runs (and compiles) in the second step: after one warm-up step the
# `callbacks` phase held that compile (413 ms of a 12.6-ms EMA; H200, 2026-11-30).
breakdown_warmup() { echo $((WARMUP > 2 ? WARMUP : 2)); }

# A shipped run config at FastVideo's 77x448x832 clips (20x56x104 latents, 29120 tokens):
# random weights of its shapes, random data of that shape, the tensor-core attention on every
# DiT role; real trainer steps with their phases and the GPU memory peak.
config_job() { # CONFIG VARIANT STEPS
  local sets=(--set 'data={kind="random",channels=16,frames=20,height=56,width=104,text_len=512,text_dim=4096}')
  local role
  for role in student teacher critic; do
    grep -q "^\[models.$role\]" "$1" && sets+=(--set "models.$role.attention=\"$ATTENTION\"")
  done
  job breakdown method="$1" variant="$2" attention="$(attention_label "$ATTENTION")" -- "$BIN_DIR/reel-cuda-$2" \
    bench --breakdown --config "$1" --random-weights --steps "$3" --warmup "$(breakdown_warmup)" "${sets[@]}" --json
}

# The blocks' self-attention alone at SHAPE in bf16: every Reel kernel (`reel bench
# --attention-only`) and PyTorch's scaled_dot_product_attention, forward and forward + backward.
attention_job() { # VARIANT SHAPE
  local f h w; read -r f h w <<<"${2//,/ }"
  local dims=(--preset "$PRESET" --shape "$f" "$h" "$w" --batch "$BATCH" --steps "$STEPS"
    --warmup "$WARMUP" --dtype bf16 --json)
  if [[ $TORCH == 1 ]]; then
    job torch-attention shape="$2" -- "$PYTHON" bench/pytorch/bench_wan.py --attention-only \
      --device cuda "${dims[@]}"
  fi
  local tiles=() spec
  for spec in $TILES; do tiles+=(--tiles "$spec"); done
  job attention variant="$1" shape="$2" -- "$BIN_DIR/reel-cuda-$1" bench --attention-only \
    --backend cuda "${dims[@]}" "${tiles[@]}"
}

# The blocks' matrix products alone at SHAPE in bf16 (`reel bench --matmul-only`): Burn's
# matmul and each kernel of MATMUL_KERNELS, checked against float32, with the fastest correct
# kernel over a block (`best`) and per layout (`best_pin`).
matmul_job() { # VARIANT SHAPE
  local f h w kernels=() k; read -r f h w <<<"${2//,/ }"
  for k in $MATMUL_KERNELS; do kernels+=(--matmul-kernel "$k"); done
  job matmul variant="$1" shape="$2" -- "$BIN_DIR/reel-cuda-$1" bench --matmul-only \
    --backend cuda --preset "$PRESET" --shape "$f" "$h" "$w" --batch "$BATCH" --steps "$STEPS" \
    --warmup "$WARMUP" --dtype bf16 "${kernels[@]}" --json
}

# The kernels the matmul-alone run at SHAPE found fastest over a block, per layout (a
# REEL_MATMUL value); empty when that is the `cuda` default, Burn's own matmul, or the run
# failed. The report's `burn` (REEL_MATMUL=burn: Burn's matmul for all three products,
# models/src/wan/block_kernels/matmul_pin.rs) means Burn's matmul was the fastest correct
# kernel on every layout, or that no kernel ran a layout's products correctly (best_per_layout,
# src/commands/bench/matmul_summary.rs). Burn's matmul wins where cuBLAS's rows fail (no
# libcublas, as on the CPU stand-in): there the `cuda` default (default_pin) is Burn's matmul
# too, and a pinned row would repeat the default's (~50 s at 8190 tokens).
fastest_matmul() {
  "$PYTHON" - "$manifest" "$1" <<'PY'
import json, sys
manifest, shape = sys.argv[1:]
best = ""
for line in open(manifest):
    j = json.loads(line)
    if j["kind"] == "matmul" and j["shape"] == shape and j["rc"] == "0":
        try:
            report = json.load(open(j["file"]))
            best = report.get("best_pin", report["best"])
        except Exception:
            pass
# The `cuda` default (wan::matmul::default_pin) needs no pin; nor does `burn` (above).
print("" if best in ("cublas-stream", "burn") else best)
PY
}

# The attention mode for the manifest: with REEL_TILED_TILES set, its launch shapes too.
# With REEL_BLOCK_KERNELS set (`off`: the norms, bias gradients and GELU as Burn tensor
# operations), that too.
# With REEL_MATMUL set (a pinned cubek matmul kernel), that too, and REEL_FLASH (`reel` or
# `cudnn`).
attention_label() {
  echo "$1${REEL_TILED_TILES:+ (tiles $REEL_TILED_TILES)}${REEL_BLOCK_KERNELS:+ (block kernels $REEL_BLOCK_KERNELS)}${REEL_MATMUL:+ (matmul $REEL_MATMUL)}${REEL_FLASH:+ (flash $REEL_FLASH)}"
}

encoder_job() { # VARIANT "[NAME=value ...] <reel bench args>"
  local words envs=() args
  read -r -a words <<<"$2"
  while [[ ${words[0]:-} == [A-Z]*=* ]]; do envs+=("${words[0]}"); words=("${words[@]:1}"); done
  args=${words[*]}
  job encoder args="$2" run="$args" -- env "${envs[@]}" "$BIN_DIR/reel-cuda-$1" bench --backend cuda \
    "${words[@]}" --steps "${ENCODER_STEPS:-$STEPS}" --warmup "$WARMUP" --json
  # PyTorch's run of the same arguments, once (the environment words are Reel's kernels).
  [[ $TORCH == 1 && " ${torch_encoder_done[*]} " != *" [$args] "* ]] || return 0
  torch_encoder_done+=("[$args]")
  if [[ $TORCH_UMT5 == 0 && " $args " == *" --text-encoder "* ]]; then
    skip_job torch-encoder "no transformers for $PYTHON (bench_encoders.py builds UMT5 with it)" \
      args="$args"
    return 0
  fi
  job torch-encoder args="$args" -- "$PYTHON" bench/pytorch/bench_encoders.py --device cuda \
    "${words[@]}" --steps "${ENCODER_STEPS:-$STEPS}" --warmup "$WARMUP" --json
}
torch_encoder_done=()

# The variant whose Reel row at SHAPE (bf16, checkpointing) has the shortest step, the
# matmul kernel that row pinned and its REEL_FLASH (each `-` when unset); empty when no Reel
# row there succeeded.
fastest_variant() {
  "$PYTHON" - "$manifest" "$1" <<'PY'
import json, re, sys
manifest, shape = sys.argv[1:]
best = (float("inf"), "")
for line in open(manifest):
    j = json.loads(line)
    # Rows with the block kernels switched off, or with the attention on Reel's kernels
    # (`REEL_FLASH=reel`: against the default, cuDNN, within the steps' noise), or with
    # REEL_GPU_MEMORY set, are measurements, not candidates; `cudnn-queued` is a candidate.
    measured = lambda: ("block kernels" in j["attention"] or "(flash reel)" in j["attention"]
                        or "memory" in j)
    if j["kind"] == "reel" and j["shape"] == shape and j["rc"] == "0" and not measured():
        pin = lambda name: (re.search(rf"\({name} ([^)]+)\)", j["attention"]) or [None, "-"])[1]
        try:
            ms = json.load(open(j["file"]))[0]["train_step_ms"]["median"]
            best = min(best, (ms, f"{j['variant']} {pin('matmul')} {pin('flash')}"))
        except Exception:
            pass
print(best[1])
PY
}

# The Reel attention mode (memory_efficient, fused or flash) whose attention-alone run at
# SHAPE took the least time for what a checkpointed training step runs: the forward without
# gradients plus the forward and backward; rows whose results the bench found wrong are left
# out. Empty when none ran there.
fastest_attention() {
  "$PYTHON" - "$manifest" "$1" <<'PY'
import json, sys
manifest, shape = sys.argv[1:]
# A step runs each attention forward twice (checkpointing) and its backward once: a row
# costs forward + train (train = forward + backward). The flash rows' launch shapes combine:
# the forward kernel's from the row with the fastest forward, the backward kernels' from the
# row with the fastest backward (`flash` alone: the default shapes).
KERNELS = ("forward", "backward_q", "backward_kv")
def shapes(kernel):
    spec = kernel.removeprefix("flash").strip()
    if not spec:
        return {}
    if "=" not in spec:
        return {k: spec for k in KERNELS}
    return dict(e.split("=", 1) for e in spec.split(","))
rows = []
for line in open(manifest):
    j = json.loads(line)
    if j["kind"] == "attention" and j["shape"] == shape and j["rc"] == "0":
        try:
            for r in json.load(open(j["file"])):
                # A row whose results are wrong (`error`: beyond the tolerance) never wins.
                ok = not r.get("error")
                # cuDNN's row is tried as a whole step (FLASH_PINS), not as launch shapes.
                other = r["kernel"] == "cubek" or r["kernel"].startswith("flash cudnn")
                if ok and not other and r.get("forward_ms") and r.get("train_ms"):
                    fwd, train = r["forward_ms"]["median"], r["train_ms"]["median"]
                    rows.append((fwd, train - fwd, r["kernel"]))
        except Exception:
            pass
best = min(((f + f + b, k) for f, b, k in rows), default=(float("inf"), ""))
flash = [r for r in rows if r[2].split()[0] == "flash"]
if flash:
    fwd = min(flash, key=lambda r: r[0])
    bwd = min(flash, key=lambda r: r[1])
    parts = {k: v for k, v in shapes(fwd[2]).items() if k == "forward"}
    parts.update({k: v for k, v in shapes(bwd[2]).items() if k != "forward"})
    spec = ",".join(f"{k}={parts[k]}" for k in KERNELS if k in parts)
    best = min(best, (fwd[0] + fwd[0] + bwd[1], f"flash {spec}".strip()))
print(best[1])
PY
}

# Rewrite $out.json and $out.md from the manifest, and copy them under $OUT with every job's
# raw output and full stderr ($(basename $out)-logs.tgz: the manifest and run.N.json[.err]),
# which come back even when the summary cannot be made. The logs are named after the results,
# so two gpu.sh runs in one device call (the plan, then ONLY=...) keep each other's.
summarize() {
  local logs
  "$PYTHON" bench/gpu_summary.py "$manifest" "$out" "$gpu" "$date" "$PLAN" "${BUDGET_S:-}" "$rev" ||
    echo "bench/gpu_summary.py failed: the raw results are in $(basename "$out")-logs.tgz" >&2
  if [[ -n ${OUT:-} ]]; then
    copy_out "$out.json"
    copy_out "$out.md"
    logs=$OUT/$(basename "$out")-logs.tgz
    { tar -C "$tmp" --exclude='profile*' --exclude='vae-profile-*' --exclude='memlog-*' \
      -czf "$logs.part" . 2>/dev/null && mv -f "$logs.part" "$logs"; } || rm -f "$logs.part"
  fi
  return 0
}

# FastVideo's 29120 tokens side by side, then the shipped configs at that shape (ONLY=configs).
long_runs() { # VARIANT
  torch_job 20,56,104 bf16 1
  reel_job "$1" "$ATTENTION" 20,56,104 bf16 1
  config_job configs/dmd2_wan.toml "$1" "$DMD2_STEPS"
  config_job configs/finetune_wan.toml "$1" "$STEPS"
}

# 2048 tokens without checkpointing: PyTorch and Reel, the step profiled per kernel and its
# breakdown (ONLY=small).
small_runs() { # VARIANT [PROFILE, default 1: 0 where the plan profiled it before]
  local m pin flash
  torch_job 8,32,32 bf16 0
  reel_job "$1" "$ATTENTION" 8,32,32 bf16 0
  # Beside the row above (the host's share of the step is largest here): the `cuda` defaults
  # when the plan picked pins, else each of STEP_PINS with each of FLASH_PINS.
  if [[ ${REEL_MATMUL:-cublas-stream} != cublas-stream || ${REEL_FLASH:-cudnn} != cudnn ]]; then
    REEL_MATMUL=cublas-stream REEL_FLASH=cudnn reel_job "$1" "$ATTENTION" 8,32,32 bf16 0
  else
    for pin in $STEP_PINS; do
      REEL_MATMUL=$pin reel_job "$1" "$ATTENTION" 8,32,32 bf16 0
      for flash in $FLASH_PINS; do REEL_MATMUL=$pin REEL_FLASH=$flash reel_job "$1" "$ATTENTION" 8,32,32 bf16 0; done
    done
  fi
  for m in $GPU_MEMORY; do reel_job "$1" "$ATTENTION" 8,32,32 bf16 0 "$m"; done
  if [[ ${2:-1} == 1 ]]; then profile_job "$1" "$ATTENTION" 8,32,32 0; fi
  if [[ $ATTENTION == flash ]]; then breakdown_job finetune-flash-nockpt "$1" 8,32,32
  else breakdown_job finetune-nockpt "$1" 8,32,32; fi
}

# The host's own cost per step by depth (bench/host-overhead.sh on cuda, bf16 and the
# session's attention as the real rows; ONLY=host): a table of its own in $out-host.md, copied
# under $OUT after each setting, so a call stopped part way brings back the tables it made.
host_runs() { # VARIANT
  local set m pin flash settings=() host=$out-host.md
  : >"$host"
  for m in pages $GPU_MEMORY; do settings+=("REEL_GPU_MEMORY=$m"); done
  for pin in $STEP_PINS; do
    settings+=("REEL_MATMUL=$pin")
    for flash in $FLASH_PINS; do settings+=("REEL_MATMUL=$pin REEL_FLASH=$flash"); done
  done
  for set in "${settings[@]}"; do
    if (($(left) < 60)); then
      echo "host ($set): skipped, $(left) s left" >&2
      printf '\n%s: skipped (time budget, %s s left)\n' "$set" "$(left)" >>"$host"
      continue
    fi
    echo "[$((SECONDS - start)) s] host overhead, $set" >&2
    printf '\n%s\n\n' "$set" >>"$host"
    # shellcheck disable=SC2086 # one or two NAME=value words
    env $set BACKEND=cuda DTYPE=bf16 ATTENTION="$ATTENTION" REEL="$BIN_DIR/reel-cuda-$1" \
      STEPS="$STEPS" timeout -k 5 "$(left)" bench/host-overhead.sh >>"$host" \
      2>"$tmp/host.err" || tail -3 "$tmp/host.err" >&2
    copy_out "$host"
  done
  copy_out "$host"
  cat "$host" >&2
}

# The 29120-token step with CubeCL's memory log, then that step with each GPU_MEMORY mode: its
# GPU memory and time beside the default pages' (ONLY=memory).
memory_runs() { # VARIANT
  local m
  memlog_job "$1" "$ATTENTION" 20,56,104
  for m in $GPU_MEMORY; do reel_job "$1" "$ATTENTION" 20,56,104 bf16 1 "$m"; done
}

# UMT5 and the VAE: each run of ENCODER_RUNS.
encoder_runs() { # VARIANT
  local specs spec op
  # The VAE's passes per kernel first (seconds each; VAE_PROFILE=0 skips them).
  if [[ ${VAE_PROFILE:-1} == 1 ]]; then
    for op in encode decode; do vae_profile_job "$1" "$op"; done
  fi
  IFS=';' read -r -a specs <<<"$ENCODER_RUNS"
  for spec in "${specs[@]}"; do encoder_job "$1" "$spec"; done
}

if [[ -n $ONLY ]]; then
  # No attention-alone run to pick from: the caller names the mode (flash by default).
  if [[ $ATTENTION == pick ]]; then ATTENTION=flash; fi
  echo "only: $ONLY, attention $(attention_label "$ATTENTION")" >&2
  for part in $ONLY; do
    case $part in
      configs) long_runs "${VARIANTS%% *}" ;;
      encoders) encoder_runs "${VARIANTS%% *}" ;;
      small) small_runs "${VARIANTS%% *}" ;;
      memory) memory_runs "${VARIANTS%% *}" ;;
      host) host_runs "${VARIANTS%% *}" ;;
    esac
  done
elif [[ $PLAN == session ]]; then
  # With the attention named and no launch shapes to try, the attention-alone run decides
  # nothing: it is skipped.
  if [[ $ATTENTION == pick || -n $TILES ]]; then attention_job "${VARIANTS%% *}" 21,30,52; fi
  if [[ -n $MATMUL_KERNELS ]]; then
    matmul_job "${VARIANTS%% *}" 21,30,52
    pinned=$(fastest_matmul 21,30,52)
    echo "fastest matmul kernels over a block at 8190 tokens: ${pinned:-none to pin (the cuda default cublas-stream, Burn matmul, or no result: the matmul table says which)}" >&2
  fi
  if [[ $ATTENTION == pick ]]; then
    pick=$(fastest_attention 21,30,52)
    case $pick in
      # A `--tiles` row: flash with those launch shapes for every later run.
      "flash "*) ATTENTION=flash; export REEL_TILED_TILES=${pick#flash } ;;
      "") ATTENTION=flash ;;
      *) ATTENTION=$pick ;;
    esac
    echo "fastest attention at 8190 tokens: $(attention_label "$ATTENTION")" >&2
  fi
  torch_job 21,30,52 bf16 1
  for v in $VARIANTS; do reel_job "$v" "$ATTENTION" 21,30,52 bf16 1; done
  # The linear layers on the fastest kernels of the matmul-alone run, pinned per layout.
  if [[ -n ${pinned:-} ]]; then REEL_MATMUL=$pinned reel_job "${VARIANTS%% *}" "$ATTENTION" 21,30,52 bf16 1; fi
  for pin in $STEP_PINS; do
    if [[ $pin != "${pinned:-}" ]]; then REEL_MATMUL=$pin reel_job "${VARIANTS%% *}" "$ATTENTION" 21,30,52 bf16 1; fi
  done
  # Each of FLASH_PINS with the fastest matmul pin so far: `cudnn-queued` may be picked for
  # the rest of the plan; `reel` (Reel's kernels, where cuDNN is the default) is a measurement.
  if [[ $ATTENTION == flash && -n $FLASH_PINS ]]; then
    read -r _ so_far _ <<<"$(fastest_variant 21,30,52)"
    [[ ${so_far:--} == - ]] && so_far=
    for flash in $FLASH_PINS; do
      if [[ -n $so_far ]]; then
        REEL_FLASH=$flash REEL_MATMUL=$so_far reel_job "${VARIANTS%% *}" "$ATTENTION" 21,30,52 bf16 1
      else
        REEL_FLASH=$flash reel_job "${VARIANTS%% *}" "$ATTENTION" 21,30,52 bf16 1
      fi
    done
  fi
  best=$(fastest_variant 21,30,52)
  if [[ -z $best && $ATTENTION != fused ]]; then
    # The tensor-core kernels failed on this GPU (their rows say why): the rest of the plan
    # runs the fused kernels rather than spending the session on failures.
    echo "no $ATTENTION row ran at 8190 tokens: the rest of the plan uses attention=fused" >&2
    ATTENTION=fused
    unset REEL_TILED_TILES
    reel_job "${VARIANTS%% *}" fused 21,30,52 bf16 1
    best=$(fastest_variant 21,30,52)
  fi
  read -r best best_matmul best_flash <<<"$best"
  best=${best:-${VARIANTS%% *}}
  # The rest of the plan pins the matmul kernel and the flash forward when that row was the
  # fastest.
  if [[ ${best_matmul:--} != - ]]; then export REEL_MATMUL=$best_matmul; fi
  if [[ ${best_flash:--} != - ]]; then export REEL_FLASH=$best_flash; fi
  echo "fastest variant at 8190 tokens: $best${REEL_MATMUL:+ with REEL_MATMUL=$REEL_MATMUL}${REEL_FLASH:+ REEL_FLASH=$REEL_FLASH}" >&2
  # One step per kernel at 2048 tokens without checkpointing, the row furthest from PyTorch's:
  # the kernels' GPU time against the step's (PROFILE_SHAPE, PROFILE_CKPT).
  if [[ ${PROFILE:-1} == 1 ]]; then
    profile_job "$best" "$ATTENTION" "${PROFILE_SHAPE:-8,32,32}" "${PROFILE_CKPT:-0}"
  fi
  # The fine-tuning step's phases, each with its host time (whether the GPU or the host sets
  # the pace; a breakdown run's attention follows its RUN name: `-flash` for flash).
  if [[ $ATTENTION == flash ]]; then breakdown_job finetune-flash "$best" 21,30,52
  else breakdown_job finetune "$best" 21,30,52; fi
  # The block kernels (norms, bias gradients, GELU) against tensor operations, side by side.
  if [[ ${BLOCK_KERNELS_OFF:-1} == 1 ]]; then
    REEL_BLOCK_KERNELS=off reel_job "$best" "$ATTENTION" 21,30,52 bf16 1
  fi
  # The same step with device memory in exact-size buffers (REEL_GPU_MEMORY), side by side.
  for m in $GPU_MEMORY; do reel_job "$best" "$ATTENTION" 21,30,52 bf16 1 "$m"; done
  torch_job 20,56,104 bf16 1
  reel_job "$best" "$ATTENTION" 20,56,104 bf16 1
  config_job configs/dmd2_wan.toml "$best" "$DMD2_STEPS"
  # Reel's 29120-token step held 27 % more GPU memory than PyTorch's on 2026-11-30: how much
  # of it is the pools' pages, and that step in exact-size buffers (MEMLOG=0 skips this).
  if [[ ${MEMLOG:-1} == 1 ]]; then memory_runs "$best"; fi
  # 2048 tokens and where that step's time goes (its ratio was the largest on 2026-11-30);
  # its profile ran above.
  small_runs "$best" 0
  config_job configs/finetune_wan.toml "$best" "$STEPS"
  if [[ ${ENCODERS:-1} == 1 ]]; then encoder_runs "$best"; fi
else
  for shape in $SHAPES; do attention_job "${VARIANTS%% *}" "$shape"; done
  for shape in $SHAPES; do
    for dtype in $DTYPES; do
      for ckpt in $CKPTS; do
        torch_job "$shape" "$dtype" "$ckpt"
        for variant in $VARIANTS; do
          for attention in $ATTENTION; do reel_job "$variant" "$attention" "$shape" "$dtype" "$ckpt"; done
        done
      done
    done
  done
  if [[ -n $BREAKDOWN_SHAPE ]]; then
    for run in $BREAKDOWN_RUNS; do breakdown_job "$run" "$BREAKDOWN_VARIANT" "$BREAKDOWN_SHAPE"; done
  fi
  if [[ ${ENCODERS:-1} == 1 ]]; then encoder_runs "$BREAKDOWN_VARIANT"; fi
fi
summarize
if [[ -d $REEL_KERNEL_CACHE ]]; then
  echo "kernel cache: $(du -sh "$REEL_KERNEL_CACHE" | cut -f1) in $REEL_KERNEL_CACHE" >&2
fi
echo "wrote $out.json and $out.md ($((SECONDS - start)) s)" >&2
