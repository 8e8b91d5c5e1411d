//! Helpers shared by the file-backed data sources: decoding raw tensor bytes, padding text
//! embeddings to a fixed length, and latent normalisation.

use reel_core::io::decode_le_floats;
use safetensors::tensor::Dtype;

use reel_core::config::{check, ConfigError};
use reel_core::data::TextCondition;
use reel_models::umt5::MAX_TEXT_LEN;
use serde::{Deserialize, Serialize};

/// A data source's `text_len`: from 1 to [`MAX_TEXT_LEN`] tokens, as `reel preprocess`
/// accepts. A larger count is a typo that would pad every caption (and the negative prompt)
/// to a size that does not fit in memory.
pub fn check_text_len(text_len: usize) -> Result<(), ConfigError> {
    let why = " (text tokens per prompt; Wan: 512)";
    check::count_in("text_len", text_len, MAX_TEXT_LEN, why)
}

/// The most samples a generated source (`synthetic`, `random`) may have: the loader's
/// shuffle holds one index per sample, 80 MB per worker at this count.
pub const MAX_GENERATED_SAMPLES: usize = 10_000_000;

/// A generated source's `num_samples`: from 1 to [`MAX_GENERATED_SAMPLES`].
pub fn check_generated_samples(num_samples: usize) -> Result<(), ConfigError> {
    let why = " (each epoch shuffles an index of them)";
    check::count_in("num_samples", num_samples, MAX_GENERATED_SAMPLES, why)
}

/// Element types a stored tensor may have (named as numpy / torch name them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredDtype {
    /// IEEE float32.
    F32,
    /// IEEE float16.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE float64.
    F64,
}

impl StoredDtype {
    /// Parse a dtype name: `float32`, `torch.float32`, `<f4`, `f32`, `F32`, `float16`, `half`,
    /// `bfloat16`, `float64`, `double`... Case-insensitive; `None` when not a float type Reel
    /// reads.
    pub fn parse(name: &str) -> Option<Self> {
        let lower = name.trim().to_ascii_lowercase();
        let bare = lower.strip_prefix("torch.").unwrap_or(&lower);
        let bare = bare.trim_start_matches(['<', '=', '|']);
        match bare {
            "float32" | "float" | "f32" | "f4" => Some(Self::F32),
            "float16" | "half" | "f16" | "f2" => Some(Self::F16),
            "bfloat16" | "bf16" => Some(Self::Bf16),
            "float64" | "double" | "f64" | "f8" => Some(Self::F64),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
            Self::F64 => 8,
        }
    }
}

/// Decode `numel` little-endian values of `dtype` from `bytes` to float32. The error says
/// what was expected when the byte count does not match.
pub fn decode_floats(bytes: &[u8], dtype: StoredDtype, numel: usize) -> Result<Vec<f32>, String> {
    let expected = numel
        .checked_mul(dtype.size())
        .ok_or_else(|| format!("{numel} elements overflow the addressable size"))?;
    if bytes.len() != expected {
        return Err(format!(
            "{} bytes, expected {expected} ({numel} x {dtype:?})",
            bytes.len()
        ));
    }
    let st = match dtype {
        StoredDtype::F32 => Dtype::F32,
        StoredDtype::F16 => Dtype::F16,
        StoredDtype::Bf16 => Dtype::BF16,
        StoredDtype::F64 => Dtype::F64,
    };
    let out = decode_le_floats(st, bytes)
        .unwrap_or_else(|| panic!("{st:?} is a float dtype decode_le_floats reads"));
    Ok(out)
}

/// Number of elements of `shape`, or an error for negative or overflowing dimensions.
pub fn numel(shape: &[i64]) -> Result<usize, String> {
    shape.iter().try_fold(1usize, |acc, &d| {
        let d = usize::try_from(d).map_err(|_| format!("negative dimension in shape {shape:?}"))?;
        acc.checked_mul(d)
            .ok_or_else(|| format!("shape {shape:?} overflows"))
    })
}

/// Interpret a stored latent shape: `[C, F, H, W]`, `[C, H, W]` (an image: `F = 1`) or
/// `[1, C, F, H, W]` (a leading batch of one). Returns `[C, F, H, W]`.
pub fn latent_dims(shape: &[i64]) -> Result<[usize; 4], String> {
    let dims: Vec<usize> = shape
        .iter()
        .map(|&d| usize::try_from(d).ok().filter(|&d| d > 0))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("latent shape {shape:?} has a non-positive dimension"))?;
    match dims.as_slice() {
        [c, f, h, w] | [1, c, f, h, w] => Ok([*c, *f, *h, *w]),
        [c, h, w] => Ok([*c, 1, *h, *w]),
        _ => Err(format!(
            "latent shape {shape:?}: expected [C, F, H, W], [C, H, W] or [1, C, F, H, W]"
        )),
    }
}

