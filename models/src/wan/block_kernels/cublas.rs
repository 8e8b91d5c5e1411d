//! [`MatmulKernel::Cublas`](super::matmul::MatmulKernel::Cublas): a product by NVIDIA's
//! cuBLAS (`cublasGemmEx`) on the buffers of the CUDA backend's tensors.
//!
//! cuBLAS is the library PyTorch's linear layers run on; cubek's matmul kernels, which Burn
//! runs, reached about 40 TFLOP/s on the H100's bf16 products of a Wan block (2026-11-27), where
//! cuBLAS reaches several hundred. It is loaded at run time through `cudarc` (the CUDA bindings
//! CubeCL's CUDA runtime uses): `libcublas.so.13` (or `.12`) must be on the loader's path. Without
//! it, the product is refused, and [`super::matmul::matmul`] runs Burn's.
//!
//! CubeCL keeps its CUDA streams to itself, so `cublas` runs cuBLAS on a stream of its own,
//! ordered with CubeCL's by two host syncs: the device before the product (its operands are
//! written), cuBLAS's stream after it (its operands and output are then free for CubeCL to
//! reuse). Each sync drains the GPU's queue once, tens of microseconds a product. Two orderings
//! need no host sync ([`Order`]):
//! - `cublas-async` ([`Order::Device`]) orders the two streams on the device, through flags in
//!   memory ([`super::cublas_order`]);
//! - `cublas-stream` ([`Order::Stream`]) runs cuBLAS on CubeCL's own stream, whose handle is
//!   learned through CUPTI ([`super::cublas_stream`]), so nothing needs ordering;
//! - `cublas-queued` ([`Order::Queued`]) does the same from CubeCL's server thread, as a task
//!   queued after the kernels before it ([`super::server_queue`]): the caller does not wait
//!   for that thread to hand over the buffers' addresses, as `cublas-stream` does three times
//!   a product.
//!
//! Row-major `C [m, n] = A [m, k] · B [k, n]` is column-major `Cᵀ = Bᵀ · Aᵀ`: a row-major
//! operand is its own transpose in cuBLAS's column-major view, and a transposed view (a weight
//! `wᵀ`) is a plain column-major matrix, so neither is copied. Operands with other strides are
//! made contiguous first.

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};
use burn_cubecl::element::BoolElement;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::CudaRuntime;
use cudarc::cublas::result as blas;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasHandle_t, cublasOperation_t, cudaDataType,
};
use cudarc::driver::result as driver;
use cudarc::driver::sys::{CUcontext, CUstream};

use super::cube::{empty, prim, wrap};
use super::cublas_order::Flags;
use super::matmul::MatmulError;

/// One operand as cuBLAS reads it in the column-major view of `Cᵀ = Bᵀ · Aᵀ`: whether to
/// transpose it there, and its leading dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Operand {
    /// `CUBLAS_OP_T` (a transposed view) rather than `CUBLAS_OP_N` (row-major).
    pub transpose: bool,
    /// Elements between consecutive columns of the column-major view.
    pub ld: usize,
}

/// How cuBLAS reads a `[rows, cols]` operand with `strides`, or `None` when it must be made
/// contiguous first: row-major (column stride 1, row stride at least `cols`) is read as is,
/// column-major (a transposed view: row stride 1, column stride at least `rows`) transposed.
pub(super) fn operand([rows, cols]: [usize; 2], [s0, s1]: [usize; 2]) -> Option<Operand> {
    if s1 == 1 && s0 >= cols.max(1) {
        Some(Operand {
            transpose: false,
            ld: s0,
        })
    } else if s0 == 1 && s1 >= rows.max(1) {
        Some(Operand {
            transpose: true,
            ld: s1,
        })
    } else {
        None
    }
}

/// How a product on cuBLAS's stream is ordered with CubeCL's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Order {
    /// A device sync before the product, a sync of cuBLAS's stream after it (`cublas`).
    Host,
    /// Flags in device memory, no host sync (`cublas-async`, [`super::cublas_order`]).
    Device,
    /// On CubeCL's own stream, which needs no ordering (`cublas-stream`,
    /// [`super::cublas_stream`]).
    Stream,
    /// On CubeCL's own stream, queued on CubeCL's server thread (`cublas-queued`,
    /// [`super::server_queue`]).
    Queued,
}

/// Set when device ordering failed (a wait gave up, the flags or their kernels could not be
/// made, or a product's opening or closing signal could not be queued): the rest of the
/// process syncs on the host.
static DEVICE_ORDER_FAILED: AtomicBool = AtomicBool::new(false);

