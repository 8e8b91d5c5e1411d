//! `reel train`: run (or resume) a training run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use reel_core::config::load_run_config;
use reel_core::trainer::{train, TrainOptions};

use reel_core::with_backend;

/// Install a Ctrl-C handler: the first SIGINT asks the trainer to checkpoint and stop at the
/// next step boundary; a second one exits at once (checkpoints are written atomically, so
/// nothing on disk is corrupted).
fn interrupt_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    let res = ctrlc::set_handler(move || {
        if f.swap(true, Ordering::SeqCst) {
            eprintln!("\nreel: second interrupt, exiting now");
            std::process::exit(130);
        }
        eprintln!("\nreel: interrupt received, writing a checkpoint at the end of this step (Ctrl-C again to exit now)");
    });
    if let Err(e) = res {
        eprintln!("reel: warning: cannot install the Ctrl-C handler: {e}");
    }
    flag
}

/// Load, validate and train.
pub fn run(
    config: &Path,
    set: &[String],
    resume: Option<String>,
    output: Option<PathBuf>,
) -> anyhow::Result<()> {
    let loaded = load_run_config(config, set)?;
    eprintln!("reel: {}: {}", config.display(), super::describe(&loaded));
    let opts = TrainOptions {
        resume,
        output_dir: output,
        interrupt: Some(interrupt_flag()),
    };
    let summary = with_backend!(loaded.config.runtime.backend, |B| train::<B>(
        &loaded, &opts
    )
    .map_err(anyhow::Error::from))?;
    let losses: Vec<String> = summary
        .last_losses
        .iter()
        .map(|(k, v)| format!("{k}={v:.4}"))
        .collect();
    eprintln!(
        "reel: done: {} steps, last {}, checkpoint {}",
        summary.steps,
        losses.join(" "),
        summary.checkpoint.display()
    );
    if let Some(first) = summary.worker_digests.first() {
        let n = summary.worker_digests.len();
        if summary.worker_digests.iter().all(|d| d == first) {
            eprintln!(
                "reel: all {n} workers ended with identical weights, optimizer state and EMA (sha256 {})",
                &first[..16.min(first.len())]
            );
        } else {
            eprintln!(
                "reel: warning: the {n} workers ended with different states (sha256 {:?}); worker 0's was saved. Please report this.",
                summary.worker_digests
            );
        }
    }
    if summary.skipped_steps > 0 {
        eprintln!(
            "reel: {} step(s) were skipped for non-finite values",
            summary.skipped_steps
        );
    }
    Ok(())
}
