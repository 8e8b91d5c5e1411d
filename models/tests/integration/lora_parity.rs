//! LoRA parity with diffusers + PEFT (the Wan fixture set, section 4 of its README): the
//! adapter file loads onto the fixture model and reproduces every golden output; merged
//! weights equal `fuse_lora`'s; unmerge restores the base; saving writes the same keys and
//! metadata diffusers does. Rank, alpha, targets and counts come from the fixture's adapter
//! file (its `lora_adapter_metadata` and its keys), so any fixture set made the same way works.

use crate::common;

use std::collections::HashMap;

use burn::module::Module;
use burn::tensor::TensorData;
use common::*;
use reel_core::io::{read_safetensors, write_safetensors};
use reel_core::params::named_tensor_data;
use reel_models::lora::{
    self, apply_lora, load_lora, merge_lora, read_lora_file, save_lora, set_lora_scale,
    unload_lora, unmerge_lora, KeyStyle, LoraSpec,
};
use reel_models::WanModel;

/// Forward tolerance, as in the model parity test: `2e-5 * max(1, max |ref|)`.
fn fwd_tol(scale: f64) -> f64 {
    2e-5 * scale.max(1.0)
}

fn forward(model: &WanModel<Cpu>) -> TensorData {
    let dev = Default::default();
    let inputs = fixture("inputs.safetensors");
    model
        .forward(
            tensor(&inputs["hidden_states"], &dev),
            tensor(&inputs["timestep"], &dev),
            tensor(&inputs["encoder_hidden_states"], &dev),
        )
        .into_data()
}

fn check(name: &str, got: &TensorData) {
    let golden = fixture("lora_golden.safetensors");
    let (err, scale) = max_err(name, got, &golden[name]);
    let tol = fwd_tol(scale);
    eprintln!("{name:<32} max|err| = {err:.3e}  (max|ref| = {scale:.3}, tol {tol:.1e})");
    assert!(err <= tol, "{name}: {err:.3e} > {tol:.1e}");
}

fn adapter_path() -> std::path::PathBuf {
    fixtures_dir().join("pytorch_lora_weights.safetensors")
}

/// What the fixture's adapter file says of itself: PEFT's `r`, `lora_alpha` and
/// `target_modules` (from `lora_adapter_metadata`) and the number of adapted layers (one
/// `lora_A` key each).
struct FixtureAdapter {
    rank: usize,
    alpha: f64,
    targets: Vec<String>,
    modules: usize,
}

fn fixture_adapter() -> FixtureAdapter {
    let (tensors, meta) = read_safetensors(adapter_path()).unwrap();
    let meta: serde_json::Value =
        serde_json::from_str(&meta.unwrap()["lora_adapter_metadata"]).unwrap();
    let mut targets: Vec<String> = meta["transformer.target_modules"]
        .as_array()
        .expect("target_modules in the fixture metadata")
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    targets.sort();
    FixtureAdapter {
        rank: meta["transformer.r"].as_u64().unwrap() as usize,
        alpha: meta["transformer.lora_alpha"].as_f64().unwrap(),
        targets,
        modules: tensors
            .keys()
            .filter(|k| k.ends_with(".lora_A.weight"))
            .count(),
    }
}

