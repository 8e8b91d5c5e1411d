#!/usr/bin/env bash
# Reel vs PyTorch (diffusers WanTransformer3DModel), same presets and shapes, same machine,
# one run: prints both tables and the ratio of median step times.
#
#   bench/side_by_side.sh                      # CPU presets (48, 256, 2048 tokens)
#   DEVICE=cuda bench/side_by_side.sh          # needs a CUDA build: cargo build --release --features cuda
#   PRESETS="wan-bench-small:8,16,16:8" bench/side_by_side.sh   # preset:F,H,W:batch ...
#   DTYPE=bf16 CKPT=1 DEVICE=cuda bench/side_by_side.sh  # bf16 compute, gradient checkpointing
#
# Installs PyTorch and diffusers into bench/pytorch/.venv on first use (PyPI). Set PYTHON to
# use an interpreter that already has them. REEL overrides the reel binary.
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cpu}
STEPS=${STEPS:-5}
WARMUP=${WARMUP:-2}
THREADS=${THREADS:-$(nproc)}
DTYPE=${DTYPE:-f32}
extra=(--dtype "$DTYPE"); [[ -n ${CKPT:-} ]] && extra+=(--gradient-checkpointing)
PRESETS=${PRESETS:-"wan-tiny:3,8,8:2 wan-bench-small:4,16,16:4 wan-bench-small:8,32,32:1"}
if [[ -z "${PYTHON:-}" ]]; then
  if [[ ! -x bench/pytorch/.venv/bin/python ]]; then
    echo "installing PyTorch + diffusers into bench/pytorch/.venv (first run only)" >&2
    python3 -m venv bench/pytorch/.venv
    bench/pytorch/.venv/bin/pip install -q -r bench/pytorch/requirements.txt
  fi
  PYTHON=bench/pytorch/.venv/bin/python
fi
if [[ -z "${REEL:-}" ]]; then
  feat=(); [[ $DEVICE == cuda ]] && feat=(--features cuda)
  cargo build --release --bin reel "${feat[@]}" >&2
  REEL=${CARGO_TARGET_DIR:-target}/release/reel
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
i=0
for spec in $PRESETS; do
  IFS=: read -r preset shape batch <<<"$spec"
  read -r f h w <<<"${shape//,/ }"
  i=$((i + 1))
  # Each side in its own process, so peak RSS is per run.
  "$REEL" bench --backend "$DEVICE" --preset "$preset" --shape "$f" "$h" "$w" --batch "$batch" \
    --steps "$STEPS" --warmup "$WARMUP" "${extra[@]}" --json >"$tmp/reel$i.json"
  "$PYTHON" bench/pytorch/bench_wan.py --device "$DEVICE" --preset "$preset" --shape "$f" "$h" "$w" \
    --batch "$batch" --steps "$STEPS" --warmup "$WARMUP" --threads "$THREADS" "${extra[@]}" --json >"$tmp/torch$i.json"
done
"$PYTHON" - "$tmp" "$i" <<'PY'
import json, sys
tmp, n = sys.argv[1], int(sys.argv[2])
print(f"{'preset':<18} {'batch':>5} {'tokens':>6} | {'reel step ms':>12} {'torch step ms':>13} {'reel/torch':>10} | "
      f"{'reel fwd ms':>11} {'torch fwd ms':>12} | {'reel peak MiB':>13} {'torch peak MiB':>14}")
for i in range(1, n + 1):
    r = json.load(open(f"{tmp}/reel{i}.json"))[0]
    t = json.load(open(f"{tmp}/torch{i}.json"))[0]
    if r["trainable_params"] != t["trainable_params"]:
        sys.exit(f"{r['preset']}: parameter counts differ (reel {r['trainable_params']}, torch {t['trainable_params']})")
    rs, ts = r["train_step_ms"]["median"], t["train_step_ms"]["median"]
    print(f"{r['preset']:<18} {r['batch']:>5} {r['tokens']:>6} | {rs:12.1f} {ts:13.1f} {rs / ts:10.2f} | "
          f"{r['forward_ms']['median']:11.1f} {t['forward_ms']['median']:12.1f} | {r['peak_rss_mib']:13.0f} {t['peak_mib']:14.0f}")
print("medians of the timed steps; peak = process peak RSS on CPU (reel: all of its rows; "
      "torch: one process per row), GPU memory high-water mark on CUDA for torch")
PY
