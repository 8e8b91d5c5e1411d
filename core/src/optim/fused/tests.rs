//! The fused update kernels against the tensor-operation updates on the CPU: AdamW over
//! several steps (first step without moments, weight decay, gradient scaling), the EMA and
//! the sum of squares of many gradients, on uneven lengths, some longer than a single
//! launch's units (grid stride), on parameters flattened from kernel-made rank-3 and
//! rank-5 tensors (padded rows on CUDA), and on more parameters than one launch takes, some
//! on their first step among others on later ones. Run on the wgpu
//! backend (`--features wgpu`; on a machine without a GPU, Mesa's lavapipe) and on CUDA
//! (`--features cuda`).

use std::collections::BTreeMap;

use burn::backend::Autodiff;
use burn::tensor::TensorData;

use super::*;
use crate::optim::{adamw_updates, ema_updates, OptimizerConfig};
use crate::rng::StreamRng;
use crate::role::RoleHandle;

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
    check_adamw_of::<B>(&[len], |_| 1, |v| on::<B>(v, device));
}

/// Three AdamW steps of parameters of `lens` on `B` (made by `make`, fused, all in one
/// call) and on the CPU (tensor operations); parameter `i` takes its first step at step
/// `starts(i)`, so a call can hold parameters on their first step among others on later
/// ones. Parameters and moments agree after each step.
fn check_adamw_of<B: Backend>(
    lens: &[usize],
    starts: impl Fn(usize) -> u64,
    make: impl Fn(&[f32]) -> Tensor<B, 1>,
) {
    let cfg = OptimizerConfig {
        lr: 0.05,
        weight_decay: 0.1,
        ..Default::default()
    };
    let p0: Vec<Vec<f32>> = (0..lens.len())
        .map(|i| random(lens[i], 1 + 100 * i as u64))
        .collect();
    let mut fused: Vec<(Tensor<B, 1>, Option<Moments<B>>)> =
        p0.iter().map(|p| (make(p), None)).collect();
    let mut cpu: Vec<(Tensor<Cpu, 1>, Option<Moments<Cpu>>)> = p0
        .iter()
        .map(|p| (on(p, &Default::default()), None))
        .collect();
    for k in 1..=3u64 {
        let s = AdamWScalars::new(&cfg, cfg.lr, k, [0.7, 1.0, 0.25][k as usize - 1]);
        let stepping: Vec<usize> = (0..lens.len()).filter(|&i| starts(i) <= k).collect();
        let grads: Vec<Vec<f32>> = stepping
            .iter()
            .map(|&i| random(lens[i], 10 + k + 100 * i as u64))
            .collect();
        let take = |i: usize, g: &[f32], f: &mut Vec<(Tensor<B, 1>, Option<Moments<B>>)>| {
            let (p, m) = (f[i].0.clone(), f[i].1.take());
            (p, make(g), m)
        };
        let items = stepping
            .iter()
            .zip(&grads)
            .map(|(&i, g)| take(i, g, &mut fused))
            .collect();
        let got = try_adamw(items, &s).unwrap_or_else(|_| panic!("no fused kernel"));
        assert_eq!(got.len(), stepping.len(), "one update per parameter");
        let items = stepping
            .iter()
            .zip(&grads)
            .map(|(&i, g)| {
                (
                    cpu[i].0.clone(),
                    on(g, &Default::default()),
                    cpu[i].1.take(),
                )
            })
            .collect();
        let want = adamw_updates(&s, false, items);
        for ((&i, (np, nm)), (cp, cm)) in stepping.iter().zip(got).zip(want) {
            let pairs = [
                (np.clone(), cp.clone(), "param"),
                (nm.exp_avg.clone(), cm.exp_avg.clone(), "exp_avg"),
                (nm.exp_avg_sq.clone(), cm.exp_avg_sq.clone(), "exp_avg_sq"),
            ];
            for (got, want, name) in pairs {
                let e = max_rel(&values(got), &values(want));
                let len = lens[i];
                assert!(
                    e < 2e-6,
                    "parameter {i} of {len} values, step {k}: {name} off by {e:.2e}"
                );
            }
            (fused[i], cpu[i]) = ((np, Some(nm)), (cp, Some(cm)));
        }
    }
}

