//! AdamW over parameters addressed by dotted path, with the exact update order of
//! `torch.optim.AdamW` (decoupled decay first, then bias-corrected Adam).
//!
//! State is kept per parameter path, flattened to one dimension, so it saves to safetensors as
//! `exp_avg.<path>` / `exp_avg_sq.<path>` and reloads into a freshly built model regardless of
//! Burn's parameter ids.

use std::collections::BTreeMap;

use burn::tensor::{backend::Backend, Tensor};

use super::OptimizerConfig;

/// Moment estimates of one parameter.
#[derive(Debug, Clone)]
pub struct Moments<B: Backend> {
    /// First moment `m`.
    pub exp_avg: Tensor<B, 1>,
    /// Second moment `v`.
    pub exp_avg_sq: Tensor<B, 1>,
}

/// AdamW state of one role.
#[derive(Debug, Clone)]
pub struct AdamWState<B: Backend> {
    /// Number of optimizer steps taken (the `k` of the bias correction).
    pub step: u64,
    /// Moments by parameter path.
    pub moments: BTreeMap<String, Moments<B>>,
}

impl<B: Backend> Default for AdamWState<B> {
    fn default() -> Self {
        Self {
            step: 0,
            moments: BTreeMap::new(),
        }
    }
}

/// The host-side scalars of one AdamW step of a role, computed in float64 once for all of
/// its parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWScalars {
    /// Factor on the gradient (gradient clipping), applied first.
    pub grad_scale: f64,
    /// Adam `β1`.
    pub beta1: f64,
    /// Adam `β2`.
    pub beta2: f64,
    /// Decoupled decay factor `1 − lr·wd`.
    pub decay: f64,
    /// `sqrt(1 − β2^k)`.
    pub bc2_sqrt: f64,
    /// Adam `ε`.
    pub eps: f64,
    /// `lr / (1 − β1^k)`.
    pub step_size: f64,
}

impl AdamWScalars {
    /// The scalars of step `k` (1-based) at learning rate `lr`, gradients scaled by
    /// `grad_scale`.
    pub fn new(cfg: &OptimizerConfig, lr: f64, k: u64, grad_scale: f64) -> Self {
        let [beta1, beta2] = cfg.betas;
        Self {
            grad_scale,
            beta1,
            beta2,
            decay: 1.0 - lr * cfg.weight_decay,
            bc2_sqrt: (1.0 - beta2.powi(k as i32)).sqrt(),
            eps: cfg.eps,
            step_size: lr / (1.0 - beta1.powi(k as i32)),
        }
    }
}

/// One parameter's AdamW inputs: the flattened parameter, its gradient and its moments
/// (`None` before its first step).
pub type AdamWInputs<B> = (Tensor<B, 1>, Tensor<B, 1>, Option<Moments<B>>);

/// One parameter's AdamW result: the updated parameter and its moments.
pub type AdamWOutput<B> = (Tensor<B, 1>, Moments<B>);

/// One parameter's EMA inputs: its shadow and its current value, both flattened.
pub type EmaPair<B> = (Tensor<B, 1>, Tensor<B, 1>);

/// One AdamW update of each flattened parameter of `items` (see [`AdamWScalars`]), in order:
///
/// `g ← g·grad_scale; p ← p·(1 − lr·wd); m ← β1·m + (1−β1)·g; v ← β2·v + (1−β2)·g²;
///  p ← p − (lr / (1−β1^k)) · m / (sqrt(v) / sqrt(1−β2^k) + ε)`
///
/// With `fused` and float32 parameters on a CubeCL backend (`cuda`, `wgpu`) the step is one
/// kernel launch per group of parameters (`optim::fused`, same operation order); on a CPU
/// backend (ndarray, Flex) one loop over each parameter's host memory, bit-identical to the
/// tensor operations (`optim::host`); otherwise Burn tensor operations, parameter by
/// parameter.
pub fn adamw_updates<B: Backend>(
    s: &AdamWScalars,
    fused: bool,
    mut items: Vec<AdamWInputs<B>>,
) -> Vec<AdamWOutput<B>> {
    if fused {
        #[cfg(any(feature = "cuda", feature = "wgpu"))]
        match super::fused::try_adamw(items, s) {
            Ok(out) => return out,
            Err(back) => items = back,
        }
        match super::host::try_adamw(items, s) {
            Ok(out) => return out,
            Err(back) => items = back,
        }
    }
    items
        .into_iter()
        .map(|(param, grad, moments)| reference_update(s, param, grad, moments))
        .collect()
}

