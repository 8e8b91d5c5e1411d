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
use super::{CudnnError, Flash};
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
    pub graph: &'a (dyn Fn() -> Result<Vec<Desc>, CudnnError> + Sync),
    pub tensors: &'a [(i64, &'a CubeTensor<CudaRuntime>)],
    pub scalars: &'a [(i64, f32)],
}

/// Runs `call` on the device of its first tensor, ordered after the kernels CubeCL queued
/// before and before those it queues after: from CubeCL's server thread for an attention call
/// under `REEL_FLASH=cudnn-queued` ([`super::queued`]), else from this thread.
pub(super) fn execute(call: Call<'_>) -> Result<(), CudnnError> {
    let like = call
        .tensors
        .first()
        .map(|(_, t)| *t)
        .ok_or_else(|| CudnnError::Unsupported("a cuDNN call without device tensors".into()))?;
    let stream = cublas_stream::cubecl_stream(like).ok();
    let attention = matches!(call.key, PlanKey::Forward(_) | PlanKey::Backward(_));
    if let Some(stream) = stream.filter(|_| attention && super::flash() == Flash::CudnnQueued) {
        return super::queued::execute(call, like, stream);
    }
    with_state(like.device.index, |state| {
        let plan = state.plan(call.key, call.graph)?;
        let workspace = workspace(like, plan.workspace);
        let pointer = |t: &CubeTensor<CudaRuntime>| {
            let p = cublas::pointer(t).map_err(|e| CudnnError::Call(e.to_string()))?;
            aligned(p.ptr as *mut c_void)?;
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
        let buffers: Vec<*mut c_void> = pointers.iter().map(|p| p.ptr as *mut c_void).collect();
        let space_ptr = space
            .as_ref()
            .map_or(std::ptr::null_mut(), |p| p.ptr as *mut c_void);
        let on = stream.unwrap_or(state.stream);
        let tensors = call.tensors.iter().map(|&(uid, _)| uid).zip(buffers);
        state.launch(
            &plan,
            call.key,
            tensors,
            call.scalars,
            space_ptr,
            on,
            stream.is_none(),
        )?;
        drop((pointers, space, workspace));
        Ok(())
    })
}

/// A workspace of at least `bytes` on `like`'s device (none for 0).
pub(super) fn workspace(
    like: &CubeTensor<CudaRuntime>,
    bytes: usize,
) -> Option<CubeTensor<CudaRuntime>> {
    (bytes > 0).then(|| {
        let words = Shape::new([bytes.div_ceil(4)]);
        empty_device_dtype(like.client.clone(), like.device.clone(), words, DType::F32)
    })
}

/// `Ok` when `ptr` is 16-byte aligned, as cuDNN's graphs want their tensors.
pub(super) fn aligned(ptr: *mut c_void) -> Result<(), CudnnError> {
    if (ptr as usize).is_multiple_of(16) {
        Ok(())
    } else {
        // No address in the message: each distinct reason is printed once.
        Err(CudnnError::Unsupported(
            "a tensor is not 16-byte aligned".into(),
        ))
    }
}

/// The size in bytes of the workspace of `key`'s plan on this thread and device `index`,
/// making the plan from `graph` the first time.
pub(super) fn plan(
    index: usize,
    key: PlanKey,
    graph: &(dyn Fn() -> Result<Vec<Desc>, CudnnError> + Sync),
) -> Result<usize, CudnnError> {
    with_state(index, |state| Ok(state.plan(key, graph)?.workspace))
}

/// Runs `key`'s plan, made on this thread before ([`plan`]), with the device `tensors`
/// (`(uid, address)`), the host `scalars` and the workspace `space`, on `stream`; its first run
/// is waited for.
pub(super) fn run_planned(
    index: usize,
    key: PlanKey,
    tensors: impl Iterator<Item = (i64, *mut c_void)>,
    scalars: &[(i64, f32)],
    space: *mut c_void,
    stream: CUstream,
) -> Result<(), CudnnError> {
    with_state(index, |state| {
        let plan = (state.plans.get(&key).cloned()).ok_or_else(|| {
            let why = state.failed.get(&key).cloned();
            CudnnError::Call(why.unwrap_or_else(|| format!("no plan of {key:?} on this thread")))
        })?;
        state.launch(&plan, key, tensors, scalars, space, stream, false)
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
    /// Runs `plan` (of `key`) on `on` with the device `tensors` (`(uid, address)`), the host
    /// `scalars` and the workspace `space`, and waits for it when `wait` or when it is the
    /// plan's first run.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &mut self,
        plan: &Plan,
        key: PlanKey,
        tensors: impl Iterator<Item = (i64, *mut c_void)>,
        scalars: &[(i64, f32)],
        space: *mut c_void,
        on: CUstream,
        wait: bool,
    ) -> Result<(), CudnnError> {
        let mut values: Vec<f32> = scalars.iter().map(|&(_, x)| x).collect();
        let (mut uids, mut addresses): (Vec<i64>, Vec<*mut c_void>) = tensors.unzip();
        uids.extend(scalars.iter().map(|&(uid, _)| uid));
        addresses.extend(values.iter_mut().map(|x| x as *mut f32 as *mut c_void));
        // SAFETY: a live handle; CubeCL's stream lives as long as its server, the process.
        graph::check("cudnnSetStream", unsafe {
            dnn::cudnnSetStream(self.handle, on as dnn::cudaStream_t)
        })?;
        // SAFETY: the caller keeps the buffers alive and sized by the key's dims and strides;
        // the host scalars live until this returns.
        unsafe { plan.execute(self.handle, &uids, &addresses, space) }?;
        // CubeCL may reuse the buffers once the caller drops them. A plan's first run is waited
        // for on its stream too, so that a fault in cuDNN's kernels is named here, with its
        // key, rather than at a later CubeCL kernel (later calls of that key then fail fast).
        let first = self.ran.insert(key);
        if wait || first {
            // SAFETY: a live stream of the current context.
            unsafe { driver::stream::synchronize(on) }.map_err(|e| {
                let why = format!("cuDNN's first run of {key:?}: {e}");
                self.failed.insert(key, why.clone());
                self.plans.remove(&key);
                CudnnError::Call(why)
            })?;
        }
        Ok(())
    }

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
