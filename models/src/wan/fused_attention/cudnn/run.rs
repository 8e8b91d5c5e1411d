//! Running a cuDNN graph on CubeCL's buffers: this thread's cuDNN handle per device, the plans
//! made on it (once per [`PlanKey`]), the workspace from CubeCL's memory pool, and the
//! ordering with CubeCL's kernels (CubeCL's own stream, else host syncs).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::rc::Rc;

use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::empty_device_dtype;
use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::CudaRuntime;
use cudarc::cudnn::sys as dnn;
use cudarc::driver::result as driver;
use cudarc::driver::sys::{CUcontext, CUstream};

use super::conv::ConvKey;
use super::graph::{self, Desc, Plan, Target};
use super::sdpa::Key;
use super::CudnnError;
use crate::wan::block_kernels::{cublas, cublas_stream};

/// Which graph a plan runs: the attention forward or backward of a [`Key`], or a convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum PlanKey {
    Forward(Key),
    Backward(Key),
    Conv(ConvKey),
}

/// One execution: the plan's key and how to build its graph the first time, the device
/// tensors by uid, and the host scalars (by-value tensors) by uid.
pub(super) struct Call<'a> {
    pub key: PlanKey,
    pub graph: &'a dyn Fn() -> Result<Vec<Desc>, CudnnError>,
    pub tensors: &'a [(i64, &'a CubeTensor<CudaRuntime>)],
    pub scalars: &'a [(i64, f32)],
}

/// Runs `call` on the device of its first tensor, ordered after the kernels CubeCL queued
/// before and before those it queues after.
pub(super) fn execute(call: Call<'_>) -> Result<(), CudnnError> {
    let like = call
        .tensors
        .first()
        .map(|(_, t)| *t)
        .ok_or_else(|| CudnnError::Unsupported("a cuDNN call without device tensors".into()))?;
    let stream = cublas_stream::cubecl_stream(like).ok();
    with_state(like.device.index, |state| {
        let plan = state.plan(call.key, call.graph)?;
        let workspace = (plan.workspace > 0).then(|| {
            let words = Shape::new([plan.workspace.div_ceil(4)]);
            empty_device_dtype(like.client.clone(), like.device.clone(), words, DType::F32)
        });
        let pointer = |t: &CubeTensor<CudaRuntime>| {
            let p = cublas::pointer(t).map_err(|e| CudnnError::Call(e.to_string()))?;
            if !(p.ptr as usize).is_multiple_of(16) {
                // No address in the message: each distinct reason is printed once.
                return Err(CudnnError::Unsupported(
                    "a tensor is not 16-byte aligned".into(),
                ));
            }
            Ok(p)
        };
        let pointers = call
            .tensors
            .iter()
            .map(|(_, t)| pointer(t))
            .collect::<Result<Vec<_>, _>>()?;
        let space = workspace.as_ref().map(pointer).transpose()?;
        if stream.is_none() {
            // After taking the buffers, as for cuBLAS: that orders this thread's CubeCL stream
            // after any other stream that wrote them, and the sync then waits for it.
            cubecl::future::block_on(like.client.sync())
                .map_err(|e| CudnnError::Call(format!("sync before cuDNN: {e:?}")))?;
        }
        let mut scalars: Vec<f32> = call.scalars.iter().map(|&(_, x)| x).collect();
        let uids: Vec<i64> = (call.tensors.iter().map(|&(uid, _)| uid))
            .chain(call.scalars.iter().map(|&(uid, _)| uid))
            .collect();
        let addresses: Vec<*mut c_void> = (pointers.iter().map(|p| p.ptr as *mut c_void))
            .chain(scalars.iter_mut().map(|x| x as *mut f32 as *mut c_void))
            .collect();
        let space = space
            .as_ref()
            .map_or(std::ptr::null_mut(), |p| p.ptr as *mut c_void);
        let on = stream.unwrap_or(state.stream);
        // SAFETY: a live handle; CubeCL's stream lives as long as its server, the process.
        graph::check("cudnnSetStream", unsafe {
            dnn::cudnnSetStream(state.handle, on as dnn::cudaStream_t)
        })?;
        // SAFETY: the buffers are alive (`pointers`, `space`) and sized by the key's dims and
        // strides; the host scalars live until `execute` returns.
        unsafe { plan.execute(state.handle, &uids, &addresses, space) }?;
        // CubeCL may reuse the buffers once this returns. A plan's first run is waited for
        // on CubeCL's stream too, so that a fault in cuDNN's kernels is named here, with its
        // key, rather than at a later CubeCL kernel (later calls of that key then fail fast).
        let first = state.ran.insert(call.key);
        if stream.is_none() || first {
            // SAFETY: a live stream of the current context.
            unsafe { driver::stream::synchronize(on) }.map_err(|e| {
                let why = format!("cuDNN's first run of {:?}: {e}", call.key);
                state.failed.insert(call.key, why.clone());
                state.plans.remove(&call.key);
                CudnnError::Call(why)
            })?;
        }
        drop((pointers, space, workspace));
        Ok(())
    })
}

