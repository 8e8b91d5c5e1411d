//! [`RoleHandle`]: the object-safe view of a trainable role that the trainer, checkpoints and
//! callbacks use, and [`RoleFields`], how a method lists its roles (derived with
//! `#[derive(Roles)]`).

use std::collections::BTreeMap;

use burn::tensor::{backend::AutodiffBackend, Tensor, TensorData};

use super::{RoleModule, TrainableRole};
use crate::io::key_list;
use crate::parallel::ParallelError;

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Errors restoring role state from a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum RoleStateError {
    /// Tensors in the file do not match the role's trainable parameters.
    #[error(
        "role `{role}`: {what}: {}",
        mismatch_parts(missing, unexpected, wrong_shape)
    )]
    Mismatch {
        /// Role name.
        role: String,
        /// Which state (weights, optimizer, ema).
        what: String,
        /// Keys the role needs that the file lacks.
        missing: Vec<String>,
        /// Keys in the file the role does not have.
        unexpected: Vec<String>,
        /// Keys with a different shape (`key: expected vs found`).
        wrong_shape: Vec<String>,
    },
}

/// The non-empty parts of a [`RoleStateError::Mismatch`], each a count and its first keys.
fn mismatch_parts(missing: &[String], unexpected: &[String], wrong_shape: &[String]) -> String {
    let parts: Vec<String> = [
        ("missing", missing),
        ("unexpected", unexpected),
        ("wrong shape", wrong_shape),
    ]
    .into_iter()
    .filter(|(_, keys)| !keys.is_empty())
    .map(|(what, keys)| format!("{} {what} ({})", keys.len(), key_list(keys)))
    .collect();
    parts.join("; ")
}

/// A function over a role's flat gradients (see [`RoleHandle::map_grads`]).
pub type GradMap<'a, B> =
    &'a mut dyn FnMut(Vec<Tensor<Inner<B>, 1>>) -> Result<Vec<Tensor<Inner<B>, 1>>, ParallelError>;

/// Object-safe view of a trainable role used by the trainer, checkpoints and callbacks.
pub trait RoleHandle<B: AutodiffBackend>: Send {
    /// Role name.
    fn name(&self) -> &str;
    /// Whether gradients are waiting to be applied this step.
    fn has_pending_grads(&self) -> bool;
    /// Squared global L2 norm of the pending (already averaged) gradients, as a 1-element
    /// device tensor (no host sync). `None` without pending gradients.
    fn grad_norm_sq(&self) -> Option<Tensor<Inner<B>, 1>>;
    /// Apply the pending gradients with AdamW at global step `step`, scaled by `grad_scale`
    /// (the clipping factor), then clear them.
    fn apply_update(&mut self, step: u64, grad_scale: f64);
    /// Replace the pending gradients, in key order, by `f` of them (the data-parallel
    /// all-reduce); no call without pending gradients.
    fn map_grads(&mut self, f: GradMap<'_, B>) -> Result<(), ParallelError>;
    /// `(tensors, values)` of the pending gradients.
    fn grad_counts(&self) -> (usize, usize);
    /// Drop pending gradients without updating (non-finite skip, or a role not due).
    fn discard_grads(&mut self);
    /// Learning rate at global step `step`.
    fn lr_at(&self, step: u64) -> f64;
    /// Gradient-clipping threshold (global L2 norm), if any.
    fn max_grad_norm(&self) -> Option<f64>;
    /// Optimizer steps taken so far.
    fn optimizer_steps(&self) -> u64;
    /// The trainable parameters (those that require gradients) copied to the host.
    fn trainable_tensors(&self) -> Vec<(String, TensorData)>;
    /// Replace the trainable parameters from host tensors (exact key set and shapes).
    fn load_trainable_tensors(
        &mut self,
        tensors: &BTreeMap<String, TensorData>,
    ) -> Result<(), RoleStateError>;
    /// Optimizer moments as host tensors (`exp_avg.<path>`, `exp_avg_sq.<path>`); the step
    /// count is [`Self::optimizer_steps`].
    fn optimizer_tensors(&self) -> Vec<(String, TensorData)>;
    /// Restore the optimizer state: moments and step count.
    fn load_optimizer_tensors(
        &mut self,
        tensors: &BTreeMap<String, TensorData>,
        step: u64,
    ) -> Result<(), RoleStateError>;
    /// Update the EMA shadow `e ← d·e + (1−d)·p` (initialised from the weights on first use).
    fn ema_update(&mut self, decay: f64);
    /// Whether an EMA shadow exists.
    fn has_ema(&self) -> bool;
    /// Swap live weights and EMA shadow (call twice to swap back). No-op without EMA.
    fn swap_ema(&mut self);
    /// EMA shadow as host tensors.
    fn ema_tensors(&self) -> Vec<(String, TensorData)>;
    /// Restore the EMA shadow.
    fn load_ema_tensors(
        &mut self,
        tensors: &BTreeMap<String, TensorData>,
    ) -> Result<(), RoleStateError>;
}

/// The trainable roles of a method, as the trainer, checkpoints and callbacks see them.
/// Derive it: `#[derive(Roles)]` on the method struct with `#[role]` on each field that holds
/// a [`TrainableRole`](super::TrainableRole) (or an `Option` of one); roles are listed in
/// field order.
pub trait RoleFields<B: AutodiffBackend> {
    /// The roles, read-only.
    fn role_fields(&self) -> Vec<&dyn RoleHandle<B>>;
    /// The roles, mutable.
    fn role_fields_mut(&mut self) -> Vec<&mut dyn RoleHandle<B>>;
}

/// A method field that holds roles: a role, or an optional one (what `#[role]` accepts).
pub trait RoleField<B: AutodiffBackend> {
    /// Append the roles of this field.
    fn push_roles<'a>(&'a self, out: &mut Vec<&'a dyn RoleHandle<B>>);
    /// Append the roles of this field, mutable.
    fn push_roles_mut<'a>(&'a mut self, out: &mut Vec<&'a mut dyn RoleHandle<B>>);
}

impl<B: AutodiffBackend, M: RoleModule<B>> RoleField<B> for TrainableRole<B, M> {
    fn push_roles<'a>(&'a self, out: &mut Vec<&'a dyn RoleHandle<B>>) {
        out.push(self);
    }
    fn push_roles_mut<'a>(&'a mut self, out: &mut Vec<&'a mut dyn RoleHandle<B>>) {
        out.push(self);
    }
}

impl<B: AutodiffBackend, M: RoleModule<B>> RoleField<B> for Option<TrainableRole<B, M>> {
    fn push_roles<'a>(&'a self, out: &mut Vec<&'a dyn RoleHandle<B>>) {
        if let Some(r) = self {
            out.push(r);
        }
    }
    fn push_roles_mut<'a>(&'a mut self, out: &mut Vec<&'a mut dyn RoleHandle<B>>) {
        if let Some(r) = self {
            out.push(r);
        }
    }
}
