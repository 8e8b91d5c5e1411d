//! [`TrainableRole`]: a role's module with its pending gradients, AdamW state, learning-rate
//! schedule and optional EMA shadow, all addressed by parameter path.

use std::collections::BTreeMap;

use burn::module::AutodiffModule;
use burn::tensor::{backend::AutodiffBackend, Tensor, TensorData};

use super::module::{ParamValues, RoleModule};
use super::state::{check_keys, flat_from_data, to_data};
use super::{GradMap, RoleHandle, RoleStateError};
use crate::model::{DiffusionModel, DynModel, LossFn};
use crate::optim::{
    adamw_updates, ema_updates, squared_norm, AdamWScalars, AdamWState, Moments, OptimizerConfig,
};
use crate::parallel::ParallelError;

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// A trainable role owning its module `M` (a [`DynModel`](crate::model::DynModel) or any
/// Burn [`AutodiffModule`]).
#[derive(Debug)]
pub struct TrainableRole<B: AutodiffBackend, M: RoleModule<B>> {
    name: String,
    model: M,
    optimizer: OptimizerConfig,
    max_grad_norm: Option<f64>,
    max_steps: u64,
    state: AdamWState<Inner<B>>,
    grads: ParamValues<B>,
    ema: Option<ParamValues<B>>,
}

impl<B: AutodiffBackend, M: RoleModule<B>> TrainableRole<B, M> {
    /// A trainable role. `max_steps` is the run length used by the LR schedule.
    pub fn new(
        name: impl Into<String>,
        model: M,
        optimizer: OptimizerConfig,
        max_grad_norm: Option<f64>,
        max_steps: u64,
    ) -> Self {
        Self {
            name: name.into(),
            model,
            optimizer,
            max_grad_norm,
            max_steps,
            state: AdamWState::default(),
            grads: BTreeMap::new(),
            ema: None,
        }
    }

    /// The current module (autodiff).
    pub fn model(&self) -> &M {
        &self.model
    }

    /// Replace the module (e.g. after applying an adapter).
    pub fn set_model(&mut self, model: M) {
        self.model = model;
    }

    /// The optimizer settings.
    pub fn optimizer_config(&self) -> &OptimizerConfig {
        &self.optimizer
    }

    /// Accumulate the gradients in `grads` for this role's trainable parameters, multiplied by
    /// `scale` (use `1 / micro_batches` so accumulation averages).
    pub fn accumulate(&mut self, grads: &B::Gradients, scale: f64) {
        let collected = self.collect_grads(grads);
        self.add_grads(collected, scale);
    }

    /// The gradients in `grads` of this role's trainable parameters (those it has one for),
    /// flattened and keyed by dotted path, without accumulating them. With
    /// [`Self::add_grads`] this lets a method that runs its backward in stages (activation
    /// checkpointing) collect each stage while the model is borrowed.
    pub fn collect_grads(&self, grads: &B::Gradients) -> ParamValues<B> {
        self.model.param_grads(grads)
    }

    /// Accumulate gradients from [`Self::collect_grads`], multiplied by `scale`.
    pub fn add_grads(&mut self, grads: ParamValues<B>, scale: f64) {
        for (key, g) in grads {
            // One pass over every gradient saved in the common case of one micro-batch
            // (multiplying by 1 changes no bit).
            let g = if scale == 1.0 { g } else { g.mul_scalar(scale) };
            let acc = match self.grads.remove(&key) {
                Some(prev) => prev.add(g),
                None => g,
            };
            self.grads.insert(key, acc);
        }
    }

    /// Move this role's trainable parameters towards those of `source` (same module layout),
    /// on the device: `p ← d·p + (1−d)·q`, the EMA's update (fused when the role's optimizer
    /// is). `decay = 0` copies `source`. For a target network that follows another role
    /// (consistency distillation's EMA target) and is never stepped: its optimizer config only
    /// decides whether this update is fused; the optimizer state and any EMA shadow are
    /// untouched.
    pub fn follow(&mut self, source: &Self, decay: f64) {
        let mut src: ParamValues<B> = source
            .model
            .trainable_params()
            .into_iter()
            .map(|p| (p.path, p.value))
            .collect();
        let (mut paths, mut pairs) = (Vec::new(), Vec::new());
        for p in self.model.trainable_params() {
            let q = src.remove(&p.path).unwrap_or_else(|| {
                panic!(
                    "role `{}` follows `{}`, which lacks parameter `{}`",
                    self.name, source.name, p.path
                )
            });
            paths.push(p.path);
            pairs.push((p.value, q));
        }
        assert!(
            src.is_empty(),
            "role `{}` follows `{}`, which has extra parameters {:?}",
            self.name,
            source.name,
            src.keys().collect::<Vec<_>>()
        );
        // The EMA's own update (one launch per group of tensors on the fused backends).
        let next: Vec<_> = if decay == 0.0 {
            pairs.into_iter().map(|(_, q)| q).collect()
        } else {
            ema_updates(self.optimizer.fused, pairs, decay)
        };
        self.replace(paths.into_iter().zip(next).collect(), None);
    }

