//! The progress line on stderr.
//!
//! ```text
//! step 120/1200 (10%) | loss 0.3127 | lr 1.00e-3 | gnorm 0.812 | 0.214 s/it | elapsed 00:26 | eta 03:51
//! ```
//!
//! On a terminal an indicatif progress bar shows the line, redrawn after every step and cut to
//! the terminal's width; other callbacks print their lines above it ([`print_above`]).
//! Otherwise (CI, a log file) a plain line is printed every `every_steps` steps and after the
//! last one. The ETA is the remaining steps times the mean of the last [`WINDOW`] step times.
//! A step whose update was skipped for non-finite values ends with `| SKIPPED`.

use reel_core::console::say;
use std::collections::VecDeque;
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

use reel_core::callback::StepReport;

/// Number of recent step times the ETA averages.
pub const WINDOW: usize = 20;

/// `mm:ss`, or `h:mm:ss` from one hour on (`--:--` for a non-finite duration).
pub fn format_duration(seconds: f64) -> String {
    if !seconds.is_finite() || seconds < 0.0 {
        return "--:--".into();
    }
    let s = seconds.round() as u64;
    let (h, m, s) = (s / 3600, (s / 60) % 60, s % 60);
    if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m:02}:{s:02}")
    }
}

/// A value with 4 significant digits, in scientific notation when very small or large.
fn fmt_value(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 || (1e-3..1e4).contains(&a) {
        format!("{v:.4}")
    } else if a.is_finite() {
        format!("{v:.3e}")
    } else {
        format!("{v}")
    }
}

/// `name value` pairs; a lone pair shows only `label value`, several `label name value ...`.
fn group(label: &str, pairs: &[(String, f64)], fmt: fn(f64) -> String) -> Option<String> {
    match pairs {
        [] => None,
        [(_, v)] => Some(format!("{label} {}", fmt(*v))),
        many => {
            let parts: Vec<String> = many
                .iter()
                .map(|(n, v)| format!("{n} {}", fmt(*v)))
                .collect();
            Some(format!("{label} {}", parts.join(" ")))
        }
    }
}

/// The progress line of one step; `mean_step` is the recent mean step time, `elapsed` the
/// wall time since training (re)started.
pub fn format_line(report: &StepReport, mean_step: f64, elapsed: f64) -> String {
    let pct = (100 * report.step)
        .checked_div(report.max_steps)
        .unwrap_or(100);
    let mut parts = vec![format!(
        "step {}/{} ({pct}%)",
        report.step, report.max_steps
    )];
    let losses: Vec<String> = report
        .losses
        .iter()
        .map(|(n, v)| format!("{n} {}", fmt_value(*v)))
        .collect();
    if !losses.is_empty() {
        parts.push(losses.join(" "));
    }
    parts.extend(group("lr", &report.lrs, |v| format!("{v:.2e}")));
    parts.extend(group("gnorm", &report.grad_norms, |v| format!("{v:.3}")));
    parts.push(format!("{:.3} s/it", mean_step));
    let remaining = report.max_steps.saturating_sub(report.step) as f64;
    parts.push(format!("elapsed {}", format_duration(elapsed)));
    parts.push(format!("eta {}", format_duration(remaining * mean_step)));
    if report.skipped {
        parts.push("SKIPPED".into());
    }
    parts.join(" | ")
}

/// The bar on the terminal while a run draws one (one per process: the lines other
/// callbacks print go above it).
static BAR: Mutex<Option<ProgressBar>> = Mutex::new(None);

/// The bar, if one is drawn (a poisoned lock only means a panic elsewhere: keep drawing).
fn bar() -> std::sync::MutexGuard<'static, Option<ProgressBar>> {
    BAR.lock().unwrap_or_else(|e| e.into_inner())
}

/// Print `line` on stderr, above the progress bar when one is drawn.
pub fn print_above(line: &str) {
    match bar().as_ref() {
        Some(b) => b.suspend(|| say(line)),
        None => say(line),
    }
}