/// The fused EMA of shadows and parameters of `lens`, all in one call, against the tensor
/// operations on the CPU.
fn check_ema<B: Backend>(lens: &[usize], device: &B::Device) {
    let data: Vec<(Vec<f32>, Vec<f32>)> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| (random(n, 3 + 100 * i as u64), random(n, 4 + 100 * i as u64)))
        .collect();
    let pairs = data
        .iter()
        .map(|(e, p)| (on::<B>(e, device), on::<B>(p, device)))
        .collect();
    let got = try_ema(pairs, 0.93).unwrap_or_else(|_| panic!("no fused kernel"));
    let cpu = Default::default();
    let pairs = data
        .iter()
        .map(|(e, p)| (on::<Cpu>(e, &cpu), on::<Cpu>(p, &cpu)))
        .collect();
    let want = ema_updates(false, pairs, 0.93);
    assert_eq!(got.len(), lens.len(), "one shadow per parameter");
    for (i, (got, want)) in got.into_iter().zip(want).enumerate() {
        let err = max_rel(&values(got), &values(want));
        assert!(
            err < 1e-6,
            "parameter {i} of {} values: EMA off by {err:.2e}",
            lens[i]
        );
    }
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

/// Linear layers of uneven widths: two parameter tensors each.
#[derive(burn::module::Module, Debug)]
struct Layers<B: Backend> {
    layers: Vec<burn::nn::Linear<B>>,
}

impl<B: Backend> Layers<B> {
    fn new(count: usize, device: &B::Device) -> Self {
        let width = |i: usize| 3 + (i * 7) % 11;
        let layers = (0..count)
            .map(|i| burn::nn::LinearConfig::new(width(i), width(i + 1)).init(device))
            .collect();
        Self { layers }
    }
}

type Role<B> = crate::role::TrainableRole<Autodiff<B>, Layers<Autodiff<B>>>;

/// A role of `count` linear layers on `B`, clipping at norm 1, with the weights `values`.
fn role_with<B: Backend>(
    values: &BTreeMap<String, TensorData>,
    count: usize,
    fused: bool,
) -> Role<B> {
    let cfg = OptimizerConfig {
        lr: 0.05,
        weight_decay: 0.1,
        fused,
        ..Default::default()
    };
    let mut role = Role::<B>::new(
        "student",
        Layers::new(count, &Default::default()),
        cfg,
        Some(1.0),
        10,
    );
    role.load_trainable_tensors(values)
        .expect("the same module layout");
    role
}

/// Every host tensor of a role's state: weights, moments and EMA shadow, by kind and path.
fn role_state<B: Backend>(role: &Role<B>) -> Vec<(String, Vec<f32>)> {
    let all = [
        role.trainable_tensors(),
        role.optimizer_tensors(),
        role.ema_tensors(),
    ];
    all.into_iter()
        .zip(["weight", "moment", "ema"])
        .flat_map(|(list, kind)| {
            list.into_iter()
                .map(move |(k, d)| (format!("{kind} {k}"), d))
        })
        .map(|(k, d)| (k, d.convert::<f32>().to_vec().expect("float32 data")))
        .collect()
}

