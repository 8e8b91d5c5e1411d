//! Adversarial losses over discriminator logits `[B]` (one logit per sample and head), and
//! the R1 gradient penalty.
//!
//! ```text
//! hinge           generator      mean(relu(1 − D(fake)))
//!                 discriminator  mean(relu(1 + D(fake))) + mean(relu(1 − D(real)))
//! non_saturating  generator      mean(softplus(−D(fake)))
//!                 discriminator  mean(softplus(D(fake))) + mean(softplus(−D(real)))
//! ```
//!
//! With several heads each loss is computed per head and averaged over heads.
//!
//! R1 (`‖∇ₓ D(x_real)‖²`) needs a second-order gradient, which Burn 0.21's autodiff does not
//! provide. Reel uses the finite-difference estimator `(D(x + ε·n) − D(x))² / ε²` with
//! `n ~ N(0, I)`: since `E[n nᵀ] = I`, its expectation is `‖∇ₓ D(x)‖²` up to `O(ε)`, and its
//! gradient with respect to the discriminator's parameters needs only a first-order backward
//! through two forwards (the approach of approximated R1 in adversarial post-training).

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

/// Which adversarial objective (`gan_loss = "hinge" | "non_saturating"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GanLoss {
    /// Hinge loss (FastVideo's adversarial distillation).
    #[default]
    Hinge,
    /// Non-saturating logistic loss (the original GAN generator trick; StyleGAN).
    NonSaturating,
}

/// `log(1 + eˣ)`, stable for large `|x|`: `relu(x) + log1p(e^−|x|)`.
pub fn softplus<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    x.clone().clamp_min(0.0) + x.abs().neg().exp().log1p()
}

/// `max(x, 0)`.
fn relu<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    x.clamp_min(0.0)
}

/// Mean of per-head losses. Panics on an empty list (a discriminator always has a head).
fn mean_over_heads<B: Backend>(
    heads: Vec<Tensor<B, 1>>,
    per_head: impl Fn(Tensor<B, 1>) -> Tensor<B, 1>,
) -> Tensor<B, 1> {
    let n = heads.len();
    assert!(n > 0, "adversarial loss over 0 discriminator heads");
    let losses: Vec<Tensor<B, 1>> = heads.into_iter().map(per_head).collect();
    Tensor::cat(losses, 0).sum().div_scalar(n as f64)
}

impl GanLoss {
    /// Generator loss of one head's logits on fakes `[B]` -> `[1]`.
    pub fn generator<B: Backend>(self, fake: Tensor<B, 1>) -> Tensor<B, 1> {
        match self {
            GanLoss::Hinge => relu(fake.neg().add_scalar(1.0)).mean(),
            GanLoss::NonSaturating => softplus(fake.neg()).mean(),
        }
    }

    /// Discriminator loss of one head's logits on reals and fakes (`[B]` each) -> `[1]`.
    pub fn discriminator<B: Backend>(self, real: Tensor<B, 1>, fake: Tensor<B, 1>) -> Tensor<B, 1> {
        match self {
            GanLoss::Hinge => {
                relu(fake.add_scalar(1.0)).mean() + relu(real.neg().add_scalar(1.0)).mean()
            }
            GanLoss::NonSaturating => softplus(fake).mean() + softplus(real.neg()).mean(),
        }
    }

    /// [`Self::generator`] averaged over heads.
    pub fn generator_heads<B: Backend>(self, fake: Vec<Tensor<B, 1>>) -> Tensor<B, 1> {
        mean_over_heads(fake, |f| self.generator(f))
    }

    /// [`Self::discriminator`] averaged over heads (`real[i]` and `fake[i]` from head `i`).
    pub fn discriminator_heads<B: Backend>(
        self,
        real: Vec<Tensor<B, 1>>,
        fake: Vec<Tensor<B, 1>>,
    ) -> Tensor<B, 1> {
        assert_eq!(
            real.len(),
            fake.len(),
            "real and fake logits from different numbers of heads"
        );
        let pairs: Vec<Tensor<B, 1>> = real
            .into_iter()
            .zip(fake)
            .map(|(r, f)| self.discriminator(r, f))
            .collect();
        mean_over_heads(pairs, |l| l)
    }
}

