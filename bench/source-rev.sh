#!/usr/bin/env bash
# The commit of the sources that Reel's binaries are built from: the last commit that
# touched the workspace's manifests or crates (a docs or bench-script commit does not make
# prebuilt binaries stale), with `-dirty` when those files have uncommitted changes, and
# `unknown` outside a git checkout. bench/variants.sh and bench/gpu-tests.sh record it beside
# the binaries they build.
cd "$(dirname "$0")/.." || exit 1
paths=(Cargo.toml Cargo.lock core macros models methods plugins src)
rev=$(git log -1 --format=%h --abbrev=12 -- "${paths[@]}" 2>/dev/null)
[[ -n $rev ]] || { echo unknown; exit 0; }
git diff --quiet HEAD -- "${paths[@]}" 2>/dev/null || rev+=-dirty
echo "$rev"
