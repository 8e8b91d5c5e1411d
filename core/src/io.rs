//! Safetensors I/O for Burn modules by dotted parameter path.
//!
//! Reel's module field names equal the upstream checkpoint keys (see [`crate::params`]), so a
//! safetensors file maps onto a module with no renaming table:
//!
//! - [`read_safetensors`] / [`write_safetensors`] convert between a file and host
//!   [`TensorData`] (read: F32, BF16, F16 and F64 on disk, always returned as f32; write: f32,
//!   or bf16 / f16 with [`write_safetensors_as`]);
//! - [`load_module_tensors`] puts tensors into a module by path, keeping every parameter's id,
//!   device and `require_grad` flag, and reports *all* missing, unexpected and wrongly shaped
//!   keys in one [`WeightError::Mismatch`];
//! - [`module_to_safetensors`] writes every float parameter of a module.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use burn::module::{Module, Param};
use burn::tensor::{backend::Backend, DType, Tensor, TensorData};
use safetensors::tensor::{Dtype, SafeTensors, View};

use crate::params::{
    map_named, named_param_shapes, named_tensor_data, NamedParamMapper, ParamShape,
};

/// An error while reading, writing or applying weights. Every message names the file (or the
/// source given in [`LoadOptions::source`]) and, where one is involved, the tensor key.
#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    /// The file could not be read or written.
    #[error("cannot access `{path}`: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid safetensors (or a related JSON file is malformed).
    #[error("invalid file `{path}`: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A tensor in the file has a dtype that cannot be converted to f32.
    #[error(
        "`{path}`: tensor `{key}` has dtype {dtype}; only F32, BF16, F16 and F64 are supported"
    )]
    UnsupportedDtype {
        /// The file.
        path: PathBuf,
        /// The tensor key.
        key: String,
        /// The dtype found.
        dtype: String,
    },
    /// A tensor handed to a writer is malformed (wrong byte count or dtype) or a key repeats.
    #[error("`{path}`: tensor `{key}`: {message}")]
    InvalidTensor {
        /// The file being written.
        path: PathBuf,
        /// The tensor key.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// The tensors do not match the module's parameters.
    #[error("{0}")]
    Mismatch(Box<KeyMismatch>),
}

/// A parameter whose stored tensor has the wrong shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeMismatch {
    /// The key (dotted parameter path).
    pub key: String,
    /// The shape the module expects.
    pub expected: Vec<usize>,
    /// The shape found in the tensors.
    pub found: Vec<usize>,
}

/// Every difference between a set of tensors and a module's parameters, found in one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyMismatch {
    /// Where the tensors came from (usually a file path).
    pub source: String,
    /// Module parameters with no tensor (sorted).
    pub missing: Vec<String>,
    /// Tensors with no module parameter (sorted; only reported when strict).
    pub unexpected: Vec<String>,
    /// Tensors whose shape differs from the parameter's (sorted by key).
    pub wrong_shape: Vec<ShapeMismatch>,
}

impl KeyMismatch {
    /// True when nothing is wrong.
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.unexpected.is_empty() && self.wrong_shape.is_empty()
    }
}

impl fmt::Display for KeyMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "weights from `{}` do not match the model:", self.source)?;
        if !self.missing.is_empty() {
            write!(
                f,
                "\n  {} missing key(s): {}",
                self.missing.len(),
                self.missing.join(", ")
            )?;
        }
        if !self.unexpected.is_empty() {
            write!(
                f,
                "\n  {} unexpected key(s): {}",
                self.unexpected.len(),
                self.unexpected.join(", ")
            )?;
        }
        if !self.wrong_shape.is_empty() {
            write!(f, "\n  {} wrongly shaped key(s):", self.wrong_shape.len())?;
            for m in &self.wrong_shape {
                write!(
                    f,
                    "\n    {}: expected {:?}, found {:?}",
                    m.key, m.expected, m.found
                )?;
            }
        }
        Ok(())
    }
}

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

/// Storage dtype for [`write_safetensors_as`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StoreDtype {
    /// 32-bit float (lossless for f32 parameters).
    #[default]
    F32,
    /// bfloat16 (round to nearest even).
    BF16,
    /// IEEE half precision (round to nearest even).
    F16,
}

