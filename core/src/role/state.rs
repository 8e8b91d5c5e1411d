//! Host ↔ device conversion of role state (weights, optimizer moments, EMA shadows) for
//! checkpoints, with the key and shape check that names every difference.

use std::collections::{BTreeMap, BTreeSet};

use burn::tensor::{backend::Backend, Tensor, TensorData};

use super::RoleStateError;

/// A flat device tensor as host data of `shape`.
pub(super) fn to_data<B: Backend>(t: Tensor<B, 1>, shape: &[usize]) -> TensorData {
    let mut d = t.into_data();
    d.shape = shape.to_vec().into();
    d
}

/// Host data (any float dtype) as a flat f32 tensor on `device`.
pub(super) fn flat_from_data<B: Backend>(d: &TensorData, device: &B::Device) -> Tensor<B, 1> {
    let n = d.num_elements();
    let values = d
        .clone()
        .convert::<f32>()
        .to_vec::<f32>()
        .unwrap_or_else(|e| panic!("f32 conversion of checked tensor data failed: {e:?}"));
    Tensor::from_data(TensorData::new(values, [n]), device)
}

/// Compare `tensors` with the `expected` keys and shapes of role `role`'s `what` state.
pub(super) fn check_keys(
    role: &str,
    what: &str,
    expected: &[(String, Vec<usize>)],
    tensors: &BTreeMap<String, TensorData>,
) -> Result<(), RoleStateError> {
    let mut missing = vec![];
    let mut wrong_shape = vec![];
    for (k, shape) in expected {
        match tensors.get(k) {
            None => missing.push(k.clone()),
            Some(d) if d.shape.as_slice() != shape.as_slice() => wrong_shape.push(format!(
                "{k}: expected {shape:?}, found {:?}",
                d.shape.as_slice()
            )),
            _ => {}
        }
    }
    let known: BTreeSet<&str> = expected.iter().map(|(k, _)| k.as_str()).collect();
    let unexpected: Vec<String> = tensors
        .keys()
        .filter(|k| !known.contains(k.as_str()))
        .cloned()
        .collect();
    if missing.is_empty() && unexpected.is_empty() && wrong_shape.is_empty() {
        Ok(())
    } else {
        Err(RoleStateError::Mismatch {
            role: role.to_string(),
            what: what.into(),
            missing,
            unexpected,
            wrong_shape,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes(keys: impl Iterator<Item = String>) -> Vec<(String, Vec<usize>)> {
        keys.map(|k| (k, vec![2])).collect()
    }

    #[test]
    fn mismatch_names_the_parts_and_counts_long_lists() {
        let expected = shapes((0..20).map(|i| format!("w{i:02}")));
        let mut tensors = BTreeMap::new();
        tensors.insert("w00".to_string(), TensorData::new(vec![0f32; 3], [3]));
        tensors.insert("extra".to_string(), TensorData::new(vec![0f32; 2], [2]));
        let err = check_keys("student", "optimizer", &expected, &tensors).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("role `student`: optimizer: 19 missing (w01, w02, w03,"),
            "{msg}"
        );
        assert!(msg.contains("w08, ... and 11 more)"), "{msg}");
        assert!(!msg.contains("w09"), "{msg}");
        assert!(msg.contains("1 unexpected (extra)"), "{msg}");
        assert!(
            msg.ends_with("1 wrong shape (w00: expected [2], found [3])"),
            "{msg}"
        );
        let ok: BTreeMap<_, _> = expected
            .iter()
            .map(|(k, _)| (k.clone(), TensorData::new(vec![0f32; 2], [2])))
            .collect();
        check_keys("student", "optimizer", &expected, &ok).unwrap();
        let mut only_extra = ok.clone();
        only_extra.insert("z".into(), TensorData::new(vec![0f32], [1]));
        let msg = check_keys("student", "ema", &expected, &only_extra)
            .unwrap_err()
            .to_string();
        assert_eq!(msg, "role `student`: ema: 1 unexpected (z)");
    }
}
