//! The channel-first RMS norm of the Wan VAE.
//!
//! Upstream: diffusers `autoencoder_kl_wan.py`, `WanRMS_norm`:
//! `F.normalize(x, dim=1) * dim**0.5 * gamma + bias`, i.e. every voxel's channel vector is
//! divided by its L2 norm (at least `1e-12`), scaled by `sqrt(C)` and by a learned
//! per-channel `gamma`. `gamma` is stored `[C, 1, 1, 1]` for video features
//! (`images=False`) and `[C, 1, 1]` for the per-frame attention block (`images=True`); the
//! optional bias (`bias=True`) has the same shape and is absent in the Wan2.1 VAE.

use burn::module::{Module, Param};
use burn::tensor::{backend::Backend, Tensor};

use crate::wan::init::{join, ParamInit};

/// `F.normalize`'s lower bound on the norm.
const NORM_EPS: f64 = 1e-12;

/// `x [B, C, T, H, W]` divided by the L2 norm over channels and scaled by `sqrt(C)`.
pub fn rms_normalize<B: Backend>(x: Tensor<B, 5>) -> Tensor<B, 5> {
    let c = x.dims()[1];
    let norm = x.clone().square().sum_dim(1).sqrt().clamp_min(NORM_EPS);
    x.div(norm).mul_scalar((c as f64).sqrt())
}

fn per_channel<B: Backend, const D: usize>(p: &Param<Tensor<B, D>>) -> Tensor<B, 5> {
    let c = p.dims()[0];
    p.val().reshape([1, c, 1, 1, 1])
}

/// `WanRMS_norm(dim, images=False)`: `gamma [C, 1, 1, 1]`, optional `bias [C, 1, 1, 1]`.
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    /// Scale `[C, 1, 1, 1]`.
    pub gamma: Param<Tensor<B, 4>>,
    /// Shift `[C, 1, 1, 1]` (`bias=True` only).
    pub bias: Option<Param<Tensor<B, 4>>>,
}

impl<B: Backend> RmsNorm<B> {
    /// A norm at `path` over `dim` channels, without bias (as in the Wan2.1 VAE).
    pub fn init(init: &ParamInit<B>, path: &str, dim: usize) -> Self {
        Self {
            gamma: init.ones(&join(path, "gamma"), [dim, 1, 1, 1]),
            bias: None,
        }
    }

    /// `[B, C, T, H, W] -> [B, C, T, H, W]`.
    pub fn forward(&self, x: Tensor<B, 5>) -> Tensor<B, 5> {
        let y = rms_normalize(x) * per_channel(&self.gamma);
        match &self.bias {
            Some(b) => y + per_channel(b),
            None => y,
        }
    }
}

/// `WanRMS_norm(dim, images=True)` of the attention block: `gamma [C, 1, 1]`, optional
/// `bias [C, 1, 1]`. Applied to every frame, which is the same as applying it to the video.
#[derive(Module, Debug)]
pub struct ImageRmsNorm<B: Backend> {
    /// Scale `[C, 1, 1]`.
    pub gamma: Param<Tensor<B, 3>>,
    /// Shift `[C, 1, 1]` (`bias=True` only).
    pub bias: Option<Param<Tensor<B, 3>>>,
}

impl<B: Backend> ImageRmsNorm<B> {
    /// A norm at `path` over `dim` channels, without bias.
    pub fn init(init: &ParamInit<B>, path: &str, dim: usize) -> Self {
        Self {
            gamma: init.ones(&join(path, "gamma"), [dim, 1, 1]),
            bias: None,
        }
    }

    /// `[B, C, T, H, W] -> [B, C, T, H, W]`.
    pub fn forward(&self, x: Tensor<B, 5>) -> Tensor<B, 5> {
        let y = rms_normalize(x) * per_channel(&self.gamma);
        match &self.bias {
            Some(b) => y + per_channel(b),
            None => y,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestBackend = burn::backend::NdArray;

    #[test]
    fn normalizes_each_voxel_over_channels_and_scales_by_sqrt_c() {
        let dev = Default::default();
        // Two channels, one voxel each: (3, 4) has norm 5, (0, 0) stays 0 (norm floored).
        let x = Tensor::<TestBackend, 1>::from_floats([3.0, 0.0, 4.0, 0.0], &dev)
            .reshape([1, 2, 1, 1, 2]);
        let mut norm = RmsNorm::init(&ParamInit::new(0, &dev), "n", 2);
        norm.gamma = Param::from_tensor(
            Tensor::<TestBackend, 1>::from_floats([1.0, 2.0], &dev).reshape([2, 1, 1, 1]),
        );
        let y = norm.forward(x).into_data().to_vec::<f32>().unwrap();
        let s = 2f32.sqrt();
        let want = [0.6 * s, 0.0, 0.8 * s * 2.0, 0.0];
        for (a, b) in y.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{y:?} vs {want:?}");
        }
    }
}
