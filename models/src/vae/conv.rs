//! Convolutions of the Wan VAE: the causal 3D convolution (left temporal padding, fed from
//! the frame cache), the per-frame 2D convolution of the resamplers and the 1x1 projections
//! of the attention block.
//!
//! Upstream: diffusers `autoencoder_kl_wan.py` — `WanCausalConv3d` (an `nn.Conv3d` whose
//! temporal padding `2 * padding[0]` is applied on the left only, after concatenating the
//! cached frames), the `nn.Conv2d` inside `WanResample.resample` and the 1x1 `nn.Conv2d`
//! of `WanAttentionBlock`.

use burn::module::{Module, Param};
use burn::tensor::ops::PadMode;
use burn::tensor::{backend::Backend, Tensor};

use super::cache::{cache_tail, CacheEntry, FeatCache};
use super::conv_gemm::{conv3d_with, ConvImpl, FramePad};
use crate::wan::init::{join, ParamInit};

/// `nn.Conv3d` with causal time padding: `weight [out, in, kt, kh, kw]`, `bias [out]`.
///
/// Spatial padding is symmetric (`padding[1..]`); the temporal padding `2 * padding[0]` is
/// put before the first frame, minus the number of cached frames placed there instead.
#[derive(Module, Debug)]
pub struct CausalConv3d<B: Backend> {
    /// Kernel `[out, in, kt, kh, kw]`.
    pub weight: Param<Tensor<B, 5>>,
    /// Bias `[out]`.
    pub bias: Param<Tensor<B, 1>>,
    /// Stride `(t, h, w)`.
    pub stride: [usize; 3],
    /// diffusers' `padding` argument `(t, h, w)`; time is padded by `2 * t` on the left.
    pub padding: [usize; 3],
}

impl<B: Backend> CausalConv3d<B> {
    /// A convolution at `path` with a cubic or `(kt, kh, kw)` kernel.
    pub fn init(
        init: &ParamInit<B>,
        path: &str,
        [c_in, c_out]: [usize; 2],
        kernel: [usize; 3],
        stride: [usize; 3],
        padding: [usize; 3],
    ) -> Self {
        let [kt, kh, kw] = kernel;
        Self {
            weight: init.weight(&join(path, "weight"), [c_out, c_in, kt, kh, kw]),
            bias: init.zeros(&join(path, "bias"), [c_out]),
            stride,
            padding,
        }
    }

    /// The common 3x3x3 convolution with padding 1 (causal: two frames on the left).
    pub fn cube(init: &ParamInit<B>, path: &str, c_in: usize, c_out: usize) -> Self {
        Self::init(init, path, [c_in, c_out], [3; 3], [1; 3], [1; 3])
    }

    /// A 1x1x1 convolution (a per-voxel linear map; no temporal context).
    pub fn pointwise(init: &ParamInit<B>, path: &str, c_in: usize, c_out: usize) -> Self {
        Self::init(init, path, [c_in, c_out], [1; 3], [1; 3], [0; 3])
    }

    /// `x [B, C, T, H, W]` (after `cache [B, C, t, H, W]` when given) `-> [B, out, T', H', W']`,
    /// on `how`.
    pub fn forward(
        &self,
        x: Tensor<B, 5>,
        cache: Option<Tensor<B, 5>>,
        how: ConvImpl,
    ) -> Tensor<B, 5> {
        let [pt, ph, pw] = self.padding;
        let mut front = 2 * pt;
        let mut x = x;
        if let Some(c) = cache.filter(|_| front > 0) {
            front = front.saturating_sub(c.dims()[2]);
            x = Tensor::cat(vec![c, x], 2);
        }
        if front > 0 {
            x = x.pad([(front, 0), (0, 0), (0, 0)], PadMode::Constant(0.0));
        }
        let bias = Some(self.bias.val());
        conv3d_with(
            x,
            self.weight.val(),
            bias,
            self.stride,
            [(ph, ph), (pw, pw)],
            how,
        )
    }

    /// [`Self::forward`] on one chunk with this convolution's slot of `cache`: the cached
    /// frames go in front and the slot then keeps this chunk's tail (see
    /// [`cache_tail`]).
    pub fn forward_cached(&self, x: Tensor<B, 5>, cache: &mut FeatCache<B>) -> Tensor<B, 5> {
        let how = cache.conv();
        let slot = cache.next_slot();
        let prev = match slot {
            CacheEntry::Frames(f) => Some(f.clone()),
            _ => None,
        };
        *slot = CacheEntry::Frames(cache_tail(prev.as_ref(), &x));
        self.forward(x, prev, how)
    }
}

/// The `nn.Conv2d` applied to every frame inside a resampler: `weight [out, in, kh, kw]`,
/// `bias [out]`.
#[derive(Module, Debug)]
pub struct FrameConv2d<B: Backend> {
    /// Kernel `[out, in, kh, kw]`.
    pub weight: Param<Tensor<B, 4>>,
    /// Bias `[out]`.
    pub bias: Param<Tensor<B, 1>>,
}

