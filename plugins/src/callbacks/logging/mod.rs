//! `kind = "logging"`: what a person or a dashboard reads while a run trains.
//!
//! Four sinks, each on by default:
//! - [`progress`]: a progress line on stderr (in place on a terminal, plain lines otherwise);
//! - [`jsonl`]: `<run>/metrics.jsonl`, one object per logged step and per validation;
//! - [`tensorboard`]: `<run>/tensorboard/events.out.tfevents.*` with the scalars
//!   `train/<loss>`, `grad_norm/<role>`, `lr/<role>`, `perf/step_seconds` and every
//!   validation metric (`val/overall`, ...);
//! - [`plot`]: `<run>/loss.png` drawn from `metrics.jsonl` after the last step.
//!
//! Steps are logged when `step % every_steps == 0` and after the last step. Opening a file
//! that cannot be written stops the run at start; a write failing later prints one warning
//! and turns that sink off (a full disk should not end a long run over a log line).
//!
//! ```toml
//! [[callbacks]]
//! kind = "logging"
//! every_steps = 1
//! progress = true
//! jsonl = true
//! tensorboard = true
//! plot = true
//! ```

pub mod jsonl;
pub mod plot;
pub mod progress;
pub mod tensorboard;
pub mod tfrecord;

use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;
use reel_core::callback::{
    BuildCallback, Callback, CallbackConfig, CallbackContext, CallbackError, StepReport,
    ValidationReport,
};
use reel_core::config::{check, ConfigError};
use serde::{Deserialize, Serialize};

use self::jsonl::{step_record, to_record, validation_record, Line, MetricsLog, Record};
use self::progress::Progress;
use self::tensorboard::EventWriter;
use super::{io_error, print_line};

/// File name of the metrics log inside the run folder.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// Folder of the TensorBoard event files inside the run folder.
pub const TENSORBOARD_DIR: &str = "tensorboard";
/// File name of the loss plot inside the run folder.
pub const PLOT_FILE: &str = "loss.png";

fn one() -> u64 {
    1
}
fn yes() -> bool {
    true
}

/// Configuration of the `logging` callback.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggingConfig {
    /// Log every `every_steps` steps (and the last step); default 1.
    #[serde(default = "one")]
    pub every_steps: u64,
    /// Progress line on stderr (default true).
    #[serde(default = "yes")]
    pub progress: bool,
    /// `<run>/metrics.jsonl` (default true).
    #[serde(default = "yes")]
    pub jsonl: bool,
    /// TensorBoard event files under `<run>/tensorboard/` (default true).
    #[serde(default = "yes")]
    pub tensorboard: bool,
    /// `<run>/loss.png` at the end of training (default true).
    #[serde(default = "yes")]
    pub plot: bool,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        Self {
            every_steps: 1,
            progress: true,
            jsonl: true,
            tensorboard: true,
            plot: true,
        }
    }
}

#[reel_core::plugin(
    name = "logging",
    summary = "Progress line, metrics.jsonl, TensorBoard event files and a loss-curve PNG"
)]
impl CallbackConfig for LoggingConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        check::positive_usize("every_steps", self.every_steps as usize)
    }

    fn run_outputs(&self) -> Vec<String> {
        let outputs = [
            (self.jsonl, METRICS_FILE.to_string()),
            (self.jsonl, jsonl::DROPPED_FILE.to_string()),
            (self.tensorboard, format!("{TENSORBOARD_DIR}/")),
            (self.plot, PLOT_FILE.to_string()),
        ];
        outputs
            .into_iter()
            .filter(|(on, _)| *on)
            .map(|(_, o)| o)
            .collect()
    }
}

impl<B: AutodiffBackend> BuildCallback<B> for LoggingConfig {
    fn build_callback(&self) -> Result<Box<dyn Callback<B>>, ConfigError> {
        Ok(Box::new(LoggingCallback::new(self.clone())))
    }
}

/// The TensorBoard scalars of one step.
pub fn step_scalars(report: &StepReport) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = report
        .losses
        .iter()
        .map(|(k, v)| (format!("train/{k}"), *v))
        .collect();
    out.extend(
        report
            .grad_norms
            .iter()
            .map(|(r, v)| (format!("grad_norm/{r}"), *v)),
    );
    out.extend(report.lrs.iter().map(|(r, v)| (format!("lr/{r}"), *v)));
    out.push(("perf/step_seconds".into(), report.step_seconds));
    out
}

/// The runtime `logging` callback.
#[derive(Debug)]
pub struct LoggingCallback {
    cfg: LoggingConfig,
    run_dir: PathBuf,
    progress: Option<Progress>,
    metrics: Option<MetricsLog>,
    events: Option<EventWriter>,
    /// Records of this session, for the plot when `jsonl` is off.
    history: Vec<Record>,
}

impl LoggingCallback {
    /// A callback for `cfg` (assumed validated); sinks open at `on_train_start`.
    pub fn new(cfg: LoggingConfig) -> Self {
        Self {
            cfg,
            run_dir: PathBuf::new(),
            progress: None,
            metrics: None,
            events: None,
            history: Vec::new(),
        }
    }

