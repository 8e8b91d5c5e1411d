//! Timed repetitions ([`time`]) and one line on stderr per benchmarked step ([`Progress`]):
//! a long run (a 29k-token DMD2 step takes tens of seconds) shows that it is alive, and a run
//! stopped early (a GPU session's time limit) still leaves the times of the steps it finished
//! in its log, which `bench/gpu.sh` reports.

use std::time::Instant;

use burn::tensor::backend::Backend;

use super::{stats, BenchArgs, Stats};

/// Counts the steps of one benchmarked run and reports each one.
pub(super) struct Progress {
    what: String,
    total: usize,
    done: usize,
}

impl Progress {
    /// A run of `total` steps (warm-up ones included) described by `what`.
    pub(super) fn new(what: impl Into<String>, total: usize) -> Self {
        Self {
            what: what.into(),
            total,
            done: 0,
        }
    }

    /// The line for the step just finished: its `kind` (`warm-up`, `timed`, …) and time.
    pub(super) fn line(&mut self, kind: &str, ms: f64) -> String {
        self.done += 1;
        format!(
            "bench: {}: step {}/{} ({kind}) {ms:.1} ms",
            self.what, self.done, self.total
        )
    }

    /// Print [`Self::line`] on stderr.
    pub(super) fn step(&mut self, kind: &str, ms: f64) {
        eprintln!("{}", self.line(kind, ms));
    }
}

/// Time `f` (`warmup` untimed, then `steps` timed runs), syncing the device after each;
/// `what` names the operation in the progress lines.
pub(super) fn time<B: Backend, T>(
    args: &BenchArgs,
    what: &str,
    device: &B::Device,
    mut f: impl FnMut() -> anyhow::Result<T>,
) -> anyhow::Result<(Stats, T)> {
    let mut out = None;
    let mut ms = vec![];
    let mut progress = Progress::new(what, args.warmup + args.steps);
    for i in 0..args.warmup + args.steps {
        let t0 = Instant::now();
        let r = f()?;
        let _ = B::sync(device);
        let t = t0.elapsed().as_secs_f64() * 1e3;
        progress.step(if i < args.warmup { "warm-up" } else { "timed" }, t);
        if i >= args.warmup {
            ms.push(t);
        }
        out = Some(r);
    }
    Ok((stats(ms), out.expect("at least one timed step")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_count_the_steps_of_the_run() {
        let mut p = Progress::new("wan-tiny 8 tokens, train", 3);
        assert_eq!(
            p.line("warm-up", 12.345),
            "bench: wan-tiny 8 tokens, train: step 1/3 (warm-up) 12.3 ms"
        );
        assert_eq!(
            p.line("timed", 2.0),
            "bench: wan-tiny 8 tokens, train: step 2/3 (timed) 2.0 ms"
        );
    }
}
