//! Weight I/O in the diffusers layout: round trips, sharded checkpoints, half precision on
//! disk, and errors that name every bad key.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use burn::tensor::TensorData;
use common::*;
use reel_core::io::{read_safetensors, write_safetensors, write_safetensors_as, StoreDtype};
use reel_core::params::named_tensor_data;
use reel_models::wan::weights::{resolve_weights, WeightSource, INDEX_FILE, WEIGHTS_FILE};
use reel_models::WanModel;

fn fixture_weights() -> BTreeMap<String, TensorData> {
    fixture("model.safetensors")
}

fn model_data(model: &WanModel<Cpu>) -> BTreeMap<String, TensorData> {
    named_tensor_data(model).into_iter().collect()
}

fn assert_bit_equal(a: &BTreeMap<String, TensorData>, b: &BTreeMap<String, TensorData>) {
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "key sets differ"
    );
    for (k, v) in a {
        assert_eq!(v.shape, b[k].shape, "{k}");
        assert_eq!(v.as_bytes(), b[k].as_bytes(), "{k} differs");
    }
}

#[test]
fn module_keys_equal_diffusers_keys() {
    let model = fixture_config().init::<Cpu>(&Default::default());
    let ours: BTreeSet<String> = reel_core::params::named_param_shapes::<Cpu, _>(&model)
        .into_iter()
        .map(|p| p.path)
        .collect();
    let theirs: BTreeSet<String> = fixture_weights().into_keys().collect();
    assert_eq!(ours, theirs);
    for i in 0..fixture_config().num_layers {
        for key in [
            "attn1.to_q.weight",
            "attn2.to_out.0.bias",
            "ffn.net.0.proj.weight",
            "ffn.net.2.weight",
        ] {
            assert!(
                ours.contains(&format!("blocks.{i}.{key}")),
                "blocks.{i}.{key}"
            );
        }
    }
}

/// The architecture counts a role's parameters from its config alone (for the memory floor
/// of `reel check` and `reel train`): as many as the fixture checkpoint stores and as the
/// model built from the config holds.
#[test]
fn the_parameter_count_from_the_config_is_the_checkpoints() {
    let config = fixtures_dir().join("config.json");
    let table = format!("arch = \"wan\"\nconfig = {:?}\ntrainable = true\n", config);
    let role: reel_core::role::RoleConfig = toml::from_str(&table).unwrap();
    let counted = role
        .model
        .num_params(&role, &|p| p.to_path_buf())
        .unwrap()
        .expect("wan counts its parameters");
    let stored: u64 = fixture_weights()
        .values()
        .map(|t| t.shape.iter().product::<usize>() as u64)
        .sum();
    assert_eq!(counted, stored);
    let built = fixture_config().init::<Cpu>(&Default::default());
    assert_eq!(counted, burn::module::Module::num_params(&built) as u64);
}

#[test]
fn load_then_save_round_trips_bit_exactly() {
    let dev = Default::default();
    let model = fixture_model::<Cpu>(&dev);
    assert_bit_equal(&model_data(&model), &fixture_weights());

    let dir = tempfile::tempdir().unwrap();
    model.save_pretrained(dir.path()).unwrap();
    let (saved, meta) = read_safetensors(dir.path().join(WEIGHTS_FILE)).unwrap();
    assert_eq!(meta.unwrap()["format"], "pt");
    assert_bit_equal(&saved, &fixture_weights());

    // config.json is the diffusers config, and the folder loads back to the same weights.
    let config = reel_models::WanConfig::from_json_file(dir.path().join("config.json")).unwrap();
    assert_eq!(config, fixture_config());
    let back = WanModel::<Cpu>::from_pretrained(dir.path(), &dev).unwrap();
    assert_bit_equal(&model_data(&back), &fixture_weights());
}

