#!/usr/bin/env bash
# The GPU measurement matrix in one command: Reel's CUDA build variants x attention x dtype x
# gradient checkpointing, with PyTorch + diffusers beside each (shape, dtype, checkpointing)
# in the same run, then the `--breakdown` of the fine-tuning and DMD2 steps at ~29k tokens,
# then the Wan VAE (decode/encode of 81x480x832) and UMT5-XXL (512 tokens); ENCODERS=0 skips them.
# Writes bench/results/<date>-<gpu>[-<TAG>].{json,md}: one row per Reel run, with the device,
# the date, the build variant and the Reel/PyTorch `ratio`. Commit the JSON of every GPU run.
#
# GPU minutes are scarce, so build here and only measure there:
#   BUILD_ONLY=1 bench/gpu.sh      # here: bench/bin/reel-cuda-<variant>, stripped, and
#                                  # bench/bin/reel-cuda.tar.xz (about 30 MB) to carry
#   bench/gpu.sh                   # there (unpacks the tarball when the binaries are absent)
#
# Every axis is an environment variable (space-separated values), so one session can run the
# matrix in slices that each fit a 10-minute command:
#   SHAPES="8,32,32 21,30,52 20,56,104"   latent F,H,W: 2048, 8190 and 29120 tokens (patch 1x2x2)
#   VARIANTS="plain fusion fusion+autotune"   ATTENTION="memory_efficient fused flash"
#   DTYPES="f32 bf16"   CKPTS="0 1"   PRESET=wan2.1-t2v-1.3b   BATCH=1   STEPS=3   WARMUP=1
#   BREAKDOWN_SHAPE=20,56,104 (empty: skip)   BREAKDOWN_VARIANT=<first of VARIANTS>   TAG=slice1
#   BREAKDOWN_RUNS="finetune finetune-flash finetune-unfused dmd2 dmd2-flash" (-unfused:
#   optimizer.fused = false; -flash: attention = "flash", tensor-core attention in bf16)
#   TORCH=0 skips PyTorch (rows keep `torch_step_ms: null`); PYTHON picks its interpreter.
#   ENCODERS=0 skips the VAE / UMT5 runs; ENCODER_RUNS="<reel bench args>;..." replaces them.
# 29k tokens without checkpointing do not fit 80 GB for Reel or PyTorch: a run that fails
# (out of memory) is recorded with `error` and the matrix goes on.
set -uo pipefail
cd "$(dirname "$0")/.."
SHAPES=${SHAPES:-"8,32,32 21,30,52 20,56,104"}
VARIANTS=${VARIANTS:-"plain fusion fusion+autotune"}
ATTENTION=${ATTENTION:-"memory_efficient fused flash"}
DTYPES=${DTYPES:-"f32 bf16"}
CKPTS=${CKPTS:-"0 1"}
PRESET=${PRESET:-wan2.1-t2v-1.3b}
BATCH=${BATCH:-1}
STEPS=${STEPS:-3}
WARMUP=${WARMUP:-1}
BREAKDOWN_SHAPE=${BREAKDOWN_SHAPE-20,56,104}
BREAKDOWN_VARIANT=${BREAKDOWN_VARIANT:-${VARIANTS%% *}}
BREAKDOWN_RUNS=${BREAKDOWN_RUNS:-"finetune finetune-flash finetune-unfused dmd2 dmd2-flash"}
BIN_DIR=${BIN_DIR:-bench/bin}
PYTHON=${PYTHON:-python3}
TORCH=${TORCH:-1}

if [[ -n ${BUILD_ONLY:-} ]]; then
  set -e
  BACKEND=cuda VARIANTS="$VARIANTS" BIN_DIR="$BIN_DIR" BUILD_ONLY=1 bench/variants.sh
  tar -C "$BIN_DIR" -cJf "$BIN_DIR/reel-cuda.tar.xz" $(cd "$BIN_DIR" && ls reel-cuda-*[^z])
  ls -l "$BIN_DIR"
  exit 0
fi
for v in $VARIANTS; do
  if [[ ! -x $BIN_DIR/reel-cuda-$v && -f $BIN_DIR/reel-cuda.tar.xz ]]; then
    tar -C "$BIN_DIR" -xJf "$BIN_DIR/reel-cuda.tar.xz"
  fi
  [[ -x $BIN_DIR/reel-cuda-$v ]] || { echo "missing $BIN_DIR/reel-cuda-$v: run BUILD_ONLY=1 $0 first" >&2; exit 2; }
done
if [[ $TORCH == 1 ]] && ! "$PYTHON" -c "import torch, diffusers" 2>/dev/null; then
  echo "no torch + diffusers for $PYTHON: PyTorch columns stay empty (TORCH=0)" >&2
  TORCH=0
