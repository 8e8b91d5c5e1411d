//! Spatial and temporal resampling of the Wan VAE, with the resamplers' own cache rules.
//!
//! Upstream: diffusers `autoencoder_kl_wan.py`, `WanResample` (`upsample2d`, `upsample3d`,
//! `downsample2d`, `downsample3d`) and `WanUpsample` (`nearest-exact`, which for an exact
//! factor of 2 repeats every pixel twice along each axis).
//!
//! - `downsample3d`: on the first chunk the frames pass through untouched and are cached;
//!   afterwards the previous chunk's last frame is put in front and `time_conv` (kernel 3,
//!   stride 2, no padding) halves the frame count.
//! - `upsample3d`: on the first chunk nothing happens in time (the slot becomes `Rep`);
//!   afterwards `time_conv` (kernel 3, causal) doubles the channels, which are interleaved
//!   into twice the frames. After `Rep` the convolution sees zero padding; the cache then
//!   holds the last two input frames (zero-filled in front for a one-frame chunk).

use std::marker::PhantomData;

use burn::module::Module;
use burn::tensor::{backend::Backend, Tensor};

use super::cache::{last_frame, CacheEntry, FeatCache, CACHE_T};
use super::conv::{CausalConv3d, FrameConv2d};
use super::conv_gemm::even_pad;
use crate::wan::init::{join, ParamInit};

/// What a [`Resample`] does (diffusers' `mode` string).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResampleMode {
    /// Nearest x2 upsampling of every frame, then a 3x3 convolution to `dim / 2` channels.
    Upsample2d,
    /// [`ResampleMode::Upsample2d`] after doubling the frames with `time_conv`.
    Upsample3d,
    /// Zero padding right/bottom, then a 3x3 convolution with stride 2 on every frame.
    Downsample2d,
    /// [`ResampleMode::Downsample2d`], then halving the frames with `time_conv`.
    Downsample3d,
}

/// `WanResample`. `resample` mirrors diffusers' `nn.Sequential(ZeroPad2d | WanUpsample,
/// Conv2d)`: the first stage has no parameters, so the convolution's keys are
/// `resample.1.weight` / `resample.1.bias`.
#[derive(Module, Debug)]
pub struct Resample<B: Backend> {
    /// `(parameter-free stage, per-frame 3x3 convolution)`.
    pub resample: (PhantomData<B>, FrameConv2d<B>),
    /// Temporal convolution of the 3d modes: `dim -> 2 dim` (up, kernel 3, causal) or
    /// `dim -> dim` (down, kernel 3, stride 2).
    pub time_conv: Option<CausalConv3d<B>>,
    /// The mode.
    pub mode: ResampleMode,
}

impl<B: Backend> Resample<B> {
    /// A resampler at `path` over `dim` channels (upsamplers output `dim / 2`).
    pub fn init(init: &ParamInit<B>, path: &str, dim: usize, mode: ResampleMode) -> Self {
        let conv_out = match mode {
            ResampleMode::Upsample2d | ResampleMode::Upsample3d => dim / 2,
            _ => dim,
        };
        let tc = join(path, "time_conv");
        let time_conv = match mode {
            ResampleMode::Upsample3d => Some(CausalConv3d::init(
                init,
                &tc,
                [dim, 2 * dim],
                [3, 1, 1],
                [1; 3],
                [1, 0, 0],
            )),
            ResampleMode::Downsample3d => Some(CausalConv3d::init(
                init,
                &tc,
                [dim, dim],
                [3, 1, 1],
                [2, 1, 1],
                [0; 3],
            )),
            _ => None,
        };
        Self {
            resample: (
                PhantomData,
                FrameConv2d::init(init, &join(path, "resample.1"), dim, conv_out),
            ),
            time_conv,
            mode,
        }
    }

    /// One chunk `[B, C, t, H, W]` -> `[B, C / 2, t', 2H, 2W]` (up) or
    /// `[B, C, t', H / 2, W / 2]` (down); `t'` follows the cache rules in the module docs.
    pub fn forward(&self, x: Tensor<B, 5>, cache: &mut FeatCache<B>) -> Tensor<B, 5> {
        let parts = (&self.resample.1, self.time_conv.as_ref());
        Self::forward_parts(parts, self.mode, x, cache)
    }

    /// [`Self::forward`] on borrowed modules (`(resample.1, time_conv)`), for the encoder's
    /// flat entries (see [`ResidualBlock::forward_parts`](super::blocks::ResidualBlock::forward_parts)).
    pub fn forward_parts(
        (conv, time_conv): (&FrameConv2d<B>, Option<&CausalConv3d<B>>),
        mode: ResampleMode,
        x: Tensor<B, 5>,
        cache: &mut FeatCache<B>,
    ) -> Tensor<B, 5> {
        let how = cache.conv();
        match (mode, time_conv) {
            (ResampleMode::Upsample3d, Some(tc)) => conv.forward(
                upsample_nearest2(time_upsample(tc, x, cache)),
                1,
                even_pad(1),
                how,
            ),
            (ResampleMode::Upsample2d | ResampleMode::Upsample3d, _) => {
                conv.forward(upsample_nearest2(x), 1, even_pad(1), how)
            }
            (mode, time_conv) => {
                // One zero row at the bottom and column at the right, as diffusers' `ZeroPad2d`.
                let y = conv.forward(x, 2, [(0, 1), (0, 1)], how);
                match (mode, time_conv) {
                    (ResampleMode::Downsample3d, Some(tc)) => time_downsample(tc, y, cache),
                    _ => y,
                }
            }
        }
    }
}