fn io_err(path: &Path, source: std::io::Error) -> WeightError {
    WeightError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn format_err(path: &Path, message: impl fmt::Display) -> WeightError {
    WeightError::Format {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

/// Decode one little-endian safetensors tensor to f32 values.
fn decode_f32(path: &Path, key: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>, WeightError> {
    let out = match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F64 => bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32)
            .collect(),
        other => {
            return Err(WeightError::UnsupportedDtype {
                path: path.to_path_buf(),
                key: key.to_string(),
                dtype: format!("{other:?}"),
            })
        }
    };
    Ok(out)
}

/// Read the raw bytes of a file, naming it on failure.
pub fn read_file_bytes(path: impl AsRef<Path>) -> Result<Vec<u8>, WeightError> {
    let path = path.as_ref();
    std::fs::read(path).map_err(|e| io_err(path, e))
}

/// Dtype and shape of one stored tensor, from a safetensors header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorHeader {
    /// The stored dtype (`"F32"`, `"BF16"`, ...).
    pub dtype: String,
    /// The stored shape.
    pub shape: Vec<usize>,
}

/// Key → dtype and shape of every tensor in a safetensors file, reading only the header
/// (cheap even for multi-gigabyte shards).
pub fn read_safetensors_header(
    path: impl AsRef<Path>,
) -> Result<BTreeMap<String, TensorHeader>, WeightError> {
    use std::io::Read;
    let path = path.as_ref();
    let mut file = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|e| io_err(path, e))?;
    let n = u64::from_le_bytes(len);
    if n > 100_000_000 {
        return Err(format_err(
            path,
            format!("header length {n} is implausible"),
        ));
    }
    let mut buf = len.to_vec();
    buf.resize(8 + n as usize, 0);
    file.read_exact(&mut buf[8..])
        .map_err(|e| io_err(path, e))?;
    // `SafeTensors::read_metadata` also checks that the data section is present, so parse
    // the JSON header directly.
    let json: serde_json::Value =
        serde_json::from_slice(&buf[8..]).map_err(|e| format_err(path, e))?;
    let obj = json
        .as_object()
        .ok_or_else(|| format_err(path, "header is not a JSON object"))?;
    let mut out = BTreeMap::new();
    for (key, info) in obj {
        if key == "__metadata__" {
            continue;
        }
        let dtype = info.get("dtype").and_then(|d| d.as_str());
        let shape = info.get("shape").and_then(|s| s.as_array()).and_then(|a| {
            a.iter()
                .map(|d| d.as_u64().map(|d| d as usize))
                .collect::<Option<Vec<usize>>>()
        });
        let (Some(dtype), Some(shape)) = (dtype, shape) else {
            return Err(format_err(
                path,
                format!("header entry `{key}` has no valid dtype / shape"),
            ));
        };
        out.insert(
            key.clone(),
            TensorHeader {
                dtype: dtype.to_string(),
                shape,
            },
        );
    }
    Ok(out)
}

/// True for the dtypes [`read_safetensors`] converts to f32.
pub fn is_supported_dtype(dtype: &str) -> bool {
    matches!(dtype, "F32" | "BF16" | "F16" | "F64")
}

/// Read every tensor of a safetensors file as f32 [`TensorData`], plus the file's
/// `__metadata__` string map if it has one. F32, BF16, F16 and F64 tensors are converted;
/// any other dtype is a [`WeightError::UnsupportedDtype`] naming the file and key.
#[allow(clippy::type_complexity)]
pub fn read_safetensors(
    path: impl AsRef<Path>,
) -> Result<
    (
        BTreeMap<String, TensorData>,
        Option<HashMap<String, String>>,
    ),
    WeightError,
> {
    let path = path.as_ref();
    let bytes = read_file_bytes(path)?;
    let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| format_err(path, e))?;
    let metadata = meta.metadata().clone();
    let st = SafeTensors::deserialize(&bytes).map_err(|e| format_err(path, e))?;
    let mut out = BTreeMap::new();
    for (key, view) in st.iter() {
        let values = decode_f32(path, key, view.dtype(), view.data())?;
        out.insert(
            key.to_string(),
            TensorData::new(values, view.shape().to_vec()),
        );
    }
    Ok((out, metadata))
}

