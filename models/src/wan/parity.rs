//! Numerical parity with the diffusers golden fixtures (`$REEL_WAN_FIXTURES`, else the
//! repository's `tests/fixtures/wan_tiny`); every shape and count comes from the fixture. On
//! the CPU here, on CUDA (`cuda_*`, `--features cuda`) and on wgpu (`wgpu_*`, `--features
//! wgpu`).
//!
//! Tolerances follow the fixture README: float32 forward to ~1e-5 absolute (scaled by the
//! reference magnitude when it exceeds 1), gradients to ~1e-4 relative per tensor.
//!
//! These are unit tests, not integration tests, so that CI's kernel tests on lavapipe build
//! only the library's test binary with `wgpu` (docs/architecture.md, "CI from a cold cache").

use crate::golden::*;
use crate::{AttentionMode, WanConfig};

/// Inference backend of the CPU checks.
type Cpu = burn::backend::NdArray;
/// Training backend of the CPU checks.
type TestBackend = burn::backend::Autodiff<Cpu>;

/// How close a backend must come to the golden data.
#[derive(Clone, Copy)]
struct Tol {
    /// Forward values: `fwd · max(1, max |ref|)` absolute (also the loss, relative).
    fwd: f64,
    /// Gradients: `grad · max |ref grad|` per tensor.
    grad: f64,
}

impl Tol {
    fn fwd(&self, scale: f64) -> f64 {
        self.fwd * scale.max(1.0)
    }
}

/// Float32 on the CPU: the fixture README's bar (output ~1e-5, gradients ~1e-4 relative).
const F32: Tol = Tol {
    fwd: 2e-5,
    grad: 1e-4,
};

/// The `wan-tiny` preset is the repository's fixture model (whatever set the other tests use).
#[test]
fn wan_tiny_preset_equals_the_repository_fixture_config() {
    let path = reel_core::fixtures::WAN
        .repository_dir()
        .join("config.json");
    assert_eq!(
        WanConfig::preset("wan-tiny").unwrap(),
        WanConfig::from_json_file(path).unwrap()
    );
}

#[test]
fn forward_and_every_intermediate_match_diffusers() {
    forward_parity(AttentionMode::Naive);
}

/// The memory-efficient attention kernel reproduces diffusers within the same tolerances.
#[test]
fn forward_matches_diffusers_with_memory_efficient_attention() {
    forward_parity(AttentionMode::MemoryEfficient);
}

#[test]
fn training_step_loss_and_every_gradient_match_diffusers() {
    let _turn = reel_core::parallel::autodiff_turn();
    training_parity(AttentionMode::Naive);
}

/// The memory-efficient kernel's own backward gives diffusers' gradients too.
#[test]
fn training_step_matches_diffusers_with_memory_efficient_attention() {
    let _turn = reel_core::parallel::autodiff_turn();
    training_parity(AttentionMode::MemoryEfficient);
}

fn forward_parity(mode: AttentionMode) {
    forward_parity_on::<Cpu>(&Default::default(), mode, F32);
}

fn training_parity(mode: AttentionMode) {
    training_parity_on::<TestBackend>(&Default::default(), mode, F32);
}

/// Forward parity on any backend (the CUDA variants below reuse it).
fn forward_parity_on<B: burn::tensor::backend::Backend>(
    dev: &B::Device,
    mode: AttentionMode,
    tol: Tol,
) {
    let dev = dev.clone();
    let model = fixture_model::<B>(&dev).with_attention(mode);
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
        let tol = tol.fwd(scale);
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
    assert!(expected > 0, "the fixture has intermediates");
    assert!(
        failures.is_empty(),
        "forward parity failed:\n{}",
        failures.join("\n")
    );
}