fi

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
gpu=${gpu:-unknown-gpu}
date=$(date -u +%Y-%m-%d)
out=bench/results/$date-$(echo "$gpu" | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//')${TAG:+-$TAG}
mkdir -p bench/results
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
rows=$tmp/rows.jsonl
: >"$rows"

# Run "$@" (stdout to $1's file) while sampling GPU memory; prints the peak MiB.
peak_run() {
  local file=$1; shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 50 >"$tmp/mem" 2>/dev/null &
  local smi=$!
  "$@" >"$file" 2>"$file.err"
  local rc=$?
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  sort -n "$tmp/mem" | tail -1 | tr -d ' '
  return $rc
}

# One JSON row from a Reel JSON file, the PyTorch JSON file (or none) and the settings.
row() {
  "$PYTHON" - "$@" <<'PY'
import json, sys
reel, torch, variant, attention, dtype, ckpt, reel_mem, torch_mem, gpu, date, shape = sys.argv[1:12]
def load(p):
    try:
        return json.load(open(p))[0]
    except Exception:
        return None
r, t = load(reel), load(torch)
def err(p):
    try:
        lines = [l for l in open(p + ".err").read().splitlines() if l.strip()]
        return lines[-1][:300] if lines else "failed"
    except Exception:
        return "failed"
row = dict(device=gpu, date=date, variant=variant, attention=attention, dtype=dtype,
           gradient_checkpointing=ckpt == "1", shape=[int(x) for x in shape.split(",")],
           tokens=r["tokens"] if r else None,
           reel_step_ms=r["train_step_ms"]["median"] if r else None,
           reel_forward_ms=r["forward_ms"]["median"] if r else None,
           reel_gpu_mib=float(reel_mem) if reel_mem else None,
           torch_step_ms=t["train_step_ms"]["median"] if t else None,
           torch_forward_ms=t["forward_ms"]["median"] if t else None,
           torch_gpu_mib=float(torch_mem) if torch_mem else None)
row["ratio"] = (row["reel_step_ms"] / row["torch_step_ms"]
                if row["reel_step_ms"] and row["torch_step_ms"] else None)
if r is None:
    row["error"] = err(reel)
print(json.dumps(row))
PY
}

i=0
for shape in $SHAPES; do
  read -r f h w <<<"${shape//,/ }"
  for dtype in $DTYPES; do
    for ckpt in $CKPTS; do
      extra=(--dtype "$dtype"); [[ $ckpt == 1 ]] && extra+=(--gradient-checkpointing)
      common=(--preset "$PRESET" --shape "$f" "$h" "$w" --batch "$BATCH" --steps "$STEPS" --warmup "$WARMUP")
      tfile=$tmp/torch.$i.json tmem=""
      if [[ $TORCH == 1 ]]; then
        echo "pytorch: $shape $dtype ckpt=$ckpt" >&2
        tmem=$(peak_run "$tfile" "$PYTHON" bench/pytorch/bench_wan.py --device cuda "${common[@]}" "${extra[@]}" --json)
      fi
      for variant in $VARIANTS; do
        for attention in $ATTENTION; do
          i=$((i + 1))
          echo "reel $variant: $shape $dtype ckpt=$ckpt $attention" >&2
          rfile=$tmp/reel.$i.json
          rmem=$(peak_run "$rfile" "$BIN_DIR/reel-cuda-$variant" bench --backend cuda "${common[@]}" \
            --attention "$attention" "${extra[@]}" --json)
          row "$rfile" "$tfile" "$variant" "$attention" "$dtype" "$ckpt" "$rmem" "$tmem" "$gpu" "$date" "$shape" >>"$rows"
        done
      done
    done
  done
done

# Where the time goes at real shapes: fine-tuning and the DMD2 step (student, critic and
# teacher), bf16 with checkpointing, the fused attention.
breakdowns=$tmp/breakdowns.json
echo "[]" >"$breakdowns"
if [[ -n $BREAKDOWN_SHAPE ]]; then
  read -r f h w <<<"${BREAKDOWN_SHAPE//,/ }"
  # `finetune-unfused`: the fine-tuning step with AdamW and EMA as Burn tensor operations
  # (optimizer.fused = false), for the `clip + optimizer` and `callbacks` phases side by side.
  # `-flash`: attention = "flash": tensor-core attention (cubek's flash forward where no
  # gradient flows, Reel's tiled kernels for the training forward and backward in bf16).
  for run in $BREAKDOWN_RUNS; do
    method=${run%%-*}
    attention=fused
    extra=()
    [[ $run == *-unfused ]] && extra=(--set optimizer.fused=false)
    [[ $run == *-flash ]] && attention=flash
    echo "breakdown: $run $BREAKDOWN_SHAPE ($BREAKDOWN_VARIANT)" >&2
    bfile=$tmp/breakdown.$run.json
    bmem=$(peak_run "$bfile" "$BIN_DIR/reel-cuda-$BREAKDOWN_VARIANT" bench --breakdown --backend cuda \
      --method "$method" --preset "$PRESET" --shape "$f" "$h" "$w" --batch "$BATCH" \
      --steps "$STEPS" --warmup "$WARMUP" --dtype bf16 --gradient-checkpointing --attention "$attention" \
      "${extra[@]}" --json)
    "$PYTHON" - "$breakdowns" "$bfile" "$run" "$BREAKDOWN_VARIANT" "$bmem" <<'PY'
import json, sys
path, bfile, method, variant, mem = sys.argv[1:6]
all_ = json.load(open(path))
try:
    b = json.load(open(bfile))[0]
except Exception:
    err = [l for l in open(bfile + ".err").read().splitlines() if l.strip()]
    b = dict(error=err[-1][:300] if err else "failed")
b.update(method=method, variant=variant, gpu_mib=float(mem) if mem else None)
all_.append(b)
json.dump(all_, open(path, "w"))
PY
  done
fi

# The VAE and the text encoder at Wan's sizes: decode/encode of 81x480x832 (whole and in
# 256-px tiles) and UMT5-XXL on 512 tokens, random weights of the real shapes.
encoders=$tmp/encoders.json
echo "[]" >"$encoders"
ENCODER_RUNS=${ENCODER_RUNS:-"--vae wan2.1 --video 81 480 832;--vae wan2.1 --video 81 480 832 --vae-tile 256;--text-encoder umt5-xxl --text-len 512 --batch 1"}
if [[ ${ENCODERS:-1} == 1 ]]; then
  n=0
  IFS=';' read -r -a encoder_runs <<<"$ENCODER_RUNS"
  for spec in "${encoder_runs[@]}"; do
    n=$((n + 1))
    echo "encoders: $spec" >&2
    efile=$tmp/enc.$n.json
    # shellcheck disable=SC2086 # $spec is a list of arguments
    emem=$(peak_run "$efile" "$BIN_DIR/reel-cuda-$BREAKDOWN_VARIANT" bench --backend cuda $spec \
      --steps "$STEPS" --warmup "$WARMUP" --json)
    "$PYTHON" - "$encoders" "$efile" "$spec" "$emem" <<'PY'
import json, sys
path, efile, spec, mem = sys.argv[1:5]
all_ = json.load(open(path))
try:
    rows = json.load(open(efile))
except Exception:
    err = [l for l in open(efile + ".err").read().splitlines() if l.strip()]
    rows = [dict(op=spec, error=err[-1][:300] if err else "failed")]
for r in rows:
    r.update(args=spec, gpu_mib=float(mem) if mem else None)
all_ += rows
json.dump(all_, open(path, "w"))
PY
  done
fi

"$PYTHON" - "$rows" "$breakdowns" "$out" "$gpu" "$date" "$encoders" <<'PY'
import json, sys
rows_path, bd_path, out, gpu, date, enc_path = sys.argv[1:7]
rows = [json.loads(l) for l in open(rows_path) if l.strip()]
breakdowns = json.load(open(bd_path))
encoders = json.load(open(enc_path))
json.dump(dict(device=gpu, date=date, rows=rows, breakdowns=breakdowns, encoders=encoders),
          open(out + ".json", "w"), indent=1)
f = lambda v, p=1: "—" if v is None else f"{v:.{p}f}"
lines = [f"{gpu}, {date}: medians of the timed steps, batch 1", "",
         "| tokens | variant | attention | dtype | ckpt | Reel step ms | PyTorch step ms | Reel / PyTorch | Reel fwd ms | PyTorch fwd ms | Reel GPU MiB | PyTorch GPU MiB |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    tokens = r["tokens"] or "x".join(map(str, r["shape"]))
    lines.append(f"| {tokens} | {r['variant']} | {r['attention']} | {r['dtype']} | "
                 f"{'yes' if r['gradient_checkpointing'] else 'no'} | "
                 f"{f(r['reel_step_ms']) if not r.get('error') else 'failed: ' + r['error'][:60]} | "
                 f"{f(r['torch_step_ms'])} | {f(r['ratio'], 2)} | {f(r['reel_forward_ms'])} | "
                 f"{f(r['torch_forward_ms'])} | {f(r['reel_gpu_mib'], 0)} | {f(r['torch_gpu_mib'], 0)} |")
for b in breakdowns:
    lines += ["", f"Breakdown, {b['method']} ({b['variant']}, bf16, checkpointing), "
              f"GPU peak {f(b.get('gpu_mib'), 0)} MiB:"]
    if "error" in b:
        lines.append(f"failed: {b['error']}")
        continue
    lines += ["", "| phase | median ms | share |", "|---|---|---|"]
    lines += [f"| {p['phase']} | {p['ms']['median']:.1f} | {100 * p['share']:.1f} % |" for p in b["phases"]]
    lines.append(f"| step, profiled | {b['profiled_step_ms']['median']:.1f} | |")
    lines.append(f"| step, unprofiled | {b['step_ms']['median']:.1f} | |")
if encoders:
    lines += ["", "| encoder run | op | input | output | median ms | GPU MiB (process peak) |",
              "|---|---|---|---|---|---|"]
    for e in encoders:
        if "error" in e:
            lines.append(f"| `{e['args']}` | failed: {e['error'][:80]} | | | | |")
        else:
            lines.append(f"| `{e['args']}` | {e['op']} | {e['input']} | {e['output']} | "
                         f"{e['ms']['median']:.1f} | {f(e.get('gpu_mib'), 0)} |")
open(out + ".md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
print(f"\nwrote {out}.json and {out}.md", file=sys.stderr)
PY
