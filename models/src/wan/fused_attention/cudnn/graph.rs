//! cuDNN's graph ("backend") API in a few safe pieces: descriptors that free themselves
//! ([`Desc`]), tensors ([`TensorSpec`]), and an execution plan found by cuDNN's heuristics
//! ([`Plan`]); the operations are in `ops.rs`.
//!
//! Upstream reference: the cuDNN backend API (`cudnnBackendCreateDescriptor`,
//! `cudnnBackendSetAttribute`, `cudnnBackendFinalize`, `cudnnBackendExecute`; NVIDIA's
//! "cuDNN Graph API" documentation). cudarc binds these functions but wraps none of them.

use std::cell::RefCell;
use std::ffi::c_void;
use std::rc::Rc;

use cudarc::cudnn::sys as dnn;
use dnn::cudnnBackendAttributeName_t as Attr;
use dnn::cudnnBackendAttributeType_t as Ty;
use dnn::cudnnBackendDescriptorType_t as Kind;

use super::CudnnError;

/// cuDNN's float32, the graphs' intermediate and compute type.
pub(super) const F32: dnn::cudnnDataType_t = dnn::cudnnDataType_t::CUDNN_DATA_FLOAT;

/// `Ok` for `CUDNN_STATUS_SUCCESS`; otherwise `what` failed, with cuDNN's name for the status
/// and its last error message.
pub(super) fn check(what: &str, status: dnn::cudnnStatus_t) -> Result<(), CudnnError> {
    if status == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        return Ok(());
    }
    let mut last = [0 as std::ffi::c_char; 512];
    // SAFETY: cuDNN returns a static string; it writes at most `last.len()` bytes, with a NUL.
    let (name, last) = unsafe {
        let name = dnn::cudnnGetErrorString(status);
        dnn::cudnnGetLastErrorString(last.as_mut_ptr(), last.len());
        let name = if name.is_null() {
            format!("{status:?}")
        } else {
            std::ffi::CStr::from_ptr(name)
                .to_string_lossy()
                .into_owned()
        };
        let last = std::ffi::CStr::from_ptr(last.as_ptr())
            .to_string_lossy()
            .into_owned();
        (name, last)
    };
    let last = if last.is_empty() {
        String::new()
    } else {
        format!(": {last}")
    };
    Err(CudnnError::Call(format!("{what}: {name}{last}")))
}

/// A backend descriptor, destroyed once neither it nor a descriptor it was set on is in use:
/// the descriptors set as its attributes are kept alive with it (whether cuDNN copies them or
/// keeps pointers to them, they outlive every use).
#[derive(Clone)]
pub(super) struct Desc(Rc<Raw>);

struct Raw {
    raw: dnn::cudnnBackendDescriptor_t,
    children: RefCell<Vec<Desc>>,
}

impl Drop for Raw {
    fn drop(&mut self) {
        // SAFETY: a descriptor made by `Desc::new`, destroyed once.
        unsafe { dnn::cudnnBackendDestroyDescriptor(self.raw) };
    }
}

impl Desc {
    /// A new descriptor of `kind`.
    pub fn new(kind: Kind) -> Result<Self, CudnnError> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: cuDNN writes a new descriptor into `raw`.
        check("cudnnBackendCreateDescriptor", unsafe {
            dnn::cudnnBackendCreateDescriptor(kind, &mut raw)
        })?;
        Ok(Self(Rc::new(Raw {
            raw,
            children: RefCell::new(Vec::new()),
        })))
    }

    /// The raw handle, for calls that take it.
    pub fn raw(&self) -> dnn::cudnnBackendDescriptor_t {
        self.0.raw
    }

    /// Sets `attr` to `values` of cuDNN type `ty` (`T` must be that type's C layout).
    pub fn set<T>(&self, attr: Attr, ty: Ty, values: &[T]) -> Result<&Self, CudnnError> {
        // SAFETY: `values` holds `len` elements of the C type `ty` names (the callers pair
        // them); cuDNN copies them.
        check(&format!("set {attr:?}"), unsafe {
            dnn::cudnnBackendSetAttribute(
                self.raw(),
                attr,
                ty,
                values.len() as i64,
                values.as_ptr() as *const c_void,
            )
        })?;
        Ok(self)
    }

    /// Sets `attr` to other descriptors (kept alive with this one).
    pub fn descs(&self, attr: Attr, descs: &[&Desc]) -> Result<&Self, CudnnError> {
        let raw: Vec<_> = descs.iter().map(|d| d.raw()).collect();
        self.set(attr, Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw)?;
        let mut children = self.0.children.borrow_mut();
        children.extend(descs.iter().map(|&d| d.clone()));
        drop(children);
        Ok(self)
    }

    /// Finalizes the descriptor (no attribute can be set afterwards).
    pub fn finalize(self) -> Result<Self, CudnnError> {
        // SAFETY: a live descriptor.
        check("cudnnBackendFinalize", unsafe {
            dnn::cudnnBackendFinalize(self.raw())
        })?;
        Ok(self)
    }
}

