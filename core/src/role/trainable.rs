//! The runtime state of a trainable role: its module, accumulated gradients, AdamW state,
//! learning-rate schedule and optional EMA shadow, all addressed by parameter path.

use std::collections::{BTreeMap, HashMap};

use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::tensor::{backend::AutodiffBackend, Tensor, TensorData};

use crate::optim::{adamw_update, AdamWState, Moments, OptimizerConfig};
use crate::params::{map_named, NamedParamMapper, PathStack};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Errors restoring role state from a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum RoleStateError {
    /// Tensors in the file do not match the role's trainable parameters.
    #[error("role `{role}`: {what}: missing {missing:?}, unexpected {unexpected:?}, wrong shape {wrong_shape:?}")]
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
    /// Optimizer state as host tensors (`exp_avg.<path>`, `exp_avg_sq.<path>`) plus step count.
    fn optimizer_tensors(&self) -> (Vec<(String, TensorData)>, u64);
    /// Restore the optimizer state.
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

/// A trainable role owning its module `M`.
#[derive(Debug)]
pub struct TrainableRole<B: AutodiffBackend, M: AutodiffModule<B>> {
    name: String,
    model: Option<M>,
    optimizer: OptimizerConfig,
    max_grad_norm: Option<f64>,
    max_steps: u64,
    state: AdamWState<Inner<B>>,
    grads: BTreeMap<String, Tensor<Inner<B>, 1>>,
    ema: Option<BTreeMap<String, Tensor<Inner<B>, 1>>>,
}

struct GradCollector<'a, B: AutodiffBackend> {
    path: PathStack,
    grads: &'a B::Gradients,
    out: &'a mut BTreeMap<String, Tensor<Inner<B>, 1>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for GradCollector<'_, B> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name);
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        if !value.is_require_grad() {
            return;
        }
        if let Some(g) = value.grad(self.grads) {
            let n = g.dims().iter().product::<usize>();
            self.out.insert(self.path.joined(), g.reshape([n]));
        }
    }
}

struct TrainableCollector<B: AutodiffBackend> {
    path: PathStack,
    out: Vec<(String, Tensor<Inner<B>, 1>, Vec<usize>)>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for TrainableCollector<B> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name);
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        if value.is_require_grad() {
            let dims = value.dims().to_vec();
            let n = dims.iter().product::<usize>();
            self.out
                .push((self.path.joined(), value.inner().reshape([n]), dims));
        }
    }
}

/// Replaces trainable parameters by path with new inner values (keeps id and require_grad).
struct Replace<'a, B: AutodiffBackend> {
    values: &'a mut HashMap<String, Tensor<Inner<B>, 1>>,
    /// Old values of replaced parameters, when requested (EMA swap).
    old: Option<&'a mut BTreeMap<String, Tensor<Inner<B>, 1>>>,
}

impl<B: AutodiffBackend> NamedParamMapper<B> for Replace<'_, B> {
    fn map<const D: usize>(
        &mut self,
        path: &str,
        param: Param<Tensor<B, D>>,
    ) -> Param<Tensor<B, D>> {
        let Some(new) = self.values.remove(path) else {
            return param;
        };
        let (id, tensor, mapper) = param.consume();
        let dims = tensor.dims();
        let require_grad = tensor.is_require_grad();
        if let Some(old) = self.old.as_deref_mut() {
            let n = dims.iter().product::<usize>();
            old.insert(path.to_string(), tensor.inner().reshape([n]));
        }
        let mut t = Tensor::<B, D>::from_inner(new.reshape(dims));
        if require_grad {
            t = t.require_grad();
        }
        Param::from_mapped_value(id, t, mapper)
    }
}

