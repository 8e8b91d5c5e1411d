#!/usr/bin/env bash
# Reel's CubeCL build variants side by side, in one run on one machine: Burn's fusion layer
# and kernel autotuning on or off, times the attention implementations. Every (variant,
# attention) pair runs once per round, rounds interleaved, and the table gives the median of
# the rounds' median step times and the ratio to the first pair.
#
#   bench/variants.sh                                   # cuda: plain, fusion, fusion+autotune
#   BACKEND=wgpu bench/variants.sh                      # the same on Burn's wgpu backend
#   PRESET=wan2.1-t2v-1.3b SHAPE="21 60 104" BATCH=1 DTYPE=bf16 CKPT=1 bench/variants.sh
#   VARIANTS="plain fusion" ATTENTION="memory_efficient fused" ROUNDS=5 bench/variants.sh
#
# Binaries: $BIN_DIR/reel-<backend>-<variant> (variant features joined by `+`; `plain` = no
# extra feature). A missing one is built with `cargo build --release --features
# <backend>,<features>` into its own target dir ($CARGO_TARGET_DIR/variants/<variant>), so switching
# variants never rebuilds Burn. Build on one machine and copy BIN_DIR to another to run there:
# BUILD_ONLY=1 builds the missing binaries and stops. Each binary has a `.rev` file beside it
# (bench/source-rev.sh: the last commit of the crates it was built from, `-dirty` with
# uncommitted changes); one whose `.rev` is not the current clean one is rebuilt, so a stale
# binary is never carried. Binaries are stripped (wgpu about 45-65 MB,
# cuda 123-136 MB; `xz` takes them to about 19 MB each for carrying).
set -euo pipefail
cd "$(dirname "$0")/.."
BACKEND=${BACKEND:-cuda}
VARIANTS=${VARIANTS:-"plain fusion fusion+autotune"}
ATTENTION=${ATTENTION:-"memory_efficient fused"}
PRESET=${PRESET:-wan-bench-small}
SHAPE=${SHAPE:-"8 32 32"}
BATCH=${BATCH:-1}
DTYPE=${DTYPE:-f32}
STEPS=${STEPS:-5}
WARMUP=${WARMUP:-2}
ROUNDS=${ROUNDS:-3}
BIN_DIR=${BIN_DIR:-bench/bin}
TARGET=${CARGO_TARGET_DIR:-$PWD/target}
extra=(--dtype "$DTYPE"); [[ -n ${CKPT:-} ]] && extra+=(--gradient-checkpointing)
case $BACKEND in cuda | wgpu) ;; *) echo "BACKEND must be cuda or wgpu, not '$BACKEND'" >&2; exit 2 ;; esac

mkdir -p "$BIN_DIR"
rev=$(bench/source-rev.sh)
for variant in $VARIANTS; do
  bin="$BIN_DIR/reel-$BACKEND-$variant"
  # Built binaries (on the GPU machine, unpacked ones) are kept, except by BUILD_ONLY when
  # the crates changed since.
  if [[ -x $bin ]]; then
    built=$(cat "$bin.rev" 2>/dev/null || echo unknown)
    [[ -z ${BUILD_ONLY:-} || ($built == "$rev" && $rev != *-dirty) ]] && continue
    echo "$bin was built from $built, the sources are at $rev: rebuilding" >&2
  fi
  features=$BACKEND; [[ $variant != plain ]] && features+=",${variant//+/,}"
  echo "building $bin (--features $features)" >&2
  CARGO_TARGET_DIR="$TARGET/variants/$variant" cargo build --release --bin reel --features "$features" >&2
  cp "$TARGET/variants/$variant/release/reel" "$bin"
  strip "$bin" 2>/dev/null || true
  echo "$rev" >"$bin.rev"
done

if [[ -n ${BUILD_ONLY:-} ]]; then
  ls -l "$BIN_DIR"
  exit 0
fi

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
read -r f h w <<<"$SHAPE"
for round in $(seq "$ROUNDS"); do
  for variant in $VARIANTS; do
    for attention in $ATTENTION; do
      echo "round $round: $variant, $attention" >&2
      "$BIN_DIR/reel-$BACKEND-$variant" bench --backend "$BACKEND" --preset "$PRESET" \
        --shape "$f" "$h" "$w" --batch "$BATCH" --steps "$STEPS" --warmup "$WARMUP" \
        --attention "$attention" "${extra[@]}" --json >"$tmp/$variant.$attention.$round.json"
    done
  done
done

python3 - "$tmp" "$ROUNDS" "$VARIANTS" "$ATTENTION" <<'PY'
import json, statistics, sys
tmp, rounds, variants, attentions = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
rows = []
for v in variants:
    for a in attentions:
        runs = [json.load(open(f"{tmp}/{v}.{a}.{r}.json"))[0] for r in range(1, rounds + 1)]
        med = lambda key: statistics.median(x[key]["median"] for x in runs)
        rows.append((v, a, runs[0], med("forward_ms"), med("train_step_ms"),
                     statistics.median(x["train_tokens_per_s"] for x in runs),
                     max(x["peak_rss_mib"] for x in runs)))
first = rows[0][4]
r0 = rows[0][2]
print(f"{r0['preset']}, batch {r0['batch']}, {r0['tokens']} tokens, {r0['dtype']}, "
      f"medians of {rounds} rounds (each the median of its timed steps)")
print(f"{'variant':<18} {'attention':<17} | {'forward ms':>10} {'step ms':>9} {'tok/s':>8} "
      f"{'step / first':>12} | {'peak RSS MiB':>12}")
for v, a, r, fwd, step, tps, rss in rows:
    print(f"{v:<18} {a:<17} | {fwd:10.1f} {step:9.1f} {tps:8.0f} {step / first:12.2f} | {rss:12.0f}")
PY
