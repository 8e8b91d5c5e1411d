//! `<run>/metrics.jsonl`: one JSON object per line, for scripts and notebooks.
//!
//! Training lines: `{"step": 12, "loss": 0.31, "grad_norm/student": 0.8, "lr/student": 0.001,
//! "step_seconds": 0.21, "samples_seen": 96, "skipped": false}` (one key per loss, and a
//! `grad_norm/` and `lr/` key per updated role). Validation lines: `{"step": 100,
//! "val/overall": 0.875, "val/colour": 1.0, ...}`. Non-finite numbers are written as `null`.
//!
//! On resume the file is kept and appended to; lines of steps after the resumed step (written
//! by the interrupted run past its last checkpoint, or by the timeline a resume from an older
//! checkpoint leaves) are first moved to the end of `metrics.dropped.jsonl` beside it, so that
//! every step appears once here and no line is lost.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use reel_core::callback::{StepReport, ValidationReport};
use serde_json::{Map, Value};

/// A JSON object of metrics as read back (keys in name order).
pub type Record = Map<String, Value>;

/// A JSON object of metrics to write, keys in the order given (`step` first).
pub type Line = Vec<(String, Value)>;

/// The text of one line (no newline): an object with the keys of `line` in order.
pub fn to_json(line: &Line) -> String {
    let fields: Vec<String> = line
        .iter()
        .map(|(k, v)| format!("{}:{}", Value::from(k.as_str()), v))
        .collect();
    format!("{{{}}}", fields.join(","))
}

/// The line as a [`Record`].
pub fn to_record(line: &Line) -> Record {
    line.iter().cloned().collect()
}

