//! cuDNN's attention calls from CubeCL's server thread (`REEL_FLASH=cudnn-queued`), each queued
//! there as a task after the kernels before it (`block_kernels/server_queue.rs`), as
//! `cublas-queued` does for the linear layers' products.
//!
//! A call from the training thread ([`super::run::execute`]) asks CubeCL's server thread for
//! each buffer's address and waits for each answer: five to thirteen waits a call, the first
//! until every kernel queued before has been launched. Queued, the call takes the addresses
//! where they are, on the server thread's own cuDNN handle and plans, and the training thread
//! goes on.
//!
//! What can fail is done first, waiting, so that a failure refuses the call (Reel's kernels
//! run it): the first call of each plan key makes the plan on the server thread and runs it
//! there once, waited for; a key refused there is refused at once after. Later calls of the key
//! are queued; one that fails names the reason on stderr, and the next queued call panics with
//! it (`server_queue::check`).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::CudaRuntime;
use cubecl::server::{Binding, ComputeServer};
use cubecl::stream_id::StreamId;
use cubecl::Runtime;
use cudarc::driver::sys::CUstream;

use super::run::{self, Call, PlanKey};
use super::CudnnError;
use crate::wan::block_kernels::server_queue;

/// Calls queued so far (all threads).
static QUEUED: AtomicUsize = AtomicUsize::new(0);

/// How many calls were queued on CubeCL's server thread so far, in the whole process.
pub fn queued_runs() -> usize {
    QUEUED.load(Ordering::Relaxed)
}

/// Each (device ordinal, key) whose first call was made on the server thread: its plan's
/// workspace bytes, or why cuDNN refused it (asked again, it is refused at once).
type Planned = HashMap<(usize, PlanKey), Result<usize, String>>;

static PLANNED: Mutex<Option<Planned>> = Mutex::new(None);

/// What the first call of `(index, key)` found, if it was made.
fn planned(index: usize, key: PlanKey) -> Option<Result<usize, String>> {
    let planned = PLANNED.lock().unwrap_or_else(|e| e.into_inner());
    planned.as_ref().and_then(|p| p.get(&(index, key)).cloned())
}

/// Records what the first call of `(index, key)` found.
fn remember(index: usize, key: PlanKey, found: Result<usize, String>) {
    let mut planned = PLANNED.lock().unwrap_or_else(|e| e.into_inner());
    planned
        .get_or_insert_with(HashMap::new)
        .insert((index, key), found);
}

/// Runs `call` from CubeCL's server thread on `like`'s device, on CubeCL's `stream`: the
/// first call of its key waited for (planned and run once there), later ones queued.
///
/// # Panics
/// When an earlier queued call failed (its outputs were wrong), with the reason.
pub(super) fn execute(
    call: Call<'_>,
    like: &CubeTensor<CudaRuntime>,
    stream: CUstream,
) -> Result<(), CudnnError> {
    server_queue::check();
    // CubeCL's CUDA buffers start 512-byte aligned: an offset tells the address's alignment,
    // which the server thread could otherwise only find wrong after this call returned.
    if (call.tensors.iter()).any(|(_, t)| !t.handle.offset_start.unwrap_or(0).is_multiple_of(16)) {
        return Err(CudnnError::Unsupported(
            "a tensor is not 16-byte aligned".into(),
        ));
    }
    let device = like.device.clone();
    let (index, key) = (device.index, call.key);
    let known = planned(index, key);
    let bytes = match &known {
        Some(found) => found.clone().map_err(CudnnError::Call)?,
        None => {
            let graph = call.graph;
            let made = server_queue::wait::<CudaRuntime, _>(&device, move |_| {
                run::plan(index, key, graph)
            });
            made.map_err(CudnnError::Call)?
                .inspect_err(|e| remember(index, key, Err(e.to_string())))?
        }
    };
    let workspace = run::workspace(like, bytes);
    let tensors: Vec<(i64, Binding)> = (call.tensors.iter())
        .map(|&(uid, t)| (uid, t.handle.clone().binding()))
        .collect();
    let space = workspace.as_ref().map(|t| t.handle.clone().binding());
    let scalars = call.scalars.to_vec();
    let stream = stream as usize;
    let task = move |server: &mut <CudaRuntime as Runtime>::Server| {
        launch(
            server,
            index,
            key,
            tensors,
            &scalars,
            space,
            stream as CUstream,
        )
    };
    if known.is_some() {
        QUEUED.fetch_add(1, Ordering::Relaxed);
        server_queue::queue::<CudaRuntime>(&device, move |server| {
            task(server).map_err(|e| format!("cuDNN {key:?}: {e}"))
        });
    } else {
        // The key's first run, waited for there: a failure refuses this call and the key.
        let ran = server_queue::wait::<CudaRuntime, _>(&device, task).map_err(CudnnError::Call)?;
        remember(
            index,
            key,
            ran.as_ref().map(|()| bytes).map_err(|e| e.to_string()),
        );
        ran?;
    }
    // The task holds the workspace's buffer until cuDNN has queued its kernels.
    drop(workspace);
    Ok(())
}

/// On CubeCL's server thread: `key`'s plan on the buffers of `tensors` (by uid), the host
/// `scalars` and the workspace `space`, on `stream`.
fn launch(
    server: &mut <CudaRuntime as Runtime>::Server,
    index: usize,
    key: PlanKey,
    tensors: Vec<(i64, Binding)>,
    scalars: &[(i64, f32)],
    space: Option<Binding>,
    stream: CUstream,
) -> Result<(), CudnnError> {
    let id = StreamId::current();
    let mut take = |binding: Binding| {
        server
            .get_resource(binding, id)
            .map_err(|e| CudnnError::Call(format!("a tensor's buffer: {e:?}")))
    };
    // Kept until cuDNN has queued its kernels: CubeCL may reuse a buffer once its resource is
    // dropped, and the stream runs cuDNN's kernels before any later one.
    let mut buffers = Vec::with_capacity(tensors.len());
    for (uid, binding) in tensors {
        buffers.push((uid, take(binding)?));
    }
    let space = space.map(take).transpose()?;
    let mut addresses = Vec::with_capacity(buffers.len());
    for (uid, buffer) in &buffers {
        let ptr = buffer.resource().ptr as *mut c_void;
        run::aligned(ptr)?;
        addresses.push((*uid, ptr));
    }
    let space_ptr =
        (space.as_ref()).map_or(std::ptr::null_mut(), |r| r.resource().ptr as *mut c_void);
    run::run_planned(
        index,
        key,
        addresses.into_iter(),
        scalars,
        space_ptr,
        stream,
    )
}
