//! Work run on a CubeCL server's own thread, in line with the kernels queued there.
//!
//! CubeCL runs each device's server on a thread of its own: a client's kernel launch is a task
//! queued for that thread (`ComputeClient::launch`), which returns at once. A call that needs
//! the server's state, such as a buffer's device address (`ComputeClient::get_resource`), waits
//! for the thread to run everything queued before it, and the thread may be asleep (it sleeps
//! in 150-µs steps when idle, `cubecl-common`'s channel). A library call on CubeCL's buffers
//! made from the caller's thread (cuBLAS) takes that wait for each buffer.
//!
//! [`queue`] hands such a call to the server's thread as one more task: it runs after the
//! kernels queued before it, with the server's state at hand, and the caller goes on at once.
//! CubeCL finds a device's server by the device's id and the server's type
//! (`cubecl_common`'s `DeviceHandle::new`), the way its own clients are made; nothing new is
//! started. [`wait`] runs a task there and waits for its result.
//!
//! A queued task cannot hand an error back: the caller has gone on with its outputs. A task
//! that fails (returns an error or panics: CubeCL's server thread catches a task's panic and
//! only logs it) is named on stderr at once, and the next [`check`] (each queued call makes one
//! before queueing) panics with it rather than go on from wrong values. The trainer finds it
//! too, through `reel_core::device_fault` (after each step's host sync and before each
//! checkpoint's commit), so that a failure among a run's last calls stops the run with an
//! error and reaches no checkpoint.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, Once};

use cubecl::device::Device;
use cubecl::device_handle::DeviceHandle;
use cubecl::Runtime;

/// Why a queued task failed: the first failure.
static FAILED: Mutex<Option<String>> = Mutex::new(None);

/// The first queued task's failure, for `reel_core::device_fault`.
fn failure() -> Option<String> {
    FAILED.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Records that a queued task failed (`why`), naming it on stderr; [`check`] panics from then
/// on.
fn fail(why: String) {
    eprintln!("reel: a call queued on CubeCL's server thread failed: {why}");
    let mut failed = FAILED.lock().unwrap_or_else(|e| e.into_inner());
    failed.get_or_insert(why);
}

/// Panics when a queued task failed before ([`fail`]): its outputs, and what was computed from
/// them, are wrong.
#[cfg(any(feature = "cuda", test))]
pub(crate) fn check() {
    // The reason is copied out first: a panic holding the lock would poison it.
    if let Some(why) = failure() {
        panic!(
            "a call queued on CubeCL's server thread failed ({why}): its outputs, and what was \
             computed from them, are wrong"
        );
    }
}

/// The handle of `device`'s server, the one its clients queue their kernels on.
fn server<R: Runtime>(device: &R::Device) -> DeviceHandle<R::Server> {
    DeviceHandle::new(device.to_id())
}

/// Queues `task` on `device`'s server thread, after everything this thread queued there
/// before, and returns at once. `task` runs with this thread's CubeCL stream id as the current
/// one; its error or panic is recorded for [`check`].
pub(crate) fn queue<R: Runtime>(
    device: &R::Device,
    task: impl FnOnce(&mut R::Server) -> Result<(), String> + Send + 'static,
) {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        reel_core::device_fault::register(
            "reel-models (cuBLAS/cuDNN on CubeCL's server thread)",
            failure,
        )
    });
    server::<R>(device).submit(move |server| {
        match catch_unwind(AssertUnwindSafe(|| task(server))) {
            Ok(Ok(())) => {}
            Ok(Err(why)) => fail(why),
            Err(panic) => {
                let why = (panic.downcast_ref::<String>().cloned())
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
                fail(format!("a panic: {}", why.unwrap_or_default()))
            }
        }
    });
}

/// Runs `task` on `device`'s server thread, after everything this thread queued there before,
/// and waits for its result.
pub(crate) fn wait<R: Runtime, T: Send>(
    device: &R::Device,
    task: impl FnOnce(&mut R::Server) -> T + Send,
) -> Result<T, String> {
    server::<R>(device)
        .submit_blocking(task)
        .map_err(|e| format!("CubeCL's server thread did not answer: {e:?}"))
}