/// Nearest-neighbour x2 upsampling of every frame: `[B, C, T, H, W] -> [B, C, T, 2H, 2W]`.
pub fn upsample_nearest2<B: Backend>(x: Tensor<B, 5>) -> Tensor<B, 5> {
    let [b, c, t, h, w] = x.dims();
    x.reshape([b * c * t, h, 1, w, 1])
        .expand([b * c * t, h, 2, w, 2])
        .reshape([b, c, t, 2 * h, 2 * w])
}

/// The temporal half of `upsample3d` on one chunk `[B, C, t, H, W] -> [B, C, t or 2t, H, W]`.
fn time_upsample<B: Backend>(
    tc: &CausalConv3d<B>,
    x: Tensor<B, 5>,
    cache: &mut FeatCache<B>,
) -> Tensor<B, 5> {
    let how = cache.conv();
    let slot = cache.next_slot();
    let prev = match slot {
        CacheEntry::Empty => {
            *slot = CacheEntry::Rep;
            return x;
        }
        CacheEntry::Rep => None,
        CacheEntry::Frames(f) => Some(f.clone()),
    };
    let [b, c, t, h, w] = x.dims();
    let keep = t.min(CACHE_T);
    let mut tail = x.clone().narrow(2, t - keep, keep);
    if keep < CACHE_T {
        let front = match &prev {
            Some(p) => last_frame(p),
            None => tail.zeros_like(),
        };
        tail = Tensor::cat(vec![front, tail], 2);
    }
    *slot = CacheEntry::Frames(tail);
    // [B, 2C, t, H, W] -> [B, 2, C, t, H, W] -> [B, C, t, 2, H, W] -> [B, C, 2t, H, W].
    tc.forward(x, prev, how)
        .reshape([b, 2, c, t, h, w])
        .permute([0, 2, 3, 1, 4, 5])
        .reshape([b, c, 2 * t, h, w])
}

/// The temporal half of `downsample3d` on one chunk `[B, C, t, H, W]`.
fn time_downsample<B: Backend>(
    tc: &CausalConv3d<B>,
    x: Tensor<B, 5>,
    cache: &mut FeatCache<B>,
) -> Tensor<B, 5> {
    let how = cache.conv();
    let slot = cache.next_slot();
    match slot {
        CacheEntry::Frames(prev) => {
            let input = Tensor::cat(vec![last_frame(prev), x.clone()], 2);
            *slot = CacheEntry::Frames(last_frame(&x));
            tc.forward(input, None, how)
        }
        _ => {
            *slot = CacheEntry::Frames(x.clone());
            x
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestBackend = burn::backend::NdArray;

    #[test]
    fn nearest_upsampling_repeats_each_pixel() {
        let dev = Default::default();
        let x = Tensor::<TestBackend, 1>::from_floats([1.0, 2.0, 3.0, 4.0], &dev)
            .reshape([1, 1, 1, 2, 2]);
        let y = upsample_nearest2(x).into_data().to_vec::<f32>().unwrap();
        let want = [
            1., 1., 2., 2., 1., 1., 2., 2., 3., 3., 4., 4., 3., 3., 4., 4.,
        ];
        assert_eq!(y, want);
    }

    /// Frame counts through the cache rules: down 1, 4, 4 -> 1, 2, 2; up 1, 1, 1 -> 1, 2, 2.
    #[test]
    fn temporal_resamplers_follow_the_chunk_schedule() {
        let dev = Default::default();
        let init = ParamInit::new(1, &dev);
        let down = Resample::<TestBackend>::init(&init, "d", 4, ResampleMode::Downsample3d);
        let up = Resample::<TestBackend>::init(&init, "u", 4, ResampleMode::Upsample3d);
        let (mut cd, mut cu) = (FeatCache::new(), FeatCache::new());
        let mut frames = Vec::new();
        for (i, n) in [1, 4, 4].into_iter().enumerate() {
            cd.start_chunk(i);
            cu.start_chunk(i);
            let d = down.forward(Tensor::zeros([1, 4, n, 4, 4], &dev), &mut cd);
            let u = up.forward(Tensor::zeros([1, 4, 1, 2, 2], &dev), &mut cu);
            assert_eq!(d.dims()[3..], [2, 2]);
            assert_eq!(u.dims()[1..], [2, u.dims()[2], 4, 4]);
            frames.push((d.dims()[2], u.dims()[2]));
        }
        assert_eq!(frames, vec![(1, 1), (2, 2), (2, 2)]);
    }
}
