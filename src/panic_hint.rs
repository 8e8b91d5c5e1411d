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

/// How to end when `message` is `println!`'s panic on an output it cannot write: the exit
/// code and the line to print, if any. A reader that went away (`reel list | head`) ends the
/// process quietly with the shell's code for a broken pipe (141), as `yes | head` does; any
/// other failure (a full disk, `> /dev/full`) is one error line and code 1.
pub fn unwritable_output(message: &str) -> Option<(i32, Option<String>)> {
    let (stream, why) = ["stdout", "stderr"].iter().find_map(|s| {
        Some((
            s,
            message.strip_prefix(&format!("failed printing to {s}: "))?,
        ))
    })?;
    if why.starts_with("Broken pipe") {
        return Some((141, None));
    }
    Some((1, Some(format!("error: cannot write to {stream}: {why}"))))
}

/// Installs a panic hook that prints the default report, then [`hint`] when it applies (also
/// for a training worker's panic, which the trainer catches and reports as an error). An
/// output that cannot be written ends the process with [`unwritable_output`]'s line instead
/// of a panic report.
pub fn install() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if let Some((code, line)) = unwritable_output(panic_message(info.payload()).unwrap_or("")) {
            if let Some(line) = line {
                let _ = std::io::Write::write_all(&mut std::io::stderr(), (line + "\n").as_bytes());
            }
            std::process::exit(code);
        }
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
    fn an_output_that_cannot_be_written_is_one_line_or_a_quiet_end() {
        let full = "failed printing to stdout: No space left on device (os error 28)";
        assert_eq!(
            unwritable_output(full),
            Some((
                1,
                Some("error: cannot write to stdout: No space left on device (os error 28)".into())
            ))
        );
        let pipe = "failed printing to stdout: Broken pipe (os error 32)";
        assert_eq!(unwritable_output(pipe), Some((141, None)));
        assert_eq!(unwritable_output("index out of bounds"), None);
    }

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
