//! The flow-matching Euler solver of phased consistency distillation.
//!
//! The ODE is discretised into `N = num_euler_timesteps` points `j = 0..=N` with
//! `σ_j = shift(j / N)`: `σ_N = 1` is pure noise and `σ_0 = 0` the clean sample. (FastVideo's
//! `EulerSolver` uses the same grid, `σ = shift(k·(1000/N)/1000)`, except that its lowest
//! boundary is the scheduler's smallest σ ≈ 0.001·shift instead of 0.) A training sample sits
//! at a point `i ∈ 1..=N`; the teacher's Euler step moves it to `i − 1`.
//!
//! `n` phases split the grid at `b_k = ⌊k·N/n⌋`, `k = 0..=n` (FastVideo's `inference_indices`,
//! `np.linspace(0, N, n, endpoint=False)` floored). Point `i` belongs to the phase whose lower
//! boundary (its *phase end*) is the largest `b_k < i`. A consistency model maps any point of a
//! phase to the phase end along one straight Euler segment, `x + (σ_end − σ)·v`, so sampling with
//! `n` phases takes one model call per phase: Euler over `σ_N, σ_{b_{n−1}}, …, σ_{b_1}, 0`.

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use reel_core::flow::shift_sigma;

/// The σ grid of `N` Euler points and its phase arithmetic.
#[derive(Debug, Clone, PartialEq)]
pub struct EulerSolver {
    /// `σ_j` for `j = 0..=N`, increasing, `σ_0 = 0`, `σ_N = 1`.
    sigmas: Vec<f64>,
}

impl EulerSolver {
    /// A grid of `points` (`N ≥ 1`) Euler points with timestep shift `shift`.
    pub fn new(points: usize, shift: f64) -> Self {
        assert!(points >= 1, "an Euler solver needs at least one point");
        let sigmas = (0..=points)
            .map(|j| {
                if j == 0 {
                    0.0
                } else {
                    // Written as `1 − (N − j)/N` so that the grid is bit-identical to
                    // `sampling_sigmas(N, shift)`.
                    shift_sigma(1.0 - (points - j) as f64 / points as f64, shift)
                }
            })
            .collect();
        Self { sigmas }
    }

    /// Number of Euler points `N`.
    pub fn points(&self) -> usize {
        self.sigmas.len() - 1
    }

    /// `σ_j`, `j ∈ 0..=N`.
    pub fn sigma(&self, j: usize) -> f64 {
        self.sigmas[j]
    }

    /// The training point for a uniform draw `u ∈ [0, 1)`: `1 + ⌊u·N⌋` (FastVideo draws its
    /// index uniformly from `0..N`).
    pub fn point_from_uniform(&self, u: f64) -> usize {
        let n = self.points();
        1 + ((u * n as f64).floor() as usize).min(n - 1)
    }

    /// Boundaries `b_k = ⌊k·N/n⌋`, `k = 0..=n`, of `phases` phases (`1 ≤ n ≤ N`).
    pub fn phase_boundaries(&self, phases: usize) -> Vec<usize> {
        let n = self.points();
        assert!(
            (1..=n).contains(&phases),
            "phase count {phases} outside 1..={n} (validated with the config)"
        );
        (0..=phases).map(|k| k * n / phases).collect()
    }

    /// The phase end of point `i ∈ 1..=N` with `phases` phases: the largest boundary `< i`.
    pub fn phase_end(&self, i: usize, phases: usize) -> usize {
        assert!(
            (1..=self.points()).contains(&i),
            "point {i} outside 1..={}",
            self.points()
        );
        self.phase_boundaries(phases)
            .into_iter()
            .take_while(|&b| b < i)
            .last()
            .expect("b_0 = 0 < i")
    }

    /// The σ schedule of the `phases`-step sampler: `[σ_N = 1, σ_{b_{n−1}}, …, σ_{b_1}, 0]`
    /// (length `phases + 1`), for [`reel_core::flow::euler_sample`].
    pub fn phase_sigmas(&self, phases: usize) -> Vec<f64> {
        self.phase_boundaries(phases)
            .into_iter()
            .rev()
            .map(|b| self.sigmas[b])
            .collect()
    }
}

