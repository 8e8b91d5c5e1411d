//! CubeCL's own CUDA stream, for cuBLAS to run on (the `cublas-stream` kernel of
//! [`super::matmul`]): a stream runs its work in order, so a product queued there between
//! CubeCL's kernels needs neither a host sync ([`super::cublas::Order::Host`]) nor flags in
//! memory ([`super::cublas_order`]).
//!
//! CubeCL creates its streams itself and does not hand their handles out. The handle of the
//! stream a thread's kernels run on is learned once, from NVIDIA's profiling interface CUPTI
//! (`libcupti`, part of the CUDA toolkit): while a callback on `cuLaunchKernel` is
//! subscribed, a probe kernel is launched on the stream with a grid no other kernel uses
//! ([`PROBE_GRID`]), and the callback keeps the stream of that launch. The subscription ends
//! as soon as the probe has been launched, so CUPTI costs nothing afterwards. CubeCL makes its
//! streams when its server starts and keeps them for the process, so the handle stays valid.
//!
//! `libcupti` is looked for on the loader's path, then in the toolkit's `extras/CUPTI/lib64`
//! (under `CUDA_PATH`, `CUDA_HOME` or `/usr/local/cuda`). Where it is missing, or where another
//! tool holds CUPTI's one subscription (a profiler), the stream is not found and the products
//! are ordered by host syncs instead.

// The `#[cube(launch)]` macro generates undocumented launch modules and structs.
#![allow(missing_docs)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::CudaRuntime;
use cubecl::prelude::*;
use cudarc::cupti::sys as cupti;
use cudarc::driver::sys::CUstream;

use super::matmul::MatmulError;

/// The probe's grid `(x, y, z)`, with one unit per cube: a shape no kernel of Reel's or
/// Burn's launches (their grids are sized by tensors, not by two small primes).
const PROBE_GRID: (u32, u32, u32) = (1, 251, 3);

/// Writes 1 into `out[0]` (the probe: only its launch matters).
#[cube(launch)]
pub fn probe(out: &mut Tensor<u32>) {
    if ABSOLUTE_POS == 0 {
        out[0] = 1u32;
    }
}

/// The stream each (device ordinal, CubeCL stream id) was found on, or why it was not.
type Found = HashMap<(usize, u64), Result<usize, String>>;

static FOUND: Mutex<Option<Found>> = Mutex::new(None);

/// The CUDA stream that CubeCL runs this thread's kernels on, on `like`'s device: found once
/// per device and CubeCL stream id, then remembered (a failure too).
pub(crate) fn cubecl_stream(like: &CubeTensor<CudaRuntime>) -> Result<CUstream, MatmulError> {
    let key = (
        like.device.index,
        cubecl::stream_id::StreamId::current().value,
    );
    let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    let found = found.get_or_insert_with(HashMap::new);
    let stream = found.entry(key).or_insert_with(|| find(like));
    match stream {
        Ok(address) => Ok(*address as CUstream),
        Err(why) => Err(MatmulError::Refused(format!(
            "cuBLAS on CubeCL's stream: {why}"
        ))),
    }
}

/// The stream of a probe launched on `like`'s client, through CUPTI's launch callback.
fn find(like: &CubeTensor<CudaRuntime>) -> Result<usize, String> {
    load_cupti()?;
    // The callback writes the probe's stream here; it lives for the process, as a late
    // callback (none is expected once unsubscribed) must find it.
    static SEEN: AtomicUsize = AtomicUsize::new(0);
    SEEN.store(0, Ordering::SeqCst);
    let subscriber = Subscription::new(&SEEN)?;
    let out = super::cube::empty(like, &[1], DType::U32);
    let (x, y, z) = PROBE_GRID;
    probe::launch::<CudaRuntime>(
        &like.client,
        CubeCount::Static(x, y, z),
        CubeDim::new_1d(1),
        out.into_tensor_arg(),
    );
    // The sync returns after CubeCL's server has launched everything queued before it.
    let synced = cubecl::future::block_on(like.client.sync());
    drop(subscriber);
    synced.map_err(|e| format!("sync after the probe: {e:?}"))?;
    match SEEN.load(Ordering::SeqCst) {
        0 => Err("CUPTI saw no launch of the probe kernel".into()),
        stream => Ok(stream),
    }
}

/// The driver calls whose launches the probe is looked for in (the one CubeCL makes, and its
/// per-thread-stream form); both take `cuLaunchKernel`'s parameters.
const LAUNCHES: [cupti::CUpti_driver_api_trace_cbid_enum; 2] = [
    cupti::CUpti_driver_api_trace_cbid_enum::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
    cupti::CUpti_driver_api_trace_cbid_enum::CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
];

/// A CUPTI subscription to the driver's kernel launches, ended on drop.
struct Subscription(cupti::CUpti_SubscriberHandle);