fn fixture_lora_model() -> WanModel<Cpu> {
    load_lora(fixture_model::<Cpu>(&Default::default()), adapter_path())
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn fixture_adapter_reproduces_output_lora_and_its_runtime_scale() {
    let a = fixture_adapter();
    assert!(a.modules > 0, "the fixture adapter has layers");
    let file = read_lora_file(adapter_path()).unwrap();
    assert!(file.has_metadata);
    assert_eq!(file.style, KeyStyle::Diffusers);
    assert_eq!((file.spec.rank, file.spec.alpha), (a.rank, a.alpha));
    assert_eq!(file.spec.target_modules, a.targets);
    let scale = a.alpha / a.rank as f64;
    assert!(file.scaling.values().all(|s| *s == scale) && file.scaling.len() == a.modules);

    let mut model = fixture_lora_model();
    check("output_lora", &forward(&model));
    assert_eq!(set_lora_scale(&mut model, 0.3), a.modules);
    check("output_lora_attn_scale_0p3", &forward(&model));
    set_lora_scale(&mut model, 1.0);
    check("output_lora", &forward(&model));
}

#[test]
fn merge_matches_fuse_lora_and_unmerge_restores_the_base() {
    let golden = fixture("lora_golden.safetensors");
    let base: HashMap<String, TensorData> =
        named_tensor_data(&fixture_model::<Cpu>(&Default::default()))
            .into_iter()
            .collect();
    let modules = fixture_adapter().modules;
    let mut model = fixture_lora_model();
    assert_eq!(merge_lora(&mut model), modules);
    let merged: HashMap<String, TensorData> = named_tensor_data(&model).into_iter().collect();
    let mut n = 0;
    for (key, want) in golden.iter().filter(|(k, _)| k.starts_with("merged.")) {
        let (err, scale) = max_err(key, &merged[&key["merged.".len()..]], want);
        eprintln!("{key:<40} max|err| = {err:.3e}  (max|ref| = {scale:.3})");
        assert!(err <= 1e-6 * scale.max(1.0), "{key}: {err:.3e}");
        n += 1;
    }
    let want = golden.keys().filter(|k| k.starts_with("merged.")).count();
    assert!(
        n == want && n > 0,
        "{n} of {want} fixture merged weights checked"
    );
    check("output_lora_merged", &forward(&model));

    // A multiplier set while merged acts once unmerged; the unmerge takes back what the
    // merge added (with the multiplier of then), so the base comes back whole below.
    set_lora_scale(&mut model, 0.5);
    check("output_lora_merged", &forward(&model));
    assert_eq!(unmerge_lora(&mut model), modules);
    set_lora_scale(&mut model, 1.0);
    check("output_lora", &forward(&model));
    unload_lora(&mut model);
    let restored = named_tensor_data(&model);
    assert_eq!(restored.len(), base.len(), "no adapter keys after unload");
    let mut worst = 0f64;
    for (key, got) in &restored {
        let (err, _) = max_err(key, got, &base[key]);
        worst = worst.max(err);
    }
    eprintln!("unmerge: max |W - W_base| = {worst:.3e}");
    assert!(worst <= 1e-6, "unmerge left {worst:.3e}");
    check("output_base", &forward(&model));
}

#[test]
fn file_without_metadata_loads_with_scale_one() {
    let (tensors, meta) = read_safetensors(adapter_path()).unwrap();
    assert!(meta.unwrap().contains_key("lora_adapter_metadata"));
    let dir = tempfile::tempdir().unwrap();
    let bare = dir.path().join("bare.safetensors");
    write_safetensors(&bare, &tensors.into_iter().collect::<Vec<_>>(), None).unwrap();
    let file = read_lora_file(&bare).unwrap();
    assert!(!file.has_metadata);
    let rank = fixture_adapter().rank;
    assert_eq!((file.spec.rank, file.spec.alpha), (rank, rank as f64));
    let model = load_lora(fixture_model::<Cpu>(&Default::default()), &bare).unwrap();
    check("output_lora_no_metadata", &forward(&model));
}

#[test]
fn saving_writes_diffusers_keys_and_metadata_and_loads_back() {
    let model = fixture_lora_model();
    let fixture_file = read_lora_file(adapter_path()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let written = save_lora(&model, &fixture_file.spec, dir.path().join("out")).unwrap();
    assert!(written.ends_with("out/pytorch_lora_weights.safetensors"));
    let (ours, meta) = read_safetensors(&written).unwrap();
    let (theirs, their_meta) = read_safetensors(adapter_path()).unwrap();
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        theirs.keys().collect::<Vec<_>>()
    );
    for (k, v) in &theirs {
        assert_eq!(ours[k].as_bytes(), v.as_bytes(), "{k}");
    }
    let (meta, their_meta) = (meta.unwrap(), their_meta.unwrap());
    assert_eq!(meta["format"], their_meta["format"]);
    let ours_json: serde_json::Value =
        serde_json::from_str(&meta["lora_adapter_metadata"]).unwrap();
    let theirs_json: serde_json::Value =
        serde_json::from_str(&their_meta["lora_adapter_metadata"]).unwrap();
    for (k, v) in ours_json.as_object().unwrap() {
        assert_eq!(
            Some(v),
            theirs_json.get(k),
            "metadata field {k} differs from diffusers'"
        );
    }
    let back = load_lora(fixture_model::<Cpu>(&Default::default()), &written).unwrap();
    check("output_lora", &forward(&back));
}

#[test]
fn comfy_style_keys_load_to_the_same_model() {
    // The fixture adapter renamed to the original-Wan / ComfyUI layout, alpha as scalars.
    let alpha = fixture_adapter().alpha as f32;
    let (tensors, _) = read_safetensors(adapter_path()).unwrap();
    let mut comfy = vec![];
    for (k, v) in tensors {
        let k = k
            .replace("transformer.", "diffusion_model.")
            .replace(".attn1.", ".self_attn.")
            .replace(".attn2.", ".cross_attn.")
            .replace(".to_out.0.", ".o.")
            .replace(".to_q.", ".q.")
            .replace(".to_k.", ".k.")
            .replace(".to_v.", ".v.")
            .replace("lora_A", "lora_down")
            .replace("lora_B", "lora_up");
        if k.ends_with("lora_down.weight") {
            comfy.push((
                k.replace("lora_down.weight", "alpha"),
                TensorData::new(vec![alpha], [0usize; 0]),
            ));
        }
        comfy.push((k, v));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("comfy.safetensors");
    write_safetensors(&path, &comfy, None).unwrap();
    let file = read_lora_file(&path).unwrap();
    assert_eq!(file.style, KeyStyle::Comfy);
    let model = load_lora(fixture_model::<Cpu>(&Default::default()), &path).unwrap();
    check("output_lora", &forward(&model));
    // An alpha that is no number (empty, NaN) is an error naming the key, not a NaN scale.
    let first_alpha = comfy
        .iter()
        .position(|(k, _)| k.ends_with(".alpha"))
        .unwrap();
    let key = comfy[first_alpha].0.clone();
    for bad in [vec![], vec![f32::NAN]] {
        let n = bad.len();
        comfy[first_alpha].1 = TensorData::new(bad, [n]);
        write_safetensors(&path, &comfy, None).unwrap();
        let err = read_lora_file(&path).unwrap_err().to_string();
        assert!(
            err.contains(&key) && err.contains("one finite number"),
            "{err}"
        );
    }
}

#[test]
fn fresh_adapter_is_identity_and_only_it_gets_gradients() {
    let _turn = reel_core::parallel::autodiff_turn();
    let dev = Default::default();
    let a = fixture_adapter();
    let spec = LoraSpec {
        alpha: a.alpha,
        init_seed: Some(1),
        ..LoraSpec::new(a.rank, a.targets.clone())
    };
    let fresh = apply_lora(fixture_model::<Cpu>(&dev), &spec, 0).unwrap();
    check("output_base", &forward(&fresh));
    let keys: Vec<String> = lora::lora_tensors(&fresh)
        .into_iter()
        .map(|(k, _)| format!("transformer.{k}"))
        .collect();
    let mut fixture_keys: Vec<String> = read_safetensors(adapter_path())
        .unwrap()
        .0
        .into_keys()
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    fixture_keys.sort();
    assert_eq!(sorted, fixture_keys, "same targets, same keys as PEFT");

    let model = apply_lora(fixture_model::<TestBackend>(&dev), &spec, 0).unwrap();
    let inputs = fixture("inputs.safetensors");
    let out = model.forward(
        tensor(&inputs["hidden_states"], &dev),
        tensor(&inputs["timestep"], &dev),
        tensor(&inputs["encoder_hidden_states"], &dev),
    );
    let grads = out.square().mean().backward();
    let mut with_grad = vec![];
    struct V<'a> {
        path: reel_core::params::PathStack,
        grads: &'a <TestBackend as burn::tensor::backend::AutodiffBackend>::Gradients,
        out: &'a mut Vec<(String, bool)>,
    }
    impl burn::module::ModuleVisitor<TestBackend> for V<'_> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name);
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(
            &mut self,
            p: &burn::module::Param<burn::tensor::Tensor<TestBackend, D>>,
        ) {
            self.out
                .push((self.path.joined(), p.val().grad(self.grads).is_some()));
        }
    }
    model.visit(&mut V {
        path: Default::default(),
        grads: &grads,
        out: &mut with_grad,
    });
    let (lora_params, base): (Vec<_>, Vec<_>) =
        with_grad.iter().partition(|(k, _)| lora::is_lora_key(k));
    assert_eq!(
        lora_params.len(),
        2 * a.modules,
        "lora_A and lora_B per adapted layer"
    );
    // B starts at zero, so A's gradient is zero too, but it exists.
    assert!(
        lora_params.iter().all(|(_, g)| *g),
        "every adapter weight gets a gradient"
    );
    assert!(base.iter().all(|(_, g)| !*g), "base weights are frozen");
}