/// Three steps of a role's update (gradient norm, AdamW with clipping, EMA) on `K` with the
/// fused kernels against the same role on the CPU with tensor operations: the role hands its
/// parameters to the grouped launches and must take each result back under its own path.
/// Both get the same host gradients; the fifth parameter takes its first step at the second
/// step, and from then on every third parameter gets no gradient (its moments wait). Then a
/// second role follows each (`follow`, the EMA's update towards the trained weights).
fn check_role_update<K: Backend>(count: usize) {
    let init = Layers::<Autodiff<Cpu>>::new(count, &Default::default());
    let weights: BTreeMap<String, TensorData> =
        Role::<Cpu>::new("init", init, OptimizerConfig::default(), None, 1)
            .trainable_tensors()
            .into_iter()
            .collect();
    let mut cpu = role_with::<Cpu>(&weights, count, false);
    let mut fused = role_with::<K>(&weights, count, true);
    for step in 0..3u64 {
        for (i, (path, d)) in weights.iter().enumerate() {
            if (step == 0 && i == 4) || (step > 0 && i % 3 == 0) {
                continue;
            }
            let g = random(d.num_elements(), 50 + 1000 * step + i as u64);
            let (on_cpu, on_k) = (
                on::<Cpu>(&g, &Default::default()),
                on::<K>(&g, &Default::default()),
            );
            cpu.add_grads(BTreeMap::from([(path.clone(), on_cpu)]), 1.0);
            fused.add_grads(BTreeMap::from([(path.clone(), on_k)]), 1.0);
        }
        let want = values::<Cpu>(cpu.grad_norm_sq().expect("gradients"))[0];
        let got = values::<K>(fused.grad_norm_sq().expect("gradients"))[0];
        let e = (got - want).abs() / want;
        assert!(e < 1e-5, "step {step}: squared norm {got} against {want}");
        // Clipping to norm 1, as the trainer does from the norm.
        let scale = (1.0 / f64::from(want).sqrt()).min(1.0);
        cpu.apply_update(step, scale);
        fused.apply_update(step, scale);
        cpu.ema_update(0.9);
        fused.ema_update(0.9);
    }
    assert_same_state(&role_state(&fused), &role_state(&cpu), "after three steps");
    // A target that follows the trained role (consistency distillation's EMA target),
    // starting from the initial weights: the EMA's update, fused on `K`.
    let mut cpu_target = role_with::<Cpu>(&weights, count, false);
    let mut fused_target = role_with::<K>(&weights, count, true);
    cpu_target.follow(&cpu, 0.7);
    fused_target.follow(&fused, 0.7);
    let (want, got) = (role_state(&cpu_target), role_state(&fused_target));
    assert_same_state(&got, &want, "after following");
    // And both are 0.7 · initial + 0.3 · trained, by the host.
    let host = |d: TensorData| d.convert::<f32>().to_vec::<f32>().expect("float32 data");
    let by_host: Vec<(String, Vec<f32>)> = cpu
        .trainable_tensors()
        .into_iter()
        .map(|(path, trained)| {
            let (init, trained) = (host(weights[&path].clone()), host(trained));
            let mixed = init.iter().zip(&trained).map(|(a, b)| 0.7 * a + 0.3 * b);
            (format!("weight {path}"), mixed.collect())
        })
        .collect();
    assert_same_state(&want, &by_host, "after following, against the host");
}

/// Asserts that two role states hold the same tensors within 1e-5 (relative).
fn assert_same_state(got: &[(String, Vec<f32>)], want: &[(String, Vec<f32>)], when: &str) {
    let keys = |s: &[(String, Vec<f32>)]| s.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(keys(got), keys(want), "the same state tensors {when}");
    for ((key, got), (_, want)) in got.iter().zip(want) {
        let e = max_rel(got, want);
        assert!(e < 1e-5, "{key}: off by {e:.2e} {when}");
    }
}

#[test]
fn cpu_backends_get_no_fused_kernel() {
    let dev = Default::default();
    let s = AdamWScalars::new(&OptimizerConfig::default(), 1e-3, 1, 1.0);
    let t = || on::<Cpu>(&[1.0, 2.0], &dev);
    assert!(try_adamw(vec![(t(), t(), None)], &s).is_err());
    assert!(try_ema(vec![(t(), t())], 0.5).is_err());
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
                check_adamw_of::<$backend>(
                    &[len],
                    |_| 1,
                    |v| flattened(v, [1536, 16, 1, 2, 2], &device),
                );
                check_adamw_of::<$backend>(
                    &[37 * 3 * 5],
                    |_| 1,
                    |v| flattened(v, [37, 3, 5], &device),
                );
            }

            #[test]
            fn fused_updates_stride_over_buffers_longer_than_one_launch() {
                let device = Default::default();
                let len = (UNITS * MAX_CUBES) as usize + 1003;
                check_adamw::<$backend>(len, &device);
                check_ema::<$backend>(&[len, 7], &device);
            }

            #[test]
            fn a_roles_fused_update_matches_its_tensor_operations() {
                // 40 parameter tensors: groups of 4 on lavapipe, 16 on CUDA.
                check_role_update::<$backend>(20);
            }

            #[test]
            fn fused_updates_take_more_parameters_than_one_launch() {
                let device = Default::default();
                // Two full groups and a partial one, lengths uneven; the last ten parameters
                // (and every third) take their first step a step after the others.
                let n = 2 * MAX_GROUP + 5;
                let lens: Vec<usize> = (0..n).map(|i| 1 + (i * 37) % 300).collect();
                let starts = |i| if i >= n - 10 || i % 3 == 2 { 2 } else { 1 };
                check_adamw_of::<$backend>(&lens, starts, |v| on::<$backend>(v, &device));
                check_ema::<$backend>(&lens, &device);
                check_sum_squares::<$backend>(&lens, &device);
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
                check_ema::<$backend>(&[1], &device);
                check_ema::<$backend>(&[300, 5000, 2], &device);
            }
        }
    };
}

#[cfg(feature = "wgpu")]
backend_tests!(wgpu, WgpuCube);

#[cfg(feature = "cuda")]
backend_tests!(cuda, CudaCube);
