//! Loading a safetensors checkpoint (one file or shards) into any module by key, for the
//! models that come as Hugging Face folders (the Wan VAE, the UMT5 text encoder).
//!
//! Keys are the module's parameter paths, so nothing is renamed except through the
//! caller's `rename` (used for tied weights stored under another name). All keys are
//! checked from the file headers first and every missing, unexpected or wrongly shaped key
//! is reported in one error naming the file; then the files are read one at a time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::tensor::{backend::Backend, TensorData};
use reel_core::io::{
    check_shapes, is_supported_dtype, load_module_tensors_report, read_safetensors,
    read_safetensors_header, LoadOptions, WeightError,
};
use reel_core::params::named_param_shapes;

use crate::wan::weights::{read_weight_map, WeightSource};

/// The folder holding the `config.json` of a Hugging Face model given as its folder or as a
/// weights file inside it (the file's parent); a path that does not exist is refused.
pub fn config_dir(path: &Path) -> Result<&Path, WeightError> {
    if !path.exists() {
        return Err(not_found(path));
    }
    Ok(if path.is_dir() {
        path
    } else {
        path.parent().unwrap_or(Path::new("."))
    })
}

fn not_found(path: &Path) -> WeightError {
    WeightError::Io {
        path: path.to_path_buf(),
        error: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file or folder"),
    }
}

/// Resolve `path`: a folder (the first of `candidates` present in it; names ending in
/// `.index.json` are shard indexes), a `.safetensors` file or a `.safetensors.index.json`.
pub fn resolve(path: &Path, candidates: &[&str]) -> Result<WeightSource, WeightError> {
    if path.is_dir() {
        let found = candidates
            .iter()
            .map(|c| path.join(c))
            .find(|p| p.is_file());
        return match found {
            Some(p) => resolve(&p, candidates),
            None => Err(WeightError::Format {
                path: path.to_path_buf(),
                message: format!("folder has none of {}", candidates.join(", ")),
            }),
        };
    }
    if !path.is_file() {
        return Err(not_found(path));
    }
    if !path.to_string_lossy().ends_with(".index.json") {
        return Ok(WeightSource::Single(path.to_path_buf()));
    }
    let map = read_weight_map(path)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut shards: Vec<PathBuf> = map.values().map(|s| dir.join(s)).collect();
    shards.sort();
    shards.dedup();
    Ok(WeightSource::Sharded {
        index: path.to_path_buf(),
        shards,
    })
}

/// The files of a source and the name used for it in errors.
fn files(source: &WeightSource) -> (Vec<PathBuf>, String) {
    match source {
        WeightSource::Single(f) => (vec![f.clone()], f.display().to_string()),
        WeightSource::Sharded { index, shards } => (shards.clone(), index.display().to_string()),
    }
}

/// Key -> shape of every stored tensor (from the headers only).
pub fn stored_shapes(source: &WeightSource) -> Result<BTreeMap<String, Vec<usize>>, WeightError> {
    let mut found = BTreeMap::new();
    for file in files(source).0 {
        for (key, header) in read_safetensors_header(&file)? {
            if !is_supported_dtype(&header.dtype) {
                return Err(WeightError::UnsupportedDtype {
                    path: file,
                    key,
                    dtype: header.dtype,
                });
            }
            if found.insert(key.clone(), header.shape).is_some() {
                return Err(WeightError::InvalidTensor {
                    path: file,
                    key,
                    message: "key appears in more than one shard".into(),
                });
            }
        }
    }
    Ok(found)
}

/// Check `source` against the parameters of `module` from the file headers only (no tensor
/// data is read; a lazily initialised module allocates nothing): every missing, unexpected
/// or wrongly shaped key is reported in one error naming the file. `rename` as for [`load`].
pub fn check<B: Backend, M: Module<B>>(
    module: &M,
    source: &WeightSource,
    rename: impl Fn(&str) -> Option<String>,
) -> Result<(), WeightError> {
    let found: BTreeMap<String, Vec<usize>> = stored_shapes(source)?
        .into_iter()
        .filter_map(|(k, s)| rename(&k).map(|k| (k, s)))
        .collect();
    let params = named_param_shapes::<B, M>(module);
    let mismatch = check_shapes(&params, &found, &LoadOptions::from_source(files(source).1));
    if mismatch.is_empty() {
        Ok(())
    } else {
        Err(WeightError::Mismatch(Box::new(mismatch)))
    }
}

/// Load every parameter of `module` from `source`, strictly (checked first with [`check`]).
/// `rename` maps a stored key to the module key it fills (`None` skips the tensor); use
/// `|k| Some(k.to_string())` for none.
pub fn load<B: Backend, M: Module<B>>(
    module: M,
    source: &WeightSource,
    rename: impl Fn(&str) -> Option<String>,
) -> Result<M, WeightError> {
    check(&module, source, &rename)?;
    let mut module = module;
    for file in files(source).0 {
        let (tensors, _) = read_safetensors(&file)?;
        let tensors: BTreeMap<String, TensorData> = tensors
            .into_iter()
            .filter_map(|(k, v)| rename(&k).map(|k| (k, v)))
            .collect();
        let opts = LoadOptions {
            strict: false,
            allow_missing: true,
            source: file.display().to_string(),
        };
        module = load_module_tensors_report(module, &tensors, &opts)?.0;
    }
    Ok(module)
}
