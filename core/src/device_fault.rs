//! Failures of device work found after the call that queued it returned.
//!
//! Some device calls run after their caller has gone on: `reel-models` queues its cuBLAS and
//! cuDNN calls on CubeCL's server thread (`REEL_MATMUL=cublas-queued`,
//! `REEL_FLASH=cudnn-queued`), where a failure cannot be handed back to the caller. The code
//! that queues such calls registers a [`FaultSource`] here, and the trainer calls [`check`]
//! after each step's host sync (every call queued before it has run by then) and before it
//! commits a checkpoint. A failure thus stops the run before the step's update, and no
//! checkpoint holds values computed from a failed call.

use std::sync::Mutex;

/// The first failure a source has seen since the process started, or `None`.
pub type FaultSource = fn() -> Option<String>;

/// The registered sources, by name.
static SOURCES: Mutex<Vec<(&'static str, FaultSource)>> = Mutex::new(Vec::new());

/// A device call that ran after the call that queued it returned has failed: its outputs,
/// and what was computed from them, are wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a device call queued by {caller} failed after its caller went on ({why})")]
pub struct DeviceFault {
    /// The [`register`]ed name of the code that queued the call.
    pub caller: &'static str,
    /// What failed.
    pub why: String,
}

/// Registers `source` under `name` (a second registration of the same name is ignored).
pub fn register(name: &'static str, source: FaultSource) {
    let mut sources = SOURCES.lock().unwrap_or_else(|e| e.into_inner());
    if !sources.iter().any(|(n, _)| *n == name) {
        sources.push((name, source));
    }
}

/// The first registered source's failure, if any has failed. Sync the device first (read a
/// value back) so that everything queued before has run. The fault point `device-fault`
/// ([`crate::fault`]) makes the selected call fail, to test what the trainer does then.
pub fn check() -> Result<(), DeviceFault> {
    if crate::fault::fires("device-fault") {
        return Err(DeviceFault {
            caller: "REEL_FAULT",
            why: "device-fault injected".into(),
        });
    }
    // The sources are copied out first: a source may register another.
    first_failure(&SOURCES.lock().unwrap_or_else(|e| e.into_inner()).clone())
}

/// The first of `sources` that has failed.
fn first_failure(sources: &[(&'static str, FaultSource)]) -> Result<(), DeviceFault> {
    for &(caller, failure) in sources {
        if let Some(why) = failure() {
            return Err(DeviceFault { caller, why });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> Option<String> {
        None
    }

    fn broken() -> Option<String> {
        Some("the unit test's call".into())
    }

    /// The first failed source is found, named; healthy sources pass. (On a local list: a
    /// failing source registered process-wide would stop the other tests' trainings.)
    #[test]
    fn the_first_failed_source_is_found() {
        assert_eq!(first_failure(&[("a", healthy), ("b", healthy)]), Ok(()));
        let fault =
            first_failure(&[("a", healthy), ("b", broken), ("c", broken)]).expect_err("b failed");
        assert_eq!(fault.caller, "b");
        assert_eq!(fault.why, "the unit test's call");
        assert!(fault.to_string().contains("queued by b failed"), "{fault}");
    }

    /// One registration per name, however often `register` is called.
    #[test]
    fn a_source_is_registered_once() {
        register("unit test", healthy);
        register("unit test", healthy);
        let sources = SOURCES.lock().unwrap().clone();
        assert_eq!(sources.iter().filter(|(n, _)| *n == "unit test").count(), 1);
        assert!(first_failure(&sources).is_ok());
    }
}
