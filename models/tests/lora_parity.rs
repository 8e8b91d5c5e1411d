//! LoRA parity with diffusers + PEFT (`shared/fixtures/wan_tiny`, section 4 of its README):
//! the adapter file loads onto the fixture model and reproduces every golden output; merged
//! weights equal `fuse_lora`'s; unmerge restores the base; saving writes the same keys and
//! metadata diffusers does.

mod common;

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

fn fixture_lora_model() -> WanModel<Cpu> {
    load_lora(fixture_model::<Cpu>(&Default::default()), adapter_path())
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn fixture_adapter_reproduces_output_lora_and_its_runtime_scale() {
    let file = read_lora_file(adapter_path()).unwrap();
    assert!(file.has_metadata);
    assert_eq!(file.style, KeyStyle::Diffusers);
    assert_eq!((file.spec.rank, file.spec.alpha), (4, 8.0));
    assert_eq!(
        file.spec.target_modules,
        ["to_k", "to_out.0", "to_q", "to_v"]
    );
    assert!(file.scaling.values().all(|s| *s == 2.0) && file.scaling.len() == 16);

    let mut model = fixture_lora_model();
    check("output_lora", &forward(&model));
    assert_eq!(set_lora_scale(&mut model, 0.3), 16);
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
    let mut model = fixture_lora_model();
    assert_eq!(merge_lora(&mut model), 16);
    let merged: HashMap<String, TensorData> = named_tensor_data(&model).into_iter().collect();
    let mut n = 0;
    for (key, want) in golden.iter().filter(|(k, _)| k.starts_with("merged.")) {
        let (err, scale) = max_err(key, &merged[&key["merged.".len()..]], want);
        eprintln!("{key:<40} max|err| = {err:.3e}  (max|ref| = {scale:.3})");
        assert!(err <= 1e-6 * scale.max(1.0), "{key}: {err:.3e}");
        n += 1;
    }
    assert_eq!(n, 3, "fixture merged weights");
    check("output_lora_merged", &forward(&model));

    assert_eq!(unmerge_lora(&mut model), 16);
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
    assert_eq!((file.spec.rank, file.spec.alpha), (4, 4.0));
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
                TensorData::new(vec![8.0f32], [0usize; 0]),
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
}

#[test]
fn fresh_adapter_is_identity_and_only_it_gets_gradients() {
    let dev = Default::default();
    let spec = LoraSpec {
        alpha: 8.0,
        init_seed: Some(1),
        ..LoraSpec::new(
            4,
            vec![
                "to_q".into(),
                "to_k".into(),
                "to_v".into(),
                "to_out.0".into(),
            ],
        )
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
    assert_eq!(lora_params.len(), 32);
    // B starts at zero, so A's gradient is zero too, but it exists.
    assert!(
        lora_params.iter().all(|(_, g)| *g),
        "every adapter weight gets a gradient"
    );
    assert!(base.iter().all(|(_, g)| !*g), "base weights are frozen");
}