fn to_data<B: burn::tensor::backend::Backend>(t: Tensor<B, 1>, shape: &[usize]) -> TensorData {
    let mut d = t.into_data();
    d.shape = shape.to_vec().into();
    d
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> TrainableRole<B, M> {
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
            model: Some(model),
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
        self.model
            .as_ref()
            .expect("role model is always present outside updates")
    }

    /// The current module without autodiff (for no-grad inference: sampling, targets).
    pub fn model_valid(&self) -> M::InnerModule {
        self.model().valid()
    }

    /// Replace the module (e.g. after applying an adapter).
    pub fn set_model(&mut self, model: M) {
        self.model = Some(model);
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
    pub fn collect_grads(&self, grads: &B::Gradients) -> BTreeMap<String, Tensor<Inner<B>, 1>> {
        let mut out = BTreeMap::new();
        let mut c = GradCollector::<B> {
            path: PathStack::default(),
            grads,
            out: &mut out,
        };
        self.model().visit(&mut c);
        out
    }

    /// Accumulate gradients from [`Self::collect_grads`], multiplied by `scale`.
    pub fn add_grads(&mut self, grads: BTreeMap<String, Tensor<Inner<B>, 1>>, scale: f64) {
        for (key, g) in grads {
            let g = g.mul_scalar(scale);
            let acc = match self.grads.remove(&key) {
                Some(prev) => prev.add(g),
                None => g,
            };
            self.grads.insert(key, acc);
        }
    }

    /// Move this role's trainable parameters towards those of `source` (same module layout),
    /// on the device: `p ← d·p + (1−d)·q`. `decay = 0` copies `source`. For a target network
    /// that follows another role (consistency distillation's EMA target) without an optimizer
    /// of its own; the optimizer state and any EMA shadow are untouched.
    pub fn follow(&mut self, source: &Self, decay: f64) {
        let mut src: HashMap<String, Tensor<Inner<B>, 1>> = source
            .trainable()
            .into_iter()
            .map(|(k, t, _)| (k, t))
            .collect();
        let values: HashMap<String, Tensor<Inner<B>, 1>> = self
            .trainable()
            .into_iter()
            .map(|(k, p, _)| {
                let q = src.remove(&k).unwrap_or_else(|| {
                    panic!(
                        "role `{}` follows `{}`, which lacks parameter `{k}`",
                        self.name, source.name
                    )
                });
                let next = if decay == 0.0 {
                    q
                } else {
                    p.mul_scalar(decay).add(q.mul_scalar(1.0 - decay))
                };
                (k, next)
            })
            .collect();
        assert!(
            src.is_empty(),
            "role `{}` follows `{}`, which has extra parameters {:?}",
            self.name,
            source.name,
            src.keys().collect::<Vec<_>>()
        );
        self.replace(values, None);
    }

    fn trainable(&self) -> Vec<(String, Tensor<Inner<B>, 1>, Vec<usize>)> {
        let mut c = TrainableCollector::<B> {
            path: PathStack::default(),
            out: Vec::new(),
        };
        self.model().visit(&mut c);
        c.out
    }

    fn replace(
        &mut self,
        mut values: HashMap<String, Tensor<Inner<B>, 1>>,
        old: Option<&mut BTreeMap<String, Tensor<Inner<B>, 1>>>,
    ) {
        let model = self.model.take().expect("role model present");
        let mut r = Replace::<B> {
            values: &mut values,
            old,
        };
        self.model = Some(map_named(model, &mut r));
        assert!(
            values.is_empty(),
            "role `{}`: parameters vanished while replacing: {:?}",
            self.name,
            values.keys().collect::<Vec<_>>()
        );
    }

    fn check_keys(
        &self,
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
                role: self.name.clone(),
                what: what.into(),
                missing,
                unexpected,
                wrong_shape,
            })
        }
    }

    fn flat_from_data(&self, d: &TensorData) -> Tensor<Inner<B>, 1> {
        let device = self
            .model()
            .devices()
            .into_iter()
            .next()
            .unwrap_or_default();
        let n = d.num_elements();
        let data = TensorData::new(
            d.clone()
                .convert::<f32>()
                .to_vec::<f32>()
                .expect("f32 data"),
            [n],
        );
        Tensor::from_data(data, &device)
    }
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> RoleHandle<B> for TrainableRole<B, M> {
    fn name(&self) -> &str {
        &self.name
    }

    fn has_pending_grads(&self) -> bool {
        !self.grads.is_empty()
    }

    fn grad_norm_sq(&self) -> Option<Tensor<Inner<B>, 1>> {
        let parts: Vec<Tensor<Inner<B>, 1>> = self
            .grads
            .values()
            .map(|g| g.clone().square().sum())
            .collect();
        if parts.is_empty() {
            None
        } else {
            Some(Tensor::cat(parts, 0).sum())
        }
    }

    fn apply_update(&mut self, step: u64, grad_scale: f64) {
        if self.grads.is_empty() {
            return;
        }
        let lr = self.optimizer.lr_at(step, self.max_steps);
        let k = self.state.step + 1;
        let grads = std::mem::take(&mut self.grads);
        let params: HashMap<String, Tensor<Inner<B>, 1>> = self
            .trainable()
            .into_iter()
            .map(|(k, t, _)| (k, t))
            .collect();
        let mut new_values = HashMap::new();
        for (path, g) in grads {
            let p = params
                .get(&path)
                .unwrap_or_else(|| {
                    panic!(
                        "role `{}`: gradient for unknown parameter `{path}`",
                        self.name
                    )
                })
                .clone();
            let g = if grad_scale == 1.0 {
                g
            } else {
                g.mul_scalar(grad_scale)
            };
            let prev = self.state.moments.remove(&path);
            let (updated, moments) = adamw_update(&self.optimizer, lr, k, p, g, prev);
            self.state.moments.insert(path.clone(), moments);
            new_values.insert(path, updated);
        }
        self.state.step = k;
        self.replace(new_values, None);
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
        self.trainable()
            .into_iter()
            .map(|(k, t, shape)| (k, to_data(t, &shape)))
            .collect()
    }

    fn load_trainable_tensors(
        &mut self,
        tensors: &BTreeMap<String, TensorData>,
    ) -> Result<(), RoleStateError> {
        let expected: Vec<(String, Vec<usize>)> = self
            .trainable()
            .into_iter()
            .map(|(k, _, s)| (k, s))
            .collect();
        self.check_keys("weights", &expected, tensors)?;
        let values = tensors
            .iter()
            .map(|(k, d)| (k.clone(), self.flat_from_data(d)))
            .collect();
        self.replace(values, None);
        Ok(())
    }

    fn optimizer_tensors(&self) -> (Vec<(String, TensorData)>, u64) {
        let mut out = Vec::new();
        for (k, m) in &self.state.moments {
            let n = m.exp_avg.dims()[0];
            out.push((format!("exp_avg.{k}"), to_data(m.exp_avg.clone(), &[n])));
            out.push((
                format!("exp_avg_sq.{k}"),
                to_data(m.exp_avg_sq.clone(), &[n]),
            ));
        }
        (out, self.state.step)
    }

    fn load_optimizer_tensors(
        &mut self,
        tensors: &BTreeMap<String, TensorData>,
        step: u64,
    ) -> Result<(), RoleStateError> {
        // Moments exist for every parameter that has received a gradient; each parameter has
        // both moments or neither, with the flattened parameter shape.
        let trainable = self.trainable();
        let mut expected = Vec::new();
        for (k, t, _) in &trainable {
            let (m, v) = (format!("exp_avg.{k}"), format!("exp_avg_sq.{k}"));
            if tensors.contains_key(&m) || tensors.contains_key(&v) {
                let n = t.dims()[0];
                expected.push((m, vec![n]));
                expected.push((v, vec![n]));
            }
        }
        self.check_keys("optimizer state", &expected, tensors)?;
        let mut moments = BTreeMap::new();
        for (k, _, _) in &trainable {
            if let (Some(m), Some(v)) = (
                tensors.get(&format!("exp_avg.{k}")),
                tensors.get(&format!("exp_avg_sq.{k}")),
            ) {
                moments.insert(
                    k.clone(),
                    Moments {
                        exp_avg: self.flat_from_data(m),
                        exp_avg_sq: self.flat_from_data(v),
                    },
                );
            }
        }
        self.state = AdamWState { step, moments };
        Ok(())
    }

    fn ema_update(&mut self, decay: f64) {
        let current = self.trainable();
        let ema = self.ema.get_or_insert_with(BTreeMap::new);
        for (k, t, _) in current {
            let next = match ema.remove(&k) {
                Some(e) => e.mul_scalar(decay).add(t.mul_scalar(1.0 - decay)),
                None => t,
            };
            ema.insert(k, next);
        }
    }

    fn has_ema(&self) -> bool {
        self.ema.is_some()
    }

    fn swap_ema(&mut self) {
        let Some(ema) = self.ema.take() else { return };
        let mut old = BTreeMap::new();
        self.replace(ema.into_iter().collect(), Some(&mut old));
        self.ema = Some(old);
    }

    fn ema_tensors(&self) -> Vec<(String, TensorData)> {
        match &self.ema {
            None => vec![],
            Some(e) => {
                let shapes: HashMap<String, Vec<usize>> = self
                    .trainable()
                    .into_iter()
                    .map(|(k, _, s)| (k, s))
                    .collect();
                e.iter()
                    .map(|(k, t)| (k.clone(), to_data(t.clone(), &shapes[k])))
                    .collect()
            }
        }
    }

    fn load_ema_tensors(
        &mut self,
        tensors: &BTreeMap<String, TensorData>,
    ) -> Result<(), RoleStateError> {
        let expected: Vec<(String, Vec<usize>)> = self
            .trainable()
            .into_iter()
            .map(|(k, _, s)| (k, s))
            .collect();
        self.check_keys("ema", &expected, tensors)?;
        self.ema = Some(
            tensors
                .iter()
                .map(|(k, d)| (k.clone(), self.flat_from_data(d)))
                .collect(),
        );
        Ok(())
    }
}
