//! `cublas-queued`: cuBLAS's products run from CubeCL's server thread, on CubeCL's own stream
//! ([`super::cublas_stream`]), each queued there as a task after the kernels before it
//! ([`super::server_queue`]).
//!
//! A product needs its buffers' device addresses, which only CubeCL's server thread knows:
//! `cublas-stream` asks that thread for each of the three and waits for the answers, so the
//! caller waits three times a product for the kernels queued before it to be launched (and for
//! the thread to wake). Queued, the product takes the addresses where they are, and the caller
//! goes on as after a CubeCL kernel launch.
//!
//! A queued product cannot hand an error back: the caller has taken its output already. So
//! what can fail before cuBLAS is called is done first, waiting: the server thread's cuBLAS
//! handle for the stream is made by the first product on it, and a failure there refuses that
//! product (Burn's matmul runs it). A `cublasGemmEx` that fails afterwards left a wrong output:
//! the reason goes to stderr, and the next queued call panics with it
//! ([`server_queue::check`]).

use std::collections::HashSet;
use std::ffi::c_void;
use std::sync::Mutex;

use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::{CudaDevice, CudaRuntime};
use cubecl::server::{Binding, ComputeServer};
use cubecl::stream_id::StreamId;
use cubecl::Runtime;
use cudarc::driver::sys::CUstream;

use super::cublas::{refused, with_blas, Gemm};
use super::matmul::MatmulError;
use super::server_queue;

/// The (device ordinal, stream address) pairs whose cuBLAS handle the server thread has made.
static READY: Mutex<Option<HashSet<(usize, usize)>>> = Mutex::new(None);

/// Queues `gemm` on the buffers of `[a, b, c]` for CubeCL's server thread, to run on CubeCL's
/// `stream` after the kernels this thread queued before; returns at once.
///
/// # Panics
/// When an earlier queued call failed (its output was wrong), with the reason.
pub(super) fn queue(
    gemm: Gemm,
    tensors: [&CubeTensor<CudaRuntime>; 3],
    stream: CUstream,
) -> Result<(), MatmulError> {
    server_queue::check();
    let device = tensors[2].device.clone();
    let (index, stream) = (device.index, stream as usize);
    prepare(&device, stream)?;
    let bindings = tensors.map(|t| t.handle.clone().binding());
    server_queue::queue::<CudaRuntime>(&device, move |server| {
        run(server, &gemm, bindings, index, stream as CUstream).map_err(|e| e.to_string())
    });
    Ok(())
}

/// Makes the server thread's cuBLAS handle for `stream` on `device` the first time, and waits
/// for it.
fn prepare(device: &CudaDevice, stream: usize) -> Result<(), MatmulError> {
    let index = device.index;
    let ready = || READY.lock().unwrap_or_else(|e| e.into_inner());
    if ready()
        .as_ref()
        .is_some_and(|r| r.contains(&(index, stream)))
    {
        return Ok(());
    }
    // Not holding the lock while the server thread works: another device's first product
    // need not wait for this one (making the handle twice is harmless: `Blas::on` keeps one).
    server_queue::wait::<CudaRuntime, _>(device, move |_| {
        with_blas(index, |blas| blas.on(stream as CUstream).map(|_| ()))
    })
    .map_err(refused)??;
    ready()
        .get_or_insert_with(HashSet::new)
        .insert((index, stream));
    Ok(())
}

/// On CubeCL's server thread: `gemm` on the buffers of `bindings` (`[a, b, c]`), queued on
/// `stream` with this thread's handle for it.
fn run(
    server: &mut <CudaRuntime as Runtime>::Server,
    gemm: &Gemm,
    bindings: [Binding; 3],
    index: usize,
    stream: CUstream,
) -> Result<(), MatmulError> {
    let id = StreamId::current();
    let [a, b, c] = bindings.map(|binding| {
        server
            .get_resource(binding, id)
            .map_err(|e| refused(format!("a tensor's buffer: {e:?}")))
    });
    // Kept until cuBLAS has queued the product: CubeCL may reuse a buffer once its resource is
    // dropped, and the stream runs the product before any later kernel.
    let (a, b, c) = (a?, b?, c?);
    let buffers = [&a, &b, &c].map(|r| r.resource().ptr as *const c_void);
    // SAFETY: live buffers of CubeCL's context, sized by the tensors the caller described.
    with_blas(index, |blas| unsafe { gemm.run(blas.on(stream)?, buffers) })
}
