//! Flow-matching math shared by every method.
//!
//! Convention (rectified flow, as in Wan / FastVideo): `x_t = (1−σ)·x0 + σ·ε`, the model
//! predicts the velocity `v = ε − x0`, the model's timestep is `t = 1000·σ`, and
//! `x0 = x_t − σ·v`. Shift: `σ' = s·σ / (1 + (s−1)·σ)`.

use burn::tensor::{backend::Backend, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use crate::config::{check, ConfigError};
use crate::rng::StreamRng;

/// Number of training timesteps: the model's timestep is `TIMESTEP_SCALE · σ`.
pub const TIMESTEP_SCALE: f64 = 1000.0;

/// Timestep shift: `σ' = s·σ / (1 + (s−1)·σ)`. `s = 1` is the identity.
pub fn shift_sigma(sigma: f64, shift: f64) -> f64 {
    shift * sigma / (1.0 + (shift - 1.0) * sigma)
}

/// Broadcast per-sample values `[B]` to `[B, 1, 1, 1, 1]`.
fn per_sample<B: Backend>(values: Tensor<B, 1>) -> Tensor<B, 5> {
    let b = values.dims()[0];
    values.reshape([b, 1, 1, 1, 1])
}

/// `x_t = (1−σ)·x0 + σ·ε` with per-sample `σ` `[B]`; `x0`, `noise`: `[B, C, F, H, W]`.
pub fn add_noise<B: Backend>(
    x0: Tensor<B, 5>,
    noise: Tensor<B, 5>,
    sigma: Tensor<B, 1>,
) -> Tensor<B, 5> {
    let s = per_sample(sigma);
    x0.mul(s.clone().neg().add_scalar(1.0)).add(noise.mul(s))
}

/// The flow-matching target `ε − x0`.
pub fn velocity_target<B: Backend>(x0: Tensor<B, 5>, noise: Tensor<B, 5>) -> Tensor<B, 5> {
    noise.sub(x0)
}

/// `x0 = x_t − σ·v` with per-sample `σ` `[B]`.
pub fn x0_from_velocity<B: Backend>(
    x_t: Tensor<B, 5>,
    v: Tensor<B, 5>,
    sigma: Tensor<B, 1>,
) -> Tensor<B, 5> {
    x_t.sub(v.mul(per_sample(sigma)))
}

/// Model timesteps `1000·σ` from sigmas.
pub fn timesteps_from_sigmas<B: Backend>(sigma: Tensor<B, 1>) -> Tensor<B, 1> {
    sigma.mul_scalar(TIMESTEP_SCALE)
}

/// A per-sample `[B]` tensor from host values.
pub fn sigma_tensor<B: Backend>(values: &[f32], device: &B::Device) -> Tensor<B, 1> {
    Tensor::from_data(TensorData::new(values.to_vec(), [values.len()]), device)
}

/// Classifier-free guidance: `uncond + g·(cond − uncond)`.
pub fn cfg_combine<B: Backend, const D: usize>(
    cond: Tensor<B, D>,
    uncond: Tensor<B, D>,
    scale: f64,
) -> Tensor<B, D> {
    uncond.clone().add(cond.sub(uncond).mul_scalar(scale))
}

/// Density of training σ before the shift.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum TimestepDensity {
    /// Uniform in (0, 1). (A struct variant without fields, so that `deny_unknown_fields`
    /// applies to it: a unit variant would accept `logit_std` and ignore it.) The default.
    Uniform {},
    /// `σ = sigmoid(N(mean, std))` (SD3's logit-normal).
    LogitNormal {
        /// Mean of the normal before the sigmoid.
        #[serde(default)]
        logit_mean: f64,
        /// Standard deviation of the normal.
        #[serde(default = "one")]
        logit_std: f64,
    },
    /// SD3's mode density: `σ = 1 − u − scale·(cos²(πu/2) − 1 + u)`.
    Mode {
        /// Mode scale (1.29 in SD3).
        #[serde(default = "mode_scale_default")]
        mode_scale: f64,
    },
}

