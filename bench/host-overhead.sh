#!/usr/bin/env bash
# The host's own cost of a training step, by depth: `reel bench --breakdown` on Wan models
# of 2 heads of 16 and 4 tokens (so the kernels cost next to nothing) with 10, 30 and 60
# blocks, fine-tuning and DMD2. What grows faster than the block count is bookkeeping per
# operation (Burn's autodiff graph, Reel's per-call work), which on a GPU adds to every step
# whatever its shape. Prints one table (median ms of the timed steps).
#
#   bench/host-overhead.sh                    # cpu backend
#   BACKEND=cuda REEL=path/to/reel bench/host-overhead.sh
#   LAYERS="30 40" METHODS=finetune STEPS=10 bench/host-overhead.sh
#   DTYPE=bf16 ATTENTION=flash BACKEND=cuda ...   # runtime.dtype and every role's attention
#
# REEL is the reel binary (default: the release build under CARGO_TARGET_DIR, else target/).
set -euo pipefail
cd "$(dirname "$0")/.."
BACKEND=${BACKEND:-cpu}
LAYERS=${LAYERS:-"10 30 60"}
METHODS=${METHODS:-"finetune dmd2"}
STEPS=${STEPS:-6}
DTYPE=${DTYPE:-}
ATTENTION=${ATTENTION:-}
REEL=${REEL:-${CARGO_TARGET_DIR:-target}/release/reel}
[[ -x $REEL ]] || { echo "host-overhead: no reel binary at $REEL (cargo build --release)" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

# The roles of method `$1`.
roles_of() { if [[ $1 == dmd2 ]]; then echo student teacher critic; else echo student; fi; }

# The run config of `method` over the model config `$1`.
run_config() {
  local model=$1 method=$2 role
  printf '[runtime]\nbackend = "cpu"\nseed = 1\noutput_dir = "%s/out"\n' "$tmp"
  for role in $(roles_of "$method"); do
    local trained=true; [[ $role == teacher ]] && trained=false
    printf '[models.%s]\narch = "wan"\nconfig = "%s"\ntrainable = %s\n' "$role" "$model" "$trained"
  done
  if [[ $method == dmd2 ]]; then
    printf '[method]\nkind = "dmd2"\nrollout = "simulate"\ndenoising_steps = [1000, 750, 500, 250]\n'
    printf 'generator_update_interval = 1\n'
  else
    printf '[method]\nkind = "finetune"\n'
  fi
  printf '[data]\nkind = "random"\nchannels = 4\nframes = 1\nheight = 4\nwidth = 4\n'
  printf 'text_len = 8\ntext_dim = 32\nbatch_size = 1\n[optimizer]\nlr = 1e-4\n'
  printf '[training]\nmax_steps = 100\nmax_grad_norm = 1.0\n'
}

# The median of the phase named `$2` (a fixed string) in breakdown output `$1`.
phase_ms() {
  awk -v p="$2" 'index($0, "  " p " ") == 1 {
    for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.]+$/) { print $(i + 1); exit }
  }' "$1"
}

printf '| method | blocks | step ms | forward ms | backward ms | clip + optimizer ms |\n'
printf '|---|---|---|---|---|---|\n'
for layers in $LAYERS; do
  model=$tmp/wan-$layers.json
  printf '{"_class_name": "WanTransformer3DModel", "patch_size": [1, 2, 2], %s, %s, %s}\n' \
    '"num_attention_heads": 2, "attention_head_dim": 16, "in_channels": 4, "out_channels": 4' \
    '"text_dim": 32, "freq_dim": 32, "ffn_dim": 64, "num_layers": '"$layers" \
    '"cross_attn_norm": true, "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "rope_max_seq_len": 32' \
    >"$model"
  for method in $METHODS; do
    run_config "$model" "$method" >"$tmp/host-overhead.toml"
    sets=(--set "runtime.backend=$BACKEND")
    [[ -n $DTYPE ]] && sets+=(--set "runtime.dtype=$DTYPE")
    if [[ -n $ATTENTION ]]; then
      for role in $(roles_of "$method"); do
        sets+=(--set "models.$role.attention=$ATTENTION")
      done
    fi
    out=$tmp/out.txt
    "$REEL" bench --breakdown --config "$tmp/host-overhead.toml" "${sets[@]}" \
      --steps "$STEPS" >"$out" 2>"$tmp/err.txt" || {
      echo "| $method | $layers | failed: $(tail -1 "$tmp/err.txt") | | | |"
      continue
    }
    printf '| %s | %s | %s | %s | %s | %s |\n' "$method" "$layers" \
      "$(phase_ms "$out" "step, unprofiled")" "$(phase_ms "$out" "student forward")" \
      "$(phase_ms "$out" "student backward")" "$(phase_ms "$out" "clip + optimizer")"
  done
done