/// A tensor of `R` dimensions (the attention graphs' 4, a 3-D convolution's 5) of a graph:
/// `uid` names it in the variant pack; a virtual one lives inside the fused kernel only; a
/// by-value one is a host scalar passed at execution.
#[derive(Clone, Copy, Debug)]
pub(super) struct TensorSpec<const R: usize = 4> {
    pub uid: i64,
    pub dtype: dnn::cudnnDataType_t,
    pub dims: [i64; R],
    pub strides: [i64; R],
    pub is_virtual: bool,
    pub by_value: bool,
}

impl TensorSpec {
    /// A virtual float32 tensor of `dims`, stored row-major.
    pub fn virtual_f32(uid: i64, dims: [i64; 4]) -> Self {
        let strides = [dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1];
        Self {
            uid,
            dtype: F32,
            dims,
            strides,
            is_virtual: true,
            by_value: false,
        }
    }
}

impl<const R: usize> TensorSpec<R> {
    /// A device tensor (neither virtual nor by value).
    pub fn device(
        uid: i64,
        dtype: dnn::cudnnDataType_t,
        dims: [i64; R],
        strides: [i64; R],
    ) -> Self {
        Self {
            uid,
            dtype,
            dims,
            strides,
            is_virtual: false,
            by_value: false,
        }
    }

    /// The tensor's descriptor (16-byte alignment: the callers check the addresses).
    pub fn build(&self) -> Result<Desc, CudnnError> {
        let d = Desc::new(Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
        d.set(
            Attr::CUDNN_ATTR_TENSOR_DATA_TYPE,
            Ty::CUDNN_TYPE_DATA_TYPE,
            &[self.dtype],
        )?
        .set(
            Attr::CUDNN_ATTR_TENSOR_DIMENSIONS,
            Ty::CUDNN_TYPE_INT64,
            &self.dims,
        )?
        .set(
            Attr::CUDNN_ATTR_TENSOR_STRIDES,
            Ty::CUDNN_TYPE_INT64,
            &self.strides,
        )?
        .set(
            Attr::CUDNN_ATTR_TENSOR_UNIQUE_ID,
            Ty::CUDNN_TYPE_INT64,
            &[self.uid],
        )?
        .set(
            Attr::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
            Ty::CUDNN_TYPE_INT64,
            &[16i64],
        )?
        .set(
            Attr::CUDNN_ATTR_TENSOR_IS_VIRTUAL,
            Ty::CUDNN_TYPE_BOOLEAN,
            &[self.is_virtual],
        )?
        .set(
            Attr::CUDNN_ATTR_TENSOR_IS_BY_VALUE,
            Ty::CUDNN_TYPE_BOOLEAN,
            &[self.by_value],
        )?;
        d.finalize()
    }
}

/// The most device workspace a plan may take, in bytes: cuDNN's fused attention engines need
/// little, where an engine that kept the whole score matrix would take gigabytes (3.2 GB at
/// 8190 tokens and 12 heads) and run slowly anyway.
const MAX_WORKSPACE: usize = 512 << 20;

/// An execution plan of an operation graph, with the descriptors it was made from (kept
/// alive as long as the plan).
pub(super) struct Plan {
    plan: Desc,
    /// Bytes of device workspace an execution needs.
    pub workspace: usize,
    /// The global index of the engine cuDNN chose, for the log.
    pub engine: i64,
    _keep: Vec<Desc>,
}

/// What a plan is made for: a device through a cuDNN handle, or, to check graphs without a
/// GPU, a device described by cuDNN's device-properties JSON (cuDNN 9.8 and later).
#[derive(Clone, Copy)]
pub(super) enum Target<'a> {
    Handle(dnn::cudnnHandle_t),
    /// Only the tests make plans without a GPU.
    #[cfg_attr(not(test), allow(dead_code))]
    Described(&'a Desc),
}

/// A device described by cuDNN's device-properties JSON, for [`Target::Described`].
#[cfg_attr(not(test), allow(dead_code))]
pub(super) fn described_device(json: &str) -> Result<Desc, CudnnError> {
    let desc = Desc::new(Kind::CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR)?;
    desc.set(
        Attr::CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION,
        Ty::CUDNN_TYPE_CHAR,
        json.as_bytes(),
    )?;
    desc.finalize()
}

/// An H100 80GB HBM3 as cuDNN's device properties describe it (the values of the
/// CUDA device attributes cuDNN reads).
#[cfg(test)]
pub(super) const H100: &str = r#"{"deviceVer": 900, "driverVer": 12080, "cudaDeviceId": 0,
    "totalGlobalMem": 85045968896, "maxGridSize": [2147483647, 65535, 65535],
    "maxBlockSize": [1024, 1024, 64], "regsPerBlock": 65536, "multiProcessorCount": 132,
    "smCountOrigin": 0, "warpSize": 32, "maxSharedMemoryPerBlock": 49152,
    "maxSharedMemoryPerBlockOptin": 232448, "oversizedSharedMemoryPerBlock": 0,
    "reservedSharedMemoryPerBlock": 1024, "maxRegistersPerSM": 65536, "maxCtasPerSM": 32,
    "maxThreadsPerBlock": 1024, "maxThreadsPerSM": 2048, "pciDeviceId": 9008,
    "isTccDriver": 0, "supportCoopLaunch": 1, "smClockRateKHz": 1980000,
    "memClockRateKHz": 2619000, "memoryBusWidth": 5120, "l2CacheSize": 52428800,
    "deviceName": "NVIDIA H100 80GB HBM3"}"#;