impl<B: Backend> FrameConv2d<B> {
    /// A 3x3 convolution at `path`.
    pub fn init(init: &ParamInit<B>, path: &str, c_in: usize, c_out: usize) -> Self {
        Self {
            weight: init.weight(&join(path, "weight"), [c_out, c_in, 3, 3]),
            bias: init.zeros(&join(path, "bias"), [c_out]),
        }
    }

    /// Every frame of `x [B, C, T, H, W]` zero-padded by `pad` and convolved with spatial
    /// `stride` `-> [B, out, T, H', W']`, on `how`.
    pub fn forward(
        &self,
        x: Tensor<B, 5>,
        stride: usize,
        pad: FramePad,
        how: ConvImpl,
    ) -> Tensor<B, 5> {
        let w = self.weight.val().unsqueeze_dim::<5>(2);
        let bias = Some(self.bias.val());
        conv3d_with(x, w, bias, [1, stride, stride], pad, how)
    }
}

/// A 1x1 `nn.Conv2d` used as a linear map over channels: `weight [out, in, 1, 1]`,
/// `bias [out]`.
#[derive(Module, Debug)]
pub struct Conv1x1<B: Backend> {
    /// Kernel `[out, in, 1, 1]`.
    pub weight: Param<Tensor<B, 4>>,
    /// Bias `[out]`.
    pub bias: Param<Tensor<B, 1>>,
}

impl<B: Backend> Conv1x1<B> {
    /// A 1x1 convolution at `path`.
    pub fn init(init: &ParamInit<B>, path: &str, c_in: usize, c_out: usize) -> Self {
        Self {
            weight: init.weight(&join(path, "weight"), [c_out, c_in, 1, 1]),
            bias: init.zeros(&join(path, "bias"), [c_out]),
        }
    }

    /// Channels-last `x [N, L, in] -> [N, L, out]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [c_out, c_in, _, _] = self.weight.dims();
        let w = self.weight.val().reshape([c_out, c_in]).transpose();
        x.matmul(w.unsqueeze::<3>()) + self.bias.val().unsqueeze::<3>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reel_core::rng::StreamRng;

    type TestBackend = burn::backend::NdArray;

    fn max_abs(a: Tensor<TestBackend, 5>, b: Tensor<TestBackend, 5>) -> f32 {
        assert_eq!(a.dims(), b.dims());
        (a - b).abs().max().into_scalar()
    }

    /// Running a clip in chunks of 1, 4, 4, 1 and 2 frames through the cache equals one
    /// causal convolution over the whole clip.
    #[test]
    fn chunked_with_cache_equals_the_full_clip() {
        let dev = Default::default();
        let conv = CausalConv3d::<TestBackend>::cube(&ParamInit::new(3, &dev), "c", 3, 5);
        let x: Tensor<TestBackend, 5> =
            StreamRng::from_seed(5).normal_tensor([2, 3, 12, 6, 5], &dev);
        let full = conv.forward(x.clone(), None, ConvImpl::Burn);
        let mut cache = FeatCache::new();
        let mut outs = Vec::new();
        let mut start = 0;
        for (i, n) in [1, 4, 4, 1, 2].into_iter().enumerate() {
            cache.start_chunk(i);
            outs.push(conv.forward_cached(x.clone().narrow(2, start, n), &mut cache));
            start += n;
        }
        assert_eq!(cache.len(), 1);
        let err = max_abs(Tensor::cat(outs, 2), full);
        assert!(err < 1e-5, "chunked vs full: {err}");
    }

    /// The temporal padding is on the left only: output frame `t` ignores inputs after `t`.
    #[test]
    fn output_frames_do_not_see_the_future() {
        let dev = Default::default();
        let conv = CausalConv3d::<TestBackend>::cube(&ParamInit::new(4, &dev), "c", 2, 2);
        let x: Tensor<TestBackend, 5> =
            StreamRng::from_seed(6).normal_tensor([1, 2, 5, 4, 4], &dev);
        let changed = x.clone().slice_assign(
            [0..1, 0..2, 3..5, 0..4, 0..4],
            Tensor::ones([1, 2, 2, 4, 4], &dev),
        );
        let how = ConvImpl::Burn;
        let (a, b) = (conv.forward(x, None, how), conv.forward(changed, None, how));
        assert_eq!(a.dims(), [1, 2, 5, 4, 4]);
        let past = max_abs(a.clone().narrow(2, 0, 3), b.clone().narrow(2, 0, 3));
        assert_eq!(past, 0.0);
        assert!(max_abs(a.narrow(2, 3, 2), b.narrow(2, 3, 2)) > 0.0);
    }
}
