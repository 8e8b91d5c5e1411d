//! Wan weight I/O in the diffusers layout.
//!
//! A diffusers `transformer/` folder holds `config.json` and either one
//! `diffusion_pytorch_model.safetensors` or shards listed by
//! `diffusion_pytorch_model.safetensors.index.json` (`{"weight_map": {key: shard}}`). Keys are
//! the module paths of [`WanModel`] unchanged; tensors may be f32, bf16, f16 or f64 on disk.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;
use reel_core::io::{module_to_safetensors_as, StoreDtype, WeightError};

use super::config::{WanConfig, WanConfigError};
use super::model::WanModel;

/// File name of a single-file diffusers checkpoint.
pub const WEIGHTS_FILE: &str = "diffusion_pytorch_model.safetensors";
/// File name of the shard index of a sharded diffusers checkpoint.
pub const INDEX_FILE: &str = "diffusion_pytorch_model.safetensors.index.json";
/// File name of the model config.
pub const CONFIG_FILE: &str = "config.json";

/// An error while loading a pretrained Wan model.
#[derive(Debug, thiserror::Error)]
pub enum WanLoadError {
    /// The config is unreadable or invalid.
    #[error(transparent)]
    Config(#[from] WanConfigError),
    /// The weights are unreadable or do not match the model.
    #[error(transparent)]
    Weights(#[from] WeightError),
}

/// Where the weights of a checkpoint live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightSource {
    /// One safetensors file.
    Single(PathBuf),
    /// A shard index and the shard files it names (in sorted order).
    Sharded {
        /// The `*.safetensors.index.json` file.
        index: PathBuf,
        /// The distinct shard files.
        shards: Vec<PathBuf>,
    },
}

/// Resolve `path`: a diffusers `transformer/` folder (index preferred when present, else the
/// single file), a `.safetensors` file, or a `.safetensors.index.json` file.
pub fn resolve_weights(path: impl AsRef<Path>) -> Result<WeightSource, WeightError> {
    crate::checkpoint::resolve(path.as_ref(), &[INDEX_FILE, WEIGHTS_FILE])
}

/// The `weight_map` (key -> shard file name) of a shard index file.
pub fn read_weight_map(index: &Path) -> Result<BTreeMap<String, String>, WeightError> {
    let text = std::fs::read_to_string(index).map_err(|error| WeightError::Io {
        path: index.to_path_buf(),
        error,
    })?;
    let bad = |message: String| WeightError::Format {
        path: index.to_path_buf(),
        message,
    };
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no `weight_map` object".into()))?;
    map.iter()
        .map(|(k, v)| match v.as_str() {
            Some(s) => Ok((k.clone(), s.to_string())),
            None => Err(bad(format!("`weight_map.{k}` is not a file name"))),
        })
        .collect()
}

/// Load weights into `model` from a folder, a `.safetensors` file or a shard index (see
/// [`resolve_weights`]). Strict: all missing, unexpected and wrongly shaped keys are
/// reported together, naming the file (or index), from the file headers before any tensor
/// is read; shards are then loaded one at a time, so peak host memory is one shard.
pub fn load_weights<B: Backend>(
    model: WanModel<B>,
    path: impl AsRef<Path>,
) -> Result<WanModel<B>, WeightError> {
    let source = resolve_weights(path)?;
    crate::checkpoint::load(model, &source, |k| Some(k.to_string())).map_err(layout_hint)
}

/// Check the weights at `path` (as [`load_weights`] resolves it) against `model` from the
/// file headers only: the same missing / unexpected / wrongly shaped keys `load_weights`
/// reports, without reading tensor data. With a lazily initialised model this allocates
/// nothing, so `reel check` runs it for the real 1.3B and 14B shapes.
pub fn check_weights<B: Backend>(
    model: &WanModel<B>,
    path: impl AsRef<Path>,
) -> Result<(), WeightError> {
    let source = resolve_weights(path)?;
    crate::checkpoint::check(model, &source, |k| Some(k.to_string())).map_err(layout_hint)
}

/// Parts of the key names of the original Wan release's DiT checkpoints
/// (`blocks.0.self_attn.q.weight`, `head.head.weight`), which diffusers renames.
const ORIGINAL_LAYOUT: [&str; 3] = [".self_attn.", ".cross_attn.", "head.head."];

/// `e` with a hint when its unexpected keys are the original Wan release's names: a user
/// pointing at `Wan-AI/Wan2.1-T2V-1.3B`'s file rather than the `-Diffusers` repository's.
fn layout_hint(e: WeightError) -> WeightError {
    match e {
        WeightError::Mismatch(mut m)
            if m.unexpected
                .iter()
                .any(|k| ORIGINAL_LAYOUT.iter().any(|p| k.contains(p))) =>
        {
            m.hints.push(
                "hint: these are the original Wan release's key names (`blocks.0.self_attn.q.\
                 weight`); Reel reads the diffusers layout: the `transformer/` folder of a \
                 `-Diffusers` repository, such as `Wan-AI/Wan2.1-T2V-1.3B-Diffusers`"
                    .into(),
            );
            WeightError::Mismatch(m)
        }
        e => e,
    }
}

impl<B: Backend> WanModel<B> {
    /// Load weights into this model (see [`load_weights`]).
    pub fn load_weights(self, path: impl AsRef<Path>) -> Result<Self, WeightError> {
        load_weights(self, path)
    }

    /// Build a model from a diffusers `transformer/` folder: `config.json` plus the weights.
    pub fn from_pretrained(
        dir: impl AsRef<Path>,
        device: &B::Device,
    ) -> Result<Self, WanLoadError> {
        let dir = dir.as_ref();
        let config = WanConfig::from_json_file(dir.join(CONFIG_FILE))?;
        let model = config.try_init::<B>(device, 0)?;
        Ok(load_weights(model, dir)?)
    }

    /// Write a diffusers `transformer/` folder: `config.json` and
    /// `diffusion_pytorch_model.safetensors` (f32, metadata `format = pt`), keys exactly the
    /// diffusers state-dict keys.
    pub fn save_pretrained(&self, dir: impl AsRef<Path>) -> Result<(), WeightError> {
        self.save_pretrained_as(dir, StoreDtype::F32)
    }

    /// [`Self::save_pretrained`] with a chosen storage dtype (bf16 halves the size).
    pub fn save_pretrained_as(
        &self,
        dir: impl AsRef<Path>,
        dtype: StoreDtype,
    ) -> Result<(), WeightError> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|error| WeightError::Io {
            path: dir.to_path_buf(),
            error,
        })?;
        // The weights first: a failed write (a full disk) leaves no new config beside the
        // old weights.
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        module_to_safetensors_as(self, dir.join(WEIGHTS_FILE), Some(meta), dtype)?;
        let config_path = dir.join(CONFIG_FILE);
        let json = self.config.to_json_string() + "\n";
        reel_core::io::replace_file(&config_path, json.as_bytes()).map_err(|error| {
            WeightError::Io {
                path: config_path.clone(),
                error,
            }
        })
    }
}
