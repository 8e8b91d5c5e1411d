//! The frame-chunk feature cache of the causal VAE, run exactly as diffusers runs it.
//!
//! Upstream: diffusers `autoencoder_kl_wan.py` — `CACHE_T`, `AutoencoderKLWan.clear_cache`
//! and the `feat_cache` / `feat_idx` arguments threaded through every module. The encoder
//! sees frame 0 alone, then chunks of 4 frames; the decoder sees one latent frame at a time.
//! Between chunks each causal convolution keeps the last [`CACHE_T`] frames of its *input*
//! (prepending the previous chunk's last frame when a chunk has a single frame), and the
//! temporal resamplers keep their own state ([`CacheEntry::Rep`] marks an upsampler that has
//! seen its first chunk). Entries are consumed in call order, as diffusers' flat list is.

use std::collections::BTreeMap;

use burn::tensor::{backend::Backend, Tensor};

use super::conv_gemm::ConvImpl;

/// Frames of a causal convolution's input kept for the next chunk (diffusers `CACHE_T`).
pub const CACHE_T: usize = 2;

/// One slot of the cache (one causal convolution or temporal resampler).
#[derive(Debug, Clone)]
pub enum CacheEntry<B: Backend> {
    /// Not run yet (diffusers `None`).
    Empty,
    /// A temporal upsampler after its first chunk, which it passed through without its
    /// time convolution (diffusers' `"Rep"` marker).
    Rep,
    /// Frames kept from the previous chunk `[B, C, t, H, W]`.
    Frames(Tensor<B, 5>),
}

/// Outputs of named modules on the first causal chunk, keyed like the golden fixtures
/// (`first_chunk.encoder.conv_in`, `first_chunk.decoder.up_blocks.0`, ...).
pub type Intermediates<B> = BTreeMap<String, Tensor<B, 5>>;

/// Prefix of every captured name.
pub const FIRST_CHUNK: &str = "first_chunk";

/// The state of one chunked encode or decode: the cache slots, the cursor of the current
/// chunk, optionally the captured first-chunk outputs, and how the convolutions run.
#[derive(Debug)]
pub struct FeatCache<B: Backend> {
    entries: Vec<CacheEntry<B>>,
    cursor: usize,
    capture: Option<Intermediates<B>>,
    capturing: bool,
    conv: ConvImpl,
}

impl<B: Backend> Default for FeatCache<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: Backend> FeatCache<B> {
    /// An empty cache (diffusers `clear_cache`), its convolutions on [`ConvImpl::of`].
    pub fn new() -> Self {
        Self {
            entries: Vec::new(),
            cursor: 0,
            capture: None,
            capturing: false,
            conv: ConvImpl::of::<B>(),
        }
    }

    /// This cache with its convolutions on `conv`.
    pub fn with_conv(self, conv: ConvImpl) -> Self {
        Self { conv, ..self }
    }

    /// How this pass's convolutions run.
    pub fn conv(&self) -> ConvImpl {
        self.conv
    }

    /// An empty cache that records module outputs during the first chunk.
    pub fn capturing() -> Self {
        Self {
            capture: Some(BTreeMap::new()),
            ..Self::new()
        }
    }

    /// Begin a chunk: slots are taken from the start again (diffusers `feat_idx = [0]`);
    /// outputs are recorded only while `index == 0`.
    pub fn start_chunk(&mut self, index: usize) {
        self.cursor = 0;
        self.capturing = index == 0 && self.capture.is_some();
    }

    /// The next slot in call order.
    pub fn next_slot(&mut self) -> &mut CacheEntry<B> {
        if self.cursor == self.entries.len() {
            self.entries.push(CacheEntry::Empty);
        }
        self.cursor += 1;
        &mut self.entries[self.cursor - 1]
    }

    /// Number of slots used so far (one per causal convolution and temporal resampler).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no slot has been used.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Record `x` as the output of `module` (e.g. `encoder.mid_block`) when capturing.
    pub fn record(&mut self, module: &str, x: &Tensor<B, 5>) {
        if !self.capturing {
            return;
        }
        if let Some(map) = self.capture.as_mut() {
            map.entry(format!("{FIRST_CHUNK}.{module}"))
                .or_insert_with(|| x.clone());
        }
    }

    /// Take the recorded outputs (empty when not capturing).
    pub fn take_intermediates(&mut self) -> Intermediates<B> {
        self.capture.take().unwrap_or_default()
    }
}

/// The frames a causal convolution keeps after seeing `x` `[B, C, t, H, W]`: its last
/// [`CACHE_T`] frames, with the previous slot's last frame in front when `x` has a single
/// frame and there is a previous slot.
pub fn cache_tail<B: Backend>(prev: Option<&Tensor<B, 5>>, x: &Tensor<B, 5>) -> Tensor<B, 5> {
    let t = x.dims()[2];
    let keep = t.min(CACHE_T);
    let tail = x.clone().narrow(2, t - keep, keep);
    match prev {
        Some(p) if keep < CACHE_T => Tensor::cat(vec![last_frame(p), tail], 2),
        _ => tail,
    }
}

/// The last frame of `x` `[B, C, t, H, W]` as `[B, C, 1, H, W]`.
pub fn last_frame<B: Backend>(x: &Tensor<B, 5>) -> Tensor<B, 5> {
    let t = x.dims()[2];
    x.clone().narrow(2, t - 1, 1)
}