/// Asserts that cuDNN's heuristics propose engines for the graph of `ops` on `device` (a
/// described one, [`described_device`]), and prints them after `what`; the tests that check
/// graphs without a GPU (`bench/cudnn-check.sh`).
#[cfg(test)]
pub(super) fn assert_engines(device: &Desc, what: &str, ops: Result<Vec<Desc>, CudnnError>) {
    let ops = ops.unwrap_or_else(|e| panic!("{what}: {e}"));
    let (_graph, _heuristics, configs) =
        Plan::configs(Target::Described(device), &ops).unwrap_or_else(|e| panic!("{what}: {e}"));
    let engines: Vec<_> = configs
        .iter()
        .map(|c| engine_index(c).unwrap_or(-1))
        .collect();
    eprintln!("{what}: cuDNN's engines {engines:?}");
    assert!(
        !engines.is_empty(),
        "{what}: cuDNN's heuristics propose no engine"
    );
}

impl Plan {
    /// The first engine configuration of cuDNN's heuristics (mode A) that can run the graph
    /// of `ops` on `target` within [`MAX_WORKSPACE`].
    pub fn new(target: Target<'_>, ops: Vec<Desc>) -> Result<Self, CudnnError> {
        let (graph, heur, configs) = Self::configs(target, &ops)?;
        let mut reasons = Vec::new();
        for config in configs {
            let engine = engine_index(&config).unwrap_or(-1);
            match Self::with_config(target, &config) {
                Ok((_, workspace)) if workspace > MAX_WORKSPACE => reasons.push(format!(
                    "engine {engine} needs {workspace} bytes of workspace (more than \
                     {MAX_WORKSPACE})"
                )),
                Ok((plan, workspace)) => {
                    let mut keep = ops;
                    keep.extend([graph, heur, config]);
                    return Ok(Self {
                        plan,
                        workspace,
                        engine,
                        _keep: keep,
                    });
                }
                Err(e) => reasons.push(format!("engine {engine}: {e}")),
            }
        }
        if reasons.is_empty() {
            reasons.push("cuDNN's heuristics proposed none".into());
        }
        Err(CudnnError::NoEngine(reasons.join("; ")))
    }