/// Training-step parity (loss and every gradient) on any autodiff backend.
fn training_parity_on<B: burn::tensor::backend::AutodiffBackend>(
    dev: &B::Device,
    mode: AttentionMode,
    tol: Tol,
) {
    let dev = dev.clone();
    let model = fixture_model::<B>(&dev).with_attention(mode);
    let f = fixture("train_step.safetensors");
    let x0 = tensor::<B, 5>(&f["x0"], &dev);
    let noise = tensor::<B, 5>(&f["noise"], &dev);
    let sigmas = tensor::<B, 1>(&f["sigmas"], &dev);
    let ctx = tensor::<B, 3>(&f["encoder_hidden_states"], &dev);

    let [b] = sigmas.dims();
    let s = sigmas.clone().reshape([b, 1, 1, 1, 1]);
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
        if err > tol.fwd(scale) {
            failures.push(format!("{name}: {err:.3e}"));
        }
    }
    let loss_val: f64 = burn::tensor::ElementConversion::elem(loss.clone().into_scalar());
    let loss_ref = values(&f["loss"])[0] as f64;
    let loss_err = (loss_val - loss_ref).abs();
    eprintln!("loss = {loss_val:.7} (ref {loss_ref:.7}), |err| = {loss_err:.3e}");
    if loss_err > tol.fwd / 2.0 * loss_ref.abs().max(1.0) {
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
        // A fraction of the tensor's largest gradient, plus an absolute floor for tensors
        // that are themselves almost zero.
        if err > tol.grad * scale + 1e-8 {
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

/// The same golden checks on Burn's CUDA backend (`cargo test -p reel-models --features cuda
/// --lib -- wan::parity::cuda`; needs an NVIDIA GPU).
///
/// Burn 0.21's CUDA matmul runs float32 products on TF32 tensor cores (cubek-matmul switches
/// f32 operands to tf32 whenever the GPU has them, with no opt-out), so the bar is TF32's:
/// measured on an H100, output 3.1e-3 of max |ref| 4.2 (7e-4 relative) and gradients 2.6e-3
/// relative. The CPU tests above hold the float32 bar; these catch backend-specific errors
/// (kernels, the memory-efficient attention dispatch on CUDA), which would be O(1).
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;

    /// TF32 matmuls: ~3× the measured error.
    const TF32: Tol = Tol {
        fwd: 2e-3,
        grad: 1e-2,
    };
    type Cuda = burn::backend::Cuda;
    type CudaAd = burn::backend::Autodiff<Cuda>;

    fn dev() -> burn::backend::cuda::CudaDevice {
        burn::backend::cuda::CudaDevice::new(0)
    }

    #[test]
    fn cuda_forward_matches_diffusers() {
        forward_parity_on::<Cuda>(&dev(), AttentionMode::Naive, TF32);
    }

    #[test]
    fn cuda_forward_matches_diffusers_with_memory_efficient_attention() {
        forward_parity_on::<Cuda>(&dev(), AttentionMode::MemoryEfficient, TF32);
    }

    #[test]
    fn cuda_training_step_matches_diffusers() {
        let _turn = reel_core::parallel::autodiff_turn();
        training_parity_on::<CudaAd>(&dev(), AttentionMode::Naive, TF32);
    }

    #[test]
    fn cuda_training_step_matches_diffusers_with_memory_efficient_attention() {
        let _turn = reel_core::parallel::autodiff_turn();
        training_parity_on::<CudaAd>(&dev(), AttentionMode::MemoryEfficient, TF32);
    }

    #[test]
    fn cuda_forward_matches_diffusers_with_fused_attention() {
        forward_parity_on::<Cuda>(&dev(), AttentionMode::Fused, TF32);
    }

    #[test]
    fn cuda_training_step_matches_diffusers_with_fused_attention() {
        let _turn = reel_core::parallel::autodiff_turn();
        training_parity_on::<CudaAd>(&dev(), AttentionMode::Fused, TF32);
    }
}

/// The same golden checks on Burn's wgpu backend (`cargo test -p reel-models --features wgpu --lib
/// -- wan::parity::wgpu`): the CubeCL code path without an NVIDIA GPU. On a machine without
/// a GPU it runs on Mesa's software Vulkan driver (lavapipe, Debian package `mesa-vulkan-drivers`).
#[cfg(feature = "wgpu")]
mod wgpu {
    use super::*;

    type Wgpu = burn::backend::Wgpu;
    type WgpuAd = burn::backend::Autodiff<Wgpu>;

    fn dev() -> burn::backend::wgpu::WgpuDevice {
        burn::backend::wgpu::WgpuDevice::default()
    }

    #[test]
    fn wgpu_forward_matches_diffusers() {
        forward_parity_on::<Wgpu>(&dev(), AttentionMode::Naive, F32);
    }

    #[test]
    fn wgpu_forward_matches_diffusers_with_memory_efficient_attention() {
        forward_parity_on::<Wgpu>(&dev(), AttentionMode::MemoryEfficient, F32);
    }

    #[test]
    fn wgpu_training_step_matches_diffusers() {
        let _turn = reel_core::parallel::autodiff_turn();
        training_parity_on::<WgpuAd>(&dev(), AttentionMode::Naive, F32);
    }

    #[test]
    fn wgpu_training_step_matches_diffusers_with_memory_efficient_attention() {
        let _turn = reel_core::parallel::autodiff_turn();
        training_parity_on::<WgpuAd>(&dev(), AttentionMode::MemoryEfficient, F32);
    }

    #[test]
    fn wgpu_forward_matches_diffusers_with_fused_attention() {
        forward_parity_on::<Wgpu>(&dev(), AttentionMode::Fused, F32);
    }

    #[test]
    fn wgpu_training_step_matches_diffusers_with_fused_attention() {
        let _turn = reel_core::parallel::autodiff_turn();
        training_parity_on::<WgpuAd>(&dev(), AttentionMode::Fused, F32);
    }
}