/// The widest text embedding a data file may store (UMT5-XXL's is 4096): a wider `D` is a
/// damaged shape, whose `text_len × D` padded embedding would not fit in memory.
pub const MAX_TEXT_DIM: usize = 1 << 16;

/// Interpret a stored text-embedding shape: `[L, D]` or `[1, L, D]`, `0 < D ≤`
/// [`MAX_TEXT_DIM`]. Returns `[L, D]`.
pub fn text_dims(shape: &[i64]) -> Result<[usize; 2], String> {
    let dims: Vec<usize> = shape
        .iter()
        .map(|&d| usize::try_from(d).ok())
        .collect::<Option<_>>()
        .ok_or_else(|| format!("text embedding shape {shape:?} has a negative dimension"))?;
    match dims.as_slice() {
        [l, d] | [1, l, d] if (1..=MAX_TEXT_DIM).contains(d) => Ok([*l, *d]),
        _ => Err(format!(
            "text embedding shape {shape:?}: expected [L, D] or [1, L, D] with 0 < D ≤ \
             {MAX_TEXT_DIM}"
        )),
    }
}

/// `Err` naming `what` and the first value of `values` that is NaN or infinite: a data file's
/// record is refused when it is read, naming the file, not later by the loader.
pub fn all_finite(what: &str, values: &[f32]) -> Result<(), String> {
    match values.iter().position(|v| !v.is_finite()) {
        Some(i) => Err(format!("{what}: value {i} is {}", values[i])),
        None => Ok(()),
    }
}

/// Pad (with zeros) or crop a `[seq, dim]` embedding to `text_len` tokens. The mask marks the
/// first `min(seq, text_len)` tokens as real, or the first `valid` tokens when the stored
/// data carried its own count of real tokens; the tokens past the real ones are zeros, as in
/// Wan's prompt form (the models read no mask, and sampling encodes prompts that way: stored
/// padding states, as a full `last_hidden_state` has, would make training differ from it).
pub fn pad_text(
    values: &[f32],
    seq: usize,
    dim: usize,
    text_len: usize,
    valid: Option<usize>,
) -> TextCondition {
    debug_assert_eq!(values.len(), seq * dim, "embedding of {seq}x{dim}");
    let keep = seq.min(text_len);
    let real = valid.unwrap_or(keep).min(keep);
    let mut embedding = vec![0.0f32; text_len * dim];
    embedding[..real * dim].copy_from_slice(&values[..real * dim]);
    let mask = (0..text_len).map(|i| i < real).collect();
    TextCondition { embedding, mask }
}

/// Per-channel latent normalisation applied when samples are loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LatentNorm {
    /// Use the stored latents as they are.
    #[default]
    None,
    /// Wan2.1 VAE statistics: `(x - mean[c]) / std[c]` over the 16 latent channels, as
    /// diffusers and FastVideo do before the DiT.
    Wan,
}

/// Wan2.1 VAE per-channel latent means (diffusers `AutoencoderKLWan.config.latents_mean`).
pub const WAN_LATENTS_MEAN: [f32; 16] = [
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715, 0.5517,
    -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
];
/// Wan2.1 VAE per-channel latent standard deviations (`latents_std`).
pub const WAN_LATENTS_STD: [f32; 16] = [
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652, 1.5579,
    1.6382, 1.1253, 2.8251, 1.9160,
];

impl LatentNorm {
    /// Check that the normalisation applies to latents with `channels` channels.
    pub fn check_channels(self, channels: usize) -> Result<(), String> {
        match self {
            Self::None => Ok(()),
            Self::Wan if channels == WAN_LATENTS_MEAN.len() => Ok(()),
            Self::Wan => Err(format!(
                "normalize = \"wan\" needs 16 latent channels, the data has {channels} \
                 (use normalize = \"none\")"
            )),
        }
    }