/// Whether `cublas-async` has gone back to host syncs for the rest of the process.
#[cfg(test)]
pub(super) fn device_order_failed() -> bool {
    DEVICE_ORDER_FAILED.load(Ordering::Relaxed)
}

/// Host syncs for the rest of the process, with `why` on stderr the first time.
fn device_order_fails(why: &str) {
    if !DEVICE_ORDER_FAILED.swap(true, Ordering::Relaxed) {
        eprintln!("reel: cublas-async: {why}; host syncs from now on");
    }
}

/// Whether `libcublas` loads (looked for once).
pub(super) fn present() -> bool {
    use std::sync::OnceLock;
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| unsafe { cudarc::cublas::sys::is_culib_present() })
}

/// Whether cuBLAS runs the linear layers' products by default on `B`
/// ([`super::matmul_pin::default_pin`]): `B` is the plain CUDA backend, under autodiff or
/// not, and `libcublas` loads.
pub(super) fn default_on<B: Backend>() -> bool {
    use burn::backend::autodiff::checkpoint::strategy::{BalancedCheckpointing, NoCheckpointing};
    use burn::backend::Autodiff;
    use std::any::TypeId;
    // Reel's CUDA backend, as the block kernels recognise it (`super::cube::is`).
    type Cuda = super::cube::Cube<CudaRuntime, u8>;
    let autodiff = [
        TypeId::of::<Autodiff<Cuda, NoCheckpointing>>(),
        TypeId::of::<Autodiff<Cuda, BalancedCheckpointing>>(),
    ];
    let cuda = super::cube::is::<B, CudaRuntime, u8>() || autodiff.contains(&TypeId::of::<B>());
    cuda && present()
}

/// `lhs · rhs` by cuBLAS, `B` being the plain CubeCL backend over CUDA, ordered by `order`.
pub(super) fn matmul<B: Backend, BT: BoolElement>(
    lhs: Tensor<B, 2>,
    rhs: Tensor<B, 2>,
    order: Order,
) -> Result<Tensor<B, 2>, MatmulError> {
    let ([m, k], [rows, n]) = (lhs.dims(), rhs.dims());
    if rows != k || [m, k, n].contains(&0) || [m, k, n].iter().any(|&d| d > i32::MAX as usize) {
        return Err(refused(format!("shape [{m}, {k}] · [{rows}, {n}]")));
    }
    let (a_type, compute) = types(lhs.dtype())?;
    if !present() {
        return Err(refused(
            "libcublas was not found (put the CUDA toolkit's lib64, or the nvidia-cublas \
             wheel's lib, on LD_LIBRARY_PATH)"
                .into(),
        ));
    }
    let device = lhs.device();
    let (a, a_op) = readable::<B, BT>(lhs);
    let (b, b_op) = readable::<B, BT>(rhs);
    let c = empty(&a, &[m, n], a.dtype);
    let gemm = Gemm {
        dims: [m, n, k],
        a_op,
        b_op,
        // CubeCL pads the rows of what it allocates (on CUDA, rows of 512 bytes or more to a
        // multiple of 512 bytes, shorter ones to a power of two): `c`'s own row stride.
        ldc: c.meta.strides()[0],
        a_type,
        compute,
    };
    match plan(order, &c) {
        Plan::Queued(stream) => super::cublas_queued::queue(gemm, [&a, &b, &c], stream)?,
        plan => run_here(plan, &gemm, [&a, &b, &c], || {
            B::sync(&device).map_err(|e| refused(format!("sync before the product: {e:?}")))
        })?,
    }
    Ok(wrap::<B, CudaRuntime, BT, 2>(c))
}

