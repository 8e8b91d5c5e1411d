//! Safetensors I/O for Burn modules by dotted parameter path: load tensors into a module
//! (checking every key and shape first), write a module's parameters.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::Path;

use burn::module::{Module, Param};
use burn::tensor::{backend::Backend, Tensor, TensorData};

use super::error::{KeyMismatch, ShapeMismatch, WeightError};
use super::safetensors::{read_safetensors, write_safetensors_as, StoreDtype};
use crate::params::{
    map_named, named_param_shapes, named_tensor_data, NamedParamMapper, ParamShape,
};

/// Options for [`load_module_tensors`].
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Tensors with no matching parameter are an error (default `true`). When `false` they are
    /// ignored (and listed in [`LoadReport::unexpected`]).
    pub strict: bool,
    /// Parameters with no tensor keep their current value instead of being an error
    /// (default `false`). Used to load sharded checkpoints one shard at a time.
    pub allow_missing: bool,
    /// Name of the source used in error messages (usually the file path).
    pub source: String,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            strict: true,
            allow_missing: false,
            source: "<tensors>".to_string(),
        }
    }
}

impl LoadOptions {
    /// Strict options naming `source` in errors.
    pub fn from_source(source: impl fmt::Display) -> Self {
        Self {
            source: source.to_string(),
            ..Self::default()
        }
    }
}

/// What [`load_module_tensors_report`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Keys that were loaded into a parameter (sorted).
    pub loaded: Vec<String>,
    /// Parameters left unchanged because no tensor had their key (sorted).
    pub missing: Vec<String>,
    /// Tensors that matched no parameter (sorted).
    pub unexpected: Vec<String>,
}

/// Write every float parameter of `module` (keyed by dotted path) to a safetensors file as
/// f32.
pub fn module_to_safetensors<B: Backend, M: Module<B>>(
    module: &M,
    path: impl AsRef<Path>,
    metadata: Option<HashMap<String, String>>,
) -> Result<(), WeightError> {
    module_to_safetensors_as(module, path, metadata, StoreDtype::F32)
}

/// Write every float parameter of `module` to a safetensors file in the given dtype.
pub fn module_to_safetensors_as<B: Backend, M: Module<B>>(
    module: &M,
    path: impl AsRef<Path>,
    metadata: Option<HashMap<String, String>>,
    dtype: StoreDtype,
) -> Result<(), WeightError> {
    let tensors = named_tensor_data(module);
    write_safetensors_as(path, &tensors, metadata, dtype)
}

/// Compare stored `key -> shape` pairs with a module's parameters (from
/// [`named_param_shapes`]); every difference is collected.
pub fn check_shapes(
    params: &[ParamShape],
    found: &BTreeMap<String, Vec<usize>>,
    opts: &LoadOptions,
) -> KeyMismatch {
    let mut mismatch = KeyMismatch {
        source: opts.source.clone(),
        ..KeyMismatch::default()
    };
    let mut known = BTreeSet::new();
    for p in params {
        known.insert(p.path.as_str());
        match found.get(&p.path) {
            None => {
                if !opts.allow_missing {
                    mismatch.missing.push(p.path.clone());
                }
            }
            Some(shape) => {
                if shape != &p.shape {
                    mismatch.wrong_shape.push(ShapeMismatch {
                        key: p.path.clone(),
                        expected: p.shape.clone(),
                        found: shape.clone(),
                    });
                }
            }
        }
    }
    if opts.strict {
        mismatch.unexpected = found
            .keys()
            .filter(|k| !known.contains(k.as_str()))
            .cloned()
            .collect();
    }
    mismatch.missing.sort();
    mismatch.wrong_shape.sort_by(|a, b| a.key.cmp(&b.key));
    mismatch
}

/// Compare `tensors` with the parameters of `module` without touching parameter values.
pub fn check_module_tensors<B: Backend, M: Module<B>>(
    module: &M,
    tensors: &BTreeMap<String, TensorData>,
    opts: &LoadOptions,
) -> KeyMismatch {
    let params = named_param_shapes::<B, M>(module);
    let found = tensors
        .iter()
        .map(|(k, v)| (k.clone(), v.shape.to_vec()))
        .collect();
    check_shapes(&params, &found, opts)
}

struct Loader<'a> {
    tensors: &'a BTreeMap<String, TensorData>,
    loaded: Vec<String>,
    missing: Vec<String>,
}

impl<B: Backend> NamedParamMapper<B> for Loader<'_> {
    fn map<const D: usize>(
        &mut self,
        path: &str,
        param: Param<Tensor<B, D>>,
    ) -> Param<Tensor<B, D>> {
        let Some(data) = self.tensors.get(path) else {
            self.missing.push(path.to_string());
            return param;
        };
        self.loaded.push(path.to_string());
        // Create the tensor on the parameter's device (read lazily, so a lazily initialized
        // parameter is never materialized), then `transform_for_load` keeps the id, the
        // `require_grad` flag and the parameter's load/save mappers.
        let device = param.lazy_device();
        let tensor = Tensor::<B, D>::from_data(data.clone(), &device);
        let id = param.id;
        param.transform_for_load(tensor, id)
    }
}

/// Put `tensors` into the float parameters of `module` by dotted path.
///
/// All keys are checked before anything is changed: missing parameters (unless
/// [`LoadOptions::allow_missing`]), unexpected tensors (when [`LoadOptions::strict`]) and
/// wrongly shaped tensors are all listed in one [`WeightError::Mismatch`]. Each loaded
/// parameter keeps its [`burn::module::ParamId`], device and `require_grad` flag; lazily
/// initialized parameters are replaced without running their initializer.
pub fn load_module_tensors<B: Backend, M: Module<B>>(
    module: M,
    tensors: &BTreeMap<String, TensorData>,
    opts: &LoadOptions,
) -> Result<M, WeightError> {
    load_module_tensors_report(module, tensors, opts).map(|(m, _)| m)
}

/// Like [`load_module_tensors`], also returning which keys were loaded, missing or ignored.
pub fn load_module_tensors_report<B: Backend, M: Module<B>>(
    module: M,
    tensors: &BTreeMap<String, TensorData>,
    opts: &LoadOptions,
) -> Result<(M, LoadReport), WeightError> {
    let mismatch = check_module_tensors::<B, M>(&module, tensors, opts);
    if !mismatch.is_empty() {
        return Err(WeightError::Mismatch(Box::new(mismatch)));
    }
    let mut loader = Loader {
        tensors,
        loaded: Vec::new(),
        missing: Vec::new(),
    };
    let module = map_named(module, &mut loader);
    let known: BTreeSet<&str> = loader
        .loaded
        .iter()
        .chain(loader.missing.iter())
        .map(String::as_str)
        .collect();
    let unexpected = tensors
        .keys()
        .filter(|k| !known.contains(k.as_str()))
        .cloned()
        .collect();
    loader.loaded.sort();
    loader.missing.sort();
    Ok((
        module,
        LoadReport {
            loaded: loader.loaded,
            missing: loader.missing,
            unexpected,
        },
    ))
}

/// Read a safetensors file and load it into `module` (strict, naming the file in errors).
pub fn load_module_safetensors<B: Backend, M: Module<B>>(
    module: M,
    path: impl AsRef<Path>,
) -> Result<M, WeightError> {
    let path = path.as_ref();
    let (tensors, _) = read_safetensors(path)?;
    load_module_tensors(module, &tensors, &LoadOptions::from_source(path.display()))
}