impl Default for TimestepDensity {
    fn default() -> Self {
        Self::Uniform {}
    }
}

fn one() -> f64 {
    1.0
}
fn mode_scale_default() -> f64 {
    1.29
}

impl TimestepDensity {
    /// Check parameters; keys are relative to the section holding the density.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match *self {
            TimestepDensity::Uniform {} => Ok(()),
            TimestepDensity::LogitNormal {
                logit_mean,
                logit_std,
            } => {
                if !logit_mean.is_finite() {
                    return Err(ConfigError::new("logit_mean", "expected a finite number"));
                }
                check::positive_f64("logit_std", logit_std)
            }
            TimestepDensity::Mode { mode_scale } => {
                // SD3's bound: above 2/(π−2) the map from u to σ is no longer monotone.
                let max = 2.0 / (std::f64::consts::PI - 2.0);
                if (0.0..=max).contains(&mode_scale) {
                    return Ok(());
                }
                Err(ConfigError::new(
                    "mode_scale",
                    format!(
                        "expected a number in [0, {max:.4}] (2/(π−2): above it the map from u \
                         to σ is no longer monotone), got {mode_scale}"
                    ),
                ))
            }
        }
    }

    /// Draw one σ in (0, 1) (before the shift).
    pub fn sample(&self, rng: &mut StreamRng) -> f64 {
        let s = match *self {
            TimestepDensity::Uniform {} => rng.uniform(),
            TimestepDensity::LogitNormal {
                logit_mean,
                logit_std,
            } => {
                let z = logit_mean + logit_std * rng.normal();
                1.0 / (1.0 + (-z).exp())
            }
            TimestepDensity::Mode { mode_scale } => {
                let u = rng.uniform();
                let c = (std::f64::consts::PI * u / 2.0).cos();
                1.0 - u - mode_scale * (c * c - 1.0 + u)
            }
        };
        s.clamp(1e-6, 1.0 - 1e-6)
    }

    /// Draw `n` shifted sigmas.
    pub fn sample_shifted(&self, n: usize, shift: f64, rng: &mut StreamRng) -> Vec<f32> {
        (0..n)
            .map(|_| shift_sigma(self.sample(rng), shift) as f32)
            .collect()
    }
}

/// The σ schedule of an Euler sampler with `steps` steps: `linspace(1, 0, steps+1)` shifted,
/// ending at exactly 0. Length `steps + 1`.
pub fn sampling_sigmas(steps: usize, shift: f64) -> Vec<f64> {
    (0..=steps)
        .map(|i| {
            let s = 1.0 - i as f64 / steps as f64;
            if i == steps {
                0.0
            } else {
                shift_sigma(s, shift)
            }
        })
        .collect()
}

/// The σ schedule for an explicit list of model timesteps (e.g. `[1000, 750, 500, 250]`),
/// optionally warped through the shifted schedule, with a final 0 appended.
pub fn sigmas_from_timesteps(timesteps: &[f64], shift: Option<f64>) -> Vec<f64> {
    let mut out: Vec<f64> = timesteps
        .iter()
        .map(|&t| {
            let s = (t / TIMESTEP_SCALE).clamp(0.0, 1.0);
            match shift {
                Some(shift) => shift_sigma(s, shift),
                None => s,
            }
        })
        .collect();
    out.push(0.0);
    out
}

