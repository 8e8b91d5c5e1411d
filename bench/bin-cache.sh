#!/usr/bin/env bash
# Keeps the GPU tarballs (bench/bin/reel-cuda.tar.xz from `BUILD_ONLY=1 PLAN=session bench/gpu.sh`,
# bench/bin/reel-cuda-tests.tar.xz from `BUILD_ONLY=1 bench/gpu-tests.sh`) outside the clone,
# keyed by the commit of the crates they were built from (bench/source-rev.sh), so that a
# later session on the same machine carries them to the GPU without the ~40 minutes of
# building them again:
#   bench/bin-cache.sh save      # after building: copies each tarball built from the current
#                                # sources into $REEL_BIN_CACHE/<rev>/ (others are refused)
#   bench/bin-cache.sh restore   # before a GPU call, here (it needs git): copies
#                                # $REEL_BIN_CACHE/<rev>/*.tar.xz into bench/bin/; a tarball
#                                # already there built from <rev> is kept; one built from
#                                # another commit is moved aside (<name>.stale-<its rev>), so
#                                # it is never carried by mistake; exits 1 when a tarball is
#                                # missing (build it)
#   bench/bin-cache.sh list      # what the cache holds
# REEL_BIN_CACHE defaults to ~/.cache/reel-bin; `save` keeps the newest KEEP (default 3) revs.
# A tarball's own commit is read from inside it (the `.rev` files bench/variants.sh and
# bench/gpu-tests.sh write), so a stale tarball is never filed under the current commit.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${REEL_BIN_CACHE:-$HOME/.cache/reel-bin}
BIN_DIR=${BIN_DIR:-bench/bin}
TARBALLS=(reel-cuda.tar.xz reel-cuda-tests.tar.xz)

rev=$(bench/source-rev.sh)
case $rev in
  unknown)
    # No git (e.g. the GPU machine, which gets no .git): the sources' commit cannot be told.
    echo "bin-cache: no git checkout here, so the sources' commit is unknown; run" \
      "'bench/bin-cache.sh ${1:-}' on the build machine, before the device call (the GPU" \
      "machine only unpacks the carried tarballs)" >&2
    exit 2
    ;;
  *-dirty)
    echo "bin-cache: the crates' sources are '$rev'; commit them first" >&2
    exit 2
    ;;
esac

# The commit a tarball was built from: its first `.rev` or `REV` member.
built_from() {
  local member
  member=$(tar -tJf "$1" | grep -E '(\.rev|/REV)$' | head -1)
  [[ -n $member ]] && tar -xJOf "$1" "$member" | head -1
}

case ${1:-} in
  save)
    saved=0
    for t in "${TARBALLS[@]}"; do
      [[ -f $BIN_DIR/$t ]] || continue
      from=$(built_from "$BIN_DIR/$t" || true)
      if [[ $from != "$rev" ]]; then
        echo "bin-cache: $BIN_DIR/$t was built from '${from:-unknown}', not $rev: not saved" >&2
        continue
      fi
      mkdir -p "$CACHE/$rev"
      cp "$BIN_DIR/$t" "$CACHE/$rev/$t.part" && mv "$CACHE/$rev/$t.part" "$CACHE/$rev/$t"
      echo "bin-cache: saved $t ($rev)"
      saved=$((saved + 1))
    done
    # Oldest revs beyond KEEP go (by the time they were saved).
    # shellcheck disable=SC2012 # rev names are hex digits
    ls -1t "$CACHE" 2>/dev/null | tail -n +$((${KEEP:-3} + 1)) | while read -r old; do
      rm -rf "${CACHE:?}/$old" && echo "bin-cache: dropped $old"
    done
    [[ $saved -gt 0 ]]
    ;;
  restore)
    mkdir -p "$BIN_DIR"
    missing=0
    for t in "${TARBALLS[@]}"; do
      if [[ -f $CACHE/$rev/$t ]]; then
        cp "$CACHE/$rev/$t" "$BIN_DIR/$t.part" && mv "$BIN_DIR/$t.part" "$BIN_DIR/$t"
        echo "bin-cache: restored $t ($rev)"
        continue
      fi
      # No cache for these sources: a tarball already in BIN_DIR is kept only when it was
      # built from them (then `save` files it); one of another commit is moved aside, not
      # left to be carried as if current.
      if [[ -f $BIN_DIR/$t ]]; then
        from=$(built_from "$BIN_DIR/$t" || true)
        if [[ $from == "$rev" ]]; then
          echo "bin-cache: $BIN_DIR/$t was built from $rev: kept (bench/bin-cache.sh save files it)"
          continue
        fi
        mv "$BIN_DIR/$t" "$BIN_DIR/$t.stale-${from:-unknown}"
        echo "bin-cache: $BIN_DIR/$t was built from '${from:-unknown}', not $rev: moved to" \
          "$BIN_DIR/$t.stale-${from:-unknown}" >&2
      fi
      echo "bin-cache: no $t for $rev in $CACHE: build it" >&2
      missing=1
    done
    exit $missing
    ;;
  list)
    ls -lR "$CACHE" 2>/dev/null || echo "bin-cache: $CACHE is empty"
    echo "current sources: $rev"
    ;;
  *)
    echo "usage: $0 save|restore|list" >&2
    exit 2
    ;;
esac
