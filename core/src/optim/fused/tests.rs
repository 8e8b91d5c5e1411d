//! The fused update kernels against the tensor-operation updates on the CPU: AdamW over
//! several steps (first step without moments, weight decay, gradient scaling), the EMA and
//! the sum of squares of many gradients, on uneven lengths, some longer than a single
//! launch's units (grid stride), and on parameters flattened from kernel-made rank-3 and
//! rank-5 tensors (padded rows on CUDA). Run on the wgpu
//! backend (`--features wgpu`; on a machine without a GPU, Mesa's lavapipe) and on CUDA
//! (`--features cuda`).

use super::*;
use crate::optim::{adamw_update, ema_update, OptimizerConfig};
use crate::rng::StreamRng;

type Cpu = burn::backend::NdArray;

fn values<B: Backend>(t: Tensor<B, 1>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .to_vec()
        .expect("float32 data")
}

fn random(len: usize, seed: u64) -> Vec<f32> {
    let t: Tensor<Cpu, 1> = StreamRng::from_seed(seed).normal_tensor([len], &Default::default());
    values(t)
}

fn on<B: Backend>(v: &[f32], device: &B::Device) -> Tensor<B, 1> {
    Tensor::from_floats(v, device)
}

/// Largest `|a − b| / max(1, |b|)`.
fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
        .fold(0.0, f32::max)
}

/// `v` as a `shape` tensor that a kernel wrote, flattened as the roles flatten a parameter
/// and its gradient (`role/module.rs`). On CUDA, CubeCL pitches the rows of the rank ≥ 2
/// buffers it allocates (a last dimension of 2 float32 values gets a row of 4), and Burn's
/// `reshape` copies such a tensor into a packed one.
fn flattened<B: Backend, const D: usize>(
    v: &[f32],
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, 1> {
    let t: Tensor<B, D> = on::<B>(v, device).reshape(shape);
    (t.clone() + t.zeros_like()).reshape([v.len()])
}

/// Three AdamW steps of a parameter of `len` values on `B` (fused) and on the CPU (tensor
/// operations): parameter and moments agree after each step.
fn check_adamw<B: Backend>(len: usize, device: &B::Device) {
    check_adamw_of::<B>(len, |v| on::<B>(v, device));
}

/// [`check_adamw`] with the parameter and gradients on `B` made by `make`.
fn check_adamw_of<B: Backend>(len: usize, make: impl Fn(&[f32]) -> Tensor<B, 1>) {
    let cfg = OptimizerConfig {
        lr: 0.05,
        weight_decay: 0.1,
        ..Default::default()
    };
    let p0 = random(len, 1);
    let (mut p, mut state) = (make(&p0), None::<Moments<B>>);
    let (mut p_cpu, mut state_cpu) = (on::<Cpu>(&p0, &Default::default()), None);
    for k in 1..=3u64 {
        let g = random(len, 10 + k);
        let s = AdamWScalars::new(&cfg, cfg.lr, k, [0.7, 1.0, 0.25][k as usize - 1]);
        let inputs = (p, make(&g), state);
        let (np, nm) = try_adamw(inputs, &s).unwrap_or_else(|_| panic!("no fused kernel"));
        let (cp, cm) = adamw_update(&s, false, p_cpu, on(&g, &Default::default()), state_cpu);
        let pairs = [
            (np.clone(), cp.clone(), "param"),
            (nm.exp_avg.clone(), cm.exp_avg.clone(), "exp_avg"),
            (nm.exp_avg_sq.clone(), cm.exp_avg_sq.clone(), "exp_avg_sq"),
        ];
        for (got, want, name) in pairs {
            let e = max_rel(&values(got), &values(want));
            assert!(e < 2e-6, "len {len}, step {k}: {name} off by {e:.2e}");
        }
        (p, state, p_cpu, state_cpu) = (np, Some(nm), cp, Some(cm));
    }
}

fn check_ema<B: Backend>(len: usize, device: &B::Device) {
    let (e, p) = (random(len, 3), random(len, 4));
    let got = try_ema(on::<B>(&e, device), on::<B>(&p, device), 0.93)
        .unwrap_or_else(|_| panic!("no fused kernel"));
    let cpu = Default::default();
    let want = ema_update(false, on::<Cpu>(&e, &cpu), on::<Cpu>(&p, &cpu), 0.93);
    let err = max_rel(&values(got), &values(want));
    assert!(err < 1e-6, "len {len}: EMA off by {err:.2e}");
}

/// The fused sum of squares of tensors of `lens` on `B` against the tensor operations on the
/// CPU and against the float64 sum of the same values.
fn check_sum_squares<B: Backend>(lens: &[usize], device: &B::Device) {
    let data: Vec<Vec<f32>> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| random(n, 20 + i as u64))
        .collect();
    let on_b = data.iter().map(|v| on::<B>(v, device)).collect();
    let got = values(try_sum_squares(on_b).unwrap_or_else(|_| panic!("no fused kernel")));
    let cpu = Default::default();
    let want = crate::optim::squared_norm(false, data.iter().map(|v| on::<Cpu>(v, &cpu)).collect());
    let want = values(want.expect("tensors were given"));
    let exact: f64 = data
        .iter()
        .flatten()
        .map(|&v| (v as f64) * (v as f64))
        .sum();
    assert_eq!(got.len(), 1, "{lens:?}: one value");
    // The kernel's tree of short sums is closer to the exact sum than a long float32 sum.
    let checks = [
        ("float64", exact, 1e-6),
        ("tensor operations", want[0] as f64, 1e-4),
    ];
    for (what, other, tol) in checks {
        let e = (got[0] as f64 - other).abs() / other.max(1.0);
        assert!(
            e < tol,
            "{lens:?}: {} vs {other} ({what}), off by {e:.2e}",
            got[0]
        );
    }
}