#[test]
fn sharded_checkpoint_loads() {
    let dev = Default::default();
    let weights = fixture_weights();
    let dir = tempfile::tempdir().unwrap();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let mut map = serde_json::Map::new();
    for (i, (k, v)) in weights.iter().enumerate() {
        let shard = if i % 2 == 0 {
            a.push((k.clone(), v.clone()));
            "diffusion_pytorch_model-00001-of-00002.safetensors"
        } else {
            b.push((k.clone(), v.clone()));
            "diffusion_pytorch_model-00002-of-00002.safetensors"
        };
        map.insert(k.clone(), shard.into());
    }
    write_safetensors(
        dir.path()
            .join("diffusion_pytorch_model-00001-of-00002.safetensors"),
        &a,
        None,
    )
    .unwrap();
    // The second shard is stored in bf16, as real checkpoints often are.
    write_safetensors_as(
        dir.path()
            .join("diffusion_pytorch_model-00002-of-00002.safetensors"),
        &b,
        None,
        StoreDtype::BF16,
    )
    .unwrap();
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.path().join(INDEX_FILE), index.to_string()).unwrap();
    std::fs::copy(
        fixtures_dir().join("config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();

    match resolve_weights(dir.path()).unwrap() {
        WeightSource::Sharded { shards, .. } => assert_eq!(shards.len(), 2),
        other => panic!("expected a sharded source, got {other:?}"),
    }
    let model = WanModel::<Cpu>::from_pretrained(dir.path(), &dev).unwrap();
    let got = model_data(&model);
    for (k, want) in &weights {
        let g = values(&got[k]);
        let w = values(want);
        let bf16 = b.iter().any(|(n, _)| n == k);
        for (x, y) in g.iter().zip(&w) {
            let y = if bf16 {
                half::bf16::from_f32(*y).to_f32()
            } else {
                *y
            };
            assert_eq!(x.to_bits(), y.to_bits(), "{k}");
        }
    }
}

#[test]
fn bad_checkpoint_names_missing_extra_and_misshaped_keys() {
    let dev = Default::default();
    let mut weights = fixture_weights();
    let missing = format!("blocks.{}.attn2.to_k.bias", fixture_config().num_layers - 1);
    weights.remove(&missing);
    weights.insert(
        "blocks.0.attn1.lora_A.weight".into(),
        TensorData::new(vec![0.0f32; 4], [2, 2]),
    );
    let proj = weights["proj_out.weight"].shape.to_vec();
    let wrong = [proj[0] + 1, proj[1]];
    weights.insert(
        "proj_out.weight".into(),
        TensorData::new(vec![0.0f32; wrong[0] * wrong[1]], wrong),
    );
    let shape_error = format!("proj_out.weight: expected {proj:?}, found {wrong:?}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broken.safetensors");
    let list: Vec<(String, TensorData)> = weights.into_iter().collect();
    write_safetensors(&file, &list, None).unwrap();

    let model = fixture_config().init::<Cpu>(&dev);
    let err = model.load_weights(&file).unwrap_err().to_string();
    eprintln!("{err}");
    for needle in [
        "broken.safetensors",
        "missing",
        &missing,
        "unexpected",
        "blocks.0.attn1.lora_A.weight",
        &shape_error,
    ] {
        assert!(err.contains(needle), "`{needle}` not in:\n{err}");
    }

    // The same problems through a sharded index are reported together, naming the index.
    let shard = "diffusion_pytorch_model-00001-of-00001.safetensors";
    std::fs::rename(&file, dir.path().join(shard)).unwrap();
    let map: serde_json::Map<String, serde_json::Value> = list
        .iter()
        .map(|(k, _)| (k.clone(), shard.into()))
        .collect();
    std::fs::write(
        dir.path().join(INDEX_FILE),
        serde_json::json!({ "weight_map": map }).to_string(),
    )
    .unwrap();
    let model = fixture_config().init::<Cpu>(&dev);
    let err = model.load_weights(dir.path()).unwrap_err().to_string();
    assert!(err.contains(INDEX_FILE), "{err}");
    assert!(err.contains(&missing), "{err}");
    assert!(err.contains("blocks.0.attn1.lora_A.weight"), "{err}");
    assert!(err.contains("proj_out.weight"), "{err}");
}

#[test]
fn weights_of_another_layout_get_a_short_report_and_a_hint() {
    let dev = Default::default();
    let weights = fixture_weights();
    let count = weights.len();
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, rename: &dyn Fn(&str) -> String| {
        let file = dir.path().join(name);
        let list: Vec<(String, TensorData)> = weights
            .iter()
            .map(|(k, v)| (rename(k), v.clone()))
            .collect();
        write_safetensors(&file, &list, None).unwrap();
        file
    };
    // A wrapper's prefix (as ComfyUI saves a DiT): every key is the model's under it.
    let file = write("wrapped.safetensors", &|k| {
        format!("model.diffusion_model.{k}")
    });
    let model = fixture_config().init::<Cpu>(&dev);
    let err = model.load_weights(&file).unwrap_err().to_string();
    let more = count - reel_core::io::LISTED;
    assert!(err.contains(&format!("{count} missing key(s)")), "{err}");
    assert!(err.contains(&format!("... and {more} more")), "{err}");
    assert!(err.lines().all(|l| l.len() < 1000), "{err}");
    assert!(
        err.contains(&format!(
            "under a prefix (`model.diffusion_model.` {count})"
        )),
        "{err}"
    );
    assert!(!err.contains("original Wan release"), "{err}");
    // The original Wan release's names for the self-attention's projections.
    let file = write("original.safetensors", &|k| {
        k.replace("attn1.to_out.0", "self_attn.o")
            .replace("attn1.to_", "self_attn.")
    });
    let model = fixture_config().init::<Cpu>(&dev);
    let err = reel_models::wan::weights::check_weights(&model, &file)
        .unwrap_err()
        .to_string();
    assert!(err.contains("original Wan release's key names"), "{err}");
    assert!(!err.contains("under a prefix"), "{err}");
}

#[test]
fn missing_weights_folder_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixture_config().init::<Cpu>(&Default::default());
    let err = model.load_weights(dir.path()).unwrap_err().to_string();
    assert!(err.contains(WEIGHTS_FILE), "{err}");
}