/// Euler integration of the flow ODE from `x` (pure noise at `sigmas[0]`) down to
/// `sigmas.last()`: `x ← x + (σ_next − σ)·v(x, σ)`. `velocity(x, σ)` returns `v` with the
/// same shape as `x` (apply CFG inside it with [`cfg_combine`]).
pub fn euler_sample<B: Backend, F>(
    mut x: Tensor<B, 5>,
    sigmas: &[f64],
    mut velocity: F,
) -> Tensor<B, 5>
where
    F: FnMut(Tensor<B, 5>, f64) -> Tensor<B, 5>,
{
    for w in sigmas.windows(2) {
        let (s, s_next) = (w[0], w[1]);
        let v = velocity(x.clone(), s);
        x = x.add(v.mul_scalar(s_next - s));
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;
    type B = burn::backend::Flex;

    #[test]
    fn shift_is_identity_at_one_and_monotone() {
        for &s in &[0.0, 0.1, 0.5, 0.9, 1.0] {
            assert!((shift_sigma(s, 1.0) - s).abs() < 1e-12);
        }
        assert!((shift_sigma(0.5, 3.0) - 0.75).abs() < 1e-12);
        assert_eq!(shift_sigma(1.0, 5.0), 1.0);
    }

    #[test]
    fn noise_and_x0_roundtrip() {
        let dev = Default::default();
        let mut r = StreamRng::from_seed(3);
        let x0: Tensor<B, 5> = r.normal_tensor([2, 2, 1, 2, 2], &dev);
        let eps: Tensor<B, 5> = r.normal_tensor([2, 2, 1, 2, 2], &dev);
        let sigma = sigma_tensor::<B>(&[0.3, 0.8], &dev);
        let xt = add_noise(x0.clone(), eps.clone(), sigma.clone());
        let v = velocity_target(x0.clone(), eps);
        let back = x0_from_velocity(xt, v, sigma);
        let err: f32 = back.sub(x0).abs().max().into_scalar();
        assert!(err < 1e-6, "{err}");
    }

    #[test]
    fn euler_with_exact_velocity_recovers_x0() {
        // For the straight path from x0 to eps, v = eps - x0 is constant, so Euler is exact.
        let dev = Default::default();
        let mut r = StreamRng::from_seed(4);
        let x0: Tensor<B, 5> = r.normal_tensor([1, 1, 1, 2, 2], &dev);
        let eps: Tensor<B, 5> = r.normal_tensor([1, 1, 1, 2, 2], &dev);
        let v = eps.clone().sub(x0.clone());
        let out = euler_sample(eps, &sampling_sigmas(7, 3.0), |_x, _s| v.clone());
        let err: f32 = out.sub(x0).abs().max().into_scalar();
        assert!(err < 1e-5, "{err}");
    }

    #[test]
    fn densities_stay_in_unit_interval() {
        let mut r = StreamRng::from_seed(5);
        for d in [
            TimestepDensity::Uniform {},
            TimestepDensity::LogitNormal {
                logit_mean: 0.0,
                logit_std: 1.0,
            },
            TimestepDensity::Mode { mode_scale: 1.29 },
        ] {
            let v = d.sample_shifted(2000, 3.0, &mut r);
            assert!(v.iter().all(|&s| s > 0.0 && s < 1.0));
            let mean = v.iter().sum::<f32>() / v.len() as f32;
            assert!(mean > 0.5, "shift 3 pushes mass to high sigma: {mean}");
        }
    }

    #[test]
    fn densities_refuse_keys_of_another_kind() {
        let parse = |s: &str| toml::from_str::<TimestepDensity>(s);
        assert_eq!(
            parse("kind = \"uniform\"").unwrap(),
            TimestepDensity::Uniform {}
        );
        for (text, key) in [
            ("kind = \"uniform\"\nlogit_std = 1.0", "logit_std"),
            ("kind = \"mode\"\nlogit_mean = 0.0", "logit_mean"),
            ("kind = \"logit_normal\"\nmode_scale = 1.0", "mode_scale"),
        ] {
            let e = parse(text).expect_err(text).to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
    }

    #[test]
    fn explicit_timesteps_append_zero() {
        let s = sigmas_from_timesteps(&[1000.0, 750.0, 500.0, 250.0], None);
        assert_eq!(s, vec![1.0, 0.75, 0.5, 0.25, 0.0]);
    }
}
