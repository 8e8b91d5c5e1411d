//! Adapter files: the diffusers / PEFT safetensors layout (written and read) and the
//! ComfyUI Wan layout (read).
//!
//! **diffusers** (`WanPipeline.save_lora_weights`): keys `transformer.<module>.lora_A.weight`
//! `[r, in]` and `.lora_B.weight` `[out, r]`; header `__metadata__` = `{"format": "pt",
//! "lora_adapter_metadata": <JSON>}` where the JSON is PEFT's `LoraConfig` dict with every key
//! prefixed `transformer.` (`transformer.r`, `transformer.lora_alpha`,
//! `transformer.target_modules`, ...), dumped with `indent=2, sort_keys=True`. A file without
//! that metadata loads with `lora_alpha = r` (scale 1), as diffusers does. Bare module keys
//! (Reel checkpoints) and PEFT's `base_model.model.` prefix are read too.
//!
//! **ComfyUI / original Wan names** (read only): `diffusion_model.blocks.0.self_attn.q.lora_down.weight`,
//! `….lora_up.weight` and an optional scalar `….alpha` (scale `alpha / r`, else 1). Module
//! names follow the original Wan code as diffusers' `_convert_non_diffusers_wan_lora_to_diffusers`
//! maps them: `self_attn`/`cross_attn` `q, k, v, o` → `attn1`/`attn2` `to_q, to_k, to_v,
//! to_out.0`; `ffn.0`/`ffn.2` → `ffn.net.0.proj`/`ffn.net.2`; `text_embedding.0/2`,
//! `time_embedding.0/2`, `time_projection.1`, `head.head` → the condition embedder and
//! `proj_out`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use burn::module::{Module, Param};
use burn::tensor::{backend::Backend, Tensor, TensorData};
use serde_json::{json, Map, Value};

use reel_core::io::{read_safetensors, write_safetensors};
use reel_core::role::{target_matches, LoraSpec};

use super::{lora_tensors, pair_lora_keys, wan_linears_mut, LoraError, LORA_A_SUFFIX, LORA_B_SUFFIX};
use crate::wan::WanModel;

/// File name diffusers uses for an adapter (`pytorch_lora_weights.safetensors`).
pub const LORA_WEIGHTS_FILE: &str = "pytorch_lora_weights.safetensors";
/// The `__metadata__` key holding the adapter config JSON.
pub const METADATA_KEY: &str = "lora_adapter_metadata";
/// Prefix of the transformer's keys in diffusers files (and of its metadata keys).
pub const PREFIX: &str = "transformer.";

/// Key layout of an adapter file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyStyle {
    /// diffusers / PEFT: `[transformer.]<module>.lora_A.weight`.
    Diffusers,
    /// ComfyUI / original Wan: `diffusion_model.<wan module>.lora_down.weight`.
    Comfy,
}

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

/// The `lora_adapter_metadata` JSON diffusers writes for `spec`: PEFT's `LoraConfig` fields
/// (those every PEFT since 0.14 accepts) prefixed with `transformer.`, sorted, indent 2.
pub fn lora_metadata_json(spec: &LoraSpec) -> String {
    let mut targets = spec.target_modules.clone();
    targets.sort();
    targets.dedup();
    let alpha = if spec.alpha.fract() == 0.0 && spec.alpha.abs() < 1e15 { json!(spec.alpha as i64) } else { json!(spec.alpha) };
    let fields = json!({
        "alpha_pattern": {}, "base_model_name_or_path": null, "bias": "none", "exclude_modules": null,
        "fan_in_fan_out": false, "inference_mode": false, "init_lora_weights": true,
        "layers_pattern": null, "layers_to_transform": null, "lora_alpha": alpha, "lora_bias": false,
        "lora_dropout": spec.dropout, "modules_to_save": null, "peft_type": "LORA", "r": spec.rank,
        "rank_pattern": {}, "revision": null, "target_modules": targets, "task_type": null,
        "use_dora": false, "use_rslora": false,
    });
    let map: Map<String, Value> = fields.as_object().expect("object").iter().map(|(k, v)| (format!("{PREFIX}{k}"), v.clone())).collect();
    serde_json::to_string_pretty(&Value::Object(map)).expect("JSON serializes")
}

