//! Adapter files: save a model's adapter in the diffusers / PEFT layout (or the ComfyUI one),
//! read diffusers,
//! PEFT, Reel-checkpoint and ComfyUI files (see [`format`](super::format) for the layouts),
//! and attach a file's adapters to a model (diffusers `load_lora_weights`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use burn::module::{Module, Param};
use burn::tensor::{backend::Backend, Tensor, TensorData};
use serde_json::Value;

use crate::lora::{target_matches, LoraSpec};
use reel_core::io::{read_safetensors, write_safetensors};

use super::format::{
    diffusers_module_to_comfy, file_err, lora_metadata_json, metadata_fields, normalise, KeyStyle,
    METADATA_KEY, PREFIX,
};
use super::{
    lora_tensors, pair_lora_keys, wan_linears_mut, LoraError, LORA_A_SUFFIX, LORA_B_SUFFIX,
};
use crate::wan::WanModel;

/// File name diffusers uses for an adapter (`pytorch_lora_weights.safetensors`).
pub const LORA_WEIGHTS_FILE: &str = "pytorch_lora_weights.safetensors";

/// An adapter read by [`read_lora_file`].
#[derive(Debug, Clone)]
pub struct LoraFile {
    /// The file.
    pub path: PathBuf,
    /// Tensors keyed by Reel parameter path (`blocks.0.attn1.to_q.lora_A.weight`).
    pub tensors: BTreeMap<String, TensorData>,
    /// The adapter config: from the metadata, else `r` = the most common rank, `alpha = r`
    /// and the adapted module paths as targets.
    pub spec: LoraSpec,
    /// Scale `alpha / r` of each adapted module (per-module ranks, `alpha_pattern`,
    /// ComfyUI `.alpha` scalars and rsLoRA taken into account).
    pub scaling: BTreeMap<String, f64>,
    /// Whether the file carried `lora_adapter_metadata`.
    pub has_metadata: bool,
    /// The key layout found.
    pub style: KeyStyle,
}

/// The file an adapter saved at `path` goes to: `path` itself when it names a `.safetensors`
/// file (not a folder), else `path/<default_name>`.
pub fn adapter_target(path: &Path, default_name: &str) -> PathBuf {
    if !path.is_dir() && path.extension().is_some_and(|e| e == "safetensors") {
        return path.to_path_buf();
    }
    path.join(default_name)
}

/// [`adapter_target`], with its folder created.
fn adapter_path(path: &Path, default_name: &str) -> Result<PathBuf, LoraError> {
    let target = adapter_target(path, default_name);
    if target != path {
        std::fs::create_dir_all(path).map_err(|e| file_err(path, e.to_string()))?;
    }
    Ok(target)
}

/// Write the adapter of `model` as a diffusers LoRA file with `spec` as its metadata. `path`
/// is a file, or a folder that receives [`LORA_WEIGHTS_FILE`]. Returns the file written.
pub fn save_lora<B: Backend>(
    model: &WanModel<B>,
    spec: &LoraSpec,
    path: impl AsRef<Path>,
) -> Result<PathBuf, LoraError> {
    let path = adapter_path(path.as_ref(), LORA_WEIGHTS_FILE)?;
    let tensors: Vec<(String, TensorData)> = lora_tensors(model)
        .into_iter()
        .map(|(k, v)| (format!("{PREFIX}{k}"), v))
        .collect();
    if tensors.is_empty() {
        return Err(file_err(
            &path,
            "the model has no LoRA adapter to save".into(),
        ));
    }
    let meta = HashMap::from([
        ("format".to_string(), "pt".to_string()),
        (METADATA_KEY.to_string(), lora_metadata_json(spec)),
    ]);
    write_safetensors(&path, &tensors, Some(meta))?;
    Ok(path)
}

/// File name of an adapter written in the ComfyUI / original-Wan key style.
pub const COMFY_LORA_FILE: &str = "lora_comfyui.safetensors";

