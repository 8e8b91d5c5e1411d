//! bf16 compute with float32 master weights, and the attention implementations, on the
//! whole model (Flex: Burn's CPU backend with bfloat16 kernels; the same checks on CUDA
//! under `--features cuda`).

use crate::common;

use std::collections::BTreeMap;

use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{DType, ElementConversion, Tensor, TensorData};
use common::*;
use reel_core::config::Precision;
use reel_core::params::named_tensor_data;
use reel_core::rng::StreamRng;
use reel_models::{AttentionMode, WanConfig, WanModel};

type Ad = Autodiff<Flex>;

fn model(precision: Precision, mode: AttentionMode) -> WanModel<Ad> {
    model_on(&Default::default(), precision, mode)
}

fn model_on<B: AutodiffBackend>(
    dev: &B::Device,
    precision: Precision,
    mode: AttentionMode,
) -> WanModel<B> {
    WanConfig::preset("wan-quickstart")
        .unwrap()
        .init_seeded::<B>(dev, 3)
        .with_precision(precision)
        .with_attention(mode)
}

/// Fixed inputs and target of a flow-matching-style loss: `(x, t, context, target)`.
fn batch<B: AutodiffBackend>(
    dev: &B::Device,
) -> (Tensor<B, 5>, Tensor<B, 1>, Tensor<B, 3>, Tensor<B, 5>) {
    // Inputs from a private seeded stream (the backend's global RNG is shared between the
    // test threads).
    let mut rng = StreamRng::from_seed(7);
    let x: Tensor<B, 5> = rng.normal_tensor([2, 4, 4, 8, 16], dev);
    let target: Tensor<B, 5> = rng.normal_tensor([2, 4, 4, 8, 16], dev);
    let t = Tensor::<B, 1>::from_floats([900.0, 250.0], dev);
    let ctx: Tensor<B, 3> = rng.normal_tensor([2, 6, 32], dev);
    (x, t, ctx, target)
}

