//! Tests of the weight I/O.

use std::collections::{BTreeMap, HashMap};

use burn::module::{Module, Param};
use burn::tensor::{backend::Backend, Tensor, TensorData};

use super::*;
use crate::params::{named_param_shapes, named_params, named_tensor_data, num_param_values};
use burn::module::ParamId;
use burn::tensor::Shape;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

type Inner = burn::backend::Flex;
type AD = burn::backend::Autodiff<Inner>;

#[derive(Module, Debug)]
struct Lin<B: Backend> {
    weight: Param<Tensor<B, 2>>,
    bias: Option<Param<Tensor<B, 1>>>,
}

#[derive(Module, Debug)]
struct Tiny<B: Backend> {
    blocks: Vec<Lin<B>>,
    to_out: Vec<Lin<B>>,
    table: Param<Tensor<B, 3>>,
    head: Lin<B>,
}

fn lin<B: Backend>(o: usize, i: usize, bias: bool, start: f32, dev: &B::Device) -> Lin<B> {
    let w: Vec<f32> = (0..o * i).map(|k| start + k as f32 * 0.25).collect();
    Lin {
        weight: Param::from_data(TensorData::new(w, [o, i]), dev),
        bias: bias.then(|| Param::from_data(TensorData::new(vec![start; o], [o]), dev)),
    }
}

fn tiny<B: Backend>(dev: &B::Device, start: f32) -> Tiny<B> {
    Tiny {
        blocks: vec![
            lin(3, 2, true, start, dev),
            lin(3, 2, false, start + 1.0, dev),
        ],
        to_out: vec![lin(2, 2, true, start + 2.0, dev)],
        table: Param::from_data(TensorData::new(vec![start; 6], [1, 2, 3]), dev),
        head: lin(1, 3, true, start + 3.0, dev),
    }
}

fn data_of(m: &Tiny<Inner>) -> BTreeMap<String, TensorData> {
    named_tensor_data(m).into_iter().collect()
}

#[test]
fn paths_follow_field_names_vec_indices_and_skip_option() {
    let dev = Default::default();
    let m = tiny::<Inner>(&dev, 0.0);
    let paths: Vec<String> = named_params(&m).into_iter().map(|p| p.path).collect();
    assert_eq!(
        paths,
        vec![
            "blocks.0.weight",
            "blocks.0.bias",
            "blocks.1.weight",
            "to_out.0.weight",
            "to_out.0.bias",
            "table",
            "head.weight",
            "head.bias"
        ]
    );
    let shapes: Vec<String> = named_param_shapes::<Inner, _>(&m)
        .into_iter()
        .map(|p| p.path)
        .collect();
    assert_eq!(paths, shapes);
}

#[test]
fn write_read_roundtrip_f32_is_bit_exact_and_keeps_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let m = tiny::<Inner>(&Default::default(), 0.1);
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    module_to_safetensors(&m, &path, Some(meta.clone())).unwrap();
    let (read, read_meta) = read_safetensors(&path).unwrap();
    assert_eq!(read_meta, Some(meta));
    let orig = data_of(&m);
    assert_eq!(
        read.keys().collect::<Vec<_>>(),
        orig.keys().collect::<Vec<_>>()
    );
    for (k, v) in &orig {
        assert_eq!(read[k].shape, v.shape, "{k}");
        assert_eq!(read[k].as_bytes(), v.as_bytes(), "{k}");
    }
}

#[test]
fn the_same_weights_and_metadata_write_the_same_bytes() {
    // A checkpoint's metadata has several keys; each save builds its own `HashMap`, whose
    // iteration order differs from the last one's.
    let dir = tempfile::tempdir().unwrap();
    let t = vec![(
        "w".to_string(),
        TensorData::new(vec![1.5f32, -2.0, 0.25], [3]),
    )];
    let meta = || {
        let keys = ["role", "step", "format", "method", "seed"];
        Some(
            keys.iter()
                .map(|k| (k.to_string(), format!("{k}!")))
                .collect(),
        )
    };
    let files: Vec<Vec<u8>> = (0..4)
        .map(|i| {
            let path = dir.path().join(format!("{i}.safetensors"));
            write_safetensors(&path, &t, meta()).unwrap();
            std::fs::read(path).unwrap()
        })
        .collect();
    assert!(files.windows(2).all(|w| w[0] == w[1]));
    let (_, read_meta) = read_safetensors(dir.path().join("0.safetensors")).unwrap();
    assert_eq!(read_meta, meta());
}

