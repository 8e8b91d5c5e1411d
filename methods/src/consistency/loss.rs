//! Losses of consistency distillation: the distance between the student's phase-end
//! prediction and the target's (pseudo-Huber or L2), and the prediction-decay regulariser.
//!
//! All are means over every element of the batch, so gradient accumulation over equal
//! micro-batches equals one larger batch.

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

/// The distance between the student's prediction and the target (FastVideo's distillation
/// used the pseudo-Huber form with `c = 0.001`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum DistanceLoss {
    /// `mean(√((p − q)² + c²) − c)` (pseudo-Huber with constant `c = huber_c`).
    #[default]
    Huber,
    /// `mean((p − q)²)`.
    L2,
}

impl DistanceLoss {
    /// The loss between `pred` and `target` (same shape), a 1-element tensor; `huber_c` is
    /// used by [`DistanceLoss::Huber`] only.
    pub fn loss<B: Backend, const D: usize>(
        self,
        pred: Tensor<B, D>,
        target: Tensor<B, D>,
        huber_c: f64,
    ) -> Tensor<B, 1> {
        let d2 = pred.sub(target).powi_scalar(2);
        match self {
            DistanceLoss::Huber => d2
                .add_scalar(huber_c * huber_c)
                .sqrt()
                .sub_scalar(huber_c)
                .mean(),
            DistanceLoss::L2 => d2.mean(),
        }
    }
}

/// The prediction-decay regulariser on the student's phase-end prediction (FastVideo
/// `pred_decay_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PredDecay {
    /// `mean(|p|)`.
    #[default]
    L1,
    /// `mean(p²)`.
    L2,
}

impl PredDecay {
    /// The (unweighted) regulariser of `pred`, a 1-element tensor.
    pub fn loss<B: Backend, const D: usize>(self, pred: Tensor<B, D>) -> Tensor<B, 1> {
        match self {
            PredDecay::L1 => pred.abs().mean(),
            PredDecay::L2 => pred.powi_scalar(2).mean(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    type B = burn::backend::NdArray;

    fn t(v: &[f32]) -> Tensor<B, 1> {
        Tensor::from_floats(v, &Default::default())
    }

    fn val(x: Tensor<B, 1>) -> f64 {
        x.into_scalar() as f64
    }

    #[test]
    fn pseudo_huber_by_hand() {
        let (p, q) = (t(&[1.0, -2.0, 0.5]), t(&[0.0, 1.0, 0.5]));
        // d = 1, -3, 0: (√(1 + c²) − c + √(9 + c²) − c + 0) / 3.
        for c in [0.001, 0.5] {
            let want = ((1.0f64 + c * c).sqrt() - c + (9.0 + c * c).sqrt() - c) / 3.0;
            let got = val(DistanceLoss::Huber.loss(p.clone(), q.clone(), c));
            assert!((got - want).abs() < 1e-6, "c = {c}: {got} vs {want}");
        }
        // Small c: close to the mean absolute error; large c: close to MSE / (2c).
        let mae = val(DistanceLoss::Huber.loss(p.clone(), q.clone(), 1e-6));
        assert!((mae - 4.0 / 3.0).abs() < 1e-5, "{mae}");
        let big = val(DistanceLoss::Huber.loss(t(&[0.01]), t(&[0.0]), 1.0));
        assert!((big - 1e-4 / 2.0).abs() < 1e-6, "{big}");
    }

    #[test]
    fn l2_and_pred_decay_by_hand() {
        let (p, q) = (t(&[1.0, -2.0, 0.5]), t(&[0.0, 1.0, 0.5]));
        assert!((val(DistanceLoss::L2.loss(p.clone(), q, 0.001)) - 10.0 / 3.0).abs() < 1e-6);
        assert!((val(PredDecay::L1.loss(p.clone())) - 3.5 / 3.0).abs() < 1e-6);
        assert!((val(PredDecay::L2.loss(p)) - 5.25 / 3.0).abs() < 1e-6);
    }
}
