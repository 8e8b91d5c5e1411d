# Sourced by .ci/run: a build that a damaged incremental cache broke is built once more from a
# clean build of the workspace's own crates.
#
# The run compiles the workspace crates incrementally from the last run's state (.ci/run). On
# 2026-12-02 a run's test build failed to link (`rust-lld: error: undefined hidden symbol:
# anon.<hash>.llvm.<n>` and `... KernelLauncher::with_scope`, referenced by object files that
# rustc had reused from its incremental cache): a rustc incremental-compilation fault, not an
# error in the code (rust-lang/rust#81280, "Incremental occasionally causes link failures",
# open), and every later run on that cache would have failed the same way. Cargo
# calls the upstream crates' libraries fresh, so only cleaning them (and dropping the
# incremental state) rebuilds the objects that disagree.

# Output of rustc and the linker that a damaged incremental cache gives and an error in the code
# does not: missing Rust-internal symbols (hidden ones, or LLVM's `anon.*`/`*.llvm.*` names; a
# C library's missing symbol, say MPI's, is neither), an internal compiler error, unstable
# fingerprints, an error about a file of the incremental state itself.
HEAL_PATTERN='undefined hidden symbol|undefined (symbol|reference to).*(anon\.|\.llvm\.)|internal compiler error|unstable fingerprints|^error.*/incremental/'

# The workspace's packages: the only ones built incrementally.
HEAL_PACKAGES=(reel reel-core reel-macros reel-models reel-methods reel-plugins custom-method)

# heal_build CMD...: runs the build command CMD. When it fails with output matching
# HEAL_PATTERN while incremental compilation is on, cleans the workspace packages' release
# artifacts and the incremental state, says so, and runs CMD once more (its status is the
# result). Any other failure is returned as it is.
heal_build() {
    local log status damaged=0
    log="$(mktemp)"
    set +e
    "$@" 2>&1 | tee "$log"
    status="${PIPESTATUS[0]}"
    set -e
    if [ "$status" != 0 ] && [ "${CARGO_INCREMENTAL:-0}" = 1 ] && grep -Eq "$HEAL_PATTERN" "$log"
    then
        damaged=1
    fi
    rm -f "$log"
    [ "$damaged" = 1 ] || return "$status"
    echo
    echo "HEALING: the build failed as a damaged incremental cache does (matched: $HEAL_PATTERN)."
    echo "Cleaning the workspace crates' release build and $CARGO_TARGET_DIR/release/incremental,"
    echo "then building once more."
    local p args=()
    for p in "${HEAL_PACKAGES[@]}"; do args+=(-p "$p"); done
    cargo clean --release "${args[@]}"
    rm -rf "$CARGO_TARGET_DIR/release/incremental"
    "$@"
}