/// Output and every parameter gradient of the loss.
fn run<B: AutodiffBackend>(m: &WanModel<B>) -> (Vec<f32>, BTreeMap<String, TensorData>) {
    let (x, t, ctx, target) = batch::<B>(&m.proj_out.weight.device());
    let out = m.forward(x, t, ctx);
    assert_eq!(out.dtype(), DType::F32, "the model's output is float32");
    let loss = (out.clone() - target).square().mean();
    let grads = loss.backward();
    (values(&out.into_data()), named_grads(m, &grads))
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// bf16 output and gradients against float32's, both with `mode`, on `B`.
fn bf16_tracks_f32<B: AutodiffBackend>(dev: &B::Device, mode: AttentionMode) {
    let f32_model = model_on::<B>(dev, Precision::F32, mode);
    let bf16_model = model_on::<B>(dev, Precision::Bf16, mode);
    assert_eq!(bf16_model.precision(), Precision::Bf16);
    let (out32, g32) = run(&f32_model);
    let (out16, g16) = run(&bf16_model);
    let e = rel_err(&out16, &out32);
    eprintln!("{mode:?}: output relative L2 error bf16 vs f32: {e:.2e}");
    // bfloat16 has an 8-bit mantissa (relative rounding 2^-9 ≈ 2e-3 per product input).
    assert!(e > 1e-5, "bf16 products were not used (error {e:.2e})");
    assert!(e < 3e-2, "bf16 output too far from f32: {e:.2e}");
    // Master weights stay float32; every parameter gets a float32 gradient close to f32's.
    for (name, p) in named_tensor_data(&bf16_model) {
        assert_eq!(p.dtype, DType::F32, "{name}");
    }
    assert_eq!(g16.len(), g32.len());
    let mut worst = (0f64, String::new());
    for (name, g) in &g16 {
        assert_eq!(g.dtype, DType::F32, "gradient of {name}");
        let e = rel_err(&values(g), &values(&g32[name]));
        assert!(e < 5e-2, "gradient of {name}: relative error {e:.2e}");
        if e > worst.0 {
            worst = (e, name.clone());
        }
    }
    eprintln!(
        "{mode:?}: largest gradient relative L2 error: {:.2e} ({})",
        worst.0, worst.1
    );
}

#[test]
fn bf16_compute_tracks_f32_and_trains_float32_master_weights() {
    let _turn = reel_core::parallel::autodiff_turn();
    bf16_tracks_f32::<Ad>(&Default::default(), AttentionMode::Naive);
}

#[test]
fn bf16_hidden_states_are_bfloat16_between_blocks() {
    let _turn = reel_core::parallel::autodiff_turn();
    let dev = Default::default();
    let mut rng = StreamRng::from_seed(5);
    let x: Tensor<Ad, 5> = rng.normal_tensor([1, 4, 4, 8, 8], &dev);
    let t = Tensor::<Ad, 1>::from_floats([300.0], &dev);
    let ctx: Tensor<Ad, 3> = rng.normal_tensor([1, 5, 32], &dev);
    for (precision, want) in [(Precision::Bf16, DType::BF16), (Precision::F32, DType::F32)] {
        let m = model(precision, AttentionMode::Naive);
        let (out, map) = m.forward_with_intermediates(x.clone(), t.clone(), ctx.clone());
        assert_eq!(
            out.dtype(),
            DType::F32,
            "{precision:?}: the output is float32"
        );
        let stream: Vec<&String> = map
            .keys()
            .filter(|k| {
                k.starts_with("block_out.") || k.starts_with("block0.") || *k == "patch_tokens"
            })
            .collect();
        assert!(stream.len() >= 5, "{stream:?}");
        for k in stream {
            assert_eq!(map[k].flat.dtype(), want, "{precision:?}: {k}");
        }
        // The conditioning stays float32 (diffusers' `temb.float()`).
        for k in ["temb", "timestep_proj"] {
            assert_eq!(map[k].flat.dtype(), DType::F32, "{precision:?}: {k}");
        }
        // Hidden states handed to callers (discriminator heads) are float32.
        let (_, hidden) = m.forward_hidden_states(x.clone(), t.clone(), ctx.clone(), &[0]);
        assert_eq!(hidden[0].dtype(), DType::F32);
    }
}

#[test]
fn bf16_checkpointed_gradients_match_the_plain_bf16_backward() {
    let _turn = reel_core::parallel::autodiff_turn();
    bf16_checkpointed_matches_plain::<Ad>(&Default::default(), AttentionMode::MemoryEfficient);
}

/// Checkpointed and plain backward of the bf16 model with `mode`, on `B`.
fn bf16_checkpointed_matches_plain<B: AutodiffBackend>(dev: &B::Device, mode: AttentionMode) {
    let m = model_on::<B>(dev, Precision::Bf16, mode);
    let (x, t, ctx, target) = batch::<B>(dev);
    let loss_fn = |p: Tensor<B, 5>| (p - target.clone()).square().mean();

    let plain = loss_fn(m.forward(x.clone(), t.clone(), ctx.clone()));
    let plain_grads = named_grads(&m, &plain.clone().backward());
    let mut staged = BTreeMap::new();
    let ck = m.backward_checkpointed(x, t, ctx, loss_fn, |g| {
        for (name, data) in present_grads(&m, g) {
            assert!(staged.insert(name.clone(), data).is_none(), "{name} twice");
        }
    });
    let (a, b): (f32, f32) = (plain.into_scalar().elem(), ck.into_scalar().elem());
    assert!((a - b).abs() <= 1e-6 * a.abs(), "loss {a} vs {b}");
    assert_eq!(staged.len(), plain_grads.len());
    let mut worst = 0f64;
    for (name, want) in &plain_grads {
        let got = &staged[name];
        assert_eq!(got.dtype, DType::F32, "{name}");
        // The same bf16 operations on the same inputs: equal up to float32 summation order.
        let e = rel_err(&values(got), &values(want));
        assert!(e < 1e-3, "gradient of {name}: relative error {e:.2e}");
        worst = worst.max(e);
    }
    eprintln!("{mode:?}: checkpointed vs plain bf16 gradients: largest relative error {worst:.2e}");
}

#[test]
fn bf16_with_memory_efficient_attention_matches_bf16_naive() {
    let _turn = reel_core::parallel::autodiff_turn();
    let (o_naive, g_naive) = run(&model(Precision::Bf16, AttentionMode::Naive));
    let (o_eff, g_eff) = run(&model(Precision::Bf16, AttentionMode::MemoryEfficient));
    let e = rel_err(&o_eff, &o_naive);
    assert!(e < 2e-2, "outputs differ by {e:.2e}");
    for (name, g) in &g_eff {
        let e = rel_err(&values(g), &values(&g_naive[name]));
        assert!(e < 5e-2, "gradient of {name}: relative error {e:.2e}");
    }
}

#[test]
fn f32_memory_efficient_attention_matches_naive_on_flex() {
    let _turn = reel_core::parallel::autodiff_turn();
    let (o_naive, g_naive) = run(&model(Precision::F32, AttentionMode::Naive));
    let (o_eff, g_eff) = run(&model(Precision::F32, AttentionMode::MemoryEfficient));
    assert!(rel_err(&o_eff, &o_naive) < 1e-5);
    for (name, g) in &g_eff {
        let e = rel_err(&values(g), &values(&g_naive[name]));
        assert!(e < 1e-4, "gradient of {name}: relative error {e:.2e}");
    }
}

/// The model's output for fixed inputs (forward only: frozen models have no gradients).
fn forward_only(m: &WanModel<Ad>) -> Vec<f32> {
    let dev = Default::default();
    let mut rng = StreamRng::from_seed(9);
    let x: Tensor<Ad, 5> = rng.normal_tensor([1, 4, 4, 8, 8], &dev);
    let t = Tensor::<Ad, 1>::from_floats([600.0], &dev);
    let ctx: Tensor<Ad, 3> = rng.normal_tensor([1, 5, 32], &dev);
    values(&m.forward(x, t, ctx).into_data())
}

#[test]
fn a_frozen_bf16_model_stores_bf16_weight_matrices_and_computes_the_same_bits() {
    let _turn = reel_core::parallel::autodiff_turn();
    let master = model(Precision::Bf16, AttentionMode::Naive).no_grad();
    let stored = model(Precision::Bf16, AttentionMode::Naive)
        .no_grad()
        .with_bf16_weights();
    let bytes = |m: &WanModel<Ad>| -> usize {
        named_tensor_data(m)
            .iter()
            .map(|(_, d)| d.as_bytes().len())
            .sum()
    };
    let params = named_tensor_data(&stored);
    let bf16: Vec<&String> = params
        .iter()
        .filter(|(_, d)| d.dtype == DType::BF16)
        .map(|(n, _)| n)
        .collect();
    assert!(
        bf16.iter().all(|n| n.ends_with(".weight")) && bf16.len() >= 4,
        "{bf16:?}"
    );
    let bias = params.iter().find(|(n, _)| n == "proj_out.bias");
    assert!(bias.is_some_and(|(_, d)| d.dtype == DType::F32), "{bias:?}");
    let (b16, b32) = (bytes(&stored), bytes(&master));
    eprintln!("frozen model bytes: {b16} with bf16 weight matrices, {b32} float32");
    assert!((b16 as f64) < 0.6 * b32 as f64, "{b16} vs {b32}");
    // Rounding the weights once or on every forward gives the same products.
    assert_eq!(forward_only(&stored), forward_only(&master));
}

/// The bf16 checks on Burn's CUDA backend (`cargo test -p reel-models --features cuda --test
/// precision`), with the fused kernels and with the tensor-core attention of `"flash"` on
/// Reel's tiled kernels and on cuDNN.
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    type CudaAd = Autodiff<burn::backend::Cuda>;

    fn dev() -> burn::backend::cuda::CudaDevice {
        burn::backend::cuda::CudaDevice::new(0)
    }

    use reel_models::wan::fused_attention::cudnn;

    /// `check` with `"fused"`, then `"flash"` on Reel's tiled kernels and on cuDNN (the
    /// `cuda` default; calls it cannot run fall back to Reel's), on this test's thread.
    fn each_attention(check: impl Fn(AttentionMode)) {
        check(AttentionMode::Fused);
        for flash in [cudnn::Flash::Reel, cudnn::Flash::Cudnn] {
            cudnn::choose(Some(flash));
            check(AttentionMode::Flash);
        }
        cudnn::choose(None);
    }

    #[test]
    fn cuda_bf16_tracks_f32() {
        let _turn = reel_core::parallel::autodiff_turn();
        each_attention(|mode| bf16_tracks_f32::<CudaAd>(&dev(), mode));
    }

    #[test]
    fn cuda_bf16_checkpointed_matches_plain() {
        let _turn = reel_core::parallel::autodiff_turn();
        each_attention(|mode| bf16_checkpointed_matches_plain::<CudaAd>(&dev(), mode));
    }
}
