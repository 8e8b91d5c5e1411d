//! Key layouts and metadata of adapter files.
//!
//! **diffusers** (`WanPipeline.save_lora_weights`): keys `transformer.<module>.lora_A.weight`
//! `[r, in]` and `.lora_B.weight` `[out, r]`; header `__metadata__` = `{"format": "pt",
//! "lora_adapter_metadata": <JSON>}` where the JSON is PEFT's `LoraConfig` dict with every key
//! prefixed `transformer.` (`transformer.r`, `transformer.lora_alpha`,
//! `transformer.target_modules`, ...), dumped with `indent=2, sort_keys=True`. A file without
//! that metadata loads with `lora_alpha = r` (scale 1), as diffusers does. Bare module keys
//! and PEFT's `base_model.model.` prefix are read too. A Reel checkpoint's weights file
//! (`format = reel`, no adapter metadata) is refused: its alpha is not in it
//! (`reel export --format lora` writes a file that has it).
//!
//! **ComfyUI / original Wan names** (read and write):
//! `diffusion_model.blocks.0.self_attn.q.lora_down.weight`, `….lora_up.weight` (or `lora_A` /
//! `lora_B`) and an optional scalar `….alpha` (scale `alpha / r`, else 1); Reel writes `lora_down`
//! / `lora_up` with an `alpha` for every module. Module names follow the original Wan code
//! (`Wan-AI/Wan2.1` `wan/modules/model.py`), as diffusers'
//! `_convert_non_diffusers_wan_lora_to_diffusers` maps them: `self_attn`/`cross_attn` `q, k, v, o`
//! → `attn1`/`attn2` `to_q, to_k, to_v, to_out.0`; `ffn.0`/`ffn.2` → `ffn.net.0.proj`/`ffn.net.2`;
//! `text_embedding.0/2`, `time_embedding.0/2`, `time_projection.1`, `head.head` → the condition
//! embedder and `proj_out`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use burn::tensor::TensorData;
use serde_json::{json, Map, Value};

use crate::lora::LoraSpec;

use super::{LoraError, LORA_A_SUFFIX, LORA_B_SUFFIX};

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

/// The `lora_adapter_metadata` JSON diffusers writes for `spec`: PEFT's `LoraConfig` fields
/// (those every PEFT since 0.14 accepts) prefixed with `transformer.`, sorted, indent 2.
pub fn lora_metadata_json(spec: &LoraSpec) -> String {
    let mut targets = spec.target_modules.clone();
    targets.sort();
    targets.dedup();
    let alpha = if spec.alpha.fract() == 0.0 && spec.alpha.abs() < 1e15 {
        json!(spec.alpha as i64)
    } else {
        json!(spec.alpha)
    };
    let fields = json!({
        "alpha_pattern": {}, "base_model_name_or_path": null, "bias": "none", "exclude_modules": null,
        "fan_in_fan_out": false, "inference_mode": false, "init_lora_weights": true,
        "layers_pattern": null, "layers_to_transform": null, "lora_alpha": alpha, "lora_bias": false,
        "lora_dropout": spec.dropout, "modules_to_save": null, "peft_type": "LORA", "r": spec.rank,
        "rank_pattern": {}, "revision": null, "target_modules": targets, "task_type": null,
        "use_dora": false, "use_rslora": false,
    });
    let map: Map<String, Value> = fields
        .as_object()
        .expect("object")
        .iter()
        .map(|(k, v)| (format!("{PREFIX}{k}"), v.clone()))
        .collect();
    serde_json::to_string_pretty(&Value::Object(map)).expect("JSON serializes")
}

/// A [`LoraError::File`] naming `path`.
pub(crate) fn file_err(path: &Path, message: String) -> LoraError {
    LoraError::File {
        path: path.display().to_string(),
        message,
    }
}

