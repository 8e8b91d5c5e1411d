//! cuBLAS's stream ordered with CubeCL's on the device, without host syncs (the `cublas-async`
//! kernel of [`super::matmul`]).
//!
//! CubeCL keeps its CUDA streams private, so neither stream can wait on an event of the other.
//! Both can wait on memory, though, through one-unit kernels on each side:
//! 1. a CubeCL kernel ([`signal`]) writes the product's number `n` into a flag after everything
//!    CubeCL queued before it (the operands' producers);
//! 2. on cuBLAS's stream, a kernel of [`STREAM_KERNELS`] spins until it reads `n` there; the
//!    product runs; another kernel writes `n` into a second flag (after the product's writes);
//! 3. a CubeCL kernel ([`wait`]) spins until it reads `n` there, so that nothing CubeCL queues
//!    later (the product's consumers, and kernels reusing the operands' memory) starts before
//!    the product ends.
//!
//! cuBLAS's side is two small CUDA kernels compiled once by NVRTC (which CubeCL's CUDA runtime
//! compiles its own kernels with) and launched through `cudarc`. CUDA's stream memory
//! operations (`cuStreamWaitValue32`, `cuStreamWriteValue32`) would do the same without
//! kernels, but the H100 of 2026-11-27 refused them on CubeCL's buffers (which come from
//! `cuMemAllocAsync`'s pool) with `CUDA_ERROR_INVALID_VALUE`.
//!
//! The flags count products, and both streams move in lock step, so a flag never runs ahead
//! of the value awaited and equality is enough (the count may wrap). The spins are bounded:
//! cuBLAS's side by [`WAIT_NS`] of the GPU's timer (it waits for everything CubeCL queued
//! before the product), CubeCL's by [`MAX_POLLS`] loads (it waits for one product). Past the
//! bound they mark the third flag, which the host reads after the first product and every
//! [`CHECK_EVERY`] products: then device ordering is off for the process, with one line on
//! stderr, and the products go back to host syncs.

// The `#[cube(launch)]` macro generates undocumented launch modules and structs.
#![allow(missing_docs)]

use std::any::Any;
use std::ffi::{c_void, CString};

use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::CudaRuntime;
use cubecl::prelude::*;
use cudarc::driver::result as driver;
use cudarc::driver::sys::{CUfunction, CUstream};

use super::matmul::MatmulError;

/// Loads of the done flag before [`wait`] gives up (about a second at a few hundred
/// nanoseconds a load: far above any product's time, which is all it waits for).
const MAX_POLLS: u32 = 1 << 22;

/// Nanoseconds cuBLAS's side waits for CubeCL's signal before it gives up (`reel_wait_flag`).
/// It waits for everything CubeCL queued before the product, which can be a long way behind the
/// host: far more than the spin above, and a wait given up too early runs the product on
/// operands not yet written.
const WAIT_NS: u64 = 20_000_000_000;

/// Products between two host reads of the expired flag (the first product is read too).
pub(super) const CHECK_EVERY: u32 = 1024;

/// Writes `value` into `flags[0]` (one unit).
#[cube(launch)]
pub fn signal(flags: &Tensor<Atomic<u32>>, value: u32) {
    if UNIT_POS == 0 {
        flags[0].store(value);
    }
}

/// Spins until `flags[1]` holds `value`; after `max_polls` loads, writes 1 into `flags[2]`
/// and returns.
#[cube(launch)]
pub fn wait(flags: &Tensor<Atomic<u32>>, value: u32, max_polls: u32) {
    if UNIT_POS == 0 {
        let mut polls = 0u32;
        loop {
            if flags[1].load() == value {
                break;
            }
            polls += 1;
            if polls >= max_polls {
                flags[2].store(1u32);
                break;
            }
        }
    }
}

/// cuBLAS's side of the ordering, in CUDA C: `reel_wait_flag` spins until `*flag == value` (for
/// at most `max_ns` nanoseconds of the GPU's global timer, then marks `*expired`);
/// `reel_set_flag` writes `value` after every earlier write of its stream.
pub(super) const STREAM_KERNELS: &str = r#"
__device__ unsigned long long reel_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void reel_wait_flag(const volatile unsigned int* flag, unsigned int value,
                                          unsigned long long max_ns, unsigned int* expired) {
    unsigned long long start = reel_now();
    while (*flag != value) {
        if (reel_now() - start > max_ns) {
            atomicExch(expired, 1u);
            break;
        }
    }
    __threadfence();
}

extern "C" __global__ void reel_set_flag(unsigned int* flag, unsigned int value) {
    __threadfence();
    atomicExch(flag, value);
}
"#;

/// [`STREAM_KERNELS`] loaded in the current context.
struct StreamKernels {
    wait: CUfunction,
    set: CUfunction,
}

impl StreamKernels {
    /// Compiles [`STREAM_KERNELS`] and loads them in the current context.
    fn load() -> Result<Self, MatmulError> {
        let ptx = cudarc::nvrtc::compile_ptx(STREAM_KERNELS)
            .map_err(|e| refused(format!("NVRTC: {e:?}")))?;
        let image = CString::new(ptx.to_src())
            .map_err(|e| refused(format!("the PTX holds a NUL byte: {e}")))?;
        let name = |n: &str| CString::new(n).expect("a kernel name without NUL bytes");
        // SAFETY: NUL-terminated PTX, loaded in the current context (the caller's); the module
        // lives as long as the process, like the flags.
        unsafe {
            let module = driver::module::load_data(image.as_ptr().cast())
                .map_err(|e| refused(format!("cuModuleLoadData: {e}")))?;
            let function = |n: &str| {
                driver::module::get_function(module, name(n))
                    .map_err(|e| refused(format!("cuModuleGetFunction {n}: {e}")))
            };
            Ok(Self {
                wait: function("reel_wait_flag")?,
                set: function("reel_set_flag")?,
            })
        }
    }

