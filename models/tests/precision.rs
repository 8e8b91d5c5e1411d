//! bf16 compute with float32 master weights, and the attention implementations, on the
//! whole model (Flex: Burn's CPU backend with bfloat16 kernels).

mod common;

use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::tensor::{DType, Tensor};
use common::*;
use reel_core::config::Precision;
use reel_core::params::named_tensor_data;
use reel_core::rng::StreamRng;
use reel_models::{AttentionMode, WanConfig, WanModel};

type Ad = Autodiff<Flex>;

fn model(precision: Precision, mode: AttentionMode) -> WanModel<Ad> {
    WanConfig::preset("wan-quickstart")
        .unwrap()
        .init_seeded::<Ad>(&Default::default(), 3)
        .with_precision(precision)
        .with_attention(mode)
}

/// Output and every parameter gradient of a flow-matching-style loss.
fn run(
    m: &WanModel<Ad>,
) -> (
    Vec<f32>,
    std::collections::BTreeMap<String, burn::tensor::TensorData>,
) {
    // Inputs from a private seeded stream (the backend's global RNG is shared between the
    // test threads).
    let dev = Default::default();
    let mut rng = StreamRng::from_seed(7);
    let x: Tensor<Ad, 5> = rng.normal_tensor([2, 4, 4, 8, 16], &dev);
    let target: Tensor<Ad, 5> = rng.normal_tensor([2, 4, 4, 8, 16], &dev);
    let t = Tensor::<Ad, 1>::from_floats([900.0, 250.0], &dev);
    let ctx: Tensor<Ad, 3> = rng.normal_tensor([2, 6, 32], &dev);
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

#[test]
fn bf16_compute_tracks_f32_and_trains_float32_master_weights() {
    let f32_model = model(Precision::F32, AttentionMode::Naive);
    let bf16_model = model(Precision::Bf16, AttentionMode::Naive);
    assert_eq!(bf16_model.precision(), Precision::Bf16);
    let (out32, g32) = run(&f32_model);
    let (out16, g16) = run(&bf16_model);
    let e = rel_err(&out16, &out32);
    eprintln!("output relative L2 error bf16 vs f32: {e:.2e}");
    // bfloat16 has an 8-bit mantissa (relative rounding 2^-9 ≈ 2e-3 per product input).
    assert!(e > 1e-5, "bf16 products were not used (error {e:.2e})");
    assert!(e < 3e-2, "bf16 output too far from f32: {e:.2e}");
    // Master weights stay float32; every parameter gets a float32 gradient close to f32's.
    for (name, p) in named_tensor_data(&bf16_model) {
        assert_eq!(p.dtype, DType::F32, "{name}");
    }
    assert_eq!(g16.len(), g32.len());
    for (name, g) in &g16 {
        assert_eq!(g.dtype, DType::F32, "gradient of {name}");
        let e = rel_err(&values(g), &values(&g32[name]));
        assert!(e < 5e-2, "gradient of {name}: relative error {e:.2e}");
    }
}

#[test]
fn bf16_with_memory_efficient_attention_matches_bf16_naive() {
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