/// Runs `gemm` on `[a, b, c]` from this thread, ordered by `plan` (not [`Plan::Queued`]);
/// `sync` waits for the device (the host-ordered plan's first sync).
fn run_here(
    plan: Plan,
    gemm: &Gemm,
    [a, b, c]: [&CubeTensor<CudaRuntime>; 3],
    sync: impl FnOnce() -> Result<(), MatmulError>,
) -> Result<(), MatmulError> {
    // Taking the buffers orders this thread's CubeCL stream after any other stream that
    // wrote them (and, the call being answered by CubeCL's server, after every kernel this
    // thread queued before); the sync then waits for that stream.
    let (pa, pb, pc) = (pointer(a)?, pointer(b)?, pointer(c)?);
    let buffers = [pa.ptr, pb.ptr, pc.ptr];
    with_blas(a.device.index, |blas| unsafe {
        let host_ordered = |blas: &mut Blas| {
            sync()?;
            gemm.run(blas.handle, buffers)?;
            // CubeCL may reuse the operands' and the output's memory once this returns.
            driver::stream::synchronize(blas.stream)
                .map_err(|e| refused(format!("stream sync: {e}")))
        };
        match plan {
            Plan::Host => host_ordered(blas),
            Plan::Device => {
                // The flags and their kernels are made on the first device-ordered product.
                // Where they cannot be made, or a product's opening signal cannot be queued,
                // the products run host-ordered rather than on Burn's matmul.
                let number = match blas.make_flags(c).and_then(|()| blas.ordered_before()) {
                    Ok(number) => number,
                    Err(why) => {
                        device_order_fails(&why.to_string());
                        return host_ordered(blas);
                    }
                };
                gemm.run(blas.handle, buffers)?;
                let after = blas.ordered_after(number);
                if let Err(e) = &after {
                    // The product is queued and nothing holds CubeCL back: it must finish
                    // before its buffers go back to CubeCL (the fallback may reuse them).
                    let _ = driver::stream::synchronize(blas.stream);
                    device_order_fails(&e.to_string());
                }
                after
            }
            Plan::Stream(stream) => gemm.run(blas.on(stream)?, buffers),
            Plan::Queued(_) => unreachable!("a queued product runs on CubeCL's server thread"),
        }
    })?;
    drop((pa, pb, pc));
    Ok(())
}

/// How one product is ordered, once the failures of earlier ones are taken into account.
#[derive(Clone, Copy)]
enum Plan {
    Host,
    Device,
    /// On CubeCL's own stream, this one.
    Stream(CUstream),
    /// On CubeCL's own stream, this one, from CubeCL's server thread.
    Queued(CUstream),
}

/// The plan for `order` on `like`'s device and stream: host syncs where device ordering has
/// failed before, or where CubeCL's stream is not found (one line on stderr the first time).
/// (A device-ordered product whose flags or opening signal cannot be made also syncs on the
/// host, as do the products after it: `matmul`.)
fn plan(order: Order, like: &CubeTensor<CudaRuntime>) -> Plan {
    match order {
        Order::Host => Plan::Host,
        Order::Device if DEVICE_ORDER_FAILED.load(Ordering::Relaxed) => Plan::Host,
        Order::Device => Plan::Device,
        Order::Stream | Order::Queued => match super::cublas_stream::cubecl_stream(like) {
            Ok(stream) if order == Order::Queued => Plan::Queued(stream),
            Ok(stream) => Plan::Stream(stream),
            Err(why) => {
                static WARNED: AtomicBool = AtomicBool::new(false);
                if !WARNED.swap(true, Ordering::Relaxed) {
                    eprintln!("reel: {why}; cuBLAS's products are ordered by host syncs");
                }
                Plan::Host
            }
        },
    }
}

/// One `cublasGemmEx` call: row-major `C [m, n] = A [m, k] · B [k, n]` as column-major
/// `Cᵀ = Bᵀ · Aᵀ`, float32 scalars.
pub(super) struct Gemm {
    /// `[m, n, k]`.
    dims: [usize; 3],
    a_op: Operand,
    b_op: Operand,
    /// `c`'s row stride, in elements (`n` or more).
    ldc: usize,
    a_type: cudaDataType,
    compute: cublasComputeType_t,
}

