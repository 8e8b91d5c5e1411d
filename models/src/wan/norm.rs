//! Normalization layers: LayerNorm (optionally affine) and RMSNorm, both over the last
//! dimension. [`layer_norm_affine`], [`rms_norm`] and the modules compute in float32 whatever
//! the input's dtype (diffusers' `FP32LayerNorm`; PyTorch's `RMSNorm` on the float32 `q`/`k`
//! of Wan's attention); the bare [`layer_norm`] computes in the input's dtype.
//!
//! In training the affine LayerNorm and the RMSNorm run as single autodiff operations that
//! keep only their input for the backward pass ([`super::norm_ops`]).

use burn::module::{Module, Param};
use burn::tensor::{backend::Backend, Tensor};

use super::custom_op::{dispatch, first_input, next_input, output, CustomBackward};
use super::init::{join, ParamInit};
use super::mem_attention::{to_dtype, to_f32};
use super::norm_ops::{
    autodiff_layer_norm_affine, autodiff_rms_norm, layer_norm_affine_rows, rms_norm_rows,
};

/// `(x - mean) / sqrt(var + eps)` over the last dimension (biased variance), without an
/// affine transform: diffusers' `FP32LayerNorm(dim, eps, elementwise_affine=False)`.
///
/// `x - mean` is computed once and serves both the variance and the output, so the backward
/// pass keeps one full-size tensor of this function (Burn's `var_mean_bias` followed by a
/// division would keep two).
pub fn layer_norm<B: Backend, const D: usize>(x: Tensor<B, D>, eps: f64) -> Tensor<B, D> {
    normalized(x, eps).0
}

/// `(x - mean) / sqrt(var + eps)`, the row means `[.., 1]` and `1 / sqrt(var + eps)` `[.., 1]`.
pub(crate) fn normalized<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    eps: f64,
) -> (Tensor<B, D>, Tensor<B, D>, Tensor<B, D>) {
    let mean = x.clone().mean_dim(D - 1);
    let centered = x - mean.clone();
    let var = centered.clone().square().mean_dim(D - 1);
    let rstd = (var + eps).sqrt().recip();
    (centered * rstd.clone(), mean, rstd)
}

/// `x / sqrt(mean(x²) + eps)` and `1 / sqrt(mean(x²) + eps)` `[.., 1]`.
pub(crate) fn rms_normalized<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    eps: f64,
) -> (Tensor<B, D>, Tensor<B, D>) {
    let rstd = (x.clone().square().mean_dim(D - 1) + eps).sqrt().recip();
    (x * rstd.clone(), rstd)
}

/// `layer_norm(x) * scale + shift`, computed in float32 and rounded once to the dtype of `x`
/// (diffusers' `FP32LayerNorm` followed by Wan's modulation `* (1 + scale) + shift`, or an
/// affine LayerNorm's `* weight + bias`).
///
/// `x [.., dim]`; `scale`, `shift` of the same rank, each axis 1 (broadcast) or that of `x`,
/// the last `dim` (for example `[B, 1, dim]` against `x [B, N, dim]`) -> `[.., dim]`.
pub fn layer_norm_affine<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    scale: Tensor<B, D>,
    shift: Tensor<B, D>,
    eps: f64,
) -> Tensor<B, D> {
    dispatch(LayerNormAffine {
        x,
        scale,
        shift,
        eps,
    })
}

/// [`layer_norm_affine`] written with Burn tensor operations.
pub fn layer_norm_affine_plain<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    scale: Tensor<B, D>,
    shift: Tensor<B, D>,
    eps: f64,
) -> Tensor<B, D> {
    let dtype = x.dtype();
    to_dtype(
        layer_norm(to_f32(x), eps) * to_f32(scale) + to_f32(shift),
        dtype,
    )
}

/// [`layer_norm_affine`]'s inputs, for [`dispatch`].
struct LayerNormAffine<B: Backend, const D: usize> {
    x: Tensor<B, D>,
    scale: Tensor<B, D>,
    shift: Tensor<B, D>,
    eps: f64,
}

impl<B: Backend, const D: usize> CustomBackward<B> for LayerNormAffine<B, D> {
    type Output = Tensor<B, D>;

    fn on_autodiff<I: Backend>(self) -> Result<Tensor<B, D>, Self> {
        let Self {
            x,
            scale,
            shift,
            eps,
        } = self;
        let x = match first_input::<B, I, D>(x) {
            Ok(x) => x,
            Err(x) => {
                return Err(Self {
                    x,
                    scale,
                    shift,
                    eps,
                })
            }
        };
        let (scale, shift) = (next_input::<B, I, D>(scale), next_input::<B, I, D>(shift));
        Ok(output(autodiff_layer_norm_affine(x, scale, shift, eps)))
    }

    fn otherwise(self) -> Tensor<B, D> {
        layer_norm_affine_rows(self.x, self.scale, self.shift, self.eps)
    }
}

/// `x / sqrt(mean(x²) + eps) * weight` over the last dimension, computed in float32 from `x`
/// of any dtype; the result is float32. `x [.., dim]`, `weight [dim]` -> `[.., dim]`.
pub fn rms_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, D> {
    dispatch(Rms { x, weight, eps })
}

/// [`rms_norm`] written with Burn tensor operations.
pub fn rms_norm_plain<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, D> {
    rms_normalized(to_f32(x), eps).0 * to_f32(weight).unsqueeze::<D>()
}

/// [`rms_norm`]'s inputs, for [`dispatch`].
struct Rms<B: Backend, const D: usize> {
    x: Tensor<B, D>,
    weight: Tensor<B, 1>,
    eps: f64,
}

impl<B: Backend, const D: usize> CustomBackward<B> for Rms<B, D> {
    type Output = Tensor<B, D>;

    fn on_autodiff<I: Backend>(self) -> Result<Tensor<B, D>, Self> {
        let Self { x, weight, eps } = self;
        let x = match first_input::<B, I, D>(x) {
            Ok(x) => x,
            Err(x) => return Err(Self { x, weight, eps }),
        };
        let weight = next_input::<B, I, 1>(weight);
        Ok(output(autodiff_rms_norm(x, weight, eps)))
    }

    fn otherwise(self) -> Tensor<B, D> {
        rms_norm_rows(self.x, self.weight, self.eps)
    }
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

    /// `[..., dim] -> [..., dim]`, computed in float32, in the dtype of `x`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let w = self.weight.val().unsqueeze::<D>();
        let b = self.bias.val().unsqueeze::<D>();
        layer_norm_affine(x, w, b, self.eps)
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

    /// `[..., dim] -> [..., dim]` float32, from `x` of any dtype.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        rms_norm(x, self.weight.val(), self.eps)
    }
}
