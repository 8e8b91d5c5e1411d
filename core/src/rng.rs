//! Seeded random generators owned by the run (never a global RNG).
//!
//! Every random draw is made from a generator derived from `(run seed, step, stream)`, so the
//! numbers a step uses depend only on the step index: a resumed run draws exactly what the
//! uninterrupted run would have drawn, without saving generator state.

use burn::tensor::{backend::Backend, Tensor, TensorData};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The run's root of randomness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunRng {
    seed: u64,
}

fn mix(mut x: u64) -> u64 {
    // splitmix64 finaliser
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl RunRng {
    /// A root generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }

    /// The run seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// A generator for one purpose at one step. `key` tells the draws of a step apart (a
    /// sample's [`Batch::keys`](crate::method::Batch::keys) entry, or a clip's index);
    /// `stream` separates independent uses inside the same step (noise, timesteps, dropout...).
    pub fn stream(&self, step: u64, key: u64, stream: &str) -> StreamRng {
        let mut h = mix(self.seed ^ 0x5EED);
        h = mix(h ^ step);
        h = mix(h ^ key.wrapping_mul(0x1000_0001));
        for b in stream.bytes() {
            h = mix(h ^ b as u64);
        }
        StreamRng {
            inner: ChaCha8Rng::seed_from_u64(h),
        }
    }
}

/// A deterministic generator for one stream (see [`RunRng::stream`]).
#[derive(Debug, Clone)]
pub struct StreamRng {
    inner: ChaCha8Rng,
}

impl StreamRng {
    /// A generator from a raw seed (tests, data jitter).
    pub fn from_seed(seed: u64) -> Self {
        Self {
            inner: ChaCha8Rng::seed_from_u64(mix(seed)),
        }
    }

    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        self.inner.random::<f64>()
    }

    /// Uniform integer in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.inner.random_range(0..n)
    }

    /// Standard normal (Box–Muller, f64).
    pub fn normal(&mut self) -> f64 {
        loop {
            let u1 = self.uniform();
            if u1 > f64::MIN_POSITIVE {
                let u2 = self.uniform();
                return (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            }
        }
    }

    /// `n` standard-normal f32 values.
    pub fn normal_vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.normal() as f32).collect()
    }

    /// A standard-normal tensor of the given shape on `device`.
    pub fn normal_tensor<B: Backend, const D: usize>(
        &mut self,
        shape: [usize; D],
        device: &B::Device,
    ) -> Tensor<B, D> {
        let n = shape.iter().product();
        Tensor::from_data(TensorData::new(self.normal_vec(n), shape), device)
    }

    /// Raw 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_deterministic_and_distinct() {
        let r = RunRng::new(7);
        let a: Vec<f32> = r.stream(3, 0, "noise").normal_vec(4);
        let b: Vec<f32> = r.stream(3, 0, "noise").normal_vec(4);
        let c: Vec<f32> = r.stream(4, 0, "noise").normal_vec(4);
        let d: Vec<f32> = r.stream(3, 0, "sigma").normal_vec(4);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }

    #[test]
    fn normal_has_unit_moments() {
        let mut r = StreamRng::from_seed(1);
        let v = r.normal_vec(50_000);
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var - 1.0).abs() < 0.03, "var {var}");
    }
}