impl Gemm {
    /// Queues the product of the buffers `[a, b, c]` (device addresses) on `handle`'s stream.
    ///
    /// # Safety
    /// The pointers are live device buffers of the handle's context, large enough for the
    /// dimensions and leading dimensions.
    pub(super) unsafe fn run(
        &self,
        handle: cublasHandle_t,
        [pa, pb, pc]: [*const c_void; 3],
    ) -> Result<(), MatmulError> {
        let [m, n, k] = self.dims.map(|d| d as i32);
        let (a_op, b_op) = (self.a_op, self.b_op);
        let (alpha, beta) = (1f32, 0f32);
        unsafe {
            blas::gemm_ex(
                handle,
                op(b_op),
                op(a_op),
                n,
                m,
                k,
                (&alpha as *const f32).cast(),
                pb,
                self.a_type,
                b_op.ld as i32,
                pa,
                self.a_type,
                a_op.ld as i32,
                (&beta as *const f32).cast(),
                pc as *mut c_void,
                self.a_type,
                self.ldc as i32,
                self.compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| refused(format!("cublasGemmEx: {e}")))
    }
}

/// The cuBLAS element type and compute type of `dtype`: float32 accumulation, on tensor cores
/// (TF32 for float32 operands, as cubek's tensor-core kernels compute them).
fn types(dtype: DType) -> Result<(cudaDataType, cublasComputeType_t), MatmulError> {
    use cublasComputeType_t::{CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32};
    match dtype {
        DType::BF16 => Ok((cudaDataType::CUDA_R_16BF, CUBLAS_COMPUTE_32F)),
        DType::F16 => Ok((cudaDataType::CUDA_R_16F, CUBLAS_COMPUTE_32F)),
        DType::F32 => Ok((cudaDataType::CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32)),
        other => Err(refused(format!("dtype {other:?}"))),
    }
}

/// `t`'s primitive in a layout cuBLAS reads ([`operand`]), copied to row-major if needed.
fn readable<B: Backend, BT: BoolElement>(t: Tensor<B, 2>) -> (CubeTensor<CudaRuntime>, Operand) {
    let t = prim::<B, CudaRuntime, BT, 2>(t);
    let dims: [usize; 2] = [t.meta.shape()[0], t.meta.shape()[1]];
    let strides: [usize; 2] = [t.meta.strides()[0], t.meta.strides()[1]];
    match operand(dims, strides) {
        Some(op) => (t, op),
        None => {
            // The copy's own strides: packed today, and still read right if the copy
            // ever pitched its rows as CubeCL's allocations do.
            let t = into_contiguous(t);
            let copied = [t.meta.strides()[0], t.meta.strides()[1]];
            let op = operand(dims, copied).unwrap_or_else(|| {
                panic!("a row-major copy of {dims:?} has strides {copied:?} cuBLAS cannot read")
            });
            (t, op)
        }
    }
}

fn op(o: Operand) -> cublasOperation_t {
    if o.transpose {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

/// A tensor's device address, with the allocation kept alive while this lives.
pub(crate) struct Pointer {
    /// The address of the tensor's first element.
    pub(crate) ptr: *const c_void,
    _keep: Box<dyn Any>,
}

/// The device address of `t`'s first element.
pub(crate) fn pointer(t: &CubeTensor<CudaRuntime>) -> Result<Pointer, MatmulError> {
    let managed = t
        .client
        .get_resource(t.handle.clone())
        .map_err(|e| refused(format!("the tensor's buffer: {e:?}")))?;
    let ptr = managed.resource().ptr as *const c_void;
    Ok(Pointer {
        ptr,
        _keep: Box::new(managed),
    })
}

/// A cuBLAS handle on a stream of its own, in the device's primary context (CubeCL's).
pub(super) struct Blas {
    context: CUcontext,
    handle: cublasHandle_t,
    stream: CUstream,
    /// The device-ordering flags, made on the first device-ordered product.
    flags: Option<Flags>,
    /// Handles bound to CubeCL's streams (`cublas-stream`), by stream address.
    shared: HashMap<usize, cublasHandle_t>,
}

impl Blas {
    /// A handle of this context bound to `stream` (one of CubeCL's), made the first time.
    pub(super) fn on(&mut self, stream: CUstream) -> Result<cublasHandle_t, MatmulError> {
        if let Some(handle) = self.shared.get(&(stream as usize)) {
            return Ok(*handle);
        }
        let handle = blas::create_handle().map_err(|e| refused(format!("cublasCreate: {e}")))?;
        // SAFETY: a live handle; CubeCL's stream lives as long as its server, the process.
        unsafe { blas::set_stream(handle, stream as _) }
            .map_err(|e| refused(format!("cublasSetStream: {e}")))?;
        self.shared.insert(stream as usize, handle);
        Ok(handle)
    }

    /// Makes the device-ordering flags on `like`'s device, the first time.
    fn make_flags(&mut self, like: &CubeTensor<CudaRuntime>) -> Result<(), MatmulError> {
        if self.flags.is_none() {
            self.flags = Some(Flags::new(like)?);
        }
        Ok(())
    }

    /// Starts a device-ordered product (the flags made by [`Self::make_flags`]); returns its
    /// number, for [`Self::ordered_after`].
    fn ordered_before(&mut self) -> Result<u32, MatmulError> {
        let stream = self.stream;
        let flags = self.flags.as_mut().ok_or_else(no_flags)?;
        flags.before(stream)
    }

    /// Ends device-ordered product `n`; on the first wait found expired, host syncs for the
    /// rest of the process.
    fn ordered_after(&mut self, n: u32) -> Result<(), MatmulError> {
        let stream = self.stream;
        let flags = self.flags.as_mut().ok_or_else(no_flags)?;
        flags.after(stream, n)?;
        if flags.expired() {
            device_order_fails(
                "a CubeCL kernel stopped waiting for a cuBLAS product (products since the \
                 last check may be wrong)",
            );
        }
        Ok(())
    }
}

/// A device-ordered product without flags (an internal ordering error, not a panic: the
/// product falls back).
fn no_flags() -> MatmulError {
    refused("device ordering without its flags".into())
}

thread_local! {
    /// This thread's cuBLAS handles, by device ordinal (a handle is not to be shared between
    /// threads; each training worker has its thread and device). They live as long as the
    /// thread, like CubeCL's own state.
    static HANDLES: RefCell<HashMap<usize, Blas>> = RefCell::new(HashMap::new());
}

/// `f` with this thread's cuBLAS handle and stream for device `index`, its context current.
pub(super) fn with_blas<T>(
    index: usize,
    f: impl FnOnce(&mut Blas) -> Result<T, MatmulError>,
) -> Result<T, MatmulError> {
    HANDLES.with(|handles| {
        let mut handles = handles.borrow_mut();
        if let Some(blas) = handles.get(&index) {
            // SAFETY: the primary context of a device that CubeCL runs on, retained below.
            unsafe { driver::ctx::set_current(blas.context) }
                .map_err(|e| refused(format!("cuCtxSetCurrent: {e}")))?;
        } else {
            handles.insert(index, new_blas(index)?);
        }
        let blas = handles.get_mut(&index).expect("inserted above");
        f(blas)
    })
}

/// A cuBLAS handle bound to a new non-blocking stream, in the primary context of device
/// `index` (the one CubeCL runs in), which it makes current.
fn new_blas(index: usize) -> Result<Blas, MatmulError> {
    let context = primary_context(index).map_err(refused)?;
    let stream = driver::stream::create(driver::stream::StreamKind::NonBlocking)
        .map_err(|e| refused(format!("cuStreamCreate: {e}")))?;
    let handle = blas::create_handle().map_err(|e| refused(format!("cublasCreate: {e}")))?;
    // SAFETY: a live handle and stream of the current context.
    unsafe { blas::set_stream(handle, stream as _) }
        .map_err(|e| refused(format!("cublasSetStream: {e}")))?;
    Ok(Blas {
        context,
        handle,
        stream,
        flags: None,
        shared: HashMap::new(),
    })
}

/// The primary context of device `index` (the one CubeCL runs in), retained and made current
/// on this thread.
pub(crate) fn primary_context(index: usize) -> Result<CUcontext, String> {
    driver::init().map_err(|e| format!("cuInit: {e}"))?;
    let device = driver::device::get(index as i32).map_err(|e| format!("device {index}: {e}"))?;
    // SAFETY: `device` is a valid device handle; its primary context is made current on this
    // thread before anything is created in it.
    unsafe {
        let context = driver::primary_ctx::retain(device)
            .map_err(|e| format!("the primary context of device {index}: {e}"))?;
        driver::ctx::set_current(context).map_err(|e| format!("cuCtxSetCurrent: {e}"))?;
        Ok(context)
    }
}

pub(super) fn refused(why: String) -> MatmulError {
    MatmulError::Refused(format!("cuBLAS: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_major_operands_are_read_as_they_are() {
        let op = operand([37, 24], [24, 1]).unwrap();
        assert_eq!(
            op,
            Operand {
                transpose: false,
                ld: 24
            }
        );
        // A column slice of a wider matrix: the row stride is the leading dimension.
        assert_eq!(operand([37, 24], [40, 1]).unwrap().ld, 40);
    }

    #[test]
    fn transposed_views_are_read_transposed() {
        // `wᵀ` of a row-major `w [20, 24]`: `[24, 20]` with strides `[1, 24]`.
        let op = operand([24, 20], [1, 24]).unwrap();
        assert_eq!(
            op,
            Operand {
                transpose: true,
                ld: 24
            }
        );
    }

    #[test]
    fn other_strides_are_made_contiguous() {
        assert_eq!(operand([4, 3], [0, 1]), None, "broadcast rows");
        assert_eq!(operand([4, 3], [6, 2]), None, "every other column");
        assert_eq!(operand([4, 3], [1, 2]), None, "overlapping columns");
    }
}
