//! A loaded config's checks against this machine: its devices exist, a step's data fits the
//! host's memory and the roles' floor each device's ([`crate::memory`]).

use super::{ConfigError, LoadedConfig};
use crate::data::DataSpec;
use crate::memory::{self, MemoryFloor, RoleState, Training};
use crate::role::RoleConfig;

impl LoadedConfig {
    /// The run's devices exist on this machine's backend
    /// ([`super::RuntimeConfig::check_devices_exist`]): an error naming the file and the
    /// `runtime` key.
    pub fn check_devices(&self) -> Result<(), ConfigError> {
        (self.config.runtime.check_devices_exist())
            .map_err(|e| e.in_section("runtime").in_file(&self.path))
    }

    /// The data a step of one of the run's `processes` holds at once (its share of
    /// `data.batch_size` in each of `training.grad_accumulation` micro-batches, and the next
    /// step's, read ahead) against the memory this machine has available
    /// ([`crate::memory::check_step_memory`]): a mistyped size fails here rather than
    /// aborting the process at the first batch.
    ///
    /// Where the launcher says how many of the run's processes share this machine
    /// (Open MPI's, MPICH's or Slurm's count), their shares are counted together: each alone may fit
    /// where all of them do not.
    pub fn check_step_memory(&self, spec: &DataSpec, processes: usize) -> Result<(), ConfigError> {
        let batch = self.config.data.batch_size();
        let (share, here) = host_share(batch, processes, processes_on_this_host());
        let accumulation = self.config.training.grad_accumulation;
        let available = memory::host_memory_available();
        let checked = memory::check_step_memory(spec, share * here, accumulation, available);
        checked.map_err(|mut e| {
            if here > 1 {
                e.message = format!(
                    "{} (the {here} processes of this run on this machine, {share} samples a \
                     micro-batch each)",
                    e.message
                );
            }
            e.in_file(&self.path)
        })
    }

    /// What the roles hold on each device for the whole run, from their configs and the
    /// data's shapes (`spec`): see [`MemoryFloor`]. A role whose architecture cannot tell
    /// its size, or whose config is wrong (reported by the other checks), is left out.
    pub fn memory_floor(&self, spec: &DataSpec) -> MemoryFloor {
        let roles: Vec<RoleState> = self
            .config
            .models
            .iter()
            .map(|(name, role)| self.role_state(name, role, spec))
            .collect();
        let accumulating = self.config.training.grad_accumulation > 1;
        MemoryFloor::of(&roles, self.config.runtime.dtype, accumulating)
    }

    /// [`Self::memory_floor`] against the memory of the run's devices
    /// ([`memory::available_for`]), where it can be told: an error naming the file, keyed
    /// `models`, when it does not fit. Returns the floor and the memory it was held against.
    pub fn check_memory_floor(
        &self,
        spec: &DataSpec,
    ) -> Result<(MemoryFloor, Option<memory::Available>), ConfigError> {
        let floor = self.memory_floor(spec);
        let runtime = &self.config.runtime;
        let available = memory::available_for(runtime.backend, &runtime.worker_devices());
        if let Some(a) = &available {
            floor.check(a).map_err(|e| e.in_file(&self.path))?;
        }
        Ok((floor, available))
    }

    fn role_state(&self, name: &str, role: &RoleConfig, spec: &DataSpec) -> RoleState {
        let resolve = |p: &std::path::Path| self.resolve(p);
        let params = role.model.num_params(role, &resolve).ok().flatten();
        let adapter_params = (role.model.num_adapter_params(role, &resolve))
            .ok()
            .flatten()
            .unwrap_or(0);
        let training = match (role.trainable, role.adapter.is_some()) {
            (false, _) => Training::Frozen,
            (true, true) => Training::Adapter,
            (true, false) => Training::Full,
        };
        let info = role.model.model_info(role, &resolve).ok().flatten();
        // An adapter role's frozen blocks before its first adapted one keep nothing unless
        // checkpointing keeps every block's input.
        let keeps_inputs = match training {
            Training::Frozen => false,
            Training::Adapter => role.gradient_checkpointing,
            Training::Full => true,
        };
        let block_inputs = match info {
            Some(info) if keeps_inputs => (info.tokens(spec.frames, spec.height, spec.width))
                .and_then(|tokens| {
                    memory::block_input_bytes(
                        self.samples_per_device(),
                        tokens,
                        info.hidden_size,
                        info.num_layers,
                        self.config.runtime.dtype,
                    )
                })
                .unwrap_or(u128::MAX),
            _ => 0,
        };
        let copied =
            (self.config.callbacks.iter()).any(|c| c.copies_of_roles().iter().any(|r| r == name));
        RoleState {
            name: name.to_string(),
            params,
            adapter_params,
            training,
            block_inputs,
            copied,
        }
    }

