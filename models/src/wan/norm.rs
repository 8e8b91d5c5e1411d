//! Normalization layers: LayerNorm (optionally affine) and RMSNorm, both over the last
//! dimension and computed in the backend's float type (f32 on the reference backends).

use burn::module::{Module, Param};
use burn::tensor::{backend::Backend, Tensor};

use super::init::{join, ParamInit};

/// `(x - mean) / sqrt(var + eps)` over the last dimension (biased variance), without an
/// affine transform: diffusers' `FP32LayerNorm(dim, eps, elementwise_affine=False)`.
///
/// `x - mean` is computed once and serves both the variance and the output, so the backward
/// pass keeps one full-size tensor of this function (Burn's `var_mean_bias` followed by a
/// division would keep two).
pub fn layer_norm<B: Backend, const D: usize>(x: Tensor<B, D>, eps: f64) -> Tensor<B, D> {
    let centered = x.clone() - x.mean_dim(D - 1);
    let var = centered.clone().square().mean_dim(D - 1);
    centered * (var + eps).sqrt().recip()
}

/// Affine LayerNorm over the last dimension: `layer_norm(x) * weight + bias`.
#[derive(Module, Debug)]
pub struct LayerNorm<B: Backend> {
    /// Scale `[dim]`.
    pub weight: Param<Tensor<B, 1>>,
    /// Shift `[dim]`.
    pub bias: Param<Tensor<B, 1>>,
    /// Epsilon added to the variance.
    pub eps: f64,
}

impl<B: Backend> LayerNorm<B> {
    /// Ones / zeros initialized norm at `path`.
    pub fn init(init: &ParamInit<B>, path: &str, dim: usize, eps: f64) -> Self {
        Self {
            weight: init.ones(&join(path, "weight"), [dim]),
            bias: init.zeros(&join(path, "bias"), [dim]),
            eps,
        }
    }

    /// `[..., dim] -> [..., dim]`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let w = self.weight.val().unsqueeze::<D>();
        let b = self.bias.val().unsqueeze::<D>();
        layer_norm(x, self.eps) * w + b
    }
}

/// RMSNorm over the last dimension with a learned scale: `x / sqrt(mean(x^2) + eps) * weight`
/// (`torch.nn.RMSNorm(dim, eps, elementwise_affine=True)`).
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    /// Scale `[dim]`.
    pub weight: Param<Tensor<B, 1>>,
    /// Epsilon added to the mean square.
    pub eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    /// One-initialized norm at `path`.
    pub fn init(init: &ParamInit<B>, path: &str, dim: usize, eps: f64) -> Self {
        Self {
            weight: init.ones(&join(path, "weight"), [dim]),
            eps,
        }
    }

    /// `[..., dim] -> [..., dim]`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let ms = x.clone().square().mean_dim(D - 1);
        let w = self.weight.val().unsqueeze::<D>();
        x * (ms + self.eps).sqrt().recip() * w
    }
}
