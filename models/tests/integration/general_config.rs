//! The model beyond the fixture shapes: temporal patches, other head sizes and channel
//! counts, no cross-attention norm, seeded init, block hooks.

use crate::common;

use burn::tensor::{Distribution, Tensor, TensorData};
use common::*;
use reel_core::params::named_tensor_data;
use reel_models::WanConfig;

/// Temporal patch 2, 3 heads x 24, 5 -> 3 channels, odd freq_dim, no norm2.
fn odd_config() -> WanConfig {
    let mut c = WanConfig::preset("wan-tiny").unwrap();
    c.patch_size = [2, 2, 2];
    c.num_attention_heads = 3;
    c.attention_head_dim = 24;
    c.in_channels = 5;
    c.out_channels = 3;
    c.text_dim = 20;
    c.freq_dim = 17;
    c.ffn_dim = 40;
    c.num_layers = 3;
    c.cross_attn_norm = false;
    c.rope_max_seq_len = 8;
    c.validate().unwrap();
    c
}

fn inputs<B: burn::tensor::backend::Backend>(
    c: &WanConfig,
    dev: &B::Device,
) -> (Tensor<B, 5>, Tensor<B, 1>, Tensor<B, 3>) {
    let x = Tensor::random(
        [2, c.in_channels, 4, 6, 8],
        Distribution::Normal(0.0, 1.0),
        dev,
    );
    let t = Tensor::from_data(TensorData::new(vec![999.0f32, 12.5], [2]), dev);
    let ctx = Tensor::random([2, 7, c.text_dim], Distribution::Normal(0.0, 1.0), dev);
    (x, t, ctx)
}

#[test]
fn temporal_patch_and_other_head_sizes_run_forward_and_backward() {
    let _turn = reel_core::parallel::autodiff_turn();
    let dev = Default::default();
    let c = odd_config();
    let model = c.init_seeded::<TestBackend>(&dev, 11);
    assert!(model.blocks.iter().all(|b| b.norm2.is_none()));
    let (x, t, ctx) = inputs::<TestBackend>(&c, &dev);
    let (out, inter) = model.forward_with_intermediates(x, t, ctx);
    assert_eq!(out.dims(), [2, 3, 4, 6, 8]);
    assert_eq!(inter["rope_cos"].shape, vec![2 * 3 * 4, 24]);
    assert_eq!(inter["timestep_sinusoid"].shape, vec![2, 17]);
    assert_eq!(inter["proj_out"].shape, vec![2, 24, 2 * 2 * 2 * 3]);
    assert_eq!(inter["patch_embed_conv"].shape, vec![2, 72, 2, 3, 4]);
    let vals = values(&out.clone().into_data());
    assert!(vals.iter().all(|v| v.is_finite()));
    assert!(vals.iter().any(|v| *v != 0.0));

    let grads = out.square().mean().backward();
    let g = named_grads(&model, &grads);
    assert_eq!(g.len(), named_tensor_data(&model).len());
    for (k, v) in g {
        assert!(values(&v).iter().all(|x| x.is_finite()), "{k}");
    }
}

#[test]
fn seeded_init_is_deterministic() {
    let dev = Default::default();
    let c = odd_config();
    let a = named_tensor_data(&c.init_seeded::<Cpu>(&dev, 5));
    let b = named_tensor_data(&c.init_seeded::<Cpu>(&dev, 5));
    let d = named_tensor_data(&c.init_seeded::<Cpu>(&dev, 6));
    for ((ka, va), (kb, vb)) in a.iter().zip(&b) {
        assert_eq!(ka, kb);
        assert_eq!(va.as_bytes(), vb.as_bytes(), "{ka}");
    }
    let w = |m: &Vec<(String, TensorData)>, key: &str| {
        values(&m.iter().find(|(k, _)| k == key).unwrap().1)
    };
    assert_ne!(
        w(&a, "blocks.0.attn1.to_q.weight"),
        w(&d, "blocks.0.attn1.to_q.weight")
    );
    assert!(w(&a, "blocks.0.attn1.to_q.bias").iter().all(|v| *v == 0.0));
    assert!(w(&a, "blocks.0.attn1.norm_q.weight")
        .iter()
        .all(|v| *v == 1.0));
    // std of a weight ~ 1/sqrt(fan_in)
    let q = w(&a, "blocks.0.ffn.net.0.proj.weight");
    let var = q.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / q.len() as f64;
    assert!((var * 72.0 - 1.0).abs() < 0.15, "{var}");
}

#[test]
fn hidden_state_hooks_match_intermediates() {
    let dev = Default::default();
    let c = odd_config();
    let model = c.init_seeded::<Cpu>(&dev, 3);
    let (x, t, ctx) = inputs::<Cpu>(&c, &dev);
    let (out_a, inter) = model.forward_with_intermediates(x.clone(), t.clone(), ctx.clone());
    let (out_b, hidden) = model.forward_hidden_states(x.clone(), t.clone(), ctx.clone(), &[2, 0]);
    let out_c = model.forward(x, t, ctx);
    let bytes = |t: Tensor<Cpu, 5>| t.into_data().as_bytes().to_vec();
    assert_eq!(bytes(out_a.clone()), bytes(out_b));
    assert_eq!(bytes(out_a), bytes(out_c));
    assert_eq!(hidden.len(), 2);
    for (h, i) in hidden.into_iter().zip([2, 0]) {
        let want = inter[&format!("block_out.{i}")].to_data();
        assert_eq!(h.into_data().as_bytes(), want.as_bytes());
    }
}

#[test]
#[should_panic(expected = "rope_max_seq_len")]
fn grid_longer_than_rope_table_is_rejected() {
    let dev = Default::default();
    let mut c = odd_config();
    c.rope_max_seq_len = 3;
    let model = c.init_seeded::<Cpu>(&dev, 0);
    let (x, t, ctx) = inputs::<Cpu>(&c, &dev);
    let _ = model.forward(x, t, ctx);
}
