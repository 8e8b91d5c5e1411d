//! Phase timing for `reel bench --breakdown`: where a training step's time goes.
//!
//! The trainer and the built-in methods mark their phases ("data", "student forward",
//! "critic backward", "clip + optimizer", ...) with [`phase`]. Off (the default), a phase is
//! one thread-local flag read. On ([`start`] on the current thread), each phase syncs the
//! device before and after it ([`Backend::sync`]: on CUDA, kernel launches are asynchronous,
//! so without the sync a phase would time only the launches), and records its time
//! **exclusive** of the phases nested in it. [`end_step`] closes one step's record, and
//! [`finish`] returns every step's phases.
//!
//! The syncs themselves cost time and stall the launch queue, so a profiled step is slower
//! than an unprofiled one; `reel bench` reports both.
//!
//! Each phase also records its **host** time: until its code returned, before the closing
//! sync. Close to the phase's time, the GPU kept up with the host (the host's launches, or
//! host syncs inside the phase, set the pace); well below it, the host ran ahead and the GPU
//! set the pace.

use std::cell::RefCell;
use std::time::Instant;

use burn::tensor::backend::Backend;

/// One phase's time in a step, summed over every entry of the phase during the step,
/// exclusive of nested phases.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseTime {
    /// The phase's name.
    pub name: String,
    /// Milliseconds, from the sync before the phase to the sync after it.
    pub ms: f64,
    /// Milliseconds until the phase's code returned (before the closing sync).
    pub host_ms: f64,
}

/// The phases of one step, in first-seen order.
pub type StepPhases = Vec<PhaseTime>;

#[derive(Default)]
struct Recorder {
    /// Open phases, innermost last: name, start, time spent in nested phases (ms).
    stack: Vec<(String, Instant, f64)>,
    current: StepPhases,
    steps: Vec<StepPhases>,
}

thread_local! {
    static RECORDER: RefCell<Option<Recorder>> = const { RefCell::new(None) };
}

/// Start recording phases on this thread (discarding any earlier record).
pub fn start() {
    RECORDER.with(|r| *r.borrow_mut() = Some(Recorder::default()));
}

/// Whether phases are being recorded on this thread.
pub fn is_on() -> bool {
    RECORDER.with(|r| r.borrow().is_some())
}

/// Close the current step's record (no-op when off).
pub fn end_step() {
    RECORDER.with(|r| {
        if let Some(rec) = r.borrow_mut().as_mut() {
            let step = std::mem::take(&mut rec.current);
            rec.steps.push(step);
        }
    });
}

/// Stop recording and return every closed step's phases (empty when recording was off).
pub fn finish() -> Vec<StepPhases> {
    RECORDER.with(|r| {
        r.borrow_mut()
            .take()
            .map(|rec| rec.steps)
            .unwrap_or_default()
    })
}

/// Run `f` as the phase `name` on `device`: when recording, the device is synced before and
/// after `f` and the time is added to `name` (minus the phases nested in `f`).
pub fn phase<B: Backend, R>(name: &str, device: &B::Device, f: impl FnOnce() -> R) -> R {
    let _guard = enter::<B>(name, device);
    f()
}

/// Like [`phase`] for code that returns early (`?`): the phase lasts until the guard drops.
pub fn enter<'a, B: Backend>(name: &str, device: &'a B::Device) -> PhaseGuard<'a, B> {
    let on = is_on();
    if on {
        sync::<B>(device);
        RECORDER.with(|r| {
            if let Some(rec) = r.borrow_mut().as_mut() {
                rec.stack.push((name.to_string(), Instant::now(), 0.0));
            }
        });
    }
    PhaseGuard { device, on }
}

/// An open phase; see [`enter`].
pub struct PhaseGuard<'a, B: Backend> {
    device: &'a B::Device,
    on: bool,
}

impl<B: Backend> Drop for PhaseGuard<'_, B> {
    fn drop(&mut self) {
        if !self.on {
            return;
        }
        let returned = Instant::now();
        sync::<B>(self.device);
        RECORDER.with(|r| {
            if let Some(rec) = r.borrow_mut().as_mut() {
                rec.close(returned);
            }
        });
    }
}

