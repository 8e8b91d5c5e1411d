//! The AdamW and EMA updates on the CPU backends (ndarray, Flex) as one loop over each
//! parameter's host memory.
//!
//! The tensor operations of [`super::adamw_updates`] make about twelve passes over a
//! parameter's values per step, each allocating a new buffer. Here each parameter, its
//! gradient and its moments are taken out of their tensors as [`TensorData`] (without a copy
//! where the tensor is the only owner of its buffer and contiguous, which the moments and
//! EMA shadows are; the parameter itself is still held by the model, so it is copied once),
//! updated in one pass, and put back (again without a copy).
//!
//! Each value goes through the same float32 operations in the same order as the tensor
//! operations (both CPU backends compute each element-wise operation in float32 with plain
//! `*`, `/`, `+`, `-` and `sqrt`, and Rust does not contract `a * b + c` into a fused
//! multiply-add), so the results are bit-identical to them; the tests assert it on both
//! backends. Multiplying by a factor of exactly 1 (no clipping, no weight decay) leaves every
//! value as it is, so the loop multiplies unconditionally where the tensor operations skip it.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor, TensorData};

use super::{AdamWInputs, AdamWOutput, AdamWScalars, EmaPair, Moments};
use crate::host::{into_data, is_host};

/// [`AdamWScalars`] rounded to float32 as the tensor operations round them (`1 − β` is
/// computed in float64 first).
#[derive(Debug, Clone, Copy)]
struct Coefs {
    grad_scale: f32,
    beta1: f32,
    one_minus_beta1: f32,
    beta2: f32,
    one_minus_beta2: f32,
    decay: f32,
    bc2_sqrt: f32,
    eps: f32,
    step_size: f32,
}

impl Coefs {
    fn new(s: &AdamWScalars) -> Self {
        Self {
            grad_scale: s.grad_scale as f32,
            beta1: s.beta1 as f32,
            one_minus_beta1: (1.0 - s.beta1) as f32,
            beta2: s.beta2 as f32,
            one_minus_beta2: (1.0 - s.beta2) as f32,
            decay: s.decay as f32,
            bc2_sqrt: s.bc2_sqrt as f32,
            eps: s.eps as f32,
            step_size: s.step_size as f32,
        }
    }

    /// The new parameter value from the old one and the new moments.
    #[inline(always)]
    fn param(&self, p: f32, m: f32, v: f32) -> f32 {
        let denom = v.sqrt() / self.bc2_sqrt + self.eps;
        p * self.decay - (m / denom) * self.step_size
    }

    /// One step after the first: `p`, `m` and `v` in place.
    fn step(&self, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
        let values = p.iter_mut().zip(g).zip(m.iter_mut().zip(v.iter_mut()));
        for ((p, &g), (m, v)) in values {
            let g = g * self.grad_scale;
            *m = *m * self.beta1 + g * self.one_minus_beta1;
            *v = *v * self.beta2 + (g * g) * self.one_minus_beta2;
            *p = self.param(*p, *m, *v);
        }
    }

    /// The first step (no moments yet): `p` in place, `m` and `v` written.
    fn first_step(&self, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
        let values = p.iter_mut().zip(g).zip(m.iter_mut().zip(v.iter_mut()));
        for ((p, &g), (m, v)) in values {
            let g = g * self.grad_scale;
            *m = g * self.one_minus_beta1;
            *v = (g * g) * self.one_minus_beta2;
            *p = self.param(*p, *m, *v);
        }
    }
}

/// Whether the host loops take tensors of `B` with these dtypes: a CPU backend and float32
/// throughout.
fn runs_here<B: Backend>(dtypes: impl IntoIterator<Item = DType>) -> bool {
    is_host::<B>() && dtypes.into_iter().all(|d| d == DType::F32)
}

/// [`super::adamw_updates`] as one loop per parameter where `B` is a CPU backend and every
/// tensor is float32; otherwise `items` back, untouched.
pub(super) fn try_adamw<B: Backend>(
    items: Vec<AdamWInputs<B>>,
    s: &AdamWScalars,
) -> Result<Vec<AdamWOutput<B>>, Vec<AdamWInputs<B>>> {
    let dtypes = items.iter().flat_map(|(p, g, m)| {
        let moments = m
            .iter()
            .flat_map(|m| [m.exp_avg.dtype(), m.exp_avg_sq.dtype()]);
        [p.dtype(), g.dtype()].into_iter().chain(moments)
    });
    if !runs_here::<B>(dtypes) {
        return Err(items);
    }
    let c = Coefs::new(s);
    Ok(items
        .into_iter()
        .map(|(p, g, m)| adamw_one(&c, p, g, m))
        .collect())
}