impl Subscription {
    /// Subscribes [`on_launch`] (with `seen` as its user data) to `cuLaunchKernel`.
    fn new(seen: &'static AtomicUsize) -> Result<Self, String> {
        let mut handle = std::ptr::null_mut();
        let user = seen as *const AtomicUsize as *mut c_void;
        // SAFETY: `on_launch` matches `CUpti_CallbackFunc`; `user` outlives the subscription.
        check("cuptiSubscribe", unsafe {
            cupti::cuptiSubscribe(&mut handle, Some(on_launch), user)
        })?;
        let subscription = Self(handle);
        for cbid in LAUNCHES {
            // SAFETY: a live subscriber handle.
            check("cuptiEnableCallback", unsafe {
                cupti::cuptiEnableCallback(
                    1,
                    subscription.0,
                    cupti::CUpti_CallbackDomain::CUPTI_CB_DOMAIN_DRIVER_API,
                    cbid as u32,
                )
            })?;
        }
        Ok(subscription)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // SAFETY: the live subscriber handle made in `new`.
        let _ = unsafe { cupti::cuptiUnsubscribe(self.0) };
    }
}

/// CUPTI's callback: on entry to a launch with the probe's grid and one unit per cube, stores
/// its stream into the `AtomicUsize` behind `user`.
unsafe extern "C" fn on_launch(
    user: *mut c_void,
    domain: cupti::CUpti_CallbackDomain,
    cbid: cupti::CUpti_CallbackId,
    data: *const c_void,
) {
    let launch = LAUNCHES.iter().any(|&c| c as u32 == cbid);
    if domain != cupti::CUpti_CallbackDomain::CUPTI_CB_DOMAIN_DRIVER_API
        || !launch
        || data.is_null()
    {
        return;
    }
    // SAFETY: for the driver domain, CUPTI passes a `CUpti_CallbackData`; the two launch
    // callbacks of `LAUNCHES` share `cuLaunchKernel`'s parameter layout.
    let data = unsafe { &*(data as *const cupti::CUpti_CallbackData) };
    if data.callbackSite != cupti::CUpti_ApiCallbackSite::CUPTI_API_ENTER
        || data.functionParams.is_null()
    {
        return;
    }
    let p = unsafe { &*(data.functionParams as *const cupti::cuLaunchKernel_params_st) };
    let grid = (p.gridDimX, p.gridDimY, p.gridDimZ);
    let block = (p.blockDimX, p.blockDimY, p.blockDimZ);
    if grid == PROBE_GRID && block == (1, 1, 1) && !p.hStream.is_null() {
        // SAFETY: `user` is the `&'static AtomicUsize` given to `cuptiSubscribe`.
        let seen = unsafe { &*(user as *const AtomicUsize) };
        seen.store(p.hStream as usize, Ordering::SeqCst);
    }
}

/// `Ok` for `CUPTI_SUCCESS`, CUPTI's message otherwise.
fn check(what: &str, result: cupti::CUptiResult) -> Result<(), String> {
    if result == cupti::CUptiResult::CUPTI_SUCCESS {
        return Ok(());
    }
    let mut text = std::ptr::null();
    // SAFETY: CUPTI writes a pointer to a static string.
    let message = unsafe {
        if cupti::cuptiGetResultString(result, &mut text) == cupti::CUptiResult::CUPTI_SUCCESS
            && !text.is_null()
        {
            std::ffi::CStr::from_ptr(text)
                .to_string_lossy()
                .into_owned()
        } else {
            format!("{result:?}")
        }
    };
    Err(format!("{what}: {message}"))
}

/// Makes `libcupti` loadable by `cudarc`: already on the loader's path, or loaded here from the
/// toolkit's `extras/CUPTI/lib64` (cudarc then finds it by its soname).
fn load_cupti() -> Result<(), String> {
    // SAFETY: loading a shared library by name runs its initialisers (CUPTI's own).
    if unsafe { cupti::is_culib_present() } {
        return Ok(());
    }
    let dirs = cupti_dirs();
    // Found but not usable: cudarc opens CUPTI again by the sonames its build knows.
    let mut unusable = vec![];
    for dir in &dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if !name.to_string_lossy().starts_with("libcupti.so") {
                continue;
            }
            // SAFETY: as above; the library stays loaded for the process.
            if let Ok(lib) = unsafe { libloading::Library::new(entry.path()) } {
                std::mem::forget(lib);
                if unsafe { cupti::is_culib_present() } {
                    return Ok(());
                }
            }
            unusable.push(entry.path());
        }
    }
    let unusable = if unusable.is_empty() {
        String::new()
    } else {
        format!(
            "; {unusable:?} did not load as a CUPTI this build takes (a CUDA version mismatch?)"
        )
    };
    Err(format!(
        "libcupti was not found on the loader's path nor in {dirs:?}{unusable} (put the CUDA \
         toolkit's extras/CUPTI/lib64, or the nvidia-cuda-cupti wheel's lib, on LD_LIBRARY_PATH)"
    ))
}

/// Where a CUDA toolkit keeps `libcupti` (`extras/CUPTI/lib64`; some releases also in `lib64`
/// or `targets/x86_64-linux/lib`).
fn cupti_dirs() -> Vec<PathBuf> {
    let roots = ["CUDA_PATH", "CUDA_HOME"]
        .iter()
        .filter_map(|var| std::env::var_os(var).map(PathBuf::from))
        .chain([PathBuf::from("/usr/local/cuda")]);
    let under = ["extras/CUPTI/lib64", "lib64", "targets/x86_64-linux/lib"];
    roots
        .flat_map(|root| under.map(|dir| root.join(dir)))
        .collect()
}