impl Recorder {
    /// Closes the innermost phase, whose code returned at `returned`.
    fn close(&mut self, returned: Instant) {
        let Some((name, t0, nested)) = self.stack.pop() else {
            return;
        };
        let ms = |t: Instant| t.duration_since(t0).as_secs_f64() * 1e3;
        let (total, host) = (ms(Instant::now()), ms(returned));
        if let Some(parent) = self.stack.last_mut() {
            parent.2 += total;
        }
        let own = (total - nested).max(0.0);
        let own_host = (host - nested).clamp(0.0, own);
        match self.current.iter_mut().find(|p| p.name == name) {
            Some(p) => {
                p.ms += own;
                p.host_ms += own_host;
            }
            None => self.current.push(PhaseTime {
                name,
                ms: own,
                host_ms: own_host,
            }),
        }
    }
}

fn sync<B: Backend>(device: &B::Device) {
    // A failed sync (a device error) surfaces again at the next read of a tensor, where the
    // trainer reports it; the profiler only loses that phase's accuracy.
    let _ = B::sync(device);
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestBackend = burn::backend::NdArray;

    fn busy(ms: u64) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }

    #[test]
    fn nested_phases_are_exclusive_and_summed_per_step() {
        let dev = Default::default();
        start();
        let wall = std::time::Instant::now();
        phase::<TestBackend, _>("outer", &dev, || {
            busy(20);
            phase::<TestBackend, _>("inner", &dev, || busy(30));
            phase::<TestBackend, _>("inner", &dev, || busy(30));
        });
        let wall = wall.elapsed().as_secs_f64() * 1e3;
        end_step();
        phase::<TestBackend, _>("inner", &dev, || busy(5));
        end_step();
        let steps = finish();
        assert_eq!(steps.len(), 2);
        let names: Vec<&str> = steps[0].iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["inner", "outer"], "inner closes first: {steps:?}");
        let (inner, outer) = (steps[0][0].ms, steps[0][1].ms);
        assert!(inner >= 60.0, "two inner phases summed: {inner}");
        // Counted twice, the nested 60 ms would push the sum past the wall time (sleeps only
        // bound from below, so no upper bound on either phase alone holds on a busy machine).
        assert!(
            outer >= 20.0 && outer + inner <= wall + 0.5,
            "outer excludes its nested phases: outer {outer}, inner {inner}, wall {wall}"
        );
        assert_eq!(steps[1].len(), 1);
        assert!(!is_on(), "finish stops recording");
    }

    #[test]
    fn phases_cost_nothing_and_record_nothing_when_off() {
        let dev = Default::default();
        assert!(!is_on());
        let v = phase::<TestBackend, _>("x", &dev, || 7);
        assert_eq!(v, 7);
        end_step();
        assert!(finish().is_empty());
    }

    #[test]
    fn an_early_return_closes_its_phase() {
        let dev = Default::default();
        fn work(dev: &burn::tensor::Device<TestBackend>) -> Result<(), ()> {
            let _p = enter::<TestBackend>("fails", dev);
            Err(())
        }
        start();
        assert!(work(&dev).is_err());
        end_step();
        let steps = finish();
        assert_eq!(steps[0].len(), 1);
        assert_eq!(steps[0][0].name, "fails");
    }

    #[test]
    fn host_time_is_the_phases_own_code_before_its_closing_sync() {
        let dev = Default::default();
        start();
        let wall = std::time::Instant::now();
        phase::<TestBackend, _>("outer", &dev, || {
            busy(10);
            phase::<TestBackend, _>("inner", &dev, || busy(25));
        });
        let wall = wall.elapsed().as_secs_f64() * 1e3;
        end_step();
        let steps = finish();
        for p in &steps[0] {
            assert!(p.host_ms <= p.ms, "{p:?}");
        }
        // On the CPU the sync waits for nothing: the host time is the sleeps.
        let (inner, outer) = (&steps[0][0], &steps[0][1]);
        assert!(inner.host_ms >= 25.0, "{inner:?}");
        assert!(
            outer.host_ms >= 10.0 && outer.host_ms + inner.host_ms <= wall + 0.5,
            "the outer phase's host time excludes the inner phase: {outer:?}, wall {wall}"
        );
    }
}
