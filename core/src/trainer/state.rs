//! Saving and restoring the whole training state through the checkpoint store.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;

use super::TrainError;
use crate::callback::{Callback, CallbackContext};
use crate::checkpoint::{read_tensors, CheckpointStore, TrainerState};
use crate::method::TrainingMethod;

/// File name of a role's trainable weights inside a checkpoint.
pub fn weights_file(role: &str) -> String {
    format!("{role}.safetensors")
}
/// File name of a role's optimizer state inside a checkpoint.
pub fn optim_file(role: &str) -> String {
    format!("{role}.optim.safetensors")
}
/// File name of a role's EMA shadow inside a checkpoint.
pub fn ema_file(role: &str) -> String {
    format!("{role}.ema.safetensors")
}

fn meta(pairs: &[(&str, String)]) -> Option<HashMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    )
}

/// Write a complete checkpoint of the current state; returns its folder.
pub(crate) fn save<B: AutodiffBackend>(
    store: &CheckpointStore,
    state: &TrainerState,
    resolved_toml: &str,
    fingerprint: &str,
    callbacks: &mut [Box<dyn Callback<B>>],
    ctx: &mut CallbackContext<'_, B>,
) -> Result<PathBuf, TrainError> {
    let pending = store.begin(state.step)?;
    let mut opt_steps = BTreeMap::new();
    for role in ctx.method.roles() {
        let name = role.name().to_string();
        let step_meta = meta(&[
            ("role", name.clone()),
            ("step", state.step.to_string()),
            ("format", "reel".into()),
        ]);
        pending.write_tensors(
            &weights_file(&name),
            &role.trainable_tensors(),
            step_meta.clone(),
        )?;
        let (opt, k) = role.optimizer_tensors();
        opt_steps.insert(name.clone(), k);
        pending.write_tensors(
            &optim_file(&name),
            &opt,
            meta(&[("optimizer_step", k.to_string())]),
        )?;
        if role.has_ema() {
            pending.write_tensors(&ema_file(&name), &role.ema_tensors(), step_meta)?;
        }
    }
    let mut st = state.clone();
    st.optimizer_steps = opt_steps;
    st.method_state = ctx.method.state();
    let json = serde_json::to_string_pretty(&st).expect("state serializes");
    pending.write_bytes("state.json", json.as_bytes())?;
    pending.write_bytes("config.toml", resolved_toml.as_bytes())?;
    for cb in callbacks.iter_mut() {
        cb.on_checkpoint(ctx, pending.dir())?;
    }
    Ok(store.commit(pending, fingerprint)?)
}

/// Restore roles, method state and callback state from a verified checkpoint folder.
pub(crate) fn restore<B: AutodiffBackend>(
    dir: &Path,
    method: &mut dyn TrainingMethod<B>,
) -> Result<TrainerState, TrainError> {
    let text = std::fs::read_to_string(dir.join("state.json"))
        .map_err(|e| crate::checkpoint::CheckpointError::io(&dir.join("state.json"), e))?;
    let state: TrainerState =
        serde_json::from_str(&text).map_err(|e| crate::checkpoint::CheckpointError::Damaged {
            dir: dir.to_path_buf(),
            reason: format!("state.json: {e}"),
        })?;
    for role in method.roles_mut() {
        let name = role.name().to_string();
        let (w, _) = read_tensors(dir, &weights_file(&name))?;
        role.load_trainable_tensors(&w)
            .map_err(crate::method::MethodError::from)?;
        let (o, _) = read_tensors(dir, &optim_file(&name))?;
        let k = state.optimizer_steps.get(&name).copied().unwrap_or(0);
        role.load_optimizer_tensors(&o, k)
            .map_err(crate::method::MethodError::from)?;
        if dir.join(ema_file(&name)).is_file() {
            let (e, _) = read_tensors(dir, &ema_file(&name))?;
            role.load_ema_tensors(&e)
                .map_err(crate::method::MethodError::from)?;
        }
    }
    method.load_state(&state.method_state)?;
    Ok(state)
}