/// Write the adapter of `model` in the ComfyUI / original-Wan key style that ComfyUI's Wan
/// LoRA loader reads: `diffusion_model.<wan module>.lora_down.weight` `[r, in]`,
/// `….lora_up.weight` `[out, r]` and a scalar `….alpha` (= `spec.alpha`, so the scale stays
/// `alpha / r`). `path` is a file, or a folder that receives [`COMFY_LORA_FILE`]. Fails,
/// naming them, when adapted modules have no original-Wan name.
pub fn save_lora_comfy<B: Backend>(
    model: &WanModel<B>,
    spec: &LoraSpec,
    path: impl AsRef<Path>,
) -> Result<PathBuf, LoraError> {
    let path = adapter_path(path.as_ref(), COMFY_LORA_FILE)?;
    let mut tensors = Vec::new();
    let mut unnamed = Vec::new();
    for (key, value) in lora_tensors(model) {
        let (module, kind) = if let Some(m) = key.strip_suffix(LORA_A_SUFFIX) {
            (m, "lora_down")
        } else if let Some(m) = key.strip_suffix(LORA_B_SUFFIX) {
            (m, "lora_up")
        } else {
            continue;
        };
        let Some(comfy) = diffusers_module_to_comfy(module) else {
            unnamed.push(module.to_string());
            continue;
        };
        if kind == "lora_down" {
            tensors.push((
                format!("diffusion_model.{comfy}.alpha"),
                TensorData::new(vec![spec.alpha as f32], Vec::<usize>::new()),
            ));
        }
        tensors.push((format!("diffusion_model.{comfy}.{kind}.weight"), value));
    }
    if !unnamed.is_empty() {
        unnamed.dedup();
        return Err(file_err(
            &path,
            format!("modules without an original-Wan (ComfyUI) name: {unnamed:?}"),
        ));
    }
    if tensors.is_empty() {
        return Err(file_err(
            &path,
            "the model has no LoRA adapter to save".into(),
        ));
    }
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors(&path, &tensors, Some(meta))?;
    Ok(path)
}

/// Read an adapter file (diffusers, PEFT, Reel checkpoint or ComfyUI keys) and work out its
/// config and per-module scales. Errors name the file and the offending keys or fields.
pub fn read_lora_file(path: impl AsRef<Path>) -> Result<LoraFile, LoraError> {
    let path = path.as_ref();
    let (raw, meta) = read_safetensors(path)?;
    let (tensors, comfy_alpha, style) = normalise(path, raw)?;
    let pairs = pair_lora_keys(tensors.keys()).map_err(|m| file_err(path, m))?;
    if pairs.is_empty() {
        return Err(file_err(path, "no LoRA tensors".into()));
    }
    let mut ranks = BTreeMap::new();
    for (module, (ka, kb)) in &pairs {
        let (sa, sb) = (tensors[ka].shape.as_slice(), tensors[kb].shape.as_slice());
        if sa.len() != 2 || sb.len() != 2 || sa[0] != sb[1] {
            return Err(file_err(
                path,
                format!("`{module}`: lora_A {sa:?} and lora_B {sb:?} are not [r, in] and [out, r]"),
            ));
        }
        ranks.insert(module.clone(), sa[0]);
    }
    let mut counts = BTreeMap::new();
    for r in ranks.values() {
        *counts.entry(*r).or_insert(0usize) += 1;
    }
    let common_rank = counts
        .iter()
        .max_by_key(|(r, n)| (**n, std::cmp::Reverse(**r)))
        .map(|(r, _)| *r)
        .expect("non-empty");
    let meta = meta.unwrap_or_default();
    if meta.get("format").is_some_and(|f| f == "reel") && !meta.contains_key(METADATA_KEY) {
        // A checkpoint's weights file: without the alpha its scale would be guessed as 1.
        return Err(file_err(
            path,
            "a Reel checkpoint's weights: they hold the adapter's tensors but not its alpha, \
             so their scale is unknown; `reel export <checkpoint> --format lora` writes an \
             adapter file that has it"
                .into(),
        ));
    }
    let fields = metadata_fields(path, &meta)?;
    let has_metadata = fields.is_some();
    let fields = fields.unwrap_or_default();
    let num = |k: &str| fields.get(k).and_then(Value::as_f64);
    let flag = |k: &str| fields.get(k).and_then(Value::as_bool).unwrap_or(false);
    if flag("use_dora") {
        return Err(file_err(
            path,
            "DoRA adapters (`use_dora = true`) are not supported".into(),
        ));
    }
    let rank = num("r").map(|r| r as usize).unwrap_or(common_rank);
    let alpha = num("lora_alpha").unwrap_or(rank as f64);
    let targets = match fields.get("target_modules").and_then(Value::as_array) {
        Some(a) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        None => pairs.keys().cloned().collect(),
    };
    let pattern = |k: &str| -> Vec<(String, f64)> {
        fields
            .get(k)
            .and_then(Value::as_object)
            .map(|o| {
                o.iter()
                    .filter_map(|(p, v)| Some((p.clone(), v.as_f64()?)))
                    .collect()
            })
            .unwrap_or_default()
    };
    let alpha_pattern = pattern("alpha_pattern");
    let mut scaling = BTreeMap::new();
    for (module, r) in &ranks {
        let a = comfy_alpha
            .get(module)
            .copied()
            .or_else(|| {
                alpha_pattern
                    .iter()
                    .find(|(p, _)| target_matches(module, p))
                    .map(|(_, a)| *a)
            })
            .unwrap_or(if style == KeyStyle::Comfy {
                *r as f64
            } else {
                alpha
            });
        let denom = if flag("use_rslora") {
            (*r as f64).sqrt()
        } else {
            *r as f64
        };
        scaling.insert(module.clone(), a / denom);
    }
    let spec = LoraSpec {
        rank,
        alpha,
        target_modules: targets,
        dropout: 0.0,
        init_seed: None,
    };
    Ok(LoraFile {
        path: path.to_path_buf(),
        tensors,
        spec,
        scaling,
        has_metadata,
        style,
    })
}

