//! Numerical parity with the diffusers golden fixtures (`shared/fixtures/wan_tiny`).
//!
//! Tolerances follow the fixture README: float32 forward to ~1e-5 absolute (scaled by the
//! reference magnitude when it exceeds 1), gradients to ~1e-4 relative per tensor.

mod common;

use common::*;
use reel_models::WanConfig;

/// Forward tolerance: `2e-5 * max(1, max |ref|)`.
fn fwd_tol(scale: f64) -> f64 {
    2e-5 * scale.max(1.0)
}

#[test]
fn wan_tiny_preset_equals_fixture_config() {
    assert_eq!(WanConfig::preset("wan-tiny").unwrap(), fixture_config());
}

#[test]
fn forward_and_every_intermediate_match_diffusers() {
    let dev = Default::default();
    let model = fixture_model::<Cpu>(&dev);
    let inputs = fixture("inputs.safetensors");
    let outputs = fixture("outputs.safetensors");
    let (out, inter) = model.forward_with_intermediates(
        tensor(&inputs["hidden_states"], &dev),
        tensor(&inputs["timestep"], &dev),
        tensor(&inputs["encoder_hidden_states"], &dev),
    );

    let mut failures = Vec::new();
    let mut check = |name: &str, got: &burn::tensor::TensorData| {
        let want = &outputs[name];
        let (err, scale) = max_err(name, got, want);
        let tol = fwd_tol(scale);
        eprintln!("{name:<40} max|err| = {err:.3e}  (max|ref| = {scale:.3}, tol {tol:.1e})");
        if err > tol {
            failures.push(format!("{name}: {err:.3e} > {tol:.1e}"));
        }
    };
    check("output", &out.into_data());
    let mut expected = 0;
    for key in outputs.keys().filter(|k| k.starts_with("intermediate.")) {
        let short = &key["intermediate.".len()..];
        let got = inter
            .get(short)
            .unwrap_or_else(|| panic!("model did not capture `{short}`"))
            .to_data();
        check(key, &got);
        expected += 1;
    }
    assert_eq!(expected, 15, "fixture intermediates");
    assert!(
        failures.is_empty(),
        "forward parity failed:\n{}",
        failures.join("\n")
    );
}

#[test]
fn training_step_loss_and_every_gradient_match_diffusers() {
    let dev = Default::default();
    let model = fixture_model::<TestBackend>(&dev);
    let f = fixture("train_step.safetensors");
    let x0 = tensor::<TestBackend, 5>(&f["x0"], &dev);
    let noise = tensor::<TestBackend, 5>(&f["noise"], &dev);
    let sigmas = tensor::<TestBackend, 1>(&f["sigmas"], &dev);
    let ctx = tensor::<TestBackend, 3>(&f["encoder_hidden_states"], &dev);

    let s = sigmas.clone().reshape([2, 1, 1, 1, 1]);
    let noisy = x0.clone() * (s.clone().neg() + 1.0) + noise.clone() * s;
    let t = sigmas * 1000.0;
    let pred = model.forward(noisy.clone(), t.clone(), ctx);
    let target = noise - x0;
    let loss = (pred.clone() - target.clone()).square().mean();

    let mut failures = Vec::new();
    for (name, got) in [
        ("noisy_input", noisy.into_data()),
        ("timesteps", t.into_data()),
        ("target", target.into_data()),
        ("pred", pred.into_data()),
    ] {
        let (err, scale) = max_err(name, &got, &f[name]);
        eprintln!("{name:<58} max|err| = {err:.3e}  (max|ref| = {scale:.3})");
        if err > fwd_tol(scale) {
            failures.push(format!("{name}: {err:.3e}"));
        }
    }
    let loss_val = loss.clone().into_scalar() as f64;
    let loss_ref = values(&f["loss"])[0] as f64;
    let loss_err = (loss_val - loss_ref).abs();
    eprintln!("loss = {loss_val:.7} (ref {loss_ref:.7}), |err| = {loss_err:.3e}");
    if loss_err > 1e-5 * loss_ref.abs().max(1.0) {
        failures.push(format!("loss: {loss_err:.3e}"));
    }

    let grads = loss.backward();
    let got = named_grads(&model, &grads);
    let reference: Vec<&String> = f.keys().filter(|k| k.starts_with("grad.")).collect();
    assert_eq!(
        reference.len(),
        got.len(),
        "the fixture has a gradient for every parameter"
    );
    let mut worst = 0f64;
    for key in reference {
        let name = &key["grad.".len()..];
        let g = got
            .get(name)
            .unwrap_or_else(|| panic!("model has no parameter `{name}`"));
        let (err, scale) = max_err(key, g, &f[key.as_str()]);
        let rel = err / scale.max(1e-12);
        worst = worst.max(rel);
        eprintln!("{key:<58} max|err| = {err:.3e}  rel = {rel:.2e}  (max|ref| = {scale:.3e})");
        // 1e-4 of the tensor's largest gradient, plus an absolute floor for tensors that are
        // themselves almost zero.
        if err > 1e-4 * scale + 1e-8 {
            failures.push(format!("{key}: {err:.3e} (rel {rel:.2e})"));
        }
    }
    eprintln!("worst relative gradient error: {worst:.3e}");
    assert!(
        failures.is_empty(),
        "training parity failed:\n{}",
        failures.join("\n")
    );
}