/// One parameter's AdamW step on the host.
fn adamw_one<B: Backend>(
    c: &Coefs,
    param: Tensor<B, 1>,
    grad: Tensor<B, 1>,
    moments: Option<Moments<B>>,
) -> AdamWOutput<B> {
    let device = param.device();
    let mut p = into_data(param);
    let g = into_data(grad);
    assert_eq!(
        p.shape, g.shape,
        "AdamW: a parameter of shape {:?} has a gradient of shape {:?}",
        p.shape, g.shape
    );
    let (m, v) = match moments {
        Some(Moments {
            exp_avg,
            exp_avg_sq,
        }) => {
            let (mut m, mut v) = (into_data(exp_avg), into_data(exp_avg_sq));
            c.step(
                values_mut(&mut p),
                values(&g),
                values_mut(&mut m),
                values_mut(&mut v),
            );
            (m, v)
        }
        None => {
            let n = g.num_elements();
            let (mut m, mut v) = (vec![0.0; n], vec![0.0; n]);
            c.first_step(values_mut(&mut p), values(&g), &mut m, &mut v);
            (TensorData::new(m, [n]), TensorData::new(v, [n]))
        }
    };
    let tensor = |data| Tensor::from_data(data, &device);
    (
        tensor(p),
        Moments {
            exp_avg: tensor(m),
            exp_avg_sq: tensor(v),
        },
    )
}

/// [`super::ema_updates`] as one loop per shadow where `B` is a CPU backend and every tensor
/// is float32 (`shadow·decay + param·(1 − decay)`, the shadow updated in place); otherwise
/// `pairs` back, untouched.
pub(super) fn try_ema<B: Backend>(
    pairs: Vec<EmaPair<B>>,
    decay: f64,
) -> Result<Vec<Tensor<B, 1>>, Vec<EmaPair<B>>> {
    if !runs_here::<B>(pairs.iter().flat_map(|(s, p)| [s.dtype(), p.dtype()])) {
        return Err(pairs);
    }
    let (keep, take) = (decay as f32, (1.0 - decay) as f32);
    Ok(pairs
        .into_iter()
        .map(|(shadow, param)| {
            let device = shadow.device();
            let (mut s, p) = (into_data(shadow), into_data(param));
            assert_eq!(
                s.shape, p.shape,
                "EMA: a shadow of shape {:?} for a parameter of shape {:?}",
                s.shape, p.shape
            );
            for (s, &p) in values_mut(&mut s).iter_mut().zip(values(&p)) {
                *s = *s * keep + p * take;
            }
            Tensor::from_data(s, &device)
        })
        .collect())
}

/// The float32 values of `data`, whose dtype [`runs_here`] checked.
fn values(data: &TensorData) -> &[f32] {
    let dtype = data.dtype;
    data.as_slice()
        .unwrap_or_else(|e| panic!("host update: float32 data checked, got {dtype:?}: {e:?}"))
}

/// [`values`], mutable.
fn values_mut(data: &mut TensorData) -> &mut [f32] {
    let dtype = data.dtype;
    data.as_mut_slice()
        .unwrap_or_else(|e| panic!("host update: float32 data checked, got {dtype:?}: {e:?}"))
}

#[cfg(test)]
mod tests {
    use burn::tensor::backend::Backend;
    use burn::tensor::{Tensor, TensorData};

    use crate::optim::{adamw_updates, ema_updates, AdamWScalars, Moments, OptimizerConfig};