    /// `(path, shape)` of every trainable parameter.
    pub(super) fn shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.model
            .trainable_params()
            .into_iter()
            .map(|p| (p.path, p.shape))
            .collect()
    }

    /// Put `values` into the module; every value must find its parameter.
    pub(super) fn replace(&mut self, mut values: ParamValues<B>, old: Option<&mut ParamValues<B>>) {
        self.model.replace_params(&mut values, old);
        assert!(
            values.is_empty(),
            "role `{}`: parameters vanished while replacing: {:?}",
            self.name,
            values.keys().collect::<Vec<_>>()
        );
    }

    /// Host tensors as flat device values, after checking keys and shapes against `expected`.
    pub(super) fn device_values(
        &self,
        what: &str,
        expected: &[(String, Vec<usize>)],
        tensors: &BTreeMap<String, TensorData>,
    ) -> Result<ParamValues<B>, RoleStateError> {
        check_keys(&self.name, what, expected, tensors)?;
        let device = self.model.device();
        Ok(tensors
            .iter()
            .map(|(k, d)| (k.clone(), flat_from_data::<Inner<B>>(d, &device)))
            .collect())
    }
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> TrainableRole<B, M> {
    /// The current module without autodiff (for no-grad inference: sampling, targets).
    pub fn model_valid(&self) -> M::InnerModule {
        self.model.valid()
    }
}

impl<B: AutodiffBackend> TrainableRole<B, DynModel<B>> {
    /// The current model without autodiff (for no-grad inference: sampling, targets).
    pub fn model_valid(&self) -> Box<dyn DiffusionModel<Inner<B>>> {
        self.model.valid()
    }

    /// Forward, `loss(prediction)` and the model's block-checkpointed backward
    /// ([`TrainableModel::backward_checkpointed`](crate::model::TrainableModel)): the loss,
    /// detached, and this role's gradients stage by stage (add them with
    /// [`Self::add_grads`]; the gradients of other models in the loss's graph are dropped).
    pub fn checkpointed_grads(
        &self,
        latents: Tensor<B, 5>,
        timesteps: Tensor<B, 1>,
        text: Tensor<B, 3>,
        loss: LossFn<'_, B>,
    ) -> (Tensor<B, 1>, Vec<ParamValues<B>>) {
        let mut stages = Vec::new();
        let out = self
            .model
            .backward_checkpointed(latents, timesteps, text, loss, &mut |g| {
                stages.push(self.model.param_grads(g))
            });
        (out, stages)
    }

    /// [`Self::checkpointed_grads`] with the gradients accumulated with weight `scale`.
    pub fn checkpointed_backward(
        &mut self,
        latents: Tensor<B, 5>,
        timesteps: Tensor<B, 1>,
        text: Tensor<B, 3>,
        loss: LossFn<'_, B>,
        scale: f64,
    ) -> Tensor<B, 1> {
        let (out, stages) = self.checkpointed_grads(latents, timesteps, text, loss);
        for g in stages {
            self.add_grads(g, scale);
        }
        out
    }
}

impl<B: AutodiffBackend, M: RoleModule<B>> RoleHandle<B> for TrainableRole<B, M> {
    fn name(&self) -> &str {
        &self.name
    }

    fn has_pending_grads(&self) -> bool {
        !self.grads.is_empty()
    }

    fn grad_norm_sq(&self) -> Option<Tensor<Inner<B>, 1>> {
        let grads = self.grads.values().cloned().collect();
        squared_norm(self.optimizer.fused, grads)
    }

    fn apply_update(&mut self, step: u64, grad_scale: f64) {
        if self.grads.is_empty() {
            return;
        }
        let lr = self.optimizer.lr_at(step, self.max_steps);
        let k = self.state.step + 1;
        let grads = std::mem::take(&mut self.grads);
        let mut params: ParamValues<B> = self
            .model
            .trainable_params()
            .into_iter()
            .map(|p| (p.path, p.value))
            .collect();
        let scalars = AdamWScalars::new(&self.optimizer, lr, k, grad_scale);
        let mut paths = Vec::with_capacity(grads.len());
        let mut items = Vec::with_capacity(grads.len());
        for (path, g) in grads {
            let p = params.remove(&path).unwrap_or_else(|| {
                panic!(
                    "role `{}`: gradient for unknown parameter `{path}`",
                    self.name
                )
            });
            items.push((p, g, self.state.moments.remove(&path)));
            paths.push(path);
        }
        let updated = adamw_updates(&scalars, self.optimizer.fused, items);
        let mut new_values = ParamValues::<B>::new();
        for (path, (value, moments)) in paths.into_iter().zip(updated) {
            self.state.moments.insert(path.clone(), moments);
            new_values.insert(path, value);
        }
        self.state.step = k;
        self.replace(new_values, None);
    }

