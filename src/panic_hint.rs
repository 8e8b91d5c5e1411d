//! A hint after a panic that is the device running out of memory.
//!
//! Burn and CubeCL report a failed device allocation by panicking (their allocation results
//! are unwrapped inside the backend), so what a user sees is an internal message and a
//! backtrace. [`install`] keeps that report and adds what to change in the run.

use reel_core::trainer::panic_message;

/// What to change when a run does not fit the device's memory.
pub const OUT_OF_MEMORY_HINT: &str = "reel: the device ran out of memory. To fit the run: \
`runtime.dtype = \"bf16\"`; `gradient_checkpointing = true` on each trained role; a smaller \
`data.batch_size` with `training.grad_accumulation` keeping the effective batch; a LoRA \
adapter instead of full fine-tuning; or more devices (`runtime.num_devices`). \
`reel bench --breakdown --config <run.toml>` reports a run's peak memory \
(docs/performance.md).";

/// Lower-case markers of a failed device allocation in Burn's, CubeCL's, CUDA's and wgpu's
/// messages.
const MARKERS: [&str; 6] = [
    "out of memory",
    "out-of-memory",
    "out_of_memory",
    "outofmemory",
    "buffertoobig",
    "can't allocate buffer",
];

/// [`OUT_OF_MEMORY_HINT`] when `message` reports a failed device allocation.
pub fn hint(message: &str) -> Option<&'static str> {
    let message = message.to_lowercase();
    MARKERS
        .iter()
        .any(|m| message.contains(m))
        .then_some(OUT_OF_MEMORY_HINT)
}

/// Installs a panic hook that prints the default report, then [`hint`] when it applies (also
/// for a training worker's panic, which the trainer catches and reports as an error).
pub fn install() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        if let Some(h) = hint(panic_message(info.payload()).unwrap_or("")) {
            eprintln!("{h}");
        }
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_device_allocation_failures_only() {
        let oom = [
            "called `Result::unwrap()` on an `Err` value: BufferTooBig { size: 8589934592 }",
            "can't allocate buffer of size: 8589934592",
            "CUDA allocation error: CUDA_ERROR_OUT_OF_MEMORY",
            "An out-of-memory error happened during launch",
            "Validation Error: Out of memory",
        ];
        for m in oom {
            assert_eq!(hint(m), Some(OUT_OF_MEMORY_HINT), "{m}");
        }
        for m in [
            "index out of bounds: the len is 3 but the index is 5",
            "fused attention: head dims 512 + 512 do not fit the device's 49152 bytes",
            "",
        ] {
            assert_eq!(hint(m), None, "{m}");
        }
    }
}