    /// The finalized operation graph of `ops`, its heuristics, and the engine configurations
    /// they propose for `target`, best first (with their engines' global indices).
    pub fn configs(
        target: Target<'_>,
        ops: &[Desc],
    ) -> Result<(Desc, Desc, Vec<Desc>), CudnnError> {
        let graph = Desc::new(Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
        let refs: Vec<&Desc> = ops.iter().collect();
        graph.descs(Attr::CUDNN_ATTR_OPERATIONGRAPH_OPS, &refs)?;
        if let Target::Handle(h) = target {
            graph.set(
                Attr::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
                Ty::CUDNN_TYPE_HANDLE,
                &[h],
            )?;
        }
        let graph = graph.finalize()?;
        let heur = Desc::new(Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
        heur.descs(Attr::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[&graph])?
            .set(
                Attr::CUDNN_ATTR_ENGINEHEUR_MODE,
                Ty::CUDNN_TYPE_HEUR_MODE,
                &[dnn::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A],
            )?;
        if let Target::Described(device) = target {
            heur.descs(Attr::CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, &[device])?;
        }
        let heur = heur.finalize()?;
        let configs = engine_configs(&heur)?;
        Ok((graph, heur, configs))
    }

    /// A finalized plan of `config` and its workspace size.
    fn with_config(target: Target<'_>, config: &Desc) -> Result<(Desc, usize), CudnnError> {
        let plan = Desc::new(Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
        match target {
            Target::Handle(h) => plan.set(
                Attr::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                Ty::CUDNN_TYPE_HANDLE,
                &[h],
            )?,
            Target::Described(device) => {
                plan.descs(Attr::CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, &[device])?
            }
        };
        plan.descs(Attr::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[config])?;
        let plan = plan.finalize()?;
        let mut workspace = 0i64;
        get(
            &plan,
            Attr::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
            Ty::CUDNN_TYPE_INT64,
            &mut workspace,
        )?;
        Ok((plan, workspace.max(0) as usize))
    }

    /// Runs the plan on `handle`'s stream with the device (or, for by-value tensors, host)
    /// addresses `pointers` of the tensors `uids`, and `workspace` (at least
    /// [`Self::workspace`] bytes; may be null when that is 0).
    ///
    /// # Safety
    /// Every pointer is live and large enough for its tensor, until the kernels that read it
    /// have run (the host scalars: until this returns).
    pub unsafe fn execute(
        &self,
        handle: dnn::cudnnHandle_t,
        uids: &[i64],
        pointers: &[*mut c_void],
        workspace: *mut c_void,
    ) -> Result<(), CudnnError> {
        let pack = Desc::new(Kind::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
        pack.set(
            Attr::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
            Ty::CUDNN_TYPE_INT64,
            uids,
        )?
        .set(
            Attr::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
            Ty::CUDNN_TYPE_VOID_PTR,
            pointers,
        )?
        .set(
            Attr::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
            Ty::CUDNN_TYPE_VOID_PTR,
            &[workspace],
        )?;
        let pack = pack.finalize()?;
        // SAFETY: the caller's contract.
        check("cudnnBackendExecute", unsafe {
            dnn::cudnnBackendExecute(handle, self.plan.raw(), pack.raw())
        })
    }
}

/// The engine configurations cuDNN's heuristics `heur` propose, best first.
fn engine_configs(heur: &Desc) -> Result<Vec<Desc>, CudnnError> {
    let mut count = 0i64;
    // SAFETY: asking for zero elements writes the count only.
    check("engine configurations (count)", unsafe {
        dnn::cudnnBackendGetAttribute(
            heur.raw(),
            Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            0,
            &mut count,
            std::ptr::null_mut(),
        )
    })?;
    let configs = (0..count.max(0))
        .map(|_| Desc::new(Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
        .collect::<Result<Vec<_>, _>>()?;
    let mut raw: Vec<_> = configs.iter().map(Desc::raw).collect();
    let mut got = 0i64;
    // SAFETY: `raw` holds `count` created engine-configuration descriptors for cuDNN to fill.
    check("engine configurations", unsafe {
        dnn::cudnnBackendGetAttribute(
            heur.raw(),
            Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            raw.len() as i64,
            &mut got,
            raw.as_mut_ptr() as *mut c_void,
        )
    })?;
    let mut configs = configs;
    configs.truncate(got.max(0) as usize);
    Ok(configs)
}

/// The global index of the engine of `config` (for the log).
pub(super) fn engine_index(config: &Desc) -> Result<i64, CudnnError> {
    let engine = Desc::new(Kind::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
    // cuDNN fills the engine descriptor created here.
    let mut raw = engine.raw();
    get(
        config,
        Attr::CUDNN_ATTR_ENGINECFG_ENGINE,
        Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR,
        &mut raw,
    )?;
    let mut index = -1i64;
    get(
        &engine,
        Attr::CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
        Ty::CUDNN_TYPE_INT64,
        &mut index,
    )?;
    Ok(index)
}

/// Reads one attribute `attr` of type `ty` into `out` (one element: a scalar, or a created
/// descriptor for cuDNN to fill).
fn get<T>(desc: &Desc, attr: Attr, ty: Ty, out: &mut T) -> Result<(), CudnnError> {
    let mut got = 0i64;
    // SAFETY: `out` has room for one element of the C type `ty` names.
    check(&format!("get {attr:?}"), unsafe {
        dnn::cudnnBackendGetAttribute(
            desc.raw(),
            attr,
            ty,
            1,
            &mut got,
            out as *mut T as *mut c_void,
        )
    })
}