    /// `function` on one thread of `stream` with `args` (pointers to the values).
    ///
    /// # Safety
    /// `args` match the kernel's parameters; `stream` is live in the current context.
    unsafe fn launch(
        function: CUfunction,
        stream: CUstream,
        args: &mut [*mut c_void],
    ) -> Result<(), MatmulError> {
        unsafe { driver::launch_kernel(function, (1, 1, 1), (1, 1, 1), 0, stream, args) }
            .map_err(|e| refused(format!("cuLaunchKernel: {e}")))
    }
}

/// The flags of one thread's products on one device: `[ready, done, expired, unused]`.
pub(super) struct Flags {
    tensor: CubeTensor<CudaRuntime>,
    address: u64,
    _keep: Box<dyn Any>,
    kernels: StreamKernels,
    count: u32,
    since_check: u32,
}

impl Flags {
    /// Zeroed flags on `like`'s device.
    pub fn new(like: &CubeTensor<CudaRuntime>) -> Result<Self, MatmulError> {
        let client = like.client.clone();
        let handle = client.create_from_slice(&[0u8; 16]);
        // cuBLAS's stream reads the flags outside CubeCL's stream order: they must be zero
        // before the first product.
        cubecl::future::block_on(client.sync())
            .map_err(|e| refused(format!("sync after zeroing the flags: {e:?}")))?;
        let tensor = CubeTensor::new_contiguous(
            client,
            like.device.clone(),
            Shape::new([4]),
            handle,
            DType::U32,
        );
        let managed = tensor
            .client
            .get_resource(tensor.handle.clone())
            .map_err(|e| refused(format!("the flags' buffer: {e:?}")))?;
        let address = managed.resource().ptr;
        Ok(Self {
            tensor,
            address,
            _keep: Box::new(managed),
            kernels: StreamKernels::load()?,
            count: 0,
            // The first product is read back at once: an ordering that never works costs one
            // spin's bound, not 1024 of them.
            since_check: CHECK_EVERY - 1,
        })
    }

    /// Before a product on `stream`: CubeCL signals the next number, `stream` waits for it.
    /// Returns the number, for [`Self::after`].
    pub fn before(&mut self, stream: CUstream) -> Result<u32, MatmulError> {
        // Zero is the flags' initial value: never a product's number.
        self.count = self.count.wrapping_add(1).max(1);
        let n = self.count;
        signal::launch::<CudaRuntime>(
            &self.tensor.client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(1),
            self.tensor.clone().into_tensor_arg(),
            n,
        );
        // CubeCL queues launches for its device thread and sends them to the driver later:
        // the signal must reach CubeCL's stream before `stream` spins on it (else each product
        // waits for CubeCL's next flush, or, where the two streams share a hardware queue,
        // for the spin's bound).
        self.tensor
            .client
            .flush()
            .map_err(|e| refused(format!("flushing CubeCL's queue: {e:?}")))?;
        let (mut flag, mut value, mut max_ns) = (self.address, n, WAIT_NS);
        let mut expired = self.address + 8;
        let mut args = [
            (&mut flag as *mut u64).cast(),
            (&mut value as *mut u32).cast(),
            (&mut max_ns as *mut u64).cast(),
            (&mut expired as *mut u64).cast(),
        ];
        // SAFETY: `reel_wait_flag(const unsigned*, unsigned, unsigned long long, unsigned*)`
        // with the flags' live device addresses, on a live stream of the current context.
        unsafe { StreamKernels::launch(self.kernels.wait, stream, &mut args) }?;
        Ok(n)
    }

    /// After product `n` on `stream`: `stream` writes `n`, CubeCL waits for it.
    pub fn after(&mut self, stream: CUstream, n: u32) -> Result<(), MatmulError> {
        let (mut flag, mut value) = (self.address + 4, n);
        let mut args = [
            (&mut flag as *mut u64).cast(),
            (&mut value as *mut u32).cast(),
        ];
        // SAFETY: `reel_set_flag(unsigned*, unsigned)` with the done flag's live device
        // address, on a live stream of the current context (after the product).
        unsafe { StreamKernels::launch(self.kernels.set, stream, &mut args) }?;
        wait::launch::<CudaRuntime>(
            &self.tensor.client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(1),
            self.tensor.clone().into_tensor_arg(),
            n,
            MAX_POLLS,
        );
        Ok(())
    }

    /// Whether a [`wait`] gave up, read from the device on the first call and every
    /// [`CHECK_EVERY`] calls after it (a host sync then), `false` in between.
    pub fn expired(&mut self) -> bool {
        self.since_check += 1;
        if self.since_check < CHECK_EVERY {
            return false;
        }
        self.since_check = 0;
        match self.tensor.client.read_one(self.tensor.handle.clone()) {
            Ok(bytes) => bytes.get(8..12).is_some_and(|b| b != [0, 0, 0, 0]),
            Err(_) => true,
        }
    }
}

fn refused(why: String) -> MatmulError {
    MatmulError::Refused(format!("cuBLAS ordering: {why}"))
}
