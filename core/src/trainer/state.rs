//! Saving and restoring the whole training state through the checkpoint store.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;

use super::TrainError;
use crate::callback::{Callback, CallbackContext};
use crate::checkpoint::{read_tensors, CheckpointError, CheckpointStore, TrainerState, STATE_FILE};
use crate::data::DataSpec;
use crate::method::TrainingMethod;
use crate::role::{RoleHandle, RoleStateError};

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

/// Where a checkpoint is taken: the loop's position and the config it belongs to.
#[derive(Debug, Clone)]
pub(super) struct SavePoint<'a> {
    /// Completed steps.
    pub step: u64,
    /// Data loader cursor to resume from.
    pub data_cursor: u64,
    /// Workers of the run that writes it.
    pub workers: usize,
    /// Run seed.
    pub seed: u64,
    /// The resolved config, saved as `config.toml`.
    pub resolved_toml: &'a str,
    /// The config fingerprint the manifest records.
    pub fingerprint: &'a str,
    /// Stamps of the roles' weight files ([`super::stamp`]).
    pub weights: BTreeMap<String, String>,
    /// The shapes of the run's samples.
    pub data_spec: DataSpec,
    /// The number of samples of the run's data set.
    pub data_len: u64,
    /// Steps skipped for non-finite values so far.
    pub skipped_steps: u64,
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
pub(super) fn save<B: AutodiffBackend>(
    store: &CheckpointStore,
    at: &SavePoint<'_>,
    callbacks: &mut [Box<dyn Callback<B>>],
    ctx: &mut CallbackContext<'_, B>,
) -> Result<PathBuf, TrainError> {
    let pending = store.begin(at.step)?;
    let mut optimizer_steps = BTreeMap::new();
    for role in ctx.method.roles() {
        let name = role.name().to_string();
        let step_meta = meta(&[
            ("role", name.clone()),
            ("step", at.step.to_string()),
            ("format", "reel".into()),
        ]);
        pending.write_tensors(
            &weights_file(&name),
            &role.trainable_tensors(),
            step_meta.clone(),
        )?;
        pending.write_tensors(&optim_file(&name), &role.optimizer_tensors(), None)?;
        optimizer_steps.insert(name.clone(), role.optimizer_steps());
        if role.has_ema() {
            pending.write_tensors(&ema_file(&name), &role.ema_tensors(), step_meta)?;
        }
    }
    let state = TrainerState {
        step: at.step,
        data_cursor: at.data_cursor,
        workers: at.workers,
        seed: at.seed,
        optimizer_steps,
        method_state: ctx.method.state(),
        weights: at.weights.clone(),
        data_spec: Some(at.data_spec),
        data_len: Some(at.data_len),
        skipped_steps: at.skipped_steps,
    };
    let json = serde_json::to_string_pretty(&state)
        .unwrap_or_else(|e| panic!("trainer state does not serialize: {e}"));
    pending.write_bytes(STATE_FILE, json.as_bytes())?;
    pending.write_bytes("config.toml", at.resolved_toml.as_bytes())?;
    for cb in callbacks.iter_mut() {
        cb.on_checkpoint(ctx, pending.dir())?;
    }
    // The tensors were read back: every call queued before has run.
    super::check_device(store, at.step)?;
    Ok(store.commit(pending, at.fingerprint)?)
}

/// Restore roles, method state and callback state from a verified checkpoint folder. The
/// EMA shadows are loaded for the roles of `ema_roles` only (those an EMA callback of the
/// config keeps): a shadow no callback updates would be saved, sampled and exported as it was
/// at this step for the rest of the run. Returns the state and the roles whose shadow in the
/// checkpoint was left out.
pub(super) fn restore<B: AutodiffBackend>(
    dir: &Path,
    method: &mut dyn TrainingMethod<B>,
    ema_roles: &[String],
) -> Result<(TrainerState, Vec<String>), TrainError> {
    let state = TrainerState::read(dir)?;
    let mut left_out = vec![];
    for role in method.roles_mut() {
        let name = role.name().to_string();
        let file = weights_file(&name);
        let (w, _) = read_tensors(dir, &file)?;
        (role.load_trainable_tensors(&w)).map_err(|e| does_not_fit(dir, &file, e))?;
        let file = optim_file(&name);
        let (o, _) = read_tensors(dir, &file)?;
        let k = state.optimizer_steps.get(&name).copied().unwrap_or(0);
        (role.load_optimizer_tensors(&o, k)).map_err(|e| does_not_fit(dir, &file, e))?;
        if ema_roles.contains(&name) {
            load_ema_if_kept(dir, role)?;
        } else if dir.join(ema_file(&name)).is_file() {
            left_out.push(name);
        }
    }
    method.load_state(&state.method_state)?;
    Ok((state, left_out))
}

/// Load the weights in `dir` (a run's `final/` folder or a checkpoint: each trainable role's
/// weights and, where the run kept one, its EMA shadow) into a freshly built method. No
/// optimizer or method state is read: for `sample` and `eval`, not for resuming. A role
/// without its file is an error naming the file.
pub(super) fn load_final<B: AutodiffBackend>(
    dir: &Path,
    method: &mut dyn TrainingMethod<B>,
) -> Result<(), TrainError> {
    for role in method.roles_mut() {
        let name = role.name().to_string();
        let file = weights_file(&name);
        if !dir.join(&file).is_file() {
            let why = format!("missing: the folder holds no weights file of role `{name}`");
            return Err(CheckpointError::io(&dir.join(&file), why).into());
        }
        let (w, _) = read_tensors(dir, &file)?;
        (role.load_trainable_tensors(&w)).map_err(|e| does_not_fit(dir, &file, e))?;
        load_ema_if_kept(dir, role)?;
    }
    Ok(())
}

/// The data shapes a run trained at, written beside the weights it publishes in `final/`
/// (which holds no checkpoint state), so that they can be sampled where the data is not.
pub const SHAPES_FILE: &str = "shapes.json";

/// Write `spec` as `dir`'s [`SHAPES_FILE`], whole or not at all ([`crate::io::replace_file`]).
pub(super) fn write_shapes(dir: &Path, spec: &DataSpec) -> Result<(), TrainError> {
    let path = dir.join(SHAPES_FILE);
    let text = serde_json::to_string_pretty(spec).map_err(|e| super::io_err(&path, e))?;
    crate::io::replace_file(&path, text.as_bytes()).map_err(|e| super::io_err(&path, e))
}

/// The data shapes recorded beside published weights ([`SHAPES_FILE`] in `final/` or a copy
/// of it); `None` where there is no such file (a run published before it was written) or it
/// does not read as one.
pub fn final_shapes(dir: &Path) -> Option<DataSpec> {
    let text = std::fs::read_to_string(dir.join(SHAPES_FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Load `role`'s EMA shadow from `dir` when the run kept one there.
fn load_ema_if_kept<B: AutodiffBackend>(
    dir: &Path,
    role: &mut dyn RoleHandle<B>,
) -> Result<(), TrainError> {
    let name = ema_file(role.name());
    if dir.join(&name).is_file() {
        let (e, _) = read_tensors(dir, &name)?;
        (role.load_ema_tensors(&e)).map_err(|e| does_not_fit(dir, &name, e))?;
    }
    Ok(())
}

/// A role whose state does not fit the tensors of `dir`'s `file`, as an error naming the file.
fn does_not_fit(dir: &Path, file: &str, e: RoleStateError) -> TrainError {
    CheckpointError::does_not_fit(&dir.join(file), &e).into()
}