/// One parameter's [`adamw_updates`] in Burn tensor operations.
fn reference_update<B: Backend>(
    s: &AdamWScalars,
    param: Tensor<B, 1>,
    grad: Tensor<B, 1>,
    moments: Option<Moments<B>>,
) -> (Tensor<B, 1>, Moments<B>) {
    let (b1, b2) = (s.beta1, s.beta2);
    let grad = if s.grad_scale == 1.0 {
        grad
    } else {
        grad.mul_scalar(s.grad_scale)
    };
    let (m, v) = match moments {
        Some(Moments {
            exp_avg,
            exp_avg_sq,
        }) => (
            exp_avg
                .mul_scalar(b1)
                .add(grad.clone().mul_scalar(1.0 - b1)),
            exp_avg_sq
                .mul_scalar(b2)
                .add(grad.square().mul_scalar(1.0 - b2)),
        ),
        None => (
            grad.clone().mul_scalar(1.0 - b1),
            grad.square().mul_scalar(1.0 - b2),
        ),
    };
    let decayed = if s.decay == 1.0 {
        param
    } else {
        param.mul_scalar(s.decay)
    };
    let denom = v.clone().sqrt().div_scalar(s.bc2_sqrt).add_scalar(s.eps);
    let updated = decayed.sub(m.clone().div(denom).mul_scalar(s.step_size));
    (
        updated,
        Moments {
            exp_avg: m,
            exp_avg_sq: v,
        },
    )
}

/// The sum of the squares of every value of `tensors` (a role's gradients, for its global
/// norm), `[1]` float32; `None` for no tensors. With `fused` and float32 tensors on a
/// CubeCL backend, one kernel launch per group of tensors and one sum (`optim::fused`);
/// otherwise a square and a sum per tensor and a sum of those.
pub fn squared_norm<B: Backend>(fused: bool, tensors: Vec<Tensor<B, 1>>) -> Option<Tensor<B, 1>> {
    if tensors.is_empty() {
        return None;
    }
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    let tensors = if fused {
        match super::fused::try_sum_squares(tensors) {
            Ok(out) => return Some(out),
            Err(tensors) => tensors,
        }
    } else {
        tensors
    };
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    let _ = fused;
    let parts = tensors.into_iter().map(|t| t.square().sum()).collect();
    Some(Tensor::cat(parts, 0).sum())
}

/// One EMA step of each flattened parameter's shadow of `pairs` (`(shadow, param)`), in
/// order: `shadow·decay + param·(1 − decay)`; with `fused`, one kernel launch per group of
/// parameters on a CubeCL backend, or one loop per shadow on a CPU backend (see
/// [`adamw_updates`]).
pub fn ema_updates<B: Backend>(
    fused: bool,
    mut pairs: Vec<EmaPair<B>>,
    decay: f64,
) -> Vec<Tensor<B, 1>> {
    if fused {
        #[cfg(any(feature = "cuda", feature = "wgpu"))]
        match super::fused::try_ema(pairs, decay) {
            Ok(out) => return out,
            Err(back) => pairs = back,
        }
        match super::host::try_ema(pairs, decay) {
            Ok(out) => return out,
            Err(back) => pairs = back,
        }
    }
    pairs
        .into_iter()
        .map(|(shadow, param)| shadow.mul_scalar(decay).add(param.mul_scalar(1.0 - decay)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;
    type B = burn::backend::Flex;

    #[test]
    fn matches_hand_computation_two_steps() {
        let dev = Default::default();
        let cfg = OptimizerConfig {
            lr: 0.1,
            betas: [0.9, 0.999],
            eps: 1e-8,
            weight_decay: 0.01,
            ..Default::default()
        };
        let p = Tensor::<B, 1>::from_data(TensorData::new(vec![1.0f32, -2.0], [2]), &dev);
        let g = Tensor::<B, 1>::from_data(TensorData::new(vec![0.5f32, 0.25], [2]), &dev);
        let s = |k| AdamWScalars::new(&cfg, 0.1, k, 1.0);
        let step = |s, p, m| {
            let mut out = adamw_updates(&s, true, vec![(p, g.clone(), m)]);
            out.pop().expect("one parameter in, one out")
        };
        let (p1, m1) = step(s(1), p, None);
        let (p2, _) = step(s(2), p1.clone(), Some(m1));
        // Hand computation in f64.
        let hand = |p0: f64, g: f64| {
            let (lr, wd, b1, b2, eps) = (0.1, 0.01, 0.9f64, 0.999f64, 1e-8);
            let mut p = p0;
            let (mut m, mut v) = (0.0, 0.0);
            let mut out = vec![];
            for k in 1..=2 {
                p *= 1.0 - lr * wd;
                m = b1 * m + (1.0 - b1) * g;
                v = b2 * v + (1.0 - b2) * g * g;
                let denom = v.sqrt() / (1.0 - b2.powi(k)).sqrt() + eps;
                p -= lr / (1.0 - b1.powi(k)) * m / denom;
                out.push(p);
            }
            out
        };
        let a = p1.into_data().to_vec::<f32>().unwrap();
        let b = p2.into_data().to_vec::<f32>().unwrap();
        for (i, (p0, g)) in [(1.0, 0.5), (-2.0, 0.25)].into_iter().enumerate() {
            let h = hand(p0, g);
            assert!((a[i] as f64 - h[0]).abs() < 1e-6, "{} vs {}", a[i], h[0]);
            assert!((b[i] as f64 - h[1]).abs() < 1e-6, "{} vs {}", b[i], h[1]);
        }
    }
}
