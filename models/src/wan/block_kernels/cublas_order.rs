//! cuBLAS's stream ordered with CubeCL's on the device, without host syncs (the `cublas-async`
//! kernel of [`super::matmul`]).
//!
//! CubeCL keeps its CUDA streams private, so neither stream can wait on an event of the other.
//! Both can wait on memory, though:
//! 1. a one-unit CubeCL kernel ([`signal`]) writes the product's number `n` into a flag after
//!    everything CubeCL queued before it (the operands' producers);
//! 2. cuBLAS's stream waits for that value (`cuStreamWaitValue32`), runs the product, and
//!    writes `n` into a second flag (`cuStreamWriteValue32`, after the product's writes);
//! 3. a one-unit CubeCL kernel ([`wait`]) spins until it reads `n` there, so that nothing CubeCL
//!    queues later (the product's consumers, and kernels reusing the operands' memory) starts
//!    before the product ends.
//!
//! The flags count products, and both streams move in lock step, so a flag never runs ahead
//! of the value awaited and equality is enough (the count may wrap). The spin is bounded (about
//! a second of loads); past the bound it marks the third flag, which the host reads every
//! [`CHECK_EVERY`] products: then device ordering is off for the process, with one line on
//! stderr, and the products go back to host syncs.

// The `#[cube(launch)]` macro generates undocumented launch modules and structs.
#![allow(missing_docs)]

use std::any::Any;

use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::CudaRuntime;
use cubecl::prelude::*;
use cudarc::driver::sys::{self as cu, CUstream};

use super::matmul::MatmulError;

/// Loads of the done flag before [`wait`] gives up (about a second at a few hundred
/// nanoseconds a load: far above any product's time).
const MAX_POLLS: u32 = 1 << 22;

/// Products between two host reads of the expired flag.
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

/// The flags of one thread's products on one device: `[ready, done, expired, unused]`.
pub(super) struct Flags {
    tensor: CubeTensor<CudaRuntime>,
    address: u64,
    _keep: Box<dyn Any>,
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
            count: 0,
            since_check: 0,
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
        let eq = cu::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32;
        // SAFETY: a live stream of the current context and the flags' live device address.
        unsafe { cu::cuStreamWaitValue32_v2(stream, self.address, n, eq) }
            .result()
            .map_err(|e| refused(format!("cuStreamWaitValue32: {e}")))?;
        Ok(n)
    }

    /// After product `n` on `stream`: `stream` writes `n`, CubeCL waits for it.
    pub fn after(&mut self, stream: CUstream, n: u32) -> Result<(), MatmulError> {
        // SAFETY: as in `before`; the default flags order the write after the product's.
        unsafe { cu::cuStreamWriteValue32_v2(stream, self.address + 4, n, 0) }
            .result()
            .map_err(|e| refused(format!("cuStreamWriteValue32: {e}")))?;
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

    /// Whether a [`wait`] gave up, read from the device every [`CHECK_EVERY`] calls (a host
    /// sync then) and `false` in between.
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