/// Attach the adapters of `file` to `model` (diffusers `load_lora_weights`): every module
/// the file names gets its `A`, `B` and scale; every base parameter is frozen. Errors list
/// modules that are not linear layers of this model, wrong shapes and already adapted layers.
pub fn apply_lora_file<B: Backend>(
    model: WanModel<B>,
    file: &LoraFile,
) -> Result<WanModel<B>, LoraError> {
    let pairs = pair_lora_keys(file.tensors.keys()).map_err(|m| file_err(&file.path, m))?;
    let mut model = model.no_grad();
    let mut found = 0;
    for (path, lin) in wan_linears_mut(&mut model) {
        let Some((ka, kb)) = pairs.get(&path) else {
            continue;
        };
        let (a, b) = (&file.tensors[ka], &file.tensors[kb]);
        if a.shape[1] != lin.in_features() || b.shape[0] != lin.out_features() {
            return Err(file_err(
                &file.path,
                format!(
                    "`{path}`: lora_A {:?} / lora_B {:?} do not fit a {} -> {} layer",
                    a.shape.as_slice(),
                    b.shape.as_slice(),
                    lin.in_features(),
                    lin.out_features()
                ),
            ));
        }
        if lin.has_lora() {
            return Err(file_err(
                &file.path,
                format!("`{path}` already has a LoRA adapter"),
            ));
        }
        let device = lin.weight.lazy_device();
        let param =
            |d: &TensorData| Param::from_tensor(Tensor::<B, 2>::from_data(d.clone(), &device));
        lin.attach_lora(param(a), param(b), file.scaling[&path]);
        found += 1;
    }
    if found != pairs.len() {
        let mut known = lora_module_set(&mut model);
        let missing: Vec<&String> = pairs.keys().filter(|m| !known.remove(*m)).collect();
        return Err(file_err(
            &file.path,
            format!("modules that are not linear layers of this model: {missing:?}"),
        ));
    }
    Ok(model)
}

fn lora_module_set<B: Backend>(model: &mut WanModel<B>) -> std::collections::BTreeSet<String> {
    wan_linears_mut(model)
        .into_iter()
        .filter(|(_, l)| l.has_lora())
        .map(|(p, _)| p)
        .collect()
}

/// [`read_lora_file`] then [`apply_lora_file`].
pub fn load_lora<B: Backend>(
    model: WanModel<B>,
    path: impl AsRef<Path>,
) -> Result<WanModel<B>, LoraError> {
    apply_lora_file(model, &read_lora_file(path)?)
}