fn number(v: f64) -> Value {
    serde_json::Number::from_f64(v)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

/// The line of one training step.
pub fn step_record(report: &StepReport) -> Line {
    let mut r = Line::new();
    r.push(("step".into(), report.step.into()));
    for (k, v) in &report.losses {
        r.push((k.clone(), number(*v)));
    }
    for (role, v) in &report.grad_norms {
        r.push((format!("grad_norm/{role}"), number(*v)));
    }
    for (role, v) in &report.lrs {
        r.push((format!("lr/{role}"), number(*v)));
    }
    r.push(("step_seconds".into(), number(report.step_seconds)));
    r.push(("samples_seen".into(), report.samples_seen.into()));
    r.push(("skipped".into(), report.skipped.into()));
    r
}

/// The line of one validation.
pub fn validation_record(report: &ValidationReport) -> Line {
    let mut r = Line::new();
    r.push(("step".into(), report.step.into()));
    for (k, v) in &report.metrics {
        r.push((k.clone(), number(*v)));
    }
    r
}

/// Whether a record is a validation line (it has a `val/` key).
pub fn is_validation(record: &Record) -> bool {
    record.keys().any(|k| k.starts_with("val/"))
}

/// The `step` of a record.
pub fn record_step(record: &Record) -> Option<u64> {
    record.get("step").and_then(Value::as_u64)
}

/// File the lines a resume drops from a metrics file are moved to.
pub const DROPPED_FILE: &str = "metrics.dropped.jsonl";

/// Every line of a metrics file, with the record it holds (`None` for a blank or unparsable
/// line, such as one torn by a crash, whatever bytes it holds).
fn lines_of(path: &Path) -> std::io::Result<Vec<(String, Option<Record>)>> {
    let mut out = Vec::new();
    for bytes in BufReader::new(File::open(path)?).split(b'\n') {
        let line = String::from_utf8_lossy(&bytes?).into_owned();
        let record = match serde_json::from_str::<Value>(&line) {
            Ok(Value::Object(r)) => Some(r),
            _ => None,
        };
        out.push((line, record));
    }
    Ok(out)
}

/// Read every record of a metrics file (blank and unparsable lines are skipped).
pub fn read_metrics(path: &Path) -> std::io::Result<Vec<Record>> {
    Ok(lines_of(path)?.into_iter().filter_map(|(_, r)| r).collect())
}

/// An open metrics file.
#[derive(Debug)]
pub struct MetricsLog {
    path: PathBuf,
    file: File,
}

impl MetricsLog {
    /// Open `path` for a run at `step` completed steps: keep the lines with `step <=` it
    /// (none for a fresh run), move the other records to the end of [`DROPPED_FILE`] beside
    /// it (unparsable lines, torn by a crash, are dropped), rewrite the file atomically and
    /// append from there.
    pub fn open(path: &Path, step: u64) -> std::io::Result<MetricsLog> {
        if path.exists() {
            let (mut kept, mut dropped) = (String::new(), String::new());
            for (line, record) in lines_of(path)? {
                let Some(r) = record else { continue };
                let to = match record_step(&r).is_some_and(|s| s <= step) {
                    true => &mut kept,
                    false => &mut dropped,
                };
                to.push_str(&line);
                to.push('\n');
            }
            // Lines moved by an open that died before its rewrite are at the end already.
            let aside = path.with_file_name(DROPPED_FILE);
            if !dropped.is_empty() && !ends_with(&aside, dropped.as_bytes())? {
                let mut f = OpenOptions::new().create(true).append(true).open(&aside)?;
                f.write_all(dropped.as_bytes())?;
                f.sync_all()?;
            }
            reel_core::io::replace_file(path, kept.as_bytes())?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(MetricsLog {
            path: path.to_path_buf(),
            file,
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Make the lines written so far durable (a power loss after a checkpoint must not lose
    /// the lines of the steps it holds: a resume does not write them again).
    pub fn sync(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }

    /// Append one line (written through at once).
    pub fn write(&mut self, line: &Line) -> std::io::Result<()> {
        let mut text = to_json(line);
        text.push('\n');
        self.file.write_all(text.as_bytes())
    }
}

/// Whether the file at `path` ends with `tail` (false where there is no file).
fn ends_with(path: &Path, tail: &[u8]) -> std::io::Result<bool> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    let n = tail.len() as u64;
    if len < n {
        return Ok(false);
    }
    f.seek(SeekFrom::Start(len - n))?;
    let mut end = vec![0; tail.len()];
    f.read_exact(&mut end)?;
    Ok(end == tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(step: u64, loss: f64) -> StepReport {
        StepReport {
            step,
            max_steps: 10,
            losses: vec![("loss".into(), loss)],
            grad_norms: vec![("student".into(), 0.5)],
            lrs: vec![("student".into(), 1e-3)],
            step_seconds: 0.25,
            samples_seen: step * 4,
            skipped: false,
        }
    }

    #[test]
    fn records_have_the_documented_keys() {
        let line = step_record(&report(3, f64::NAN));
        let keys: Vec<&str> = line.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys,
            [
                "step",
                "loss",
                "grad_norm/student",
                "lr/student",
                "step_seconds",
                "samples_seen",
                "skipped"
            ]
        );
        let text = to_json(&line);
        assert!(text.starts_with("{\"step\":3,\"loss\":null,"), "{text}");
        let r: Record = serde_json::from_str(&text).unwrap();
        assert_eq!(r, to_record(&line));
        assert_eq!(r["samples_seen"], 12);
        assert!(!is_validation(&r));
        let v = to_record(&validation_record(&ValidationReport {
            step: 4,
            metrics: vec![("val/overall".into(), 0.5)],
            files: vec![],
        }));
        assert!(is_validation(&v) && record_step(&v) == Some(4));
    }

    #[test]
    fn resume_drops_lines_after_the_resumed_step_and_appends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut log = MetricsLog::open(&path, 0).unwrap();
        for s in 1..=5 {
            log.write(&step_record(&report(s, s as f64))).unwrap();
        }
        log.write(&validation_record(&ValidationReport {
            step: 5,
            metrics: vec![("val/overall".into(), 1.0)],
            files: vec![],
        }))
        .unwrap();
        drop(log);
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"step\": 6, \"lo\xff\xfe")
            .unwrap(); // a torn last line, cut inside a character
        let mut log = MetricsLog::open(&path, 3).unwrap();
        log.write(&step_record(&report(4, 40.0))).unwrap();
        drop(log);
        let steps_of = |p: &Path| -> Vec<u64> {
            (read_metrics(p).unwrap().iter())
                .filter_map(record_step)
                .collect()
        };
        let records = read_metrics(&path).unwrap();
        assert_eq!(steps_of(&path), [1, 2, 3, 4]);
        assert_eq!(records[3]["loss"], 40.0);
        // The dropped timeline's lines (steps 4, 5 and the validation) are kept aside.
        let dropped = dir.path().join(DROPPED_FILE);
        assert_eq!(steps_of(&dropped), [4, 5, 5]);
        assert_eq!(read_metrics(&dropped).unwrap()[0]["loss"], 4.0);
        // A fresh run in the same folder starts over; what it drops is appended.
        drop(MetricsLog::open(&path, 0).unwrap());
        assert!(read_metrics(&path).unwrap().is_empty());
        assert_eq!(steps_of(&dropped), [4, 5, 5, 1, 2, 3, 4]);
    }

    /// An open that died after moving lines aside but before rewriting the file leaves them
    /// in both: the next open does not move them again.
    #[test]
    fn lines_moved_aside_by_an_interrupted_open_are_not_moved_twice() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let mut log = MetricsLog::open(&path, 0).unwrap();
        for s in 1..=4 {
            log.write(&step_record(&report(s, s as f64))).unwrap();
        }
        drop(log);
        let text = std::fs::read_to_string(&path).unwrap();
        let after_2: String = text.lines().skip(2).map(|l| format!("{l}\n")).collect();
        let dropped = dir.path().join(DROPPED_FILE);
        std::fs::write(&dropped, &after_2).unwrap();
        drop(MetricsLog::open(&path, 2).unwrap());
        let steps: Vec<u64> = (read_metrics(&dropped).unwrap().iter())
            .filter_map(record_step)
            .collect();
        assert_eq!(steps, [3, 4]);
        assert_eq!(read_metrics(&path).unwrap().len(), 2);
    }
}
