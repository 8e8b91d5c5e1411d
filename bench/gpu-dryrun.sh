#!/usr/bin/env bash
# Rehearses bench/gpu.sh on this machine, without a GPU, before its plan spends device
# minutes: every job of the plan runs in order, on a CPU stand-in for the CUDA binary (the
# CPU build of `reel`, the `wan-tiny` preset at a 1x4x4 latent, float32), and the summary is
# written from what they printed, so a change to the plan, to its picks (`fastest_*`) or to
# the summary shows its mistakes in seconds. The timings mean nothing; the jobs the CPU cannot
# run (the shipped configs, UMT5 and the VAE at full size) fail on purpose and are listed as
# such. PyTorch is left out (TORCH=0).
#   bench/gpu-dryrun.sh                          # the session plan, as a GPU session runs it
#   ATTENTION=flash bench/gpu-dryrun.sh          # any of gpu.sh's settings pass through
#   PLAN=matrix SHAPES=8,32,32 bench/gpu-dryrun.sh
# REEL_BIN (default: the release `reel` under CARGO_TARGET_DIR, else target/) is the CPU
# binary; the results go to a temporary folder, printed at the end, not to bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
reel=${REEL_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/release/reel}
[[ -x $reel ]] || { echo "no CPU build at $reel: cargo build --release (or set REEL_BIN)" >&2; exit 2; }
reel=$(realpath "$reel")
dir=$(mktemp -d)
# Stand-ins for every variant either plan may name.
variants=${VARIANTS:-plain fusion fusion+autotune}

for v in $variants; do
  cat >"$dir/reel-cuda-$v" <<EOF
#!/usr/bin/env bash
# CPU stand-in for reel-cuda-$v (bench/gpu-dryrun.sh).
args=()
while [[ \$# -gt 0 ]]; do
  case \$1 in
    --backend) args+=(--backend cpu); shift 2 ;;
    --preset) args+=(--preset wan-tiny); shift 2 ;;
    --shape) args+=(--shape 1 4 4); shift 4 ;;
    --dtype) shift 2 ;;
    # bench/host-overhead.sh's configs are small: they run, on the CPU (Flex, which takes bf16).
    --config) [[ \$2 == */host-overhead.toml ]] || { echo "dry run: \$1 is too large for the CPU stand-in" >&2; exit 1; }
      args+=("\$1" "\$2"); shift 2 ;;
    --set) [[ \$2 == runtime.backend=* ]] && args+=(--set runtime.backend=flex) || args+=(--set "\$2"); shift 2 ;;
    --text-encoder | --vae) echo "dry run: \$1 is too large for the CPU stand-in" >&2; exit 1 ;;
    *) args+=("\$1"); shift ;;
  esac
done
echo "dry run: reel \${args[*]}\${REEL_MATMUL:+ REEL_MATMUL=\$REEL_MATMUL}\${REEL_FLASH:+ REEL_FLASH=\$REEL_FLASH}" >&2
exec "$reel" "\${args[@]}"
EOF
  chmod +x "$dir/reel-cuda-$v"
  bench/source-rev.sh >"$dir/reel-cuda-$v.rev"
done

PLAN=${PLAN:-session} TORCH=0 BIN_DIR=$dir RESULTS_DIR=$dir/results TAG=${TAG:-dryrun} bench/gpu.sh
echo "dry run results: $dir/results/" >&2
ls "$dir/results" >&2
