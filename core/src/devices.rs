//! Whether the device indices a run or a command names exist on this machine. A GPU index
//! past what the driver sees (a config written for a bigger machine, `--device 1` on a
//! one-GPU host) is an error naming the index before anything is built, not a panic inside
//! the backend at the first tensor.

use crate::backend::BackendName;

/// How many devices `backend` has on this machine, where that can be told: on `cuda`, the
/// devices the CUDA driver sees (it honours `CUDA_VISIBLE_DEVICES`). `None` where there is
/// no driver to ask or it does not start (a login node checking a config: as the memory
/// check, nothing is compared), in a build without `cuda`, and on the other backends (the
/// CPU backends ignore the index; `wgpu`'s adapters are not counted).
pub fn device_count(backend: BackendName) -> Option<usize> {
    match backend {
        BackendName::Cuda => cuda_count(),
        BackendName::Cpu | BackendName::Flex | BackendName::Wgpu => None,
    }
}

/// `Ok` when every index of `devices` exists on `backend` here, or the count cannot be told
/// ([`device_count`]); otherwise a message naming the first missing index and what the
/// machine has.
pub fn check_indices(backend: BackendName, devices: &[usize]) -> Result<(), String> {
    match device_count(backend) {
        Some(count) => check_against(backend, devices, count),
        None => Ok(()),
    }
}

/// [`check_indices`] against a known `count`.
pub(crate) fn check_against(
    backend: BackendName,
    devices: &[usize],
    count: usize,
) -> Result<(), String> {
    let Some(missing) = devices.iter().find(|&&d| d >= count) else {
        return Ok(());
    };
    let has = match count {
        0 => format!(
            "the {backend} driver of this machine shows no device (CUDA_VISIBLE_DEVICES may \
             hide them)"
        ),
        1 => format!("this machine has 1 {backend} device, index 0"),
        n => format!(
            "this machine has {n} {backend} devices, indices 0 to {}",
            n - 1
        ),
    };
    Err(format!("device {missing} does not exist: {has}"))
}

#[cfg(feature = "cuda")]
fn cuda_count() -> Option<usize> {
    use cudarc::driver::result as driver;
    // SAFETY: only looks for the driver library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return None;
    }
    driver::init().ok()?;
    let count = driver::device::get_count().ok()?;
    usize::try_from(count).ok()
}

#[cfg(not(feature = "cuda"))]
fn cuda_count() -> Option<usize> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_past_the_count_is_named_with_what_the_machine_has() {
        let cuda = BackendName::Cuda;
        check_against(cuda, &[0, 1], 2).unwrap();
        let e = check_against(cuda, &[0, 2, 5], 2).unwrap_err();
        assert_eq!(
            e,
            "device 2 does not exist: this machine has 2 cuda devices, indices 0 to 1"
        );
        let e = check_against(cuda, &[1], 1).unwrap_err();
        assert!(e.ends_with("has 1 cuda device, index 0"), "{e}");
        let e = check_against(cuda, &[0], 0).unwrap_err();
        assert!(e.starts_with(
            "device 0 does not exist: the cuda driver of this machine shows no device"
        ));
    }

    #[test]
    fn backends_whose_count_is_not_told_pass_every_index() {
        for b in [BackendName::Cpu, BackendName::Flex, BackendName::Wgpu] {
            assert_eq!(device_count(b), None);
            check_indices(b, &[0, 7, usize::MAX]).unwrap();
        }
        if !cfg!(feature = "cuda") {
            check_indices(BackendName::Cuda, &[usize::MAX]).unwrap();
        }
    }

    /// On a machine with a driver, the count is the driver's and one past it is refused.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_refuses_the_index_after_the_last_gpu() {
        let Some(count) = device_count(BackendName::Cuda) else {
            eprintln!("skipped: no CUDA driver here");
            return;
        };
        let e = check_indices(BackendName::Cuda, &[count]).unwrap_err();
        assert!(
            e.starts_with(&format!("device {count} does not exist")),
            "{e}"
        );
        if count > 0 {
            check_indices(BackendName::Cuda, &[count - 1]).unwrap();
        }
    }
}
