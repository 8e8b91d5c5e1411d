//! Golden test: one `finetune` step on the fixture model with the fixture's x0 / noise /
//! sigmas reproduces `train_step.safetensors` (loss, pred, two AdamW steps and the second
//! loss), through the method's loss function and core's `TrainableRole` optimizer.
//!
//! AdamW is checked so that float-level noise in a gradient cannot fail it where the update
//! is ill-conditioned: Adam's first step moves a weight by `lr·g/(|g|+eps)`, whose derivative
//! `lr·eps/(|g|+eps)²` turns a gradient error of 1e-12 into an update error of 1e-7 where
//! `|g| ≈ eps`. So (a) Reel's gradients must match the fixture's within the gradient
//! tolerance of the model parity tests, (b) Reel's update must be AdamW (float64 on the host)
//! applied to Reel's own gradients, (c) the same float64 AdamW applied to the fixture's
//! gradients must give the fixture's weights, and (d) Reel's weights may differ from the
//! fixture's by no more than the float64 AdamW maps the gradient difference to (plus f32
//! rounding).

use std::collections::BTreeMap;
use std::path::PathBuf;

use burn::tensor::{Tensor, TensorData};
use reel_core::io::read_safetensors;
use reel_core::optim::OptimizerConfig;
use reel_core::role::{RoleHandle, TrainableRole};
use reel_methods::flow_matching_loss;
use reel_models::{WanConfig, WanModel};

type B = burn::backend::Autodiff<burn::backend::NdArray>;

/// Gradients: `GRAD_REL · max |ref grad|` per tensor plus a floor, as the model parity test.
const GRAD_REL: f64 = 1e-4;
/// Float32 rounding of an updated weight, relative to `max(1, |p|)`.
const F32_ROUNDING: f64 = 1e-6;

fn fixtures_dir() -> PathBuf {
    reel_core::fixtures::WAN.require(&[
        "config.json",
        "model.safetensors",
        "train_step.safetensors",
    ])
}

fn fixture(name: &str) -> BTreeMap<String, TensorData> {
    read_safetensors(fixtures_dir().join(name))
        .unwrap_or_else(|e| panic!("{e}"))
        .0
}

fn tensor<const D: usize>(d: &TensorData) -> Tensor<B, D> {
    Tensor::from_data(d.clone(), &Default::default())
}