    fn write_record(&mut self, record: Line) {
        if let Some(m) = &mut self.metrics {
            if let Err(e) = m.write(&record) {
                print_line(&format!(
                    "reel: warning: logging: {}: {e}; metrics.jsonl is off for the rest of the run",
                    m.path().display()
                ));
                self.metrics = None;
            }
        } else {
            self.history.push(to_record(&record));
        }
    }

    fn write_scalars(&mut self, step: u64, scalars: &[(String, f64)]) {
        if let Some(w) = &mut self.events {
            if let Err(e) = w.scalars(step, scalars) {
                print_line(&format!(
                    "reel: warning: logging: {}: {e}; TensorBoard logging is off for the rest of the run",
                    w.path().display()
                ));
                self.events = None;
            }
        }
    }
}

impl<B: AutodiffBackend> Callback<B> for LoggingCallback {
    fn name(&self) -> &str {
        "logging"
    }

    fn on_train_start(&mut self, ctx: &mut CallbackContext<B>) -> Result<(), CallbackError> {
        self.run_dir = ctx.run_dir.to_path_buf();
        self.history.clear();
        if self.cfg.progress {
            let mut p = Progress::new(self.cfg.every_steps);
            p.start();
            self.progress = Some(p);
        }
        if self.cfg.jsonl {
            let path = self.run_dir.join(METRICS_FILE);
            self.metrics = Some(MetricsLog::open(&path, ctx.step).map_err(|e| io_error(&path, e))?);
        }
        if self.cfg.tensorboard {
            let dir = self.run_dir.join(TENSORBOARD_DIR);
            // Event files already there (a resumed run's, or a fresh run's leftovers from
            // one that died before its first checkpoint) lose their steps from here on.
            let earlier = std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some());
            let mut w = EventWriter::create(&dir).map_err(|e| io_error(&dir, e))?;
            if ctx.step > 0 || earlier {
                w.session_start(ctx.step + 1)
                    .map_err(|e| io_error(w.path(), e))?;
            }
            self.events = Some(w);
        }
        Ok(())
    }

    fn on_step_end(
        &mut self,
        ctx: &mut CallbackContext<B>,
        report: &StepReport,
    ) -> Result<(), CallbackError> {
        if let Some(p) = &mut self.progress {
            p.step(report, ctx.is_final);
        }
        if !report.step.is_multiple_of(self.cfg.every_steps.max(1)) && !ctx.is_final {
            return Ok(());
        }
        self.write_record(step_record(report));
        self.write_scalars(report.step, &step_scalars(report));
        Ok(())
    }

    fn on_validation(
        &mut self,
        ctx: &mut CallbackContext<B>,
        report: &ValidationReport,
    ) -> Result<(), CallbackError> {
        let _ = ctx;
        self.write_record(validation_record(report));
        self.write_scalars(report.step, &report.metrics);
        Ok(())
    }

    /// Nothing goes into the checkpoint, but the logs of the steps it holds are made durable
    /// before it is: a resume never writes them again. A failure is a warning.
    fn on_checkpoint(
        &mut self,
        ctx: &mut CallbackContext<B>,
        dir: &Path,
    ) -> Result<Vec<String>, CallbackError> {
        let _ = (ctx, dir);
        let synced = [
            (self.metrics.as_ref()).map(|m| (m.path().to_path_buf(), m.sync())),
            (self.events.as_ref()).map(|w| (w.path().to_path_buf(), w.sync())),
        ];
        for (path, result) in synced.into_iter().flatten() {
            if let Err(e) = result {
                print_line(&format!("reel: warning: logging: {}: {e}", path.display()));
            }
        }
        Ok(vec![])
    }

    fn on_train_end(&mut self, ctx: &mut CallbackContext<B>) -> Result<(), CallbackError> {
        let _ = ctx;
        if let Some(p) = &mut self.progress {
            p.finish();
        }
        if !self.cfg.plot {
            return Ok(());
        }
        let records = match &self.metrics {
            Some(m) => jsonl::read_metrics(m.path()).map_err(|e| io_error(m.path(), e))?,
            None => std::mem::take(&mut self.history),
        };
        let out = self.run_dir.join(PLOT_FILE);
        plot::write_loss_plot(&records, &out)
            .map_err(|e| CallbackError::Other(format!("logging: {e}")))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_errors() {
        let cfg: LoggingConfig = toml::from_str("").unwrap();
        assert_eq!(cfg, LoggingConfig::default());
        let cfg: LoggingConfig = toml::from_str("every_steps = 0").unwrap();
        let err = CallbackConfig::validate(&cfg).unwrap_err().to_string();
        assert!(err.contains("`every_steps`"), "{err}");
        assert!(toml::from_str::<LoggingConfig>("tensorbord = false").is_err());
    }

    #[test]
    fn scalars_are_prefixed() {
        let report = StepReport {
            step: 3,
            losses: vec![("loss".into(), 0.5)],
            grad_norms: vec![("student".into(), 1.0)],
            lrs: vec![("student".into(), 1e-3)],
            step_seconds: 0.2,
            ..StepReport::default()
        };
        let tags: Vec<String> = step_scalars(&report).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            tags,
            [
                "train/loss",
                "grad_norm/student",
                "lr/student",
                "perf/step_seconds"
            ]
        );
    }
}
