//! Host ↔ device conversion of role state (weights, optimizer moments, EMA shadows) for
//! checkpoints, with the key and shape check that names every difference.

use std::collections::BTreeMap;

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
    let unexpected: Vec<String> = tensors
        .keys()
        .filter(|k| !expected.iter().any(|(e, _)| e == *k))
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
