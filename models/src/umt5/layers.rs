//! The token embedding, the T5 layer norm and the feed-forward layer of UMT5.
//!
//! Upstream: transformers `modeling_umt5.py` — `UMT5LayerNorm` (RMS norm without mean
//! subtraction or bias), `UMT5DenseGatedActDense` / `UMT5DenseActDense` and `UMT5LayerFF`
//! (pre-norm residual FFN); `shared` is the `nn.Embedding` of `UMT5EncoderModel`.
// `DenseReluDense` is a field name because Burn names parameters after fields, and it is
// transformers' key name.
#![allow(non_snake_case)]

use burn::module::{Module, Param};
use burn::tensor::activation::{gelu, relu, silu};
use burn::tensor::{backend::Backend, Int, Tensor};

use super::config::Activation;
use crate::wan::gelu::gelu_tanh;
use crate::wan::init::{join, InitKind, ParamInit};
use crate::wan::Linear;

/// `nn.Embedding(vocab_size, d_model)`: `weight [vocab, d_model]`.
#[derive(Module, Debug)]
pub struct Embedding<B: Backend> {
    /// Table `[vocab, d_model]`.
    pub weight: Param<Tensor<B, 2>>,
}

impl<B: Backend> Embedding<B> {
    /// A `N(0, 1)` table at `path`.
    pub fn init(init: &ParamInit<B>, path: &str, vocab: usize, dim: usize) -> Self {
        Self {
            weight: init.param(
                &join(path, "weight"),
                [vocab, dim],
                InitKind::Normal { std: 1.0 },
            ),
        }
    }

    /// Rows of the table for `ids [B, L]` (each below `vocab`) `-> [B, L, d_model]`.
    pub fn forward(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [b, l] = ids.dims();
        let dim = self.weight.dims()[1];
        self.weight
            .val()
            .select(0, ids.reshape([b * l]))
            .reshape([b, l, dim])
    }
}

/// `UMT5LayerNorm`: `x / sqrt(mean(x²) + eps) * weight` over the last axis (no mean
/// subtraction, no bias).
#[derive(Module, Debug)]
pub struct T5LayerNorm<B: Backend> {
    /// Scale `[d_model]`.
    pub weight: Param<Tensor<B, 1>>,
    /// Epsilon added to the mean square.
    pub eps: f64,
}

impl<B: Backend> T5LayerNorm<B> {
    /// A one-initialised norm at `path`.
    pub fn init(init: &ParamInit<B>, path: &str, dim: usize, eps: f64) -> Self {
        Self {
            weight: init.ones(&join(path, "weight"), [dim]),
            eps,
        }
    }

    /// `[B, L, d] -> [B, L, d]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let ms = x.clone().square().mean_dim(2);
        x * (ms + self.eps).sqrt().recip() * self.weight.val().unsqueeze::<3>()
    }
}

/// Apply `act` element-wise. `gelu_new` is Wan's [`gelu_tanh`]: one kernel on the CubeCL
/// backends, and on the CPU backends a form without a tanh (ndarray's tanh runs in float64).
pub fn activate<B: Backend, const D: usize>(x: Tensor<B, D>, act: Activation) -> Tensor<B, D> {
    match act {
        Activation::Relu => relu(x),
        Activation::Gelu => gelu(x),
        Activation::GeluNew => gelu_tanh(x),
        Activation::Silu => silu(x),
    }
}

/// `DenseReluDense`: gated `wo(act(wi_0 x) * wi_1 x)` or plain `wo(act(wi x))`, all
/// bias-free.
#[derive(Module, Debug)]
pub struct DenseReluDense<B: Backend> {
    /// Plain FFN input projection `d_model -> d_ff`.
    pub wi: Option<Linear<B>>,
    /// Gated FFN: activated projection `d_model -> d_ff`.
    pub wi_0: Option<Linear<B>>,
    /// Gated FFN: linear projection `d_model -> d_ff`.
    pub wi_1: Option<Linear<B>>,
    /// Output projection `d_ff -> d_model`.
    pub wo: Linear<B>,
    /// The activation.
    pub act: Activation,
}

impl<B: Backend> DenseReluDense<B> {
    /// An FFN at `path`.
    pub fn init(
        init: &ParamInit<B>,
        path: &str,
        [d_model, d_ff]: [usize; 2],
        gated: bool,
        act: Activation,
    ) -> Self {
        let lin =
            |name: &str, i: usize, o: usize| Linear::init(init, &join(path, name), i, o, false);
        Self {
            wi: (!gated).then(|| lin("wi", d_model, d_ff)),
            wi_0: gated.then(|| lin("wi_0", d_model, d_ff)),
            wi_1: gated.then(|| lin("wi_1", d_model, d_ff)),
            wo: lin("wo", d_ff, d_model),
            act,
        }
    }

    /// `[B, L, d_model] -> [B, L, d_model]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let h = match (&self.wi, &self.wi_0, &self.wi_1) {
            (_, Some(w0), Some(w1)) => activate(w0.forward(x.clone()), self.act) * w1.forward(x),
            (Some(wi), _, _) => activate(wi.forward(x), self.act),
            _ => x,
        };
        self.wo.forward(h)
    }
}

/// `UMT5LayerFF`: `x + DenseReluDense(layer_norm(x))`.
#[derive(Module, Debug)]
pub struct LayerFF<B: Backend> {
    /// The feed-forward network.
    pub DenseReluDense: DenseReluDense<B>,
    /// Pre-norm.
    pub layer_norm: T5LayerNorm<B>,
}

impl<B: Backend> LayerFF<B> {
    /// `[B, L, d_model] -> [B, L, d_model]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        x.clone() + self.DenseReluDense.forward(self.layer_norm.forward(x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type TestBackend = burn::backend::NdArray;

    #[test]
    fn t5_layer_norm_divides_by_the_root_mean_square_only() {
        let dev = Default::default();
        let norm = T5LayerNorm::<TestBackend>::init(&ParamInit::new(0, &dev), "n", 2, 0.0);
        // (3, 5): mean square 17, no mean subtraction.
        let x = Tensor::<TestBackend, 1>::from_floats([3.0, 5.0], &dev).reshape([1, 1, 2]);
        let y = norm.forward(x).into_data().to_vec::<f32>().unwrap();
        let r = 17f32.sqrt();
        assert!(
            (y[0] - 3.0 / r).abs() < 1e-6 && (y[1] - 5.0 / r).abs() < 1e-6,
            "{y:?}"
        );
    }

    #[test]
    fn gelu_new_is_the_tanh_approximation() {
        let dev = Default::default();
        let x = Tensor::<TestBackend, 1>::from_floats([1.0, -2.0], &dev);
        let y = activate(x, Activation::GeluNew)
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        let f = |x: f64| {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
        };
        assert!((y[0] as f64 - f(1.0)).abs() < 1e-6 && (y[1] as f64 - f(-2.0)).abs() < 1e-6);
    }
}