fn host(d: &TensorData) -> Vec<f64> {
    d.to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn check(name: &str, got: &[f32], want: &[f32], rel: f32) -> f32 {
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let err = max_abs_diff(got, want);
    assert!(
        err <= rel * scale,
        "{name}: max abs error {err:e} > {rel:e} x {scale}"
    );
    err
}

/// One parameter's AdamW state in float64 (PyTorch's formula, see the fixture README).
#[derive(Clone)]
struct Adam {
    p: Vec<f64>,
    m: Vec<f64>,
    v: Vec<f64>,
}

impl Adam {
    fn new(p: Vec<f64>) -> Self {
        let n = p.len();
        Self {
            p,
            m: vec![0.0; n],
            v: vec![0.0; n],
        }
    }

    /// Step `k` (1-based) with gradient `g`.
    fn step(&mut self, g: &[f64], k: i32, o: &OptimizerConfig) {
        let (b1, b2) = (o.betas[0], o.betas[1]);
        let moments = self.m.iter_mut().zip(self.v.iter_mut());
        for ((p, (m, v)), g) in self.p.iter_mut().zip(moments).zip(g) {
            *p *= 1.0 - o.lr * o.weight_decay;
            *m = b1 * *m + (1.0 - b1) * g;
            *v = b2 * *v + (1.0 - b2) * g * g;
            let m_hat = *m / (1.0 - b1.powi(k));
            let v_hat = *v / (1.0 - b2.powi(k));
            *p -= o.lr * m_hat / (v_hat.sqrt() + o.eps);
        }
    }
}

/// Max over elements of `|got − want| − allowed`, as `(excess, at)`; `excess <= 0` passes.
fn worst_excess(got: &[f64], want: &[f64], allowed: impl Fn(usize) -> f64) -> (f64, usize) {
    (0..got.len())
        .map(|i| ((got[i] - want[i]).abs() - allowed(i), i))
        .fold((f64::NEG_INFINITY, 0), |a, b| if b.0 > a.0 { b } else { a })
}

#[test]
fn finetune_step_and_two_adamw_steps_match_torch() {
    let _turn = reel_core::parallel::autodiff_turn();
    let golden = fixture("train_step.safetensors");
    let base = fixture("model.safetensors");
    let cfg = WanConfig::from_json_file(fixtures_dir().join("config.json")).unwrap();
    let model: WanModel<B> = cfg
        .init::<B>(&Default::default())
        .load_weights(fixtures_dir().join("model.safetensors"))
        .unwrap();
    let opt = OptimizerConfig {
        lr: 1e-3,
        betas: [0.9, 0.999],
        eps: 1e-8,
        weight_decay: 0.01,
        ..Default::default()
    };
    let mut role = TrainableRole::new("student", model, opt.clone(), None, 2);
    let x0: Tensor<B, 5> = tensor(&golden["x0"]);
    let noise: Tensor<B, 5> = tensor(&golden["noise"]);
    let sigma: Tensor<B, 1> = tensor(&golden["sigmas"]);
    let text: Tensor<B, 3> = tensor(&golden["encoder_hidden_states"]);

    // The parameters the fixture follows through both AdamW steps.
    let names: Vec<String> = golden
        .keys()
        .filter_map(|k| k.strip_prefix("adamw_step1.").map(str::to_string))
        .collect();
    assert!(
        !names.is_empty(),
        "the fixture follows some parameters through AdamW"
    );
    let start = |n: &String| Adam::new(host(&base[n.as_str()]));
    let mut with_ours: BTreeMap<&String, Adam> = names.iter().map(|n| (n, start(n))).collect();
    let mut with_theirs = with_ours.clone();

    let mut report = vec![];
    for step in 0..2u64 {
        let (loss, pred) = flow_matching_loss(
            role.model(),
            x0.clone(),
            noise.clone(),
            sigma.clone(),
            text.clone(),
            false,
        );
        let loss_key = if step == 0 { "loss" } else { "loss_step2" };
        let l = loss.clone().into_data().to_vec::<f32>().unwrap();
        let want = golden[loss_key].to_vec::<f32>().unwrap();
        report.push((
            loss_key.to_string(),
            check(loss_key, &l, &want, 1e-5) as f64,
        ));
        if step == 0 {
            let p = pred.into_data().to_vec::<f32>().unwrap();
            let err = check("pred", &p, &golden["pred"].to_vec::<f32>().unwrap(), 2e-5);
            report.push(("pred".into(), err as f64));
        }
        let grads = role.collect_grads(&loss.backward());
        let ours: BTreeMap<String, Vec<f64>> = names
            .iter()
            .map(|n| (n.clone(), host(&grads[n].clone().into_data())))
            .collect();
        role.add_grads(grads, 1.0);
        role.apply_update(step, 1.0);
        let params: BTreeMap<String, TensorData> = role.trainable_tensors().into_iter().collect();
        let (grad_prefix, prefix) = if step == 0 {
            ("grad.", "adamw_step1.")
        } else {
            ("grad_step2.", "adamw_step2.")
        };
        for name in &names {
            let theirs = host(&golden[format!("{grad_prefix}{name}").as_str()]);
            // (a) Reel's gradient.
            let g_scale = theirs.iter().fold(0f64, |m, v| m.max(v.abs()));
            let (excess, _) = worst_excess(&ours[name], &theirs, |_| GRAD_REL * g_scale + 1e-8);
            assert!(
                excess <= 0.0,
                "{grad_prefix}{name}: gradient off by {excess:e} beyond its tolerance"
            );
            let k = step as i32 + 1;
            with_ours.get_mut(name).unwrap().step(&ours[name], k, &opt);
            with_theirs.get_mut(name).unwrap().step(&theirs, k, &opt);
            let (a, b) = (&with_ours[name].p, &with_theirs[name].p);
            let got = host(&params[name]);
            let want = host(&golden[format!("{prefix}{name}").as_str()]);
            assert_eq!(got.len(), want.len(), "{name}");
            let rounding = |x: f64| F32_ROUNDING * x.abs().max(1.0);
            // (b) Reel's update is AdamW of Reel's gradient.
            let (e, i) = worst_excess(&got, a, |i| rounding(a[i]));
            assert!(
                e <= 0.0,
                "{prefix}{name}[{i}]: not AdamW of Reel's own gradient ({e:e} over)"
            );
            // (c) The fixture's weights are AdamW of the fixture's gradient.
            let (e, i) = worst_excess(&want, b, |i| rounding(b[i]));
            assert!(
                e <= 0.0,
                "{prefix}{name}[{i}]: the fixture is not AdamW of its gradient ({e:e} over)"
            );
            // (d) Reel's weights differ from the fixture's only as far as the gradients do.
            let (e, i) = worst_excess(&got, &want, |i| (a[i] - b[i]).abs() + 2.0 * rounding(b[i]));
            assert!(
                e <= 0.0,
                "{prefix}{name}[{i}]: {e:e} beyond what the gradient difference explains"
            );
            report.push((
                format!("{prefix}{name}"),
                max_abs_diff(
                    &params[name].to_vec::<f32>().unwrap(),
                    &golden[format!("{prefix}{name}").as_str()]
                        .to_vec::<f32>()
                        .unwrap(),
                ) as f64,
            ));
        }
    }
    for (k, e) in &report {
        eprintln!("{k:70} max abs error {e:.2e}");
    }
}