/// One Euler segment per sample: `x + (σ_to − σ_from)·v`, with `from` and `to` `[B]` host σ
/// (the difference is taken in f64). `x`, `v`: `[B, C, F, H, W]`.
pub fn euler_segment<B: Backend>(
    x: Tensor<B, 5>,
    v: Tensor<B, 5>,
    from: &[f64],
    to: &[f64],
) -> Tensor<B, 5> {
    let b = from.len();
    assert_eq!(to.len(), b, "σ lists of one batch differ in length");
    let delta: Vec<f32> = from.iter().zip(to).map(|(f, t)| (t - f) as f32).collect();
    let delta = Tensor::<B, 1>::from_data(TensorData::new(delta, [b]), &x.device());
    x.add(v.mul(delta.reshape([b, 1, 1, 1, 1])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reel_core::flow::sampling_sigmas;

    #[test]
    fn grid_matches_the_euler_sampler_schedule() {
        let s = EulerSolver::new(50, 3.0);
        assert_eq!(s.points(), 50);
        assert_eq!(s.sigma(0), 0.0);
        assert_eq!(s.sigma(50), 1.0);
        // One phase per point is exactly the 50-step Euler schedule.
        assert_eq!(s.phase_sigmas(50), sampling_sigmas(50, 3.0));
        assert_eq!(s.phase_sigmas(1), vec![1.0, 0.0]);
        // Boundaries as FastVideo's floor(linspace(0, 50, 4, endpoint=False)) = [0, 12, 25, 37].
        assert_eq!(s.phase_boundaries(4), vec![0, 12, 25, 37, 50]);
        assert_eq!(
            s.phase_sigmas(4),
            vec![1.0, s.sigma(37), s.sigma(25), s.sigma(12), 0.0]
        );
    }

    #[test]
    fn phase_ends_by_hand() {
        let s = EulerSolver::new(50, 1.0);
        // Phases of 4: points 1..=12 end at 0, 13..=25 at 12, 26..=37 at 25, 38..=50 at 37.
        for (i, end) in [
            (1, 0),
            (12, 0),
            (13, 12),
            (25, 12),
            (26, 25),
            (37, 25),
            (38, 37),
        ] {
            assert_eq!(s.phase_end(i, 4), end, "point {i}");
        }
        assert_eq!(s.phase_end(50, 4), 37);
        // One phase: everything maps to the clean end; N phases: one step back.
        assert_eq!(s.phase_end(50, 1), 0);
        for i in 1..=50 {
            assert_eq!(s.phase_end(i, 50), i - 1);
        }
        // Uneven split: N = 10, 3 phases → boundaries 0, 3, 6, 10.
        let s = EulerSolver::new(10, 1.0);
        assert_eq!(s.phase_boundaries(3), vec![0, 3, 6, 10]);
        assert_eq!(s.phase_end(4, 3), 3);
        assert_eq!(s.phase_end(10, 3), 6);
    }

    #[test]
    fn uniform_draws_cover_every_point() {
        let s = EulerSolver::new(8, 1.0);
        assert_eq!(s.point_from_uniform(0.0), 1);
        assert_eq!(s.point_from_uniform(0.124), 1);
        assert_eq!(s.point_from_uniform(0.125), 2);
        assert_eq!(s.point_from_uniform(0.999_999), 8);
    }

    #[test]
    fn euler_segment_per_sample() {
        type B = burn::backend::NdArray;
        let dev = Default::default();
        let x = Tensor::<B, 5>::ones([2, 1, 1, 1, 2], &dev);
        let v = Tensor::<B, 5>::ones([2, 1, 1, 1, 2], &dev).mul_scalar(2.0);
        let out = euler_segment(x, v, &[0.5, 1.0], &[0.25, 0.0]);
        assert_eq!(
            out.to_data().to_vec::<f32>().unwrap(),
            vec![0.5, 0.5, -1.0, -1.0]
        );
    }
}