    fn map_grads(&mut self, f: GradMap<'_, B>) -> Result<(), ParallelError> {
        if self.grads.is_empty() {
            return Ok(());
        }
        let (keys, values): (Vec<String>, Vec<_>) =
            std::mem::take(&mut self.grads).into_iter().unzip();
        let values = f(values)?;
        assert_eq!(
            values.len(),
            keys.len(),
            "role `{}`: a gradient map returned {} tensors for {}",
            self.name,
            values.len(),
            keys.len()
        );
        self.grads = keys.into_iter().zip(values).collect();
        Ok(())
    }

    fn grad_counts(&self) -> (usize, usize) {
        (
            self.grads.len(),
            self.grads.values().map(|g| g.dims()[0]).sum(),
        )
    }

    fn discard_grads(&mut self) {
        self.grads.clear();
    }

    fn lr_at(&self, step: u64) -> f64 {
        self.optimizer.lr_at(step, self.max_steps)
    }

    fn max_grad_norm(&self) -> Option<f64> {
        self.max_grad_norm
    }

    fn optimizer_steps(&self) -> u64 {
        self.state.step
    }

    fn trainable_tensors(&self) -> Vec<(String, TensorData)> {
        self.model
            .trainable_params()
            .into_iter()
            .map(|p| (p.path, to_data(p.value, &p.shape)))
            .collect()
    }

    fn load_trainable_tensors(
        &mut self,
        tensors: &BTreeMap<String, TensorData>,
    ) -> Result<(), RoleStateError> {
        let values = self.device_values("weights", &self.shapes(), tensors)?;
        self.replace(values, None);
        Ok(())
    }

    fn optimizer_tensors(&self) -> Vec<(String, TensorData)> {
        let mut out = Vec::new();
        for (k, m) in &self.state.moments {
            let n = m.exp_avg.dims()[0];
            out.push((format!("exp_avg.{k}"), to_data(m.exp_avg.clone(), &[n])));
            out.push((
                format!("exp_avg_sq.{k}"),
                to_data(m.exp_avg_sq.clone(), &[n]),
            ));
        }
        out
    }

    fn load_optimizer_tensors(
        &mut self,
        tensors: &BTreeMap<String, TensorData>,
        step: u64,
    ) -> Result<(), RoleStateError> {
        // Moments exist for every parameter that has received a gradient; each parameter has
        // both moments or neither, with the flattened parameter shape.
        let mut expected = Vec::new();
        for (k, shape) in self.shapes() {
            let (m, v) = (format!("exp_avg.{k}"), format!("exp_avg_sq.{k}"));
            if tensors.contains_key(&m) || tensors.contains_key(&v) {
                let n = shape.iter().product::<usize>();
                expected.push((m, vec![n]));
                expected.push((v, vec![n]));
            }
        }
        let mut values = self.device_values("optimizer state", &expected, tensors)?;
        let mut moments = BTreeMap::new();
        for (k, _) in self.shapes() {
            let m = values.remove(&format!("exp_avg.{k}"));
            let v = values.remove(&format!("exp_avg_sq.{k}"));
            if let (Some(exp_avg), Some(exp_avg_sq)) = (m, v) {
                moments.insert(
                    k,
                    Moments {
                        exp_avg,
                        exp_avg_sq,
                    },
                );
            }
        }
        self.state = AdamWState { step, moments };
        Ok(())
    }

    fn ema_update(&mut self, decay: f64) {
        let current = self.model.trainable_params();
        let ema = self.ema.get_or_insert_with(BTreeMap::new);
        // A parameter without a shadow yet starts one at its value.
        let (mut paths, mut pairs) = (Vec::new(), Vec::new());
        for p in current {
            match ema.remove(&p.path) {
                Some(e) => {
                    paths.push(p.path);
                    pairs.push((e, p.value));
                }
                None => {
                    ema.insert(p.path, p.value);
                }
            }
        }
        let next = ema_updates(self.optimizer.fused, pairs, decay);
        ema.extend(paths.into_iter().zip(next));
    }

    fn has_ema(&self) -> bool {
        self.ema.is_some()
    }

    fn swap_ema(&mut self) {
        let Some(ema) = self.ema.take() else { return };
        let mut old = BTreeMap::new();
        self.replace(ema, Some(&mut old));
        self.ema = Some(old);
    }

    fn ema_tensors(&self) -> Vec<(String, TensorData)> {
        let Some(e) = &self.ema else {
            return vec![];
        };
        let shapes: BTreeMap<String, Vec<usize>> = self.shapes().into_iter().collect();
        e.iter()
            .map(|(k, t)| (k.clone(), to_data(t.clone(), &shapes[k])))
            .collect()
    }

    fn load_ema_tensors(
        &mut self,
        tensors: &BTreeMap<String, TensorData>,
    ) -> Result<(), RoleStateError> {
        self.ema = Some(self.device_values("ema", &self.shapes(), tensors)?);
        Ok(())
    }
}