    /// Samples of a micro-batch on one device: `data.batch_size` over this process's workers,
    /// or one in a run of several processes (their count is known only once they start).
    fn samples_per_device(&self) -> usize {
        let runtime = &self.config.runtime;
        let batch = self.config.data.batch_size();
        match runtime.launcher {
            Some(_) => 1,
            None => (batch / runtime.worker_devices().len().max(1)).max(1),
        }
    }
}

/// A process's share of a `batch` split over `processes`, and how many of them share this
/// machine (`here` as the launcher says, within 1 and `processes`).
fn host_share(batch: usize, processes: usize, here: usize) -> (usize, usize) {
    let processes = processes.max(1);
    (batch.div_ceil(processes), here.clamp(1, processes))
}

/// Environment variables in which MPI launchers give the number of a job's processes on
/// this machine: Open MPI's and MPICH's.
const LOCAL_SIZE_VARS: [&str; 2] = ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"];

/// How many of this job's processes run on this machine, as the launcher says: the first of
/// [`LOCAL_SIZE_VARS`] that holds a number, else Slurm's count for this job step's node
/// (`SLURM_STEP_TASKS_PER_NODE` at `SLURM_NODEID`; not `SLURM_NTASKS_PER_NODE`, the
/// allocation's request, which a step may not fill); 1 where none says.
fn processes_on_this_host() -> usize {
    let var = |name: &str| std::env::var(name).ok();
    let mpi = LOCAL_SIZE_VARS
        .iter()
        .find_map(|name| var(name)?.trim().parse::<usize>().ok());
    let slurm = || {
        let list = var("SLURM_STEP_TASKS_PER_NODE")?;
        // Without the node's index only a list of one count is read.
        let node = var("SLURM_NODEID").and_then(|n| n.trim().parse().ok());
        let node = node.or_else(|| (!list.contains(',') && !list.contains("(x")).then_some(0))?;
        slurm_tasks_on_node(&list, node)
    };
    mpi.or_else(slurm).unwrap_or(1).max(1)
}

/// The task count of node `node` in Slurm's compressed per-node list (`2(x3),1`: 2 tasks on
/// each of the first three nodes, 1 on the fourth); `None` for a malformed list or a node
/// past its end.
fn slurm_tasks_on_node(list: &str, node: usize) -> Option<usize> {
    let mut first: usize = 0;
    for entry in list.trim().split(',') {
        let (tasks, repeat) = match entry.split_once("(x") {
            Some((t, r)) => (t, r.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (entry, 1),
        };
        let tasks = tasks.parse::<usize>().ok()?;
        let next = first.checked_add(repeat)?;
        if node < next {
            return Some(tasks);
        }
        first = next;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{host_share, slurm_tasks_on_node};

    #[test]
    fn slurm_per_node_lists_give_each_nodes_count() {
        assert_eq!(slurm_tasks_on_node("4", 0), Some(4));
        assert_eq!(slurm_tasks_on_node("2(x3),1", 0), Some(2));
        assert_eq!(slurm_tasks_on_node("2(x3),1", 2), Some(2));
        assert_eq!(slurm_tasks_on_node("2(x3),1", 3), Some(1));
        assert_eq!(slurm_tasks_on_node("2(x3),1", 4), None);
        assert_eq!(slurm_tasks_on_node("1,3(x2)", 2), Some(3));
        assert_eq!(slurm_tasks_on_node("2(x", 0), None);
        assert_eq!(slurm_tasks_on_node("", 0), None);
        // A repeat count that overflows the node index is malformed, not a panic.
        assert_eq!(
            slurm_tasks_on_node("1(x18446744073709551615),2(x9)", usize::MAX),
            None
        );
    }

    #[test]
    fn processes_on_one_machine_count_their_shares_together() {
        assert_eq!(host_share(8, 2, 2), (4, 2));
        assert_eq!(host_share(8, 2, 1), (4, 1));
        assert_eq!(host_share(7, 2, 2), (4, 2));
        // A launcher's count above the run's processes (another job's) is capped; none is 1.
        assert_eq!(host_share(8, 1, 4), (8, 1));
        assert_eq!(host_share(8, 4, 0), (2, 1));
    }
}