/// A tensor ready to be written: dtype, shape and little-endian bytes.
struct RawTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &RawTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn encode(
    path: &Path,
    key: &str,
    data: &TensorData,
    dtype: StoreDtype,
) -> Result<RawTensor, WeightError> {
    let values: Vec<f32> = if data.dtype == DType::F32 {
        data.to_vec::<f32>()
    } else {
        data.clone().convert::<f32>().to_vec::<f32>()
    }
    .map_err(|e| WeightError::InvalidTensor {
        path: path.to_path_buf(),
        key: key.to_string(),
        message: format!("{e:?}"),
    })?;
    let shape = data.shape.to_vec();
    if values.len() != shape.iter().product::<usize>() {
        return Err(WeightError::InvalidTensor {
            path: path.to_path_buf(),
            key: key.to_string(),
            message: format!("{} values for shape {:?}", values.len(), shape),
        });
    }
    let (dtype, bytes) = match dtype {
        StoreDtype::F32 => (
            Dtype::F32,
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        StoreDtype::BF16 => (
            Dtype::BF16,
            values
                .iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
        ),
        StoreDtype::F16 => (
            Dtype::F16,
            values
                .iter()
                .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                .collect(),
        ),
    };
    Ok(RawTensor {
        dtype,
        shape,
        bytes,
    })
}

/// Write tensors to a safetensors file as f32, with an optional `__metadata__` map.
/// Keys must be unique.
pub fn write_safetensors(
    path: impl AsRef<Path>,
    tensors: &[(String, TensorData)],
    metadata: Option<HashMap<String, String>>,
) -> Result<(), WeightError> {
    write_safetensors_as(path, tensors, metadata, StoreDtype::F32)
}

/// Write tensors to a safetensors file in the given storage dtype. The file is written to a
/// temporary sibling and renamed into place, so a crash never leaves a truncated file.
pub fn write_safetensors_as(
    path: impl AsRef<Path>,
    tensors: &[(String, TensorData)],
    metadata: Option<HashMap<String, String>>,
    dtype: StoreDtype,
) -> Result<(), WeightError> {
    let path = path.as_ref();
    let mut raw: BTreeMap<&str, RawTensor> = BTreeMap::new();
    for (key, data) in tensors {
        let t = encode(path, key, data, dtype)?;
        if raw.insert(key.as_str(), t).is_some() {
            return Err(WeightError::InvalidTensor {
                path: path.to_path_buf(),
                key: key.clone(),
                message: "key appears more than once".to_string(),
            });
        }
    }
    let tmp = tmp_sibling(path);
    safetensors::serialize_to_file(raw.iter().map(|(k, v)| (*k, v)), metadata, &tmp).map_err(
        |e| match e {
            safetensors::SafeTensorError::IoError(io) => io_err(path, io),
            other => format_err(path, other),
        },
    )?;
    std::fs::rename(&tmp, path).map_err(|e| io_err(path, e))
}

fn tmp_sibling(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".tmp{}", std::process::id()));
    path.with_file_name(name)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::named_params;
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

    #[test]
    fn mismatch_lists_every_problem() {
        let dev = Default::default();
        let mut src = data_of(&tiny::<Inner>(&dev, 1.0));
        src.remove("blocks.0.bias");
        src.remove("head.weight");
        src.insert("extra.weight".into(), TensorData::new(vec![0.0f32; 2], [2]));
        src.insert("table".into(), TensorData::new(vec![0.0f32; 6], [2, 3]));
        let m = tiny::<Inner>(&dev, 0.0);
        let err =
            load_module_tensors(m, &src, &LoadOptions::from_source("x.safetensors")).unwrap_err();
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

    #[test]
    fn duplicate_keys_are_rejected_on_write() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.safetensors");
        let t = TensorData::new(vec![0.0f32], [1]);
        let err = write_safetensors(&path, &[("a".into(), t.clone()), ("a".into(), t)], None)
            .unwrap_err();
        assert!(err.to_string().contains("more than once"), "{err}");
    }
}
