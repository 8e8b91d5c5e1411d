//! What a run needs in memory, checked before it starts: a step's data against the host's
//! memory ([`check_step_memory`]), and the roles' floor (weights, AdamW, gradients,
//! the blocks' kept inputs) against each device's ([`MemoryFloor`]). A config that cannot fit
//! is an error naming the sizes, not an allocation failure minutes into loading weights.
//! [`allocator`] chooses how the GPU backends hand that memory out (`REEL_GPU_MEMORY`).

pub mod allocator;
mod batch;
mod floor;

pub use batch::*;
pub use floor::*;

use crate::backend::BackendName;

/// Memory a run may use, and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Available {
    /// Bytes.
    pub bytes: u64,
    /// What holds them, for messages: `"memory this machine has available"`, `"device 0
    /// (NVIDIA H100 80GB HBM3)"`.
    pub of: String,
    /// How many workers of the run share these bytes, each holding its own copy of the
    /// roles: all of them on a CPU backend, the workers given the same device on a GPU.
    pub workers: u64,
}

/// The memory the workers on `devices` of `backend` share, where it can be told: the host's
/// available memory for the CPU backends, the smallest GPU's total memory on `cuda` (its
/// driver asked; `None` without one), `None` on `wgpu`.
pub fn available_for(backend: BackendName, devices: &[usize]) -> Option<Available> {
    match backend {
        BackendName::Cpu | BackendName::Flex => Some(Available {
            bytes: host_memory_available()?,
            of: "memory this machine has available".into(),
            workers: devices.len().max(1) as u64,
        }),
        BackendName::Cuda => cuda_smallest(devices).map(|(bytes, of)| Available {
            bytes,
            of,
            workers: most_per_device(devices),
        }),
        BackendName::Wgpu => None,
    }
}

/// The memory this machine can still give a process, in bytes: `MemAvailable` of
/// `/proc/meminfo` (`None` where there is none, off Linux).
pub fn host_memory_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// `bytes` in GiB, one decimal.
pub fn gib(bytes: u128) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// `bytes` in GiB from 1 GiB on, else in MiB, one decimal.
pub fn size(bytes: u128) -> String {
    if bytes >= 1 << 30 {
        gib(bytes)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

/// One line for a run's start and `reel check`: the floor and, where told, the memory it
/// was held against (`at least 21.8 GiB per device (...), of the 79.6 GiB of device 0 (...)`).
pub fn describe(floor: &MemoryFloor, available: Option<Available>) -> String {
    match available {
        Some(a) => format!(
            "the roles hold {floor}, of the {} of {}",
            gib(a.bytes.into()),
            a.of
        ),
        None => format!("the roles hold {floor}"),
    }
}

/// The most workers given one device index.
fn most_per_device(devices: &[usize]) -> u64 {
    let count = |d: &usize| devices.iter().filter(|e| *e == d).count();
    devices.iter().map(count).max().unwrap_or(1) as u64
}

/// The smallest total memory of the GPUs `devices`, and which one it is, from the CUDA
/// driver (`None` without one).
#[cfg(feature = "cuda")]
fn cuda_smallest(devices: &[usize]) -> Option<(u64, String)> {
    use cudarc::driver::result as driver;
    // SAFETY: only looks for the driver library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return None;
    }
    driver::init().ok()?;
    let of = |&i: &usize| -> Option<(u64, String)> {
        let dev = driver::device::get(i32::try_from(i).ok()?).ok()?;
        // SAFETY: `dev` is a device handle the driver just returned.
        let bytes = unsafe { driver::device::total_mem(dev) }.ok()?;
        let name = driver::device::get_name(dev).unwrap_or_else(|_| "a GPU".into());
        Some((bytes as u64, format!("device {i} ({name})")))
    };
    let sizes: Option<Vec<_>> = devices.iter().map(of).collect();
    sizes?.into_iter().min_by_key(|(b, _)| *b)
}

#[cfg(not(feature = "cuda"))]
fn cuda_smallest(_devices: &[usize]) -> Option<(u64, String)> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_says_how_much_memory_it_has() {
        if cfg!(target_os = "linux") {
            let free = host_memory_available().expect("MemAvailable in /proc/meminfo");
            assert!(free > 0);
            let cpu = available_for(BackendName::Cpu, &[0, 1, 2]).unwrap();
            assert_eq!(cpu.workers, 3);
            assert!(cpu.bytes > 0 && cpu.of.contains("machine"), "{cpu:?}");
        }
        assert_eq!(available_for(BackendName::Wgpu, &[0]), None);
    }

    /// On a machine with a GPU, the driver tells its memory (no GPU: nothing to compare).
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_memory_of_the_gpus_is_told() {
        // SAFETY: only looks for the driver library.
        let driver = unsafe { cudarc::driver::sys::is_culib_present() };
        match available_for(BackendName::Cuda, &[0, 0]) {
            Some(gpu) => {
                assert!(gpu.bytes >= 1 << 30, "{gpu:?}");
                assert!(gpu.of.starts_with("device 0 ("), "{gpu:?}");
                assert_eq!(gpu.workers, 2);
            }
            None => assert!(
                !driver || cudarc::driver::result::init().is_err(),
                "a CUDA driver that starts, and no memory told"
            ),
        }
        assert_eq!(available_for(BackendName::Cuda, &[usize::MAX]), None);
    }

    #[test]
    fn workers_sharing_a_gpu_are_counted() {
        assert_eq!(most_per_device(&[0, 1, 2, 3]), 1);
        assert_eq!(most_per_device(&[0, 1, 1, 3, 1]), 3);
        assert_eq!(most_per_device(&[]), 1);
    }
}