    /// Normalise a `[C, F, H, W]` latent in place (`channels` must have passed
    /// [`check_channels`](Self::check_channels)).
    pub fn apply(self, latents: &mut [f32], channels: usize) {
        if self == Self::None {
            return;
        }
        let plane = latents.len() / channels.max(1);
        for (c, chunk) in latents.chunks_mut(plane).enumerate() {
            let (mean, inv_std) = (WAN_LATENTS_MEAN[c], 1.0 / WAN_LATENTS_STD[c]);
            chunk.iter_mut().for_each(|v| *v = (*v - mean) * inv_std);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes_parse_and_decode() {
        for (name, dtype) in [
            ("float32", StoredDtype::F32),
            ("torch.float32", StoredDtype::F32),
            ("<f4", StoredDtype::F32),
            ("F16", StoredDtype::F16),
            ("torch.bfloat16", StoredDtype::Bf16),
            ("float64", StoredDtype::F64),
        ] {
            assert_eq!(StoredDtype::parse(name), Some(dtype), "{name}");
        }
        assert_eq!(StoredDtype::parse("int64"), None);
        let values = [1.5f32, -2.25, 0.0];
        let f32_bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            decode_floats(&f32_bytes, StoredDtype::F32, 3).unwrap(),
            values
        );
        let bf16_bytes: Vec<u8> = values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        assert_eq!(
            decode_floats(&bf16_bytes, StoredDtype::Bf16, 3).unwrap(),
            values
        );
        let f64_bytes: Vec<u8> = values
            .iter()
            .flat_map(|&v| f64::from(v).to_le_bytes())
            .collect();
        assert_eq!(
            decode_floats(&f64_bytes, StoredDtype::F64, 3).unwrap(),
            values
        );
        let err = decode_floats(&f32_bytes[..10], StoredDtype::F32, 3).unwrap_err();
        assert!(err.contains("10 bytes, expected 12"), "{err}");
    }

    #[test]
    fn shapes_are_interpreted_or_rejected() {
        assert_eq!(latent_dims(&[16, 21, 60, 104]).unwrap(), [16, 21, 60, 104]);
        assert_eq!(latent_dims(&[1, 4, 2, 8, 8]).unwrap(), [4, 2, 8, 8]);
        assert_eq!(latent_dims(&[4, 8, 8]).unwrap(), [4, 1, 8, 8]);
        assert!(latent_dims(&[4, 0, 8, 8]).is_err());
        assert!(latent_dims(&[8, 8]).is_err());
        assert_eq!(text_dims(&[7, 32]).unwrap(), [7, 32]);
        assert_eq!(text_dims(&[1, 7, 32]).unwrap(), [7, 32]);
        assert!(text_dims(&[7, 0]).is_err());
        assert_eq!(text_dims(&[0, 1 << 16]).unwrap(), [0, 1 << 16]);
        assert!(
            text_dims(&[0, 1 << 40]).is_err(),
            "an empty embedding that wide"
        );
        assert!(text_dims(&[2, 7, 32]).is_err());
        assert_eq!(numel(&[2, 3, 4]).unwrap(), 24);
        assert!(numel(&[2, -3]).is_err());
    }

    #[test]
    fn text_is_padded_or_cropped_with_a_mask() {
        let values: Vec<f32> = (0..6).map(|v| v as f32).collect(); // [3, 2]
        let padded = pad_text(&values, 3, 2, 5, None);
        assert_eq!(padded.embedding, [0., 1., 2., 3., 4., 5., 0., 0., 0., 0.]);
        assert_eq!(padded.mask, [true, true, true, false, false]);
        let cropped = pad_text(&values, 3, 2, 2, None);
        assert_eq!(cropped.embedding, [0., 1., 2., 3.]);
        assert_eq!(cropped.mask, [true, true]);
        let counted = pad_text(&values, 3, 2, 4, Some(1));
        assert_eq!(counted.mask, [true, false, false, false]);
        // The stored states past the real tokens are not kept: zeros, as sampling has them.
        assert_eq!(counted.embedding, [0., 1., 0., 0., 0., 0., 0., 0.]);
    }

    #[test]
    fn wan_normalisation_uses_per_channel_statistics() {
        assert!(LatentNorm::Wan.check_channels(4).is_err());
        assert!(LatentNorm::Wan.check_channels(16).is_ok());
        let mut latents: Vec<f32> = (0..16).flat_map(|c| [WAN_LATENTS_MEAN[c]; 2]).collect();
        latents[1] += WAN_LATENTS_STD[0];
        LatentNorm::Wan.apply(&mut latents, 16);
        assert!((latents[1] - 1.0).abs() < 1e-6);
        assert!(latents
            .iter()
            .enumerate()
            .all(|(i, v)| i == 1 || v.abs() < 1e-6));
        let mut raw = vec![3.0f32; 8];
        LatentNorm::None.apply(&mut raw, 4);
        assert_eq!(raw, [3.0; 8]);
    }
}