/// Finite-difference R1 estimate from one head's logits on reals `d_real = D(x)` and on the
/// perturbed reals `d_perturbed = D(x + ε·n)` (`[B]` each, `n ~ N(0, I)`):
/// `mean((d_perturbed − d_real)²) / ε²` -> `[1]`, an estimate of `E‖∇ₓ D(x)‖²`.
pub fn approx_r1<B: Backend>(
    d_real: Tensor<B, 1>,
    d_perturbed: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, 1> {
    assert!(eps > 0.0, "R1 perturbation must be positive, got {eps}");
    d_perturbed
        .sub(d_real)
        .square()
        .mean()
        .div_scalar(eps * eps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reel_core::rng::StreamRng;

    type B = burn::backend::NdArray;
    type Ad = burn::backend::Autodiff<B>;

    fn t(v: &[f32]) -> Tensor<B, 1> {
        Tensor::from_floats(v, &Default::default())
    }

    fn val(x: Tensor<B, 1>) -> f32 {
        x.into_scalar()
    }

    #[test]
    fn hinge_matches_hand_computation() {
        let (real, fake) = (t(&[2.0, 0.5, -1.0]), t(&[-2.0, 0.25, 1.5]));
        // generator: relu(1 − f) = [3, 0.75, 0] -> 1.25
        assert!((val(GanLoss::Hinge.generator(fake.clone())) - 1.25).abs() < 1e-6);
        // relu(1 + f) = [0, 1.25, 2.5] -> 1.25; relu(1 − r) = [0, 0.5, 2] -> 0.8333
        let d = val(GanLoss::Hinge.discriminator(real, fake));
        assert!((d - (1.25 + 2.5 / 3.0)).abs() < 1e-6, "{d}");
    }

    #[test]
    fn non_saturating_matches_hand_computation() {
        let sp = |x: f64| (1.0 + x.exp()).ln();
        let (r, f) = ([1.0f64, -3.0], [0.5f64, 40.0]);
        let real = t(&r.map(|x| x as f32));
        let fake = t(&f.map(|x| x as f32));
        let g = val(GanLoss::NonSaturating.generator(fake.clone())) as f64;
        let want_g = (sp(-f[0]) + sp(-f[1])) / 2.0;
        assert!((g - want_g).abs() < 1e-5, "{g} vs {want_g}");
        let d = val(GanLoss::NonSaturating.discriminator(real, fake)) as f64;
        let want_d = (sp(f[0]) + sp(f[1])) / 2.0 + (sp(-r[0]) + sp(-r[1])) / 2.0;
        assert!((d - want_d).abs() < 1e-4, "{d} vs {want_d}");
    }

    #[test]
    fn softplus_is_stable_for_large_inputs() {
        let y = softplus(t(&[-100.0, 100.0, 0.0]))
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        assert!(y[0] >= 0.0 && y[0] < 1e-30);
        assert!((y[1] - 100.0).abs() < 1e-4);
        assert!((y[2] - 2f32.ln()).abs() < 1e-6);
    }

    #[test]
    fn heads_are_averaged_per_head() {
        // Two heads: hinge generator per head [1.25, 0.5] -> 0.875 (not the loss of the mean
        // logits, which would be relu(1 − mean)).
        let heads = vec![t(&[-2.0, 0.25, 1.5]), t(&[0.5, 0.5, 0.5])];
        assert!((val(GanLoss::Hinge.generator_heads(heads)) - 0.875).abs() < 1e-6);
        let d = GanLoss::Hinge
            .discriminator_heads(vec![t(&[2.0]), t(&[0.0])], vec![t(&[-2.0]), t(&[0.0])]);
        // head 0: 0 + 0; head 1: 1 + 1 -> mean 1
        assert!((val(d) - 1.0).abs() < 1e-6);
    }

    /// For `D(x) = Σ tanh(w ∘ x)` the estimator's mean over many perturbations approaches the
    /// exact `‖∇ₓ D‖²` (computed by autodiff) as ε shrinks.
    #[test]
    fn approx_r1_estimates_the_squared_input_gradient() {
        let _turn = reel_core::parallel::autodiff_turn();
        let dev = Default::default();
        let mut rng = StreamRng::from_seed(11);
        let dim = 6;
        let n = 4096;
        let w: Tensor<Ad, 2> = rng.normal_tensor([1, dim], &dev);
        let x0: Tensor<Ad, 2> = rng.normal_tensor([1, dim], &dev);
        let d =
            |x: Tensor<Ad, 2>| -> Tensor<Ad, 1> { (x * w.clone()).tanh().sum_dim(1).reshape([-1]) };
        // Exact ‖∇ₓ D(x0)‖² by a first-order backward.
        let x = x0.clone().require_grad();
        let grads = d(x.clone()).sum().backward();
        let g = x.grad(&grads).unwrap();
        let exact: f32 = g.square().sum().into_scalar();

        let x = x0.repeat_dim(0, n);
        let noise: Tensor<Ad, 2> = rng.normal_tensor([n, dim], &dev);
        let eps = 1e-2;
        let est: f32 = approx_r1(d(x.clone()), d(x + noise.mul_scalar(eps)), eps)
            .inner()
            .into_scalar();
        let rel = (est - exact).abs() / exact;
        assert!(
            rel < 0.1,
            "R1 estimate {est} vs exact {exact} (rel {rel:.3})"
        );
    }

    /// The estimator is differentiable in the discriminator's parameters with a first-order
    /// backward: for a linear `D(x) = w·x` it equals `mean((w·n)²)`, whose gradient in `w` is
    /// `2·mean((w·n) n)`.
    #[test]
    fn approx_r1_has_first_order_parameter_gradients() {
        let _turn = reel_core::parallel::autodiff_turn();
        let dev = Default::default();
        let mut rng = StreamRng::from_seed(12);
        let w: Tensor<Ad, 2> = rng.normal_tensor::<Ad, 2>([3, 1], &dev).require_grad();
        let x: Tensor<Ad, 2> = rng.normal_tensor([5, 3], &dev);
        let noise: Tensor<Ad, 2> = rng.normal_tensor([5, 3], &dev);
        let eps = 0.5;
        let d = |x: Tensor<Ad, 2>| x.matmul(w.clone()).reshape([-1]);
        let r1 = approx_r1(d(x.clone()), d(x + noise.clone().mul_scalar(eps)), eps);
        let grads = r1.backward();
        let got = w.grad(&grads).unwrap();
        let wn = noise.clone().inner().matmul(w.clone().inner()); // [5, 1]
        let want = noise.inner().transpose().matmul(wn).mul_scalar(2.0 / 5.0);
        let err: f32 = (got - want).abs().max().into_scalar();
        assert!(err < 1e-5, "{err}");
    }
}