/// Write the adapter of `model` as a diffusers LoRA file with `spec` as its metadata. `path`
/// is a file, or a folder that receives [`LORA_WEIGHTS_FILE`]. Returns the file written.
pub fn save_lora<B: Backend>(model: &WanModel<B>, spec: &LoraSpec, path: impl AsRef<Path>) -> Result<PathBuf, LoraError> {
    let mut path = path.as_ref().to_path_buf();
    if path.is_dir() || path.extension().is_none_or(|e| e != "safetensors") {
        std::fs::create_dir_all(&path).map_err(|e| file_err(&path, e.to_string()))?;
        path = path.join(LORA_WEIGHTS_FILE);
    }
    let tensors: Vec<(String, TensorData)> = lora_tensors(model).into_iter().map(|(k, v)| (format!("{PREFIX}{k}"), v)).collect();
    if tensors.is_empty() {
        return Err(file_err(&path, "the model has no LoRA adapter to save".into()));
    }
    let meta = HashMap::from([("format".to_string(), "pt".to_string()), (METADATA_KEY.to_string(), lora_metadata_json(spec))]);
    write_safetensors(&path, &tensors, Some(meta))?;
    Ok(path)
}

fn file_err(path: &Path, message: String) -> LoraError {
    LoraError::File { path: path.display().to_string(), message }
}

/// Map an original-Wan (ComfyUI) module path to the diffusers path.
pub fn comfy_module_to_diffusers(module: &str) -> Option<String> {
    let fixed = [
        ("text_embedding.0", "condition_embedder.text_embedder.linear_1"),
        ("text_embedding.2", "condition_embedder.text_embedder.linear_2"),
        ("time_embedding.0", "condition_embedder.time_embedder.linear_1"),
        ("time_embedding.2", "condition_embedder.time_embedder.linear_2"),
        ("time_projection.1", "condition_embedder.time_proj"),
        ("head.head", "proj_out"),
    ];
    if let Some((_, d)) = fixed.iter().find(|(c, _)| *c == module) {
        return Some(d.to_string());
    }
    let rest = module.strip_prefix("blocks.")?;
    let (i, rest) = rest.split_once('.')?;
    i.parse::<usize>().ok()?;
    let tail = match rest {
        "ffn.0" => "ffn.net.0.proj".to_string(),
        "ffn.2" => "ffn.net.2".to_string(),
        _ => {
            let (attn, proj) = rest.split_once('.')?;
            let attn = match attn { "self_attn" => "attn1", "cross_attn" => "attn2", _ => return None };
            let proj = match proj { "q" => "to_q", "k" => "to_k", "v" => "to_v", "o" => "to_out.0", _ => return None };
            format!("{attn}.{proj}")
        }
    };
    Some(format!("blocks.{i}.{tail}"))
}

/// Normalised tensors (Reel keys), per-module ComfyUI alphas, and the style.
type Normalised = (BTreeMap<String, TensorData>, BTreeMap<String, f64>, KeyStyle);