/// Map a diffusers module path to the original-Wan (ComfyUI) path: the inverse of
/// [`comfy_module_to_diffusers`]. `None` for modules the original code does not name.
pub fn diffusers_module_to_comfy(module: &str) -> Option<String> {
    let fixed = [
        (
            "condition_embedder.text_embedder.linear_1",
            "text_embedding.0",
        ),
        (
            "condition_embedder.text_embedder.linear_2",
            "text_embedding.2",
        ),
        (
            "condition_embedder.time_embedder.linear_1",
            "time_embedding.0",
        ),
        (
            "condition_embedder.time_embedder.linear_2",
            "time_embedding.2",
        ),
        ("condition_embedder.time_proj", "time_projection.1"),
        ("proj_out", "head.head"),
    ];
    if let Some((_, c)) = fixed.iter().find(|(d, _)| *d == module) {
        return Some(c.to_string());
    }
    let rest = module.strip_prefix("blocks.")?;
    let (i, rest) = rest.split_once('.')?;
    i.parse::<usize>().ok()?;
    let tail = match rest {
        "ffn.net.0.proj" => "ffn.0".to_string(),
        "ffn.net.2" => "ffn.2".to_string(),
        _ => {
            let (attn, proj) = rest.split_once('.')?;
            let attn = match attn {
                "attn1" => "self_attn",
                "attn2" => "cross_attn",
                _ => return None,
            };
            let proj = match proj {
                "to_q" => "q",
                "to_k" => "k",
                "to_v" => "v",
                "to_out.0" => "o",
                _ => return None,
            };
            format!("{attn}.{proj}")
        }
    };
    Some(format!("blocks.{i}.{tail}"))
}

/// Map an original-Wan (ComfyUI) module path to the diffusers path.
pub fn comfy_module_to_diffusers(module: &str) -> Option<String> {
    let fixed = [
        (
            "text_embedding.0",
            "condition_embedder.text_embedder.linear_1",
        ),
        (
            "text_embedding.2",
            "condition_embedder.text_embedder.linear_2",
        ),
        (
            "time_embedding.0",
            "condition_embedder.time_embedder.linear_1",
        ),
        (
            "time_embedding.2",
            "condition_embedder.time_embedder.linear_2",
        ),
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
            let attn = match attn {
                "self_attn" => "attn1",
                "cross_attn" => "attn2",
                _ => return None,
            };
            let proj = match proj {
                "q" => "to_q",
                "k" => "to_k",
                "v" => "to_v",
                "o" => "to_out.0",
                _ => return None,
            };
            format!("{attn}.{proj}")
        }
    };
    Some(format!("blocks.{i}.{tail}"))
}

/// Normalised tensors (Reel keys), per-module ComfyUI alphas, and the style.
pub(crate) type Normalised = (
    BTreeMap<String, TensorData>,
    BTreeMap<String, f64>,
    KeyStyle,
);

pub(crate) fn normalise(
    path: &Path,
    raw: BTreeMap<String, TensorData>,
) -> Result<Normalised, LoraError> {
    let comfy = raw.keys().any(|k| {
        k.starts_with("diffusion_model.")
            || k.ends_with(".lora_down.weight")
            || k.ends_with(".lora_up.weight")
    });
    let mut out = BTreeMap::new();
    let mut alphas = BTreeMap::new();
    let mut bad = vec![];
    for (key, t) in raw {
        let k = ["transformer.", "base_model.model.", "diffusion_model."]
            .iter()
            .find_map(|p| key.strip_prefix(p))
            .unwrap_or(&key);
        if !comfy {
            out.insert(k.to_string(), t);
            continue;
        }
        let (module, kind) = match k.rsplit_once(".lora_") {
            Some((m, "down.weight" | "A.weight")) => (m, LORA_A_SUFFIX),
            Some((m, "up.weight" | "B.weight")) => (m, LORA_B_SUFFIX),
            _ => match k.strip_suffix(".alpha") {
                Some(m) => (m, ".alpha"),
                None => (k, ""),
            },
        };
        match (comfy_module_to_diffusers(module), kind) {
            (Some(m), ".alpha") => {
                let value = t.to_vec::<f32>().ok().filter(|v| v.len() == 1);
                match value.map(|v| v[0]).filter(|a| a.is_finite()) {
                    Some(a) => alphas.insert(m, a as f64),
                    None => {
                        let why = format!("`{key}` must hold one finite number, the alpha");
                        return Err(file_err(path, why));
                    }
                };
            }
            (Some(m), suffix) if !suffix.is_empty() => {
                out.insert(format!("{m}{suffix}"), t);
            }
            _ => bad.push(key.clone()),
        }
    }
    if !bad.is_empty() {
        return Err(file_err(
            path,
            format!("keys that are not Wan LoRA weights: {bad:?}"),
        ));
    }
    Ok((
        out,
        alphas,
        if comfy {
            KeyStyle::Comfy
        } else {
            KeyStyle::Diffusers
        },
    ))
}

