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

/// One AdamW update of a flattened parameter. `k` is the 1-based step number.
///
/// `p ← p·(1 − lr·wd); m ← β1·m + (1−β1)·g; v ← β2·v + (1−β2)·g²;
///  p ← p − (lr / (1−β1^k)) · m / (sqrt(v) / sqrt(1−β2^k) + ε)`
pub fn adamw_update<B: Backend>(
    cfg: &OptimizerConfig,
    lr: f64,
    k: u64,
    param: Tensor<B, 1>,
    grad: Tensor<B, 1>,
    moments: Option<Moments<B>>,
) -> (Tensor<B, 1>, Moments<B>) {
    let [b1, b2] = cfg.betas;
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
    let bc1 = 1.0 - b1.powi(k as i32);
    let bc2_sqrt = (1.0 - b2.powi(k as i32)).sqrt();
    let decayed = if cfg.weight_decay == 0.0 {
        param
    } else {
        param.mul_scalar(1.0 - lr * cfg.weight_decay)
    };
    let denom = v.clone().sqrt().div_scalar(bc2_sqrt).add_scalar(cfg.eps);
    let updated = decayed.sub(m.clone().div(denom).mul_scalar(lr / bc1));
    (
        updated,
        Moments {
            exp_avg: m,
            exp_avg_sq: v,
        },
    )
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
        let (p1, m1) = adamw_update(&cfg, 0.1, 1, p, g.clone(), None);
        let (p2, _) = adamw_update(&cfg, 0.1, 2, p1.clone(), g, Some(m1));
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
