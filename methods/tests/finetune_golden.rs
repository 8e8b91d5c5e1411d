//! Golden test: one `finetune` step on the fixture model with the fixture's x0 / noise /
//! sigmas reproduces `train_step.safetensors` (loss, pred, two AdamW steps and the second
//! loss), through the method's loss function and core's `TrainableRole` optimizer.

use std::collections::BTreeMap;
use std::path::PathBuf;

use burn::tensor::{Tensor, TensorData};
use reel_core::io::read_safetensors;
use reel_core::optim::OptimizerConfig;
use reel_core::role::{RoleHandle, TrainableRole};
use reel_methods::flow_matching_loss;
use reel_models::{WanConfig, WanModel};

type B = burn::backend::Autodiff<burn::backend::NdArray>;

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

#[test]
fn finetune_step_and_two_adamw_steps_match_torch() {
    let golden = fixture("train_step.safetensors");
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
    let mut role = TrainableRole::new("student", model, opt, None, 2);
    let x0: Tensor<B, 5> = tensor(&golden["x0"]);
    let noise: Tensor<B, 5> = tensor(&golden["noise"]);
    let sigma: Tensor<B, 1> = tensor(&golden["sigmas"]);
    let text: Tensor<B, 3> = tensor(&golden["encoder_hidden_states"]);

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
        report.push((loss_key.to_string(), check(loss_key, &l, &want, 1e-5)));
        if step == 0 {
            let p = pred.into_data().to_vec::<f32>().unwrap();
            report.push((
                "pred".into(),
                check("pred", &p, &golden["pred"].to_vec::<f32>().unwrap(), 2e-5),
            ));
        }
        let grads = loss.backward();
        role.accumulate(&grads, 1.0);
        role.apply_update(step, 1.0);
        let prefix = if step == 0 {
            "adamw_step1."
        } else {
            "adamw_step2."
        };
        let params: BTreeMap<String, TensorData> = role.trainable_tensors().into_iter().collect();
        let mut n = 0;
        for (k, want) in golden.iter().filter(|(k, _)| k.starts_with(prefix)) {
            let name = &k[prefix.len()..];
            let got = params
                .get(name)
                .unwrap_or_else(|| panic!("no parameter `{name}`"));
            assert_eq!(got.shape, want.shape, "{name}");
            // Adam's first step moves every weight by ~lr = 1e-3: the tolerance is far below it.
            let err = max_abs_diff(
                &got.to_vec::<f32>().unwrap(),
                &want.to_vec::<f32>().unwrap(),
            );
            assert!(err < 2e-6, "{k}: max abs error {err:e}");
            report.push((k.clone(), err));
            n += 1;
        }
        assert!(n >= 8, "expected the fixture's AdamW parameters, found {n}");
    }
    for (k, e) in &report {
        eprintln!("{k:70} max abs error {e:.2e}");
    }
}