#[cfg(all(test, feature = "wgpu"))]
mod tests {
    use std::sync::mpsc;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use burn::tensor::{Distribution, Tensor};
    use cubecl::server::ComputeServer;
    use cubecl::wgpu::WgpuRuntime;

    use super::*;
    use crate::wan::block_kernels::cube::prim;

    type Cube = burn_cubecl::CubeBackend<WgpuRuntime, f32, i32, u32>;

    /// A task queued on the tensors' server takes their buffers there (the server is the
    /// tensors' own: another would not know their memory) and runs in order with the kernels
    /// queued around it, while the caller goes on.
    #[test]
    fn wgpu_queued_tasks_take_buffers_in_order_with_the_kernels() {
        let device = Default::default();
        let x = Tensor::<Cube, 2>::random([37, 24], Distribution::Default, &device);
        let order = Arc::new(Mutex::new(Vec::new()));
        let (sizes, got) = mpsc::channel();
        for step in 0..3u64 {
            // A kernel, then a task on its output: the output's buffer is there for the task.
            let y = prim::<Cube, WgpuRuntime, u32, 2>(x.clone().mul_scalar(step as f32));
            let (binding, dev) = (y.handle.clone().binding(), y.device.clone());
            let (order, sizes) = (order.clone(), sizes.clone());
            queue::<WgpuRuntime>(&dev, move |server| {
                let stream = cubecl::stream_id::StreamId::current();
                let size = server
                    .get_resource(binding, stream)
                    .map(|r| r.resource().size);
                order.lock().unwrap().push(step);
                sizes.send(size.map_err(|e| format!("{e:?}"))).unwrap();
                Ok(())
            });
        }
        // The tasks wait in the queue like kernels; a call that waits for the server runs them.
        let answer = wait::<WgpuRuntime, _>(&device, |_| order.lock().unwrap().clone()).unwrap();
        assert_eq!(
            answer,
            vec![0, 1, 2],
            "the tasks ran before the wait, in order"
        );
        for _ in 0..3 {
            let size = got
                .recv_timeout(Duration::from_secs(60))
                .expect("a task's answer");
            let size = size.unwrap_or_else(|e| panic!("the task's buffer: {e}"));
            assert!(
                size >= 37 * 24 * 4,
                "a buffer of {size} bytes for 37 x 24 floats"
            );
        }
    }

    /// A queued task that fails, by an error or by a panic (which CubeCL's server thread would
    /// only log), is recorded: `check` then panics, and the trainer's
    /// `reel_core::device_fault::check` returns it. (Not in CUDA builds: the record is
    /// process-wide, and the CUDA tests queue real calls that `check` first.)
    #[cfg(not(feature = "cuda"))]
    #[test]
    fn wgpu_a_failing_queued_task_is_recorded() {
        let device = Default::default();
        let fail_with = |task: fn(&mut <WgpuRuntime as Runtime>::Server) -> Result<(), String>| {
            queue::<WgpuRuntime>(&device, task);
            wait::<WgpuRuntime, _>(&device, |_| ()).expect("the server thread answers");
            let caught = std::panic::catch_unwind(check).is_err();
            let trainer_sees = reel_core::device_fault::check().map_err(|f| f.why);
            let why = FAILED.lock().unwrap().take();
            assert_eq!(trainer_sees, Err(why.clone().unwrap_or_default()));
            (caught, why)
        };
        let (caught, why) = fail_with(|_| Err("the product failed".into()));
        assert_eq!(why.as_deref(), Some("the product failed"));
        assert!(caught, "check did not panic after an error");
        let (caught, why) = fail_with(|_| panic!("a task's panic"));
        assert_eq!(why.as_deref(), Some("a panic: a task's panic"));
        assert!(caught, "check did not panic after a panic");
        assert!(
            std::panic::catch_unwind(check).is_ok(),
            "nothing recorded now"
        );
        assert_eq!(reel_core::device_fault::check(), Ok(()));
    }
}