/// Read the `transformer.*` fields of `lora_adapter_metadata` (prefix removed).
pub(crate) fn metadata_fields(
    path: &Path,
    meta: &HashMap<String, String>,
) -> Result<Option<Map<String, Value>>, LoraError> {
    let Some(text) = meta.get(METADATA_KEY) else {
        return Ok(None);
    };
    let v: Value = serde_json::from_str(text)
        .map_err(|e| file_err(path, format!("`{METADATA_KEY}` is not JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| file_err(path, format!("`{METADATA_KEY}` is not a JSON object")))?;
    let prefixed: Map<String, Value> = obj
        .iter()
        .filter_map(|(k, v)| k.strip_prefix(PREFIX).map(|s| (s.to_string(), v.clone())))
        .collect();
    Ok(Some(if prefixed.is_empty() {
        obj.clone()
    } else {
        prefixed
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comfy_names_map_to_diffusers() {
        let m = |s: &str| comfy_module_to_diffusers(s);
        assert_eq!(
            m("blocks.3.self_attn.q").as_deref(),
            Some("blocks.3.attn1.to_q")
        );
        assert_eq!(
            m("blocks.0.cross_attn.o").as_deref(),
            Some("blocks.0.attn2.to_out.0")
        );
        assert_eq!(
            m("blocks.1.ffn.0").as_deref(),
            Some("blocks.1.ffn.net.0.proj")
        );
        assert_eq!(
            m("time_projection.1").as_deref(),
            Some("condition_embedder.time_proj")
        );
        assert_eq!(m("head.head").as_deref(), Some("proj_out"));
        assert_eq!(m("blocks.x.self_attn.q"), None);
        assert_eq!(m("blocks.0.self_attn.norm_q"), None);
    }

    #[test]
    fn metadata_mirrors_diffusers() {
        let spec = LoraSpec {
            alpha: 8.0,
            ..LoraSpec::new(4, vec!["to_v".into(), "to_q".into()])
        };
        let text = lora_metadata_json(&spec);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["transformer.r"], 4);
        assert_eq!(v["transformer.lora_alpha"], 8);
        assert_eq!(v["transformer.target_modules"], json!(["to_q", "to_v"]));
        assert!(
            text.starts_with("{\n  \"transformer.alpha_pattern\": {},"),
            "{text}"
        );
    }

    #[test]
    fn comfy_and_diffusers_module_names_round_trip() {
        let pairs = [
            ("blocks.0.attn1.to_q", "blocks.0.self_attn.q"),
            ("blocks.3.attn1.to_out.0", "blocks.3.self_attn.o"),
            ("blocks.12.attn2.to_v", "blocks.12.cross_attn.v"),
            ("blocks.1.ffn.net.0.proj", "blocks.1.ffn.0"),
            ("blocks.1.ffn.net.2", "blocks.1.ffn.2"),
            ("condition_embedder.time_proj", "time_projection.1"),
            (
                "condition_embedder.text_embedder.linear_2",
                "text_embedding.2",
            ),
            ("proj_out", "head.head"),
        ];
        for (diffusers, comfy) in pairs {
            assert_eq!(diffusers_module_to_comfy(diffusers).as_deref(), Some(comfy));
            assert_eq!(comfy_module_to_diffusers(comfy).as_deref(), Some(diffusers));
        }
        for unknown in [
            "blocks.x.attn1.to_q",
            "blocks.0.attn3.to_q",
            "patch_embedding",
        ] {
            assert_eq!(diffusers_module_to_comfy(unknown), None, "{unknown}");
        }
    }
}