/// Show `text` on the progress bar's line in place of the training line, until the next step
/// redraws it (a validation's progress while training waits). `false` when no bar is drawn:
/// stderr is not a terminal, or no step has been shown yet.
pub fn show_activity(text: &str) -> bool {
    match bar().as_ref() {
        Some(b) => {
            b.set_message(text.to_string());
            true
        }
        None => false,
    }
}

/// Draws the progress line.
#[derive(Debug)]
pub struct Progress {
    every: u64,
    terminal: bool,
    started: Instant,
    recent: VecDeque<f64>,
}

impl Progress {
    /// A progress line printing every `every` steps when stderr is not a terminal.
    pub fn new(every: u64) -> Progress {
        Progress {
            every: every.max(1),
            terminal: std::io::stderr().is_terminal(),
            started: Instant::now(),
            recent: VecDeque::with_capacity(WINDOW),
        }
    }

    /// Restart the elapsed-time clock (at `on_train_start`).
    pub fn start(&mut self) {
        self.started = Instant::now();
        self.recent.clear();
    }

    /// Record a step time and return the mean of the recent ones.
    pub fn push_time(&mut self, seconds: f64) -> f64 {
        if self.recent.len() == WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(seconds);
        self.recent.iter().sum::<f64>() / self.recent.len() as f64
    }

    /// Show a completed step.
    pub fn step(&mut self, report: &StepReport, is_final: bool) {
        let mean = self.push_time(report.step_seconds);
        let line = format_line(report, mean, self.started.elapsed().as_secs_f64());
        if self.terminal {
            let mut slot = bar();
            let b = slot.get_or_insert_with(|| new_bar(report.max_steps));
            b.set_length(report.max_steps);
            b.set_position(report.step);
            b.set_message(line);
            if is_final {
                b.finish();
                *slot = None;
            }
        } else if report.step.is_multiple_of(self.every) || is_final || report.skipped {
            say(&line);
        }
    }

    /// Leave the bar's last line on the terminal (before the run ends without a final step).
    pub fn finish(&mut self) {
        if let Some(b) = bar().take() {
            b.abandon();
        }
    }
}

/// A bar of `steps` steps whose text is the progress line.
fn new_bar(steps: u64) -> ProgressBar {
    let style = ProgressStyle::with_template("{bar:20} {wide_msg}")
        .unwrap_or_else(|e| panic!("the progress template is fixed and valid: {e}"));
    ProgressBar::new(steps).with_style(style)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(format_duration(0.0), "00:00");
        assert_eq!(format_duration(65.4), "01:05");
        assert_eq!(format_duration(3600.0 * 2.0 + 61.0), "2:01:01");
        assert_eq!(format_duration(f64::INFINITY), "--:--");
    }

    #[test]
    fn line_shows_losses_lr_norm_timing_and_eta() {
        let report = StepReport {
            step: 10,
            max_steps: 110,
            losses: vec![("loss".into(), 0.31274)],
            grad_norms: vec![("student".into(), 0.8123)],
            lrs: vec![("student".into(), 1e-3)],
            step_seconds: 0.5,
            samples_seen: 80,
            skipped: false,
        };
        let line = format_line(&report, 0.5, 5.0);
        assert_eq!(
            line,
            "step 10/110 (9%) | loss 0.3127 | lr 1.00e-3 | gnorm 0.812 | 0.500 s/it | elapsed 00:05 | eta 00:50"
        );
        let two = StepReport {
            grad_norms: vec![("student".into(), 1.0), ("critic".into(), 2.0)],
            losses: vec![("g".into(), 1e-6), ("c".into(), f64::NAN)],
            skipped: true,
            ..report
        };
        let line = format_line(&two, 0.5, 5.0);
        assert!(line.contains("g 1.000e-6 c NaN"), "{line}");
        assert!(line.contains("gnorm student 1.000 critic 2.000"), "{line}");
        assert!(line.ends_with("| SKIPPED"), "{line}");
    }

    #[test]
    fn eta_uses_a_moving_mean() {
        let mut p = Progress::new(1);
        assert_eq!(p.push_time(1.0), 1.0);
        assert_eq!(p.push_time(3.0), 2.0);
        for _ in 0..WINDOW {
            p.push_time(0.5);
        }
        assert_eq!(p.push_time(0.5), 0.5);
    }
}
