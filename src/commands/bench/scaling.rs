//! `reel bench --devices N`: data-parallel scaling. The generated run (see [`breakdown`]'s
//! presets) or `--config` trains for real on 1 worker, then on N workers
//! (`runtime.num_devices = N`) with N times the global batch, so every worker keeps the
//! one-worker batch (weak scaling). Each row reports worker 0's median step time after the
//! warm-up steps and the throughput; the scaling efficiency is
//! `throughput(N) / (N · throughput(1))`.
//!
//! On a CPU the workers share the cores and take turns in the autodiff graph (see
//! `reel_core::parallel`), so the efficiency there shows the overhead of the collective
//! operations, not GPU scaling.
//!
//! [`breakdown`]: super::breakdown

use reel_core::config::LoadedConfig;
use reel_core::trainer::{train, TrainOptions};
use reel_core::with_backend;
use serde::Serialize;

use super::breakdown::{config_run, preset_runs, total_steps};
use super::{stats, BenchArgs, Stats};

/// One worker count's measurement.
#[derive(Debug, Clone, Serialize)]
pub struct ScalingRow {
    /// What ran: `<preset> <method>` or the config path.
    pub label: String,
    /// Data-parallel workers.
    pub workers: usize,
    /// Samples per optimizer step over all workers (batch × accumulation).
    pub global_batch: usize,
    /// Step time (worker 0) in milliseconds over the timed steps.
    pub step_ms: Stats,
    /// Samples per second at the median step time.
    pub samples_per_s: f64,
    /// `samples_per_s / (workers · samples_per_s of 1 worker)`.
    pub efficiency: f64,
}

/// Bench 1 and `n` workers, print the table (or JSON).
pub fn run(args: &BenchArgs, n: usize) -> anyhow::Result<()> {
    // A config's own batch is the one-worker batch (read once).
    let config_batch = match &args.config {
        Some(path) => Some(config_run(args, path)?.config.data.batch_size()),
        None => None,
    };
    let mut rows: Vec<ScalingRow> = vec![];
    for workers in if n == 1 { vec![1] } else { vec![1, n] } {
        let (label, loaded) = workers_run(args, config_batch, workers)?;
        let row = measure(args, &label, &loaded, workers)?;
        rows.push(row);
    }
    let base = rows[0].samples_per_s;
    for r in &mut rows {
        r.efficiency = r.samples_per_s / (r.workers as f64 * base);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{:<28} {:>7} {:>12} | {:>26} | {:>10} {:>10}",
        "run", "workers", "global batch", "step ms (med/min/max)", "samples/s", "efficiency"
    );
    for r in rows {
        println!(
            "{:<28} {:>7} {:>12} | {:>8.1} {:>8.1} {:>8.1} | {:>10.2} {:>9.0}%",
            r.label,
            r.workers,
            r.global_batch,
            r.step_ms.median,
            r.step_ms.min,
            r.step_ms.max,
            r.samples_per_s,
            r.efficiency * 100.0
        );
    }
    Ok(())
}

/// The benched run on `workers` workers, each with the one-worker batch (`config_batch`
/// for `--config`, else `--batch`).
fn workers_run(
    args: &BenchArgs,
    config_batch: Option<usize>,
    workers: usize,
) -> anyhow::Result<(String, LoadedConfig)> {
    let mut a = args.clone();
    a.set.push(format!("runtime.num_devices={workers}"));
    match (&args.config, config_batch) {
        (Some(path), Some(batch)) => {
            a.set.push(format!("data.batch_size={}", batch * workers));
            Ok((path.display().to_string(), config_run(&a, path)?))
        }
        _ => {
            a.batch = args.batch * workers;
            let mut runs = preset_runs(&a)?;
            anyhow::ensure!(!runs.is_empty(), "no preset to bench");
            Ok(runs.swap_remove(0))
        }
    }
}

/// Train `loaded` in a temporary folder; the timed steps' statistics.
fn measure(
    args: &BenchArgs,
    label: &str,
    loaded: &LoadedConfig,
    workers: usize,
) -> anyhow::Result<ScalingRow> {
    let dir = tempfile::tempdir()?;
    let opts = TrainOptions {
        output_dir: Some(dir.path().to_path_buf()),
        ..Default::default()
    };
    let backend = loaded.config.runtime.backend;
    let summary = with_backend!(backend, |B| train::<B>(loaded, &opts))?;
    let timed: Vec<f64> = summary
        .step_seconds
        .iter()
        .skip(args.warmup)
        .take(total_steps(args) - args.warmup)
        .map(|s| s * 1e3)
        .collect();
    anyhow::ensure!(!timed.is_empty(), "no timed steps: raise --steps");
    let step_ms = stats(timed);
    let global_batch = loaded.config.data.batch_size() * loaded.config.training.grad_accumulation;
    Ok(ScalingRow {
        label: label.to_string(),
        workers,
        global_batch,
        samples_per_s: global_batch as f64 / (step_ms.median / 1e3),
        step_ms,
        efficiency: 1.0,
    })
}
