//! LoRA for the Wan model, in PEFT's layout and with diffusers' numerics.
//!
//! - [`apply`]: attach adapters to the linear layers a [`LoraSpec`] targets (PEFT's
//!   `target_modules` suffix rule), freeze every base parameter, initialise `A` like PEFT
//!   (`kaiming_uniform_(a=sqrt(5))` = `U(-1/sqrt(in), 1/sqrt(in))`, seeded per module path)
//!   and `B` to zero, so a fresh adapter leaves the model's output unchanged;
//! - [`spec`]: the `[models.<role>.adapter] kind = "lora"` table ([`LoraSpec`]);
//! - [`merge`]: fold adapters into the weights and back (`W' = W + alpha/r · B A`);
//! - [`io`]: read and write adapter files in the diffusers / PEFT safetensors layout
//!   (`transformer.<module>.lora_A.weight`, `__metadata__.lora_adapter_metadata`), and read
//!   ComfyUI-style Wan files (`diffusion_model.blocks.0.self_attn.q.lora_down.weight`);
//!   [`format`](mod@format) holds the key mappings and the metadata JSON.
//!
//! Each adapted [`Linear`](crate::wan::Linear) holds `lora_A.weight [r, in]` and
//! `lora_B.weight [out, r]`, so a model's parameter paths equal the PEFT keys without the
//! `transformer.` prefix, and a trainable role's checkpoint (which holds only parameters that
//! require gradients) holds exactly the adapter.

pub mod apply;
pub mod format;
pub mod io;
pub mod merge;
pub mod spec;

use std::collections::BTreeMap;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{backend::Backend, Tensor, TensorData};

use reel_core::io::WeightError;
use reel_core::params::PathStack;
pub use spec::{target_matches, LoraSpec};

pub use apply::{
    apply_lora, block_index, check_block_targets, is_known_target, lora_module_paths,
    lora_param_count, set_lora_scale, wan_linears_mut, WAN_LINEAR_MODULES,
};
pub use format::{
    comfy_module_to_diffusers, diffusers_module_to_comfy, lora_metadata_json, KeyStyle,
    METADATA_KEY,
};
pub use io::{
    apply_lora_file, load_lora, read_lora_file, save_lora, save_lora_comfy, LoraFile,
    COMFY_LORA_FILE, LORA_WEIGHTS_FILE,
};
pub use merge::{merge_and_unload, merge_lora, unload_lora, unmerge_lora};

pub use crate::wan::linear::LoraWeight;

/// Key suffix of a LoRA down projection.
pub const LORA_A_SUFFIX: &str = ".lora_A.weight";
/// Key suffix of a LoRA up projection.
pub const LORA_B_SUFFIX: &str = ".lora_B.weight";

/// An error applying, reading or writing a LoRA adapter. Messages name the file, key or
/// config value involved.
#[derive(Debug, thiserror::Error)]
pub enum LoraError {
    /// The spec is invalid or does not fit the model (unknown target, layer already adapted).
    #[error("LoRA: {0}")]
    Spec(String),
    /// A file's tensors or metadata do not describe an adapter for this model.
    #[error("LoRA file `{path}`: {message}")]
    File {
        /// The adapter file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// Reading or writing the safetensors file failed.
    #[error(transparent)]
    Weights(#[from] WeightError),
}

/// Whether the parameter key `key` belongs to an adapter (`….lora_A.weight` /
/// `….lora_B.weight`).
pub fn is_lora_key(key: &str) -> bool {
    key.ends_with(LORA_A_SUFFIX) || key.ends_with(LORA_B_SUFFIX)
}

struct LoraCollector {
    path: PathStack,
    out: Vec<(String, TensorData)>,
}

impl<B: Backend> ModuleVisitor<B> for LoraCollector {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name);
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let key = self.path.joined();
        if is_lora_key(&key) {
            self.out.push((key, param.val().into_data()));
        }
    }
}

/// The adapter tensors of `module` copied to the host, keyed by parameter path
/// (`blocks.0.attn1.to_q.lora_A.weight`), in module order. Base weights are not read.
pub fn lora_tensors<B: Backend, M: Module<B>>(module: &M) -> Vec<(String, TensorData)> {
    let mut c = LoraCollector {
        path: PathStack::default(),
        out: Vec::new(),
    };
    module.visit(&mut c);
    c.out
}

/// The adapted module paths of a set of adapter keys, with their `(A, B)` key pair.
/// Errors on a key that is not an adapter key or a module with only one of the two.
pub fn pair_lora_keys<'a>(
    keys: impl IntoIterator<Item = &'a String>,
) -> Result<BTreeMap<String, (String, String)>, String> {
    let mut a = BTreeMap::new();
    let mut b = BTreeMap::new();
    for k in keys {
        if let Some(m) = k.strip_suffix(LORA_A_SUFFIX) {
            a.insert(m.to_string(), k.clone());
        } else if let Some(m) = k.strip_suffix(LORA_B_SUFFIX) {
            b.insert(m.to_string(), k.clone());
        } else {
            return Err(format!(
                "`{k}` is not a LoRA key (expected `<module>.lora_A.weight` / `.lora_B.weight`)"
            ));
        }
    }
    let lonely: Vec<&String> = a
        .keys()
        .filter(|m| !b.contains_key(*m))
        .chain(b.keys().filter(|m| !a.contains_key(*m)))
        .collect();
    if !lonely.is_empty() {
        return Err(format!(
            "modules with only one of lora_A / lora_B: {lonely:?}"
        ));
    }
    Ok(a.into_iter()
        .map(|(m, ka)| {
            let kb = b.remove(&m).expect("paired above");
            (m, (ka, kb))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_pair_up_or_fail_with_the_key() {
        let keys: Vec<String> = ["x.to_q.lora_A.weight", "x.to_q.lora_B.weight"]
            .map(String::from)
            .to_vec();
        let p = pair_lora_keys(&keys).unwrap();
        assert_eq!(p["x.to_q"].1, "x.to_q.lora_B.weight");
        let err = pair_lora_keys(&keys[..1].to_vec()).unwrap_err();
        assert!(err.contains("x.to_q"), "{err}");
        let bad = vec!["x.to_q.lora_B.bias".to_string()];
        assert!(pair_lora_keys(&bad).unwrap_err().contains("lora_B.bias"));
        assert!(is_lora_key("a.lora_A.weight") && !is_lora_key("a.weight"));
    }
}