#[test]
fn half_precision_files_are_read_as_f32() {
    let dir = tempfile::tempdir().unwrap();
    let vals = vec![1.0f32, -2.5, 0.1, 3.0e-3];
    let t = vec![("x".to_string(), TensorData::new(vals.clone(), [2, 2]))];
    for (dt, round) in [
        (
            StoreDtype::BF16,
            (|v: f32| half::bf16::from_f32(v).to_f32()) as fn(f32) -> f32,
        ),
        (StoreDtype::F16, |v: f32| half::f16::from_f32(v).to_f32()),
    ] {
        let path = dir.path().join(format!("{dt:?}.safetensors"));
        write_safetensors_as(&path, &t, None, dt).unwrap();
        let header = read_safetensors_header(&path).unwrap();
        assert_eq!(header["x"].shape, vec![2, 2]);
        assert_eq!(header["x"].dtype, format!("{dt:?}"));
        let (read, meta) = read_safetensors(&path).unwrap();
        assert!(meta.is_none());
        let got = read["x"].to_vec::<f32>().unwrap();
        let want: Vec<f32> = vals.iter().map(|v| round(*v)).collect();
        assert_eq!(got, want, "{dt:?}");
    }
}

#[test]
fn load_replaces_values_and_keeps_ids_and_require_grad() {
    let dev = Default::default();
    let src = data_of(&tiny::<Inner>(&dev, 5.0));
    let m = tiny::<AD>(&dev, 0.0);
    // Freeze one parameter to check the flag is kept per parameter.
    let m = Tiny {
        head: Lin {
            weight: m.head.weight.clone().set_require_grad(false),
            ..m.head.clone()
        },
        ..m
    };
    let before: Vec<(String, ParamId)> = named_params(&m)
        .into_iter()
        .map(|p| (p.path, p.id))
        .collect();
    let loaded = load_module_tensors(m, &src, &LoadOptions::default()).unwrap();
    let after: Vec<(String, ParamId)> = named_params(&loaded)
        .into_iter()
        .map(|p| (p.path, p.id))
        .collect();
    assert_eq!(before, after);
    for (k, v) in named_tensor_data(&loaded) {
        assert_eq!(v.as_bytes(), src[&k].as_bytes(), "{k}");
    }
    assert!(loaded.blocks[0].weight.val().is_require_grad());
    assert!(loaded.table.val().is_require_grad());
    assert!(!loaded.head.weight.val().is_require_grad());
    assert!(loaded.head.bias.as_ref().unwrap().val().is_require_grad());
}

#[test]
fn load_does_not_run_lazy_initializers() {
    let dev: burn::tensor::Device<Inner> = Default::default();
    let ran = Arc::new(AtomicBool::new(false));
    let flag = ran.clone();
    let lazy: Param<Tensor<Inner, 2>> = Param::uninitialized(
        ParamId::new(),
        move |d, _| {
            flag.store(true, Ordering::SeqCst);
            Tensor::zeros([3, 2], d)
        },
        dev,
        true,
        Shape::new([3, 2]),
    );
    let id = lazy.id;
    let m = Lin::<Inner> {
        weight: lazy,
        bias: None,
    };
    let src = BTreeMap::from([(
        "weight".to_string(),
        TensorData::new(vec![1.0f32; 6], [3, 2]),
    )]);
    let m = load_module_tensors(m, &src, &LoadOptions::default()).unwrap();
    assert_eq!(m.weight.id, id);
    assert_eq!(
        m.weight.val().into_data().to_vec::<f32>().unwrap(),
        vec![1.0; 6]
    );
    assert!(!ran.load(Ordering::SeqCst), "initializer ran during load");
}

/// A parameter of `shape` whose initializer records that it ran.
fn lazy_param(shape: [usize; 2], ran: &Arc<AtomicBool>) -> Param<Tensor<Inner, 2>> {
    let flag = ran.clone();
    Param::uninitialized(
        ParamId::new(),
        move |d, _| {
            flag.store(true, Ordering::SeqCst);
            Tensor::zeros([1, 1], d)
        },
        Default::default(),
        true,
        Shape::new(shape),
    )
}