/// A cuDNN handle of one device, on a stream of its own (for host-ordered calls), with the
/// plans made on it.
struct State {
    context: CUcontext,
    handle: dnn::cudnnHandle_t,
    stream: CUstream,
    plans: HashMap<PlanKey, Rc<Plan>>,
    /// Why the keys cuDNN could not plan failed: asked again, they fail at once rather than
    /// trying every engine (each compiled by NVRTC) on every call.
    failed: HashMap<PlanKey, String>,
    /// The keys whose plan has run once (and was waited for).
    ran: HashSet<PlanKey>,
}

impl State {
    /// The plan of `key`, made from `graph` the first time (one line on stderr names cuDNN's
    /// engine, workspace and the seconds planning took: NVRTC compiles the engine).
    fn plan(
        &mut self,
        key: PlanKey,
        graph: &dyn Fn() -> Result<Vec<Desc>, CudnnError>,
    ) -> Result<Rc<Plan>, CudnnError> {
        if let Some(plan) = self.plans.get(&key) {
            return Ok(plan.clone());
        }
        if let Some(why) = self.failed.get(&key) {
            return Err(CudnnError::Call(why.clone()));
        }
        let start = std::time::Instant::now();
        let made = graph().and_then(|ops| Plan::new(Target::Handle(self.handle), ops));
        let plan = Rc::new(made.inspect_err(|e| {
            self.failed.insert(key, e.to_string());
        })?);
        eprintln!(
            "reel: cuDNN {key:?}: engine {}, {} bytes of workspace, planned in {:.2} s",
            plan.engine,
            plan.workspace,
            start.elapsed().as_secs_f64()
        );
        self.plans.insert(key, plan.clone());
        Ok(plan)
    }
}

thread_local! {
    /// This thread's cuDNN state, by device ordinal (a handle is not shared between threads).
    static STATES: RefCell<HashMap<usize, State>> = RefCell::new(HashMap::new());
}

/// `f` with this thread's cuDNN state for device `index`, its context current.
fn with_state<T>(
    index: usize,
    f: impl FnOnce(&mut State) -> Result<T, CudnnError>,
) -> Result<T, CudnnError> {
    STATES.with(|states| {
        let mut states = states.borrow_mut();
        if let Some(state) = states.get(&index) {
            // SAFETY: the primary context of a device CubeCL runs on, retained by `new_state`.
            unsafe { driver::ctx::set_current(state.context) }
                .map_err(|e| CudnnError::Call(format!("cuCtxSetCurrent: {e}")))?;
        } else {
            states.insert(index, new_state(index)?);
        }
        f(states.get_mut(&index).expect("inserted above"))
    })
}

/// A cuDNN handle and a non-blocking stream in device `index`'s primary context.
fn new_state(index: usize) -> Result<State, CudnnError> {
    let context = cublas::primary_context(index).map_err(CudnnError::Call)?;
    let stream = driver::stream::create(driver::stream::StreamKind::NonBlocking)
        .map_err(|e| CudnnError::Call(format!("cuStreamCreate: {e}")))?;
    let mut handle = std::ptr::null_mut();
    // SAFETY: cuDNN writes a new handle of the current context.
    graph::check("cudnnCreate", unsafe { dnn::cudnnCreate(&mut handle) })?;
    Ok(State {
        context,
        handle,
        stream,
        plans: HashMap::new(),
        failed: HashMap::new(),
        ran: HashSet::new(),
    })
}
