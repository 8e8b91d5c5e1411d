//! The safetensors layout written with a reproducible header.
//!
//! The `safetensors` crate's writers take the `__metadata__` map as a `HashMap` and write it
//! in the map's iteration order, which changes from one process to the next. Two saves of the
//! same weights (a checkpoint's `role`, `step` and `format` keys) then differ in their
//! header, and a `sha256sum` of two runs' checkpoints cannot show that the runs agree.
//! [`write_file`] writes the same layout (the length, the JSON header padded with spaces to
//! 8 bytes, the tensors' bytes one after another) with the metadata sorted by key. With at
//! most one metadata key its bytes are the crate's (tested), and the crate reads every file
//! it writes.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};
use std::path::Path;

use safetensors::tensor::{TensorInfo, View};
use serde::ser::{Serialize, SerializeMap, Serializer};

/// The JSON header: `__metadata__` first (when given), then every tensor in file order.
struct Header<'a> {
    metadata: Option<BTreeMap<&'a str, &'a str>>,
    tensors: Vec<(&'a str, TensorInfo)>,
}

impl Serialize for Header<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let entries = self.tensors.len() + usize::from(self.metadata.is_some());
        let mut map = serializer.serialize_map(Some(entries))?;
        if let Some(metadata) = &self.metadata {
            map.serialize_entry("__metadata__", metadata)?;
        }
        for (name, info) in &self.tensors {
            map.serialize_entry(name, info)?;
        }
        map.end()
    }
}

/// Write `tensors` to `file` in the safetensors layout, ordered as the crate orders them
/// (by descending dtype, then by name), with `metadata` sorted by key.
pub(super) fn write_file<'a, V: View>(
    file: &Path,
    tensors: impl IntoIterator<Item = (&'a str, V)>,
    metadata: Option<&HashMap<String, String>>,
) -> io::Result<()> {
    let mut tensors: Vec<(&str, V)> = tensors.into_iter().collect();
    tensors.sort_by(|(a, x), (b, y)| y.dtype().cmp(&x.dtype()).then(a.cmp(b)));
    let mut offset = 0;
    let infos = tensors.iter().map(|(name, view)| {
        let start = offset;
        offset += view.data_len();
        let info = TensorInfo {
            dtype: view.dtype(),
            shape: view.shape().to_vec(),
            data_offsets: (start, offset),
        };
        (*name, info)
    });
    let header = Header {
        metadata: metadata.map(|m| m.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()),
        tensors: infos.collect(),
    };
    let mut json = serde_json::to_vec(&header)?;
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut out = io::BufWriter::new(std::fs::File::create(file)?);
    out.write_all(&(json.len() as u64).to_le_bytes())?;
    out.write_all(&json)?;
    for (_, view) in &tensors {
        out.write_all(&view.data())?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::{Dtype, SafeTensors, TensorView};

    /// Three tensors of two dtypes, named out of order.
    fn views(bytes: &[Vec<u8>; 3]) -> Vec<(&'static str, TensorView<'_>)> {
        vec![
            (
                "z.weight",
                TensorView::new(Dtype::F32, vec![2, 3], &bytes[0]).unwrap(),
            ),
            (
                "a.mask",
                TensorView::new(Dtype::U8, vec![5], &bytes[1]).unwrap(),
            ),
            (
                "b.bias",
                TensorView::new(Dtype::F32, vec![3], &bytes[2]).unwrap(),
            ),
        ]
    }

    fn values() -> [Vec<u8>; 3] {
        let f32s = |n: usize| (0..n).flat_map(|i| (i as f32 * 0.7 - 1.0).to_le_bytes());
        [f32s(6).collect(), vec![1, 0, 1, 1, 0], f32s(3).collect()]
    }

    fn written(metadata: Option<&HashMap<String, String>>) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        write_file(&path, views(&values()), metadata).unwrap();
        std::fs::read(path).unwrap()
    }

    #[test]
    fn without_ordering_to_do_the_bytes_are_the_crates() {
        let one = HashMap::from([("format".to_string(), "pt".to_string())]);
        for metadata in [None, Some(HashMap::new()), Some(one)] {
            let crates = safetensors::serialize(views(&values()), metadata.clone()).unwrap();
            assert_eq!(written(metadata.as_ref()), crates, "{metadata:?}");
        }
    }

    #[test]
    fn metadata_is_sorted_so_that_every_save_writes_the_same_bytes() {
        let keys: Vec<String> = (0..16).map(|i| format!("key{:02}", (i * 7) % 16)).collect();
        let forward: HashMap<String, String> = keys
            .iter()
            .map(|k| (k.clone(), format!("{k}-value")))
            .collect();
        let backward: HashMap<String, String> = keys
            .iter()
            .rev()
            .map(|k| (k.clone(), format!("{k}-value")))
            .collect();
        let bytes = written(Some(&forward));
        assert_eq!(bytes, written(Some(&backward)));

        let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header = std::str::from_utf8(&bytes[8..8 + header_len]).unwrap();
        let at: Vec<usize> = (0..16)
            .map(|i| header.find(&format!("\"key{i:02}\"")).unwrap())
            .collect();
        assert!(
            at.windows(2).all(|w| w[0] < w[1]),
            "keys out of order: {header}"
        );

        let (_, read) = SafeTensors::read_metadata(&bytes).unwrap();
        assert_eq!(read.metadata().as_ref(), Some(&forward));
        let file = SafeTensors::deserialize(&bytes).unwrap();
        let want = values();
        for (name, view) in views(&want) {
            let got = file.tensor(name).unwrap();
            assert_eq!(
                (got.dtype(), got.shape()),
                (view.dtype(), view.shape()),
                "{name}"
            );
            assert_eq!(got.data(), view.data(), "{name}");
        }
    }
}
