//! Numerical parity of the UMT5 encoder and the Wan prompt embeddings with transformers'
//! `UMT5EncoderModel` and diffusers' `WanPipeline._get_t5_prompt_embeds` (the golden
//! fixture `tests/fixtures/umt5_tiny`, or `$REEL_T5_FIXTURES`): token ids and mask from
//! tokenizing `prompts.json` exactly, every tensor within 1e-4 absolute in float32 on the
//! CPU (and at the TF32 bar on CUDA, under `--features cuda`). Shapes, counts and keys come
//! from the files.

use crate::common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use common::{max_err, values, Cpu};
use reel_core::io::read_safetensors;
use reel_models::umt5::{prompt_embeds, Umt5Encoder, Umt5TextEncoder};

/// The bar of the brief: float32 on the CPU.
const TOL: f64 = 1e-4;

fn fixture_dir() -> PathBuf {
    reel_core::fixtures::UMT5.require(&[
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "prompts.json",
        "golden.safetensors",
    ])
}

fn golden() -> BTreeMap<String, TensorData> {
    read_safetensors(fixture_dir().join("golden.safetensors"))
        .unwrap_or_else(|e| panic!("{e}"))
        .0
}

/// `(prompts, max_length)` of `prompts.json`.
fn prompts() -> (Vec<String>, usize) {
    let text = std::fs::read_to_string(fixture_dir().join("prompts.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let max_length = json["max_length"]
        .as_u64()
        .expect("prompts.json: max_length") as usize;
    let prompts = json["prompts"]
        .as_array()
        .expect("prompts.json: prompts")
        .iter()
        .map(|p| {
            p["prompt"]
                .as_str()
                .expect("prompts.json: prompt")
                .to_string()
        })
        .collect();
    (prompts, max_length)
}

fn text_encoder() -> Umt5TextEncoder<Cpu> {
    text_encoder_on(&Default::default())
}

fn text_encoder_on<B: Backend>(device: &B::Device) -> Umt5TextEncoder<B> {
    let dir = fixture_dir();
    Umt5TextEncoder::load(&dir, &dir, device).unwrap_or_else(|e| panic!("{e}"))
}

/// A golden float tensor holding integers, as `[B, L]` ids.
fn ids_of<B: Backend>(data: &TensorData, device: &B::Device) -> Tensor<B, 2, Int> {
    let ids: Vec<i64> = values(data).iter().map(|v| *v as i64).collect();
    Tensor::from_data(TensorData::new(ids, data.shape.clone()), device)
}

#[test]
fn tokenizer_reproduces_ids_and_mask() {
    let (text, g) = (text_encoder(), golden());
    let (prompts, max_length) = prompts();
    let refs: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let batch = text.tokenize(&refs, max_length).unwrap();
    let as_f32 = |v: &[u32]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    assert_eq!(
        g["input_ids"].shape.to_vec(),
        vec![prompts.len(), max_length]
    );
    assert_eq!(
        as_f32(&batch.input_ids),
        values(&g["input_ids"]),
        "input_ids"
    );
    assert_eq!(
        as_f32(&batch.attention_mask),
        values(&g["attention_mask"]),
        "attention_mask"
    );
    // prompts.json also lists each prompt's ids before padding.
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture_dir().join("prompts.json")).unwrap())
            .unwrap();
    for (i, p) in json["prompts"].as_array().unwrap().iter().enumerate() {
        let want: Vec<u32> = p["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let n = batch.lengths[i];
        assert_eq!(
            &batch.input_ids[i * max_length..i * max_length + n],
            &want[..n.min(want.len())]
        );
        assert_eq!(n, want.len().min(max_length), "length of prompt {i}");
    }
}

#[test]
fn hidden_states_last_hidden_state_and_prompt_embeds_match() {
    parity_on::<Cpu>(&Default::default(), |_| TOL);
}

/// Every golden tensor on the backend `B`; `bar(max|ref|)` is the largest error allowed.
fn parity_on<B: Backend>(device: &B::Device, bar: impl Fn(f64) -> f64) {
    let (text, g) = (text_encoder_on::<B>(device), golden());
    let (ids, mask) = (
        ids_of::<B>(&g["input_ids"], device),
        Tensor::from_data(g["attention_mask"].clone(), device),
    );
    let out = text.encoder.forward_with_hidden_states(ids, mask).unwrap();

    let mut failures = Vec::new();
    let mut check = |key: &str, got: TensorData| {
        let want = g
            .get(key)
            .unwrap_or_else(|| panic!("golden file has no `{key}`"));
        let (err, scale) = max_err(key, &got, want);
        eprintln!(
            "{key:<20} {:?} max|err| = {err:.3e} (max|ref| = {scale:.3})",
            want.shape
        );
        let bar = bar(scale);
        if err > bar {
            failures.push(format!("{key}: {err:.3e} > {bar:.1e}"));
        }
    };
    let hidden: Vec<&String> = g
        .keys()
        .filter(|k| k.starts_with("hidden_states."))
        .collect();
    assert_eq!(
        hidden.len(),
        out.hidden_states.len(),
        "hidden states: golden vs model"
    );
    assert_eq!(hidden.len(), text.encoder.config.num_layers + 1);
    for key in hidden {
        let i: usize = key["hidden_states.".len()..].parse().unwrap();
        check(key, out.hidden_states[i].to_data());
    }
    check("last_hidden_state", out.last_hidden_state.to_data());

    let lengths: Vec<usize> = values(&g["attention_mask"])
        .chunks(g["attention_mask"].shape[1])
        .map(|row| row.iter().filter(|m| **m > 0.0).count())
        .collect();
    let text_len = g["prompt_embeds"].shape[1];
    check(
        "prompt_embeds",
        prompt_embeds(out.last_hidden_state, &lengths, text_len).into_data(),
    );

    // The whole path from the prompt strings.
    let (prompts, _) = prompts();
    let refs: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let (embeds, got_lengths) = text.encode_prompts(&refs, text_len).unwrap();
    assert_eq!(got_lengths, lengths);
    check("prompt_embeds", embeds.into_data());
    assert!(
        failures.is_empty(),
        "UMT5 parity failed:\n{}",
        failures.join("\n")
    );
}

#[test]
fn a_file_with_only_the_tied_embed_tokens_key_loads_the_same() {
    let dir = fixture_dir();
    let (mut tensors, _) = read_safetensors(dir.join("model.safetensors")).unwrap();
    let shared = tensors
        .remove("shared.weight")
        .expect("fixture has shared.weight");
    tensors.insert("encoder.embed_tokens.weight".into(), shared.clone());
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(dir.join("config.json"), tmp.path().join("config.json")).unwrap();
    let file = tmp.path().join("model.safetensors");
    let list: Vec<(String, TensorData)> = tensors.clone().into_iter().collect();
    reel_core::io::write_safetensors(&file, &list, None).unwrap();
    let enc = Umt5Encoder::<Cpu>::load(&file, &Default::default()).unwrap();
    assert_eq!(enc.shared.weight.val().into_data(), shared);

    // Both keys present: `shared.weight` wins, the alias is accepted.
    tensors.insert("shared.weight".into(), shared.clone());
    let list: Vec<(String, TensorData)> = tensors.into_iter().collect();
    reel_core::io::write_safetensors(&file, &list, None).unwrap();
    let enc = Umt5Encoder::<Cpu>::load(tmp.path(), &Default::default()).unwrap();
    assert_eq!(enc.shared.weight.val().into_data(), shared);
}

/// The golden checks on Burn's CUDA backend (`cargo test -p reel-models --features cuda --test
/// integration -- umt5_parity::cuda`). Burn's CUDA matmul runs float32 products on TF32 tensor
/// cores, so the bar is TF32's (10-bit mantissa): 2e-3 · max(1, max|ref|).
#[cfg(feature = "cuda")]
mod cuda {
    #[test]
    fn cuda_umt5_matches_transformers() {
        super::parity_on::<burn::backend::Cuda>(&Default::default(), |scale| 2e-3 * scale.max(1.0));
    }
}