    /// `n` made-up values spanning several magnitudes, with both zeros among them.
    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n)
            .map(|i| match i % 11 {
                3 => 0.0,
                7 => -0.0,
                k => (i as f32 * 0.37 + seed).sin() * 10f32.powi(k as i32 - 5),
            })
            .collect()
    }

    fn tensor<B: Backend>(v: Vec<f32>) -> Tensor<B, 1> {
        let n = v.len();
        Tensor::from_data(TensorData::new(v, [n]), &Default::default())
    }

    fn bits<B: Backend>(t: Tensor<B, 1>) -> Vec<u32> {
        let v = t.into_data().to_vec::<f32>().expect("float32");
        v.into_iter().map(f32::to_bits).collect()
    }

    /// Three AdamW steps of parameters of several lengths (vector tails included), with
    /// clipping and weight decay on the second step only, through the host loop and through
    /// the tensor operations: every parameter and moment equal bit for bit.
    fn adamw_matches_the_tensor_operations<B: Backend>() {
        assert!(super::is_host::<B>());
        let lens = [1usize, 7, 33, 1000];
        let cfg = |wd| OptimizerConfig {
            betas: [0.9, 0.99],
            eps: 1e-8,
            weight_decay: wd,
            ..Default::default()
        };
        let steps = [
            AdamWScalars::new(&cfg(0.01), 1e-3, 1, 1.0),
            AdamWScalars::new(&cfg(0.01), 7e-4, 2, 0.37),
            AdamWScalars::new(&cfg(0.0), 3e-4, 3, 1.0),
        ];
        let start = |seed| -> Vec<(Tensor<B, 1>, Option<Moments<B>>)> {
            let p = lens.iter().map(|&n| tensor::<B>(values(n, seed)));
            p.map(|p| (p, None)).collect()
        };
        let (mut host, mut ops) = (start(0.5), start(0.5));
        for (k, s) in steps.iter().enumerate() {
            let grads = || lens.iter().map(|&n| tensor::<B>(values(n, k as f32 + 1.5)));
            let run = |state: Vec<(Tensor<B, 1>, Option<Moments<B>>)>, fused| {
                let items = state.into_iter().zip(grads()).map(|((p, m), g)| (p, g, m));
                let out = adamw_updates(s, fused, items.collect());
                out.into_iter()
                    .map(|(p, m)| (p, Some(m)))
                    .collect::<Vec<_>>()
            };
            host = run(host, true);
            ops = run(ops, false);
            for ((hp, hm), (op, om)) in host.iter().cloned().zip(ops.iter().cloned()) {
                let (hm, om) = (hm.expect("moments"), om.expect("moments"));
                assert_eq!(bits(hp), bits(op), "parameter after step {}", k + 1);
                assert_eq!(bits(hm.exp_avg), bits(om.exp_avg), "m after step {}", k + 1);
                assert_eq!(
                    bits(hm.exp_avg_sq),
                    bits(om.exp_avg_sq),
                    "v, step {}",
                    k + 1
                );
            }
        }
    }

    #[test]
    fn adamw_on_ndarray_matches_the_tensor_operations_bit_for_bit() {
        adamw_matches_the_tensor_operations::<burn::backend::NdArray>();
    }

    #[test]
    fn adamw_on_flex_matches_the_tensor_operations_bit_for_bit() {
        adamw_matches_the_tensor_operations::<burn::backend::Flex>();
    }

    fn ema_matches_the_tensor_operations<B: Backend>() {
        for decay in [0.995, 0.5, 0.0] {
            let pairs = || {
                let n = [1usize, 9, 1000];
                n.map(|n| (tensor::<B>(values(n, 0.2)), tensor::<B>(values(n, 2.2))))
                    .to_vec()
            };
            let host = ema_updates(true, pairs(), decay);
            let ops = ema_updates(false, pairs(), decay);
            for (h, o) in host.into_iter().zip(ops) {
                assert_eq!(bits(h), bits(o), "EMA with decay {decay}");
            }
        }
    }

    #[test]
    fn ema_on_both_cpu_backends_matches_the_tensor_operations_bit_for_bit() {
        ema_matches_the_tensor_operations::<burn::backend::NdArray>();
        ema_matches_the_tensor_operations::<burn::backend::Flex>();
    }

    /// The loops leave autodiff tensors and other dtypes to the tensor operations, and they
    /// do not write into a buffer another tensor still holds.
    #[test]
    fn the_loops_take_only_host_float32_and_leave_shared_buffers_alone() {
        type F = burn::backend::Flex;
        let s = AdamWScalars::new(&OptimizerConfig::default(), 1e-2, 1, 1.0);
        let ad = || tensor::<burn::backend::Autodiff<F>>(values(5, 0.1));
        assert!(super::try_adamw(vec![(ad(), ad(), None)], &s).is_err());
        let half = || tensor::<F>(values(5, 0.1)).cast(burn::tensor::DType::BF16);
        assert!(super::try_ema(vec![(half(), half())], 0.9).is_err());

        let shadow = tensor::<F>(values(5, 0.1));
        let kept = shadow.clone();
        let before = bits(kept.clone());
        let out = super::try_ema(vec![(shadow, tensor::<F>(values(5, 3.0)))], 0.5);
        let out = out.unwrap_or_else(|_| panic!("Flex float32 takes the host loop"));
        assert_eq!(bits(kept), before, "the shared shadow was written");
        assert_ne!(bits(out[0].clone()), before, "the EMA step changed nothing");
    }
}
