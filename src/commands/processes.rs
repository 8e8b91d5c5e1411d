//! Runs of several processes (`[runtime] launcher = "mpi"`): joining the MPI job, and the
//! checks around it.
//!
//! Across processes the trainer needs one operation, the sum of a host buffer
//! ([`Processes::sum`](reel_core::parallel::Processes::sum)); MPI's `MPI_Allreduce`
//! provides it through the `mpi` crate (rsmpi) when `reel` is built with `--features mpi`.
//! Launch with `mpirun` (or `srun`), one process per machine; each process runs the workers
//! of its own `runtime.devices`.

use std::path::Path;

use anyhow::bail;
use reel_core::config::{ConfigError, Launcher, LoadedConfig};
use reel_core::parallel::ProcessHandle;
#[cfg(feature = "mpi")]
use reel_core::parallel::Processes;

/// Environment variables MPI launchers set to the number of processes of the job (Open MPI,
/// then MPICH/Hydra and Intel MPI).
const SIZE_VARS: [&str; 2] = ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"];

/// The variable Slurm's `srun` sets to the number of tasks of the step, also where it sets
/// neither of [`SIZE_VARS`] (`--mpi=none`). Only read with `launcher = "mpi"`: a run in one
/// process is not refused for it (whether a batch script's own step sets it is not relied
/// on).
#[cfg(feature = "mpi")]
const SLURM_TASKS: &str = "SLURM_STEP_NUM_TASKS";

/// The processes of this run, while it lasts (finalizes MPI when dropped).
pub struct Job {
    /// The handle the trainer uses; `None` for a run in one process.
    pub processes: Option<ProcessHandle>,
    #[cfg(feature = "mpi")]
    _universe: Option<mpi::environment::Universe>,
}

/// Join the run's processes as `runtime.launcher` says; refuse a process that an MPI launcher
/// started as one of several when the config does not say so (every copy would train alone
/// and write the same run folder).
pub fn join(loaded: &LoadedConfig, config: &Path) -> anyhow::Result<Job> {
    match loaded.config.runtime.launcher {
        None => {
            if let Some((var, n)) = launched_size() {
                bail!(
                    "{}: runtime.launcher: this process is one of {n} started by an MPI launcher ({var}={n}), but the config sets no launcher, so each would train alone into the same folder; expected `launcher = \"mpi\"` in [runtime] (or --set runtime.launcher=mpi)",
                    config.display()
                );
            }
            Ok(Job {
                processes: None,
                #[cfg(feature = "mpi")]
                _universe: None,
            })
        }
        Some(Launcher::Mpi) => join_mpi(config),
    }
}

/// `(variable, processes)` when an MPI launcher started this process as one of several.
fn launched_size() -> Option<(&'static str, usize)> {
    size_above_one(&SIZE_VARS)
}

/// The first of `vars` set to a number of processes above 1, with that number.
fn size_above_one(vars: &[&'static str]) -> Option<(&'static str, usize)> {
    vars.iter().find_map(|&var| {
        let n: usize = std::env::var(var).ok()?.trim().parse().ok()?;
        (n > 1).then_some((var, n))
    })
}

/// Why a build without MPI support cannot run `launcher = "mpi"`.
const MPI_NEEDED: &str = "\"mpi\" needs a reel built with MPI support; expected a build with \
     `--features mpi` (scripts/install-mpi.sh installs Open MPI), or no launcher for a run in \
     one process";

/// The error of a config that sets `launcher = "mpi"` in a build without MPI support (`None`
/// where this build can run it), for `reel check`.
pub fn launcher_unsupported(loaded: &LoadedConfig) -> Option<ConfigError> {
    let mpi = loaded.config.runtime.launcher == Some(Launcher::Mpi);
    (mpi && !cfg!(feature = "mpi")).then(|| ConfigError::new("runtime.launcher", MPI_NEEDED))
}

#[cfg(not(feature = "mpi"))]
fn join_mpi(config: &Path) -> anyhow::Result<Job> {
    Err(ConfigError::new("runtime.launcher", MPI_NEEDED)
        .in_file(config)
        .into())
}

#[cfg(feature = "mpi")]
fn join_mpi(config: &Path) -> anyhow::Result<Job> {
    use mpi::traits::Communicator;
    let Some((universe, threading)) = mpi::initialize_with_threading(mpi::Threading::Multiple)
    else {
        bail!(
            "{}: runtime.launcher: MPI was already initialized in this process",
            config.display()
        );
    };
    // Worker threads call MPI (one at a time), and a failing worker aborts from its own thread.
    if threading != mpi::Threading::Multiple {
        bail!(
            "{}: runtime.launcher: the MPI library offers thread support {threading:?}; Reel needs MPI_THREAD_MULTIPLE (Open MPI and MPICH provide it)",
            config.display()
        );
    }
    let world = universe.world();
    // A launcher that started several processes without connecting them to one MPI job
    // (`srun --mpi=none`): each would be the whole job, and all would write the run folder.
    let launched = launched_size().or_else(|| size_above_one(&[SLURM_TASKS]));
    if let Some((var, n)) = launched.filter(|_| world.size() == 1) {
        bail!(
            "{}: runtime.launcher: MPI sees this process alone, but it is one of {n} ({var}={n}): the launcher did not join them into one MPI job (with Slurm, `srun --mpi=pmix`; or launch with mpirun)",
            config.display()
        );
    }
    let processes = MpiProcesses {
        rank: world.rank() as usize,
        size: world.size() as usize,
    };
    Ok(Job {
        processes: Some(std::sync::Arc::new(processes)),
        _universe: Some(universe),
    })
}

/// The processes of an MPI job (`MPI_COMM_WORLD`).
#[cfg(feature = "mpi")]
#[derive(Debug)]
struct MpiProcesses {
    rank: usize,
    size: usize,
}

#[cfg(feature = "mpi")]
impl Processes for MpiProcesses {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn sum(&self, values: &mut [f32]) -> Result<(), String> {
        use mpi::collective::{CommunicatorCollectives, SystemOperation};
        let send = values.to_vec();
        // MPI's default error handler ends the job on a failed call, so this returns only
        // with the sum.
        mpi::topology::SimpleCommunicator::world().all_reduce_into(
            &send[..],
            values,
            SystemOperation::sum(),
        );
        Ok(())
    }

    fn abort(&self, code: i32) -> ! {
        use mpi::traits::Communicator;
        mpi::topology::SimpleCommunicator::world().abort(code)
    }
}
