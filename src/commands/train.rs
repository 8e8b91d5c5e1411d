//! `reel train`: run (or resume) a training run.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use reel_core::config::{load_run_config, LoadedConfig};
use reel_core::console::say;
use reel_core::parallel::Processes;
use reel_core::trainer::{panic_message, train, TrainError, TrainOptions};

use reel_core::with_backend;

/// Install a Ctrl-C handler: the first SIGINT asks the trainer to checkpoint and stop at the
/// next step boundary; a second one exits at once (checkpoints are written atomically, so
/// nothing on disk is corrupted). SIGTERM and SIGHUP do the same (ctrlc's `termination`
/// feature): Slurm's preemption and time limit, `mpirun` passing on a Ctrl-C and `kill`
/// send SIGTERM, and a closed terminal SIGHUP.
fn interrupt_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    let res = ctrlc::set_handler(move || {
        if f.swap(true, Ordering::SeqCst) {
            say("\nreel: second interrupt, exiting now");
            std::process::exit(130);
        }
        say("\nreel: interrupt received, writing a checkpoint at the end of this step (Ctrl-C again to exit now)");
    });
    if let Err(e) = res {
        say(&format!(
            "reel: warning: cannot install the Ctrl-C handler: {e}"
        ));
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
    let job = super::processes::join(&loaded, config)?;
    let in_group = job.processes.as_deref().is_some_and(|p| p.size() > 1);
    let result = if in_group {
        // A panic outside the workers (a worker thread that cannot start, say) would unwind
        // into MPI's finalize, which waits for the other processes while they wait for this
        // one in a collective call: as an error, it stops every process (below).
        catch_unwind(AssertUnwindSafe(|| {
            run_in(&loaded, config, resume, output, &job)
        }))
        .unwrap_or_else(|panic| {
            let message = panic_message(panic.as_ref()).unwrap_or("(no message)");
            Err(anyhow::anyhow!("panicked: {message}"))
        })
    } else {
        run_in(&loaded, config, resume, output, &job)
    };
    match (job.processes.as_deref(), result) {
        (Some(p), Err(e)) if p.size() > 1 && !is_agreed(&e) => stop_processes(p, &e),
        (Some(p), Err(e)) if p.size() > 1 => Err(said_everywhere(p, &e)),
        (_, result) => result,
    }
}

/// Every process of the run reached `e` at the same point: each says its own line, then all
/// wait for one another before ending, since `mpirun` ends the job as soon as one process
/// exits with an error, cutting off the lines the others had not written yet.
fn said_everywhere(p: &dyn Processes, e: &anyhow::Error) -> anyhow::Error {
    say(&format!("error: {}", crate::cli::error_line(e)));
    let _ = p.sum(&mut [0.0]);
    crate::cli::Reported.into()
}

/// An error every process of the run reaches by agreement (see [`TrainError::is_agreed`]):
/// each reports it and ends normally.
fn is_agreed(e: &anyhow::Error) -> bool {
    e.downcast_ref::<TrainError>()
        .is_some_and(TrainError::is_agreed)
}

/// This process failed on its own outside a worker (opening its devices' group, say) while
/// the others may wait for it in a collective call: report it, then stop them all. Ending
/// normally (MPI's finalize) left the others waiting, and the error unprinted.
fn stop_processes(p: &dyn Processes, e: &anyhow::Error) -> ! {
    say(&format!(
        "reel: process {} of {}: error: {}; stopping every process of the run",
        p.rank(),
        p.size(),
        crate::cli::error_line(e)
    ));
    p.abort(1)
}

/// [`run`] after joining the run's processes.
fn run_in(
    loaded: &LoadedConfig,
    config: &Path,
    resume: Option<String>,
    output: Option<PathBuf>,
    job: &super::processes::Job,
) -> anyhow::Result<()> {
    if reel_core::fault::fires("main-panic") {
        panic!("REEL_FAULT: main-panic");
    }
    let process = job.processes.as_ref().map(|p| (p.rank(), p.size()));
    if process.is_none_or(|(rank, _)| rank == 0) {
        say(&format!(
            "reel: {}: {}",
            config.display(),
            super::describe(loaded)
        ));
        let kernels = reel_models::wan::kernel_settings();
        if !kernels.is_empty() {
            say(&format!(
                "reel: kernels chosen by the environment: {}",
                kernels.join(", ")
            ));
        }
    }
    if let Some((rank, size)) = process {
        let here = loaded.config.runtime.worker_devices().len();
        say(&format!(
            "reel: process {rank} of {size}: {here} worker(s) here, {} in all",
            here * size
        ));
    }
    let opts = TrainOptions {
        resume,
        output_dir: output,
        interrupt: Some(interrupt_flag()),
        processes: job.processes.clone(),
    };
    let summary = with_backend!(loaded.config.runtime.backend, |B| train::<B>(loaded, &opts)
        .map_err(anyhow::Error::from))?;
    let main = process.is_none_or(|(rank, _)| rank == 0);
    if main {
        let losses: Vec<String> = summary
            .last_losses
            .iter()
            .map(|(k, v)| format!("{k}={v:.4}"))
            .collect();
        if summary.step_seconds.is_empty() {
            say(&format!(
                "reel: nothing to train: the run is at step {} and `training.max_steps` is {} \
                 (raise it with --set to train on); checkpoint {}",
                summary.steps,
                loaded.config.training.max_steps,
                summary.checkpoint.display()
            ));
        } else {
            say(&format!(
                "reel: done: {} steps, last {}, checkpoint {}",
                summary.steps,
                losses.join(" "),
                summary.checkpoint.display()
            ));
        }
        if summary.skipped_steps > 0 {
            say(&format!(
                "reel: {} step(s) were skipped for non-finite values",
                summary.skipped_steps
            ));
        }
    }
    report_agreement(job.processes.as_deref(), &summary.worker_digests)
}

/// Say whether every worker (of every process) ended with the same training state.
fn report_agreement(processes: Option<&dyn Processes>, digests: &[String]) -> anyhow::Result<()> {
    let Some(own) = digests.first() else {
        return Ok(());
    };
    let here = digests.iter().all(|d| d == own);
    let (same, workers) = match processes {
        Some(p) => (
            reel_core::parallel::same_everywhere(p, own)? && here,
            format!("workers of the {} processes", p.size()),
        ),
        None => (here, format!("{} workers", digests.len())),
    };
    if same && processes.is_none_or(|p| p.rank() == 0) {
        say(&format!(
            "reel: all {workers} ended with identical weights, optimizer state and EMA (sha256 {})",
            &own[..16.min(own.len())]
        ));
    } else if !same {
        say(&format!(
            "reel: warning: the {workers} ended with different states (here: sha256 {digests:?}); worker 0's was saved. Please report this."
        ));
    }
    Ok(())
}