fn normalise(path: &Path, raw: BTreeMap<String, TensorData>) -> Result<Normalised, LoraError> {
    let comfy = raw.keys().any(|k| k.ends_with(".lora_down.weight") || k.ends_with(".lora_up.weight"));
    let mut out = BTreeMap::new();
    let mut alphas = BTreeMap::new();
    let mut bad = vec![];
    for (key, t) in raw {
        let k = ["transformer.", "base_model.model.", "diffusion_model."].iter().find_map(|p| key.strip_prefix(p)).unwrap_or(&key);
        if !comfy {
            out.insert(k.to_string(), t);
            continue;
        }
        let (module, kind) = match k.rsplit_once(".lora_") {
            Some((m, "down.weight")) => (m, LORA_A_SUFFIX),
            Some((m, "up.weight")) => (m, LORA_B_SUFFIX),
            _ => match k.strip_suffix(".alpha") { Some(m) => (m, ".alpha"), None => (k, "") },
        };
        match (comfy_module_to_diffusers(module), kind) {
            (Some(m), ".alpha") => {
                alphas.insert(m, t.to_vec::<f32>().ok().and_then(|v| v.first().copied()).unwrap_or(f32::NAN) as f64);
            }
            (Some(m), suffix) if !suffix.is_empty() => {
                out.insert(format!("{m}{suffix}"), t);
            }
            _ => bad.push(key.clone()),
        }
    }
    if !bad.is_empty() {
        return Err(file_err(path, format!("keys that are not Wan LoRA weights: {bad:?}")));
    }
    Ok((out, alphas, if comfy { KeyStyle::Comfy } else { KeyStyle::Diffusers }))
}

/// Read the `transformer.*` fields of `lora_adapter_metadata` (prefix removed).
fn metadata_fields(path: &Path, meta: &HashMap<String, String>) -> Result<Option<Map<String, Value>>, LoraError> {
    let Some(text) = meta.get(METADATA_KEY) else { return Ok(None) };
    let v: Value = serde_json::from_str(text).map_err(|e| file_err(path, format!("`{METADATA_KEY}` is not JSON: {e}")))?;
    let obj = v.as_object().ok_or_else(|| file_err(path, format!("`{METADATA_KEY}` is not a JSON object")))?;
    let prefixed: Map<String, Value> = obj.iter().filter_map(|(k, v)| k.strip_prefix(PREFIX).map(|s| (s.to_string(), v.clone()))).collect();
    Ok(Some(if prefixed.is_empty() { obj.clone() } else { prefixed }))
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
            return Err(file_err(path, format!("`{module}`: lora_A {sa:?} and lora_B {sb:?} are not [r, in] and [out, r]")));
        }
        ranks.insert(module.clone(), sa[0]);
    }
    let mut counts = BTreeMap::new();
    for r in ranks.values() {
        *counts.entry(*r).or_insert(0usize) += 1;
    }
    let common_rank = counts.iter().max_by_key(|(r, n)| (**n, std::cmp::Reverse(**r))).map(|(r, _)| *r).expect("non-empty");
    let fields = metadata_fields(path, &meta.unwrap_or_default())?;
    let has_metadata = fields.is_some();
    let fields = fields.unwrap_or_default();
    let num = |k: &str| fields.get(k).and_then(Value::as_f64);
    let flag = |k: &str| fields.get(k).and_then(Value::as_bool).unwrap_or(false);
    if flag("use_dora") {
        return Err(file_err(path, "DoRA adapters (`use_dora = true`) are not supported".into()));
    }
    let rank = num("r").map(|r| r as usize).unwrap_or(common_rank);
    let alpha = num("lora_alpha").unwrap_or(rank as f64);
    let targets = match fields.get("target_modules").and_then(Value::as_array) {
        Some(a) => a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect(),
        None => pairs.keys().cloned().collect(),
    };
    let pattern = |k: &str| -> Vec<(String, f64)> {
        fields.get(k).and_then(Value::as_object).map(|o| o.iter().filter_map(|(p, v)| Some((p.clone(), v.as_f64()?))).collect()).unwrap_or_default()
    };
    let alpha_pattern = pattern("alpha_pattern");
    let mut scaling = BTreeMap::new();
    for (module, r) in &ranks {
        let a = comfy_alpha
            .get(module)
            .copied()
            .or_else(|| alpha_pattern.iter().find(|(p, _)| target_matches(module, p)).map(|(_, a)| *a))
            .unwrap_or(if style == KeyStyle::Comfy { *r as f64 } else { alpha });
        let denom = if flag("use_rslora") { (*r as f64).sqrt() } else { *r as f64 };
        scaling.insert(module.clone(), a / denom);
    }
    let spec = LoraSpec { rank, alpha, target_modules: targets, dropout: 0.0, init_seed: None };
    Ok(LoraFile { path: path.to_path_buf(), tensors, spec, scaling, has_metadata, style })
}

