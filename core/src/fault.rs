//! Deterministic fault injection for crash tests.
//!
//! Set `REEL_FAULT=<point>:<n>` to kill the process (abort, no cleanup, like SIGKILL) the
//! `n`-th time execution reaches the named point (1-based). Points: `checkpoint-file` (before
//! each checkpoint file is written), `checkpoint-manifest`, `checkpoint-rename`,
//! `checkpoint-latest` (after the rename, before the `latest` pointer is replaced), `step-end`.
//!
//! Non-fatal points ask [`fires`] instead: `non-finite-loss` (once per step, after the losses
//! are read back) makes the trainer see a NaN loss at the `n`-th step of the process, to test
//! the `training.non_finite` policies; `checkpoint-disk-full` (before each checkpoint file)
//! makes that write fail as on a full disk, to test `training.on_save_error`;
//! `latest-pointer-fails` (at each checkpoint's `latest` pointer) fails that write, to test
//! that a complete checkpoint stays a success without its pointer;
//! `worker-panic` (once per worker and step, at the step's end) panics the thread of the
//! worker that reaches the `n`-th hit, to test that a failed data-parallel worker stops the
//! others; `device-out-of-memory` (same place) panics as CubeCL does when a device allocation
//! fails, to test the out-of-memory hint; `device-fault` (at each [`crate::device_fault::check`]:
//! after each step's host sync and before each checkpoint's commit) reports a failed queued
//! device call, to test that the run stops and saves nothing computed from it;
//! `callback-error` (once per step, after its callbacks) fails the step as its last callback
//! would, to test that the state is checkpointed before the run stops; `main-panic` (once, as
//! `reel train` starts after joining its processes) panics the main thread, to test that a
//! process panicking outside its workers stops the others; `bad-record` (at each batch a
//! worker reads) fails that read as a malformed record would, to test that every worker of a
//! group stops at that step and the steps before it are kept.
//! Unset in normal runs, where [`point`] costs one relaxed atomic load after the first call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

static SPEC: OnceLock<Option<(String, u64)>> = OnceLock::new();
static HITS: AtomicU64 = AtomicU64::new(0);

fn spec() -> &'static Option<(String, u64)> {
    SPEC.get_or_init(|| {
        let v = std::env::var("REEL_FAULT").ok()?;
        let (name, n) = v.rsplit_once(':')?;
        Some((name.to_string(), n.parse().ok()?))
    })
}

/// Mark a fault point; aborts the process when `REEL_FAULT` selects this hit.
pub fn point(name: &str) {
    if let Some((target, n)) = spec() {
        if target == name {
            let hit = HITS.fetch_add(1, Ordering::SeqCst) + 1;
            if hit == *n {
                eprintln!("REEL_FAULT: killing the process at `{name}` hit {hit}");
                std::process::abort();
            }
        }
    }
}

/// A non-fatal fault point: `true` exactly when `REEL_FAULT` selects this hit of `name`.
pub fn fires(name: &str) -> bool {
    match spec() {
        Some((target, n)) if target == name => HITS.fetch_add(1, Ordering::SeqCst) + 1 == *n,
        _ => false,
    }
}
