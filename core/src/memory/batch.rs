//! Whether the batches of a data set a run holds at once fit in this machine's memory, checked
//! before a run starts: a mistyped size (`height = 4000` for 40) would otherwise abort the
//! process at the first batch with an allocation failure instead of an error naming the data.

use super::gib;
use crate::config::ConfigError;
use crate::data::DataSpec;

/// Bytes of `batch` samples of `spec` as the loader holds them: latents, text embeddings and
/// their masks, float32 (`None`: more than a `u128` counts).
pub fn batch_bytes(spec: &DataSpec, batch: usize) -> Option<u128> {
    let product = |dims: &[usize]| {
        dims.iter()
            .try_fold(1u128, |acc, &d| acc.checked_mul(d as u128))
    };
    let latents = product(&[spec.channels, spec.frames, spec.height, spec.width])?;
    let text = product(&[spec.text_len, spec.text_dim])?.checked_add(spec.text_len as u128)?;
    latents
        .checked_add(text)?
        .checked_mul(batch as u128)?
        .checked_mul(4)
}

/// Refuse the samples a training step holds on the host at once, where they do not fit in
/// `available` bytes (`None`: unknown, not checked): its `accumulation` micro-batches of
/// `batch` samples each, and as many of the next step's, which the loader reads ahead while
/// this one runs. An error keyed `data` naming the counts, the shapes and both sizes.
pub fn check_step_memory(
    spec: &DataSpec,
    batch: usize,
    accumulation: usize,
    available: Option<u64>,
) -> Result<(), ConfigError> {
    let advice = "check the data's sizes, `data.batch_size` and `training.grad_accumulation`";
    let held = batch.saturating_mul(accumulation).saturating_mul(2);
    let step = if accumulation == 1 {
        format!("a batch of {batch}")
    } else {
        format!("{accumulation} micro-batches of {batch}")
    };
    samples_fit(spec, held, available, advice).map_err(|why| {
        let what = format!("a step's data ({step}, and the next step's, read ahead)");
        ConfigError::new("data", format!("{what}: {why}"))
    })
}

/// Whether `count` samples of `spec` held at once fit in `available` bytes (`None`: unknown,
/// not checked); otherwise why not ("4 samples of … take 12.0 GiB as float32, more than the
/// 8.0 GiB of memory this machine has available: {advice}", the caller's `advice` on what to
/// change; samples too large to count say to check the data's sizes).
pub fn samples_fit(
    spec: &DataSpec,
    count: usize,
    available: Option<u64>,
    advice: &str,
) -> Result<(), String> {
    let samples = if count == 1 { "sample" } else { "samples" };
    let what = format!("{count} {samples} of {spec}");
    let Some(bytes) = batch_bytes(spec, count) else {
        return Err(format!(
            "{what} has more values than can be counted: check the data's sizes"
        ));
    };
    match available {
        Some(free) if bytes > free as u128 => Err(format!(
            "{what} takes {} as float32, more than the {} of memory this machine has \
             available: {advice}",
            gib(bytes),
            gib(free as u128)
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_counts_latents_text_and_masks_in_float32() {
        let s = DataSpec::for_tests(2, 3, 5);
        let per_sample = 4 * 2 * 3 * 5 + 8 * 32 + 8;
        assert_eq!(batch_bytes(&s, 3), Some(3 * 4 * per_sample));
        assert_eq!(
            batch_bytes(&DataSpec::for_tests(1 << 62, 1 << 62, 1 << 62), 1),
            None
        );
    }

    /// A step of one micro-batch of 1 sample holds 2 samples (its own and the next step's).
    #[test]
    fn a_batch_that_fits_passes_and_one_that_does_not_names_its_sizes() {
        let s = DataSpec::for_tests(2, 12, 12);
        let bytes = batch_bytes(&s, 2).unwrap() as u64;
        check_step_memory(&s, 1, 1, Some(bytes)).unwrap();
        check_step_memory(&s, 1, 1, None).unwrap();
        let e = check_step_memory(&s, 1, 1, Some(bytes - 1)).unwrap_err();
        assert_eq!(e.key, "data");
        for want in [
            "2 samples of 4×2×12×12 latents",
            "text 8×32",
            "GiB",
            "batch_size",
        ] {
            assert!(e.message.contains(want), "missing {want:?} in {e}");
        }
        let huge = DataSpec::for_tests(1 << 62, 1 << 62, 1 << 62);
        let e = check_step_memory(&huge, 1, 1, None).unwrap_err();
        assert!(e.message.contains("more values than can be counted"), "{e}");
    }

    /// A step holds its micro-batches and the next step's at once: 2 × 3 micro-batches of 2
    /// samples are 12 samples, which fit in their bytes and not in one byte less.
    #[test]
    fn a_step_counts_its_micro_batches_and_the_next_steps() {
        let s = DataSpec::for_tests(2, 12, 12);
        let bytes = batch_bytes(&s, 12).unwrap() as u64;
        check_step_memory(&s, 2, 3, Some(bytes)).unwrap();
        let e = check_step_memory(&s, 2, 3, Some(bytes - 1)).unwrap_err();
        assert_eq!(e.key, "data");
        for want in ["3 micro-batches of 2", "12 samples", "grad_accumulation"] {
            assert!(e.message.contains(want), "missing {want:?} in {e}");
        }
        let e = check_step_memory(&s, 2, 1, Some(4 * bytes / 12 - 1)).unwrap_err();
        assert!(e.message.contains("a batch of 2, and the next"), "{e}");
        assert!(check_step_memory(&s, usize::MAX, 2, Some(u64::MAX)).is_err());
    }
}