/// Attach the adapters of `file` to `model` (diffusers `load_lora_weights`): every module
/// the file names gets its `A`, `B` and scale; every base parameter is frozen. Errors list
/// modules that are not linear layers of this model, wrong shapes and already adapted layers.
pub fn apply_lora_file<B: Backend>(model: WanModel<B>, file: &LoraFile) -> Result<WanModel<B>, LoraError> {
    let pairs = pair_lora_keys(file.tensors.keys()).map_err(|m| file_err(&file.path, m))?;
    let mut model = model.no_grad();
    let mut found = 0;
    for (path, lin) in wan_linears_mut(&mut model) {
        let Some((ka, kb)) = pairs.get(&path) else { continue };
        let (a, b) = (&file.tensors[ka], &file.tensors[kb]);
        if a.shape[1] != lin.in_features() || b.shape[0] != lin.out_features() {
            return Err(file_err(&file.path, format!(
                "`{path}`: lora_A {:?} / lora_B {:?} do not fit a {} -> {} layer",
                a.shape.as_slice(), b.shape.as_slice(), lin.in_features(), lin.out_features()
            )));
        }
        if lin.has_lora() {
            return Err(file_err(&file.path, format!("`{path}` already has a LoRA adapter")));
        }
        let device = lin.weight.lazy_device();
        let param = |d: &TensorData| Param::from_tensor(Tensor::<B, 2>::from_data(d.clone(), &device));
        lin.attach_lora(param(a), param(b), file.scaling[&path]);
        found += 1;
    }
    if found != pairs.len() {
        let mut known = lora_module_set(&mut model);
        let missing: Vec<&String> = pairs.keys().filter(|m| !known.remove(*m)).collect();
        return Err(file_err(&file.path, format!("modules that are not linear layers of this model: {missing:?}")));
    }
    Ok(model)
}

fn lora_module_set<B: Backend>(model: &mut WanModel<B>) -> std::collections::BTreeSet<String> {
    wan_linears_mut(model).into_iter().filter(|(_, l)| l.has_lora()).map(|(p, _)| p).collect()
}

/// [`read_lora_file`] then [`apply_lora_file`].
pub fn load_lora<B: Backend>(model: WanModel<B>, path: impl AsRef<Path>) -> Result<WanModel<B>, LoraError> {
    apply_lora_file(model, &read_lora_file(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comfy_names_map_to_diffusers() {
        let m = |s: &str| comfy_module_to_diffusers(s);
        assert_eq!(m("blocks.3.self_attn.q").as_deref(), Some("blocks.3.attn1.to_q"));
        assert_eq!(m("blocks.0.cross_attn.o").as_deref(), Some("blocks.0.attn2.to_out.0"));
        assert_eq!(m("blocks.1.ffn.0").as_deref(), Some("blocks.1.ffn.net.0.proj"));
        assert_eq!(m("time_projection.1").as_deref(), Some("condition_embedder.time_proj"));
        assert_eq!(m("head.head").as_deref(), Some("proj_out"));
        assert_eq!(m("blocks.x.self_attn.q"), None);
        assert_eq!(m("blocks.0.self_attn.norm_q"), None);
    }

    #[test]
    fn metadata_mirrors_diffusers() {
        let spec = LoraSpec { alpha: 8.0, ..LoraSpec::new(4, vec!["to_v".into(), "to_q".into()]) };
        let text = lora_metadata_json(&spec);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["transformer.r"], 4);
        assert_eq!(v["transformer.lora_alpha"], 8);
        assert_eq!(v["transformer.target_modules"], json!(["to_q", "to_v"]));
        assert!(text.starts_with("{\n  \"transformer.alpha_pattern\": {},"), "{text}");
    }
}