#[test]
fn values_are_counted_from_shapes_without_initializing_and_saturate() {
    let ran = Arc::new(AtomicBool::new(false));
    let dev = Default::default();
    let m = Tiny {
        blocks: vec![Lin {
            weight: lazy_param([5, 7], &ran),
            bias: None,
        }],
        to_out: vec![lin(2, 2, true, 0.0, &dev)],
        table: Param::from_data(TensorData::new(vec![0.0f32; 6], [1, 2, 3]), &dev),
        head: lin(1, 3, false, 0.0, &dev),
    };
    assert_eq!(num_param_values(&m), 35 + (4 + 2) + 6 + 3);
    assert!(
        !ran.load(Ordering::SeqCst),
        "initializer ran while counting"
    );
    let huge = Lin::<Inner> {
        weight: lazy_param([usize::MAX, 3], &ran),
        bias: None,
    };
    assert_eq!(num_param_values(&huge), u64::MAX);
    assert!(!ran.load(Ordering::SeqCst));
}

#[test]
fn mismatch_lists_every_problem() {
    let dev = Default::default();
    let mut src = data_of(&tiny::<Inner>(&dev, 1.0));
    src.remove("blocks.0.bias");
    src.remove("head.weight");
    src.insert("extra.weight".into(), TensorData::new(vec![0.0f32; 2], [2]));
    src.insert("table".into(), TensorData::new(vec![0.0f32; 6], [2, 3]));
    let m = tiny::<Inner>(&dev, 0.0);
    let err = load_module_tensors(m, &src, &LoadOptions::from_source("x.safetensors")).unwrap_err();
    let WeightError::Mismatch(mm) = &err else {
        panic!("unexpected error {err}");
    };
    assert_eq!(mm.missing, vec!["blocks.0.bias", "head.weight"]);
    assert_eq!(mm.unexpected, vec!["extra.weight"]);
    assert_eq!(
        mm.wrong_shape,
        vec![ShapeMismatch {
            key: "table".into(),
            expected: vec![1, 2, 3],
            found: vec![2, 3]
        }]
    );
    let msg = err.to_string();
    for needle in [
        "x.safetensors",
        "blocks.0.bias",
        "head.weight",
        "extra.weight",
        "table: expected [1, 2, 3], found [2, 3]",
    ] {
        assert!(msg.contains(needle), "`{needle}` not in: {msg}");
    }
}

#[test]
fn non_strict_partial_load_reports() {
    let dev = Default::default();
    let mut src = data_of(&tiny::<Inner>(&dev, 1.0));
    src.retain(|k, _| k.starts_with("blocks."));
    src.insert("extra".into(), TensorData::new(vec![0.0f32], [1]));
    let opts = LoadOptions {
        strict: false,
        allow_missing: true,
        ..LoadOptions::default()
    };
    let m = tiny::<Inner>(&dev, 0.0);
    let (m, report) = load_module_tensors_report(m, &src, &opts).unwrap();
    assert_eq!(
        report.loaded,
        vec!["blocks.0.bias", "blocks.0.weight", "blocks.1.weight"]
    );
    assert_eq!(report.unexpected, vec!["extra"]);
    assert_eq!(report.missing.len(), 5);
    let got = m.blocks[1].weight.val().into_data();
    assert_eq!(got.as_bytes(), src["blocks.1.weight"].as_bytes());
    // untouched parameter keeps its old value
    let head = m.head.weight.val().into_data().to_vec::<f32>().unwrap();
    assert_eq!(head[0], 3.0);
}

#[test]
fn unreadable_and_bad_files_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.safetensors");
    let err = read_safetensors(&missing).unwrap_err();
    assert!(err.to_string().contains("nope.safetensors"), "{err}");
    let bad = dir.path().join("bad.safetensors");
    std::fs::write(&bad, b"not a safetensors file").unwrap();
    let err = read_safetensors(&bad).unwrap_err();
    assert!(matches!(err, WeightError::Format { .. }));
    assert!(err.to_string().contains("bad.safetensors"), "{err}");
}

