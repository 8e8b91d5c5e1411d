//! Safetensors files as host tensors: read (F32, BF16, F16, F64 → f32), read headers only,
//! and write (f32, bf16, f16) atomically.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use burn::tensor::{DType, TensorData};
use safetensors::tensor::{Dtype, SafeTensors, View};

use super::error::{format_err, io_err, WeightError};
use super::serialize::write_file;

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

/// Little-endian F32, BF16, F16 or F64 values as f32; `None` for any other dtype. Trailing
/// bytes that do not fill a value are ignored (callers check byte counts).
pub fn decode_le_floats(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
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
        _ => return None,
    };
    Some(out)
}

/// Decode one safetensors tensor to f32 values, naming the file and key of an unsupported dtype.
fn decode_f32(path: &Path, key: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>, WeightError> {
    decode_le_floats(dtype, bytes).ok_or_else(|| WeightError::UnsupportedDtype {
        path: path.to_path_buf(),
        key: key.to_string(),
        dtype: format!("{dtype:?}"),
    })
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
/// (cheap even for multi-gigabyte shards). A file cut short (an interrupted download or copy)
/// or with bytes after its last tensor is refused here, from its length alone.
pub fn read_safetensors_header(
    path: impl AsRef<Path>,
) -> Result<BTreeMap<String, TensorHeader>, WeightError> {
    use std::io::Read;
    let path = path.as_ref();
    let mut file = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
    let file_len = file.metadata().map_err(|e| io_err(path, e))?.len();
    let mut prefix = [0u8; 8];
    let got = (file_len as usize).min(8);
    file.read_exact(&mut prefix[..got])
        .map_err(|e| io_err(path, e))?;
    let n = header_len(path, &prefix[..got], file_len)?;
    let mut json = vec![0u8; n];
    file.read_exact(&mut json).map_err(|e| io_err(path, e))?;
    let (out, data_len) = parse_header(path, &json)?;
    check_len(path, data_len.saturating_add(8 + n as u64), file_len)?;
    Ok(out)
}

/// The header length a file's first 8 bytes state (`prefix` holds up to 8 of them), checked
/// against the file's length.
fn header_len(path: &Path, prefix: &[u8], file_len: u64) -> Result<usize, WeightError> {
    let Ok(len) = <[u8; 8]>::try_from(prefix) else {
        return Err(truncated(path, 8, file_len));
    };
    let n = u64::from_le_bytes(len);
    if n > 100_000_000 {
        return Err(format_err(
            path,
            format!("header length {n} is implausible: not a safetensors file"),
        ));
    }
    if 8 + n > file_len {
        return Err(truncated(path, 8 + n, file_len));
    }
    Ok(n as usize)
}

/// Each tensor's dtype and shape from a JSON header, and the data section's length it
/// describes (the largest `data_offsets` end).
fn parse_header(
    path: &Path,
    json: &[u8],
) -> Result<(BTreeMap<String, TensorHeader>, u64), WeightError> {
    let json: serde_json::Value = serde_json::from_slice(json).map_err(|e| format_err(path, e))?;
    let obj = json
        .as_object()
        .ok_or_else(|| format_err(path, "header is not a JSON object"))?;
    let mut out = BTreeMap::new();
    let mut data_len = 0;
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
        let end = info
            .get("data_offsets")
            .and_then(|o| o.as_array())
            .and_then(|o| o.get(1))
            .and_then(|e| e.as_u64());
        let (Some(dtype), Some(shape), Some(end)) = (dtype, shape, end) else {
            return Err(format_err(
                path,
                format!("header entry `{key}` has no valid dtype / shape / data_offsets"),
            ));
        };
        data_len = data_len.max(end);
        out.insert(
            key.clone(),
            TensorHeader {
                dtype: dtype.to_string(),
                shape,
            },
        );
    }
    Ok((out, data_len))
}

/// Refuse a file whose length is not the `expected` its header describes.
fn check_len(path: &Path, expected: u64, file_len: u64) -> Result<(), WeightError> {
    match file_len.cmp(&expected) {
        std::cmp::Ordering::Less => Err(truncated(path, expected, file_len)),
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Greater => Err(format_err(
            path,
            format!(
                "{} bytes after its last tensor (its header describes {expected} bytes, the \
                 file has {file_len}): not a complete safetensors file",
                file_len - expected
            ),
        )),
    }
}

fn truncated(path: &Path, expected: u64, file_len: u64) -> WeightError {
    format_err(
        path,
        format!(
            "truncated: {file_len} bytes where its header needs {expected}; copy or download \
             it again"
        ),
    )
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
    let file_len = bytes.len() as u64;
    let n = header_len(path, &bytes[..bytes.len().min(8)], file_len)?;
    let (_, data_len) = parse_header(path, &bytes[8..8 + n])?;
    check_len(path, data_len.saturating_add(8 + n as u64), file_len)?;
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
/// temporary sibling, synced and renamed into place ([`replace_file_with`](super::replace_file_with)),
/// so a crash never leaves a truncated file. The same tensors and metadata give the same
/// bytes in every process (the metadata is written sorted by key).
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
    super::replace_file_with(
        path,
        |tmp| {
            write_file(tmp, raw.iter().map(|(k, v)| (*k, v)), metadata.as_ref())
                .map_err(|e| io_err(path, e))
        },
        |e| io_err(path, e),
    )
}