#[test]
fn cpu_backends_get_no_fused_kernel() {
    let dev = Default::default();
    let s = AdamWScalars::new(&OptimizerConfig::default(), 1e-3, 1, 1.0);
    let t = || on::<Cpu>(&[1.0, 2.0], &dev);
    assert!(try_adamw((t(), t(), None), &s).is_err());
    assert!(try_ema(t(), t(), 0.5).is_err());
    assert!(try_sum_squares(vec![t(), t()]).is_err());
}

macro_rules! backend_tests {
    ($name:ident, $backend:ty) => {
        mod $name {
            use super::*;

            #[test]
            fn fused_adamw_matches_the_tensor_operations() {
                let device = Default::default();
                for len in [1, 255, 1000, 4099] {
                    check_adamw::<$backend>(len, &device);
                }
            }

            #[test]
            fn fused_adamw_takes_flattened_kernel_made_tensors() {
                let device = Default::default();
                // Wan's patch embedding, [1536, 16, 1, 2, 2], and an odd small shape.
                let len = 1536 * 16 * 4;
                check_adamw_of::<$backend>(len, |v| flattened(v, [1536, 16, 1, 2, 2], &device));
                check_adamw_of::<$backend>(37 * 3 * 5, |v| flattened(v, [37, 3, 5], &device));
            }

            #[test]
            fn fused_updates_stride_over_buffers_longer_than_one_launch() {
                let device = Default::default();
                let len = (UNITS * MAX_CUBES) as usize + 1003;
                check_adamw::<$backend>(len, &device);
                check_ema::<$backend>(len, &device);
            }

            #[test]
            fn fused_sum_of_squares_matches_the_tensor_operations() {
                let device = Default::default();
                check_sum_squares::<$backend>(&[1], &device);
                check_sum_squares::<$backend>(&[2, 255, 1000, 3], &device);
                // More values than its cubes' units cover (grid stride), and many tensors.
                let long = (UNITS as usize) * NORM_CUBES * 3 + 77;
                check_sum_squares::<$backend>(&[long, 5, 4099], &device);
                check_sum_squares::<$backend>(&[17; 300], &device);
            }

            #[test]
            fn fused_ema_matches_the_tensor_operations() {
                let device = Default::default();
                for len in [1, 300, 5000] {
                    check_ema::<$backend>(len, &device);
                }
            }
        }
    };
}

#[cfg(feature = "wgpu")]
backend_tests!(wgpu, WgpuCube);

#[cfg(feature = "cuda")]
backend_tests!(cuda, CudaCube);
