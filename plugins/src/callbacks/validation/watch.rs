//! What a validation shows while it runs. A real Wan validation (50 sampling steps with CFG
//! for each prompt, then the VAE) takes minutes, with training paused.
//!
//! - On a terminal, the training progress bar's line shows the validation's progress until the
//!   next training step redraws it:
//!   `validation @ step 200: sampling step 12/50 | 00:31 | eta 01:40`, then
//!   `validation @ step 200: decoding 4 clips with the VAE`.
//! - Elsewhere (a log file, CI), the same sampling line is printed at most every
//!   [`LINE_PERIOD_S`] seconds, so a validation of a few seconds prints only its summary line.

use std::sync::Mutex;
use std::time::Instant;

use reel_core::method::SampleProgress;

use crate::callbacks::logging::progress::{format_duration, show_activity};
use crate::callbacks::print_line;

/// Seconds between two sampling lines of one validation when no progress bar is drawn (and
/// before the first).
pub const LINE_PERIOD_S: f64 = 15.0;

/// The progress text of a validation sampling: step `done` of `total` after `elapsed` seconds.
pub fn sampling_line(step: u64, done: usize, total: usize, elapsed: f64) -> String {
    let eta = match done {
        0 => f64::NAN,
        _ => elapsed / done as f64 * total.saturating_sub(done) as f64,
    };
    format!(
        "validation @ step {step}: sampling step {done}/{total} | {} | eta {}",
        format_duration(elapsed),
        format_duration(eta)
    )
}

/// Whether a plain sampling line is due at `now` seconds, the last printed at `last` (0 at
/// the start): never for the last step (the summary line follows at once).
pub fn line_due(last: f64, now: f64, done: usize, total: usize) -> bool {
    done < total && now - last >= LINE_PERIOD_S
}

/// The watcher of one validation's sampling steps at training step `step`.
pub fn sampling_watcher(step: u64) -> SampleProgress {
    let started = Instant::now();
    let last = Mutex::new(0.0);
    SampleProgress::new(move |done, total| {
        let now = started.elapsed().as_secs_f64();
        let line = sampling_line(step, done, total, now);
        if show_activity(&line) {
            return;
        }
        let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
        if line_due(*last, now, done, total) {
            *last = now;
            print_line(&line);
        }
    })
}

/// Show that the validation at `step` decodes `clips` clips with the VAE (on the bar only: a
/// log gets the summary line with the validation's whole time).
pub fn show_decoding(step: u64, clips: usize) {
    show_activity(&format!(
        "validation @ step {step}: decoding {clips} clip(s) with the VAE"
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_line_counts_steps_and_estimates_the_rest() {
        assert_eq!(
            sampling_line(200, 10, 50, 20.0),
            "validation @ step 200: sampling step 10/50 | 00:20 | eta 01:20"
        );
        assert!(sampling_line(7, 0, 8, 0.0).ends_with("eta --:--"));
        assert!(sampling_line(7, 8, 8, 3.0).ends_with("| 00:03 | eta 00:00"));
    }

    #[test]
    fn plain_lines_wait_a_period_and_skip_the_last_step() {
        assert!(!line_due(0.0, LINE_PERIOD_S - 0.1, 3, 50));
        assert!(line_due(0.0, LINE_PERIOD_S, 3, 50));
        assert!(!line_due(LINE_PERIOD_S, LINE_PERIOD_S + 1.0, 4, 50));
        assert!(!line_due(0.0, 100.0, 50, 50));
    }
}