/// An interrupted download or copy: the file cut inside the length prefix, the header and
/// the data, and one with a byte too many, each refused by both readers with the reason.
#[test]
fn cut_or_padded_files_are_refused_by_length() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.safetensors");
    let t = TensorData::new(vec![1.0f32, 2.0, 3.0], [3]);
    write_safetensors(&good, &[("a".into(), t.clone()), ("b".into(), t)], None).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let header = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!(read_safetensors_header(&good).unwrap().len(), 2);
    let mut padded = bytes.clone();
    padded.push(0);
    // A corrupt header whose data offset is the largest number JSON can hold here.
    let huge = br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551615]}}"#;
    let mut absurd = (huge.len() as u64).to_le_bytes().to_vec();
    absurd.extend_from_slice(huge);
    absurd.extend_from_slice(&[0; 4]);
    let cases = [
        (absurd, "truncated"),
        (bytes[..5].to_vec(), "truncated"),
        (bytes[..header - 1].to_vec(), "truncated"),
        (bytes[..bytes.len() - 1].to_vec(), "truncated"),
        (bytes[..header].to_vec(), "truncated"),
        (padded, "1 bytes after its last tensor"),
    ];
    for (i, (content, reason)) in cases.into_iter().enumerate() {
        let path = dir.path().join(format!("cut{i}.safetensors"));
        std::fs::write(&path, &content).unwrap();
        let len = content.len().to_string();
        for err in [
            read_safetensors(&path).unwrap_err(),
            read_safetensors_header(&path).unwrap_err(),
        ] {
            let msg = err.to_string();
            assert!(matches!(err, WeightError::Format { .. }), "case {i}: {msg}");
            assert!(
                msg.contains(&format!("cut{i}.safetensors")),
                "case {i}: {msg}"
            );
            assert!(
                msg.contains(reason) && msg.contains(&len),
                "case {i}: {msg}"
            );
        }
    }
}

#[test]
fn duplicate_keys_are_rejected_on_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.safetensors");
    let t = TensorData::new(vec![0.0f32], [1]);
    let err =
        write_safetensors(&path, &[("a".into(), t.clone()), ("a".into(), t)], None).unwrap_err();
    assert!(err.to_string().contains("more than once"), "{err}");
}

#[test]
fn long_mismatch_lists_are_counted_and_prefixes_hinted() {
    let keys: Vec<String> = (0..30).map(|i| format!("blocks.{i:02}.weight")).collect();
    let mismatch = KeyMismatch {
        source: "optim.safetensors".into(),
        missing: keys.clone(),
        unexpected: keys
            .iter()
            .flat_map(|k| [format!("exp_avg.{k}"), format!("exp_avg_sq.{k}")])
            .chain(["other.thing".to_string()])
            .collect(),
        wrong_shape: (0..10)
            .map(|i| ShapeMismatch {
                key: format!("t{i}"),
                expected: vec![2],
                found: vec![3],
            })
            .collect(),
        hints: vec!["hint: a loader's own line".into()],
    };
    let msg = mismatch.to_string();
    assert!(
        msg.contains("30 missing key(s): blocks.00.weight, blocks.01.weight"),
        "{msg}"
    );
    assert!(msg.contains("blocks.07.weight, ... and 22 more\n"), "{msg}");
    assert!(!msg.contains("blocks.08.weight"), "{msg}");
    assert!(msg.contains("61 unexpected key(s):"), "{msg}");
    assert!(
        msg.contains("t7: expected [2], found [3]\n    ... and 2 more"),
        "{msg}"
    );
    assert!(!msg.contains("t8:"), "{msg}");
    assert!(
        msg.ends_with(
            "hint: 60 unexpected key(s) are the model's own keys under a prefix (`exp_avg.` 30, \
             `exp_avg_sq.` 30): a file saved from a wrapper module, or not the weights (an \
             optimizer state?)\n  hint: a loader's own line"
        ),
        "{msg}"
    );
    // Nothing under a prefix: no hint; short lists in full.
    assert_eq!(prefix_hint(&["a.b"], &["c.d", "a.b.c"]), None);
    assert_eq!(key_list(&["x", "y"]), "x, y");
}
