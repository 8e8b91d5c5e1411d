//! [`RoleModule`]: what a trainable role needs of its module, addressed by parameter path.
//!
//! Implemented for every Burn [`AutodiffModule`] (walking it with a visitor or mapper) and for
//! [`DynModel`](crate::model::DynModel) (delegating to the model it wraps), so a role can own
//! a concrete module (discriminator heads) or a model of any architecture.

use std::collections::BTreeMap;

use burn::module::{AutodiffModule, Param};
use burn::tensor::{backend::AutodiffBackend, backend::Backend, Tensor};

use crate::host::reshape;
use crate::params::{map_named, visit_named, NamedParamMapper, NamedParamVisitor};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// Flat parameter values (or gradients) of a role on the inner backend, by dotted path.
pub type ParamValues<B> = BTreeMap<String, Tensor<Inner<B>, 1>>;

/// A trainable parameter: dotted path, flattened value and original shape.
#[derive(Debug, Clone)]
pub struct FlatParam<I: Backend> {
    /// Dotted path (the checkpoint key).
    pub path: String,
    /// The value, flattened.
    pub value: Tensor<I, 1>,
    /// The parameter's shape.
    pub shape: Vec<usize>,
}

/// The module of a trainable role, seen through its parameter paths.
pub trait RoleModule<B: AutodiffBackend>: Send {
    /// The gradients in `grads` of the trainable parameters that have one, flattened.
    fn param_grads(&self, grads: &B::Gradients) -> ParamValues<B>;
    /// The trainable parameters (those that require gradients), in module order.
    fn trainable_params(&self) -> Vec<FlatParam<Inner<B>>>;
    /// Replace trainable parameters by path with the flat values in `values` (removing each
    /// one used; their ids and `require_grad` flags are kept). With `old`, the replaced
    /// values are stored there.
    fn replace_params(&mut self, values: &mut ParamValues<B>, old: Option<&mut ParamValues<B>>);
    /// Every float parameter, trainable or frozen, in module order.
    fn all_params(&self) -> Vec<FlatParam<Inner<B>>>;
    /// Stop every parameter from requiring gradients (a frozen role).
    fn freeze(&mut self);
    /// The device the parameters live on.
    fn device(&self) -> B::Device;
}

struct GradCollector<'a, B: AutodiffBackend> {
    grads: &'a B::Gradients,
    out: ParamValues<B>,
}

impl<B: AutodiffBackend> NamedParamVisitor<B> for GradCollector<'_, B> {
    fn visit<const D: usize>(&mut self, path: &str, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        if !value.is_require_grad() {
            return;
        }
        if let Some(g) = value.grad(self.grads) {
            let n = g.dims().iter().product::<usize>();
            self.out.insert(path.to_string(), reshape(g, [n]));
        }
    }
}

/// Collects flat inner values of the parameters (all, or those that require gradients).
struct FlatCollector<B: AutodiffBackend> {
    trainable_only: bool,
    out: Vec<FlatParam<Inner<B>>>,
}

impl<B: AutodiffBackend> NamedParamVisitor<B> for FlatCollector<B> {
    fn visit<const D: usize>(&mut self, path: &str, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        if self.trainable_only && !value.is_require_grad() {
            return;
        }
        let shape = value.dims().to_vec();
        let n = shape.iter().product::<usize>();
        self.out.push(FlatParam {
            path: path.to_string(),
            value: reshape(value.inner(), [n]),
            shape,
        });
    }
}

/// The flat inner values of `module`'s parameters (only trainable ones when asked).
fn flat_params<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    trainable_only: bool,
) -> Vec<FlatParam<Inner<B>>> {
    let mut c = FlatCollector::<B> {
        trainable_only,
        out: Vec::new(),
    };
    visit_named(module, &mut c);
    c.out
}

/// Replaces parameters by path with new inner values (keeps id and `require_grad`).
struct Replace<'a, B: AutodiffBackend> {
    values: &'a mut ParamValues<B>,
    old: Option<&'a mut ParamValues<B>>,
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
            old.insert(path.to_string(), reshape(tensor.inner(), [n]));
        }
        let mut t = Tensor::<B, D>::from_inner(reshape(new, dims));
        if require_grad {
            t = t.require_grad();
        }
        Param::from_mapped_value(id, t, mapper)
    }
}

impl<B: AutodiffBackend, M: AutodiffModule<B>> RoleModule<B> for M {
    fn param_grads(&self, grads: &B::Gradients) -> ParamValues<B> {
        let mut c = GradCollector::<B> {
            grads,
            out: BTreeMap::new(),
        };
        visit_named(self, &mut c);
        c.out
    }

    fn trainable_params(&self) -> Vec<FlatParam<Inner<B>>> {
        flat_params(self, true)
    }

    fn replace_params(&mut self, values: &mut ParamValues<B>, old: Option<&mut ParamValues<B>>) {
        let mut r = Replace::<B> { values, old };
        *self = map_named(self.clone(), &mut r);
    }

    fn all_params(&self) -> Vec<FlatParam<Inner<B>>> {
        flat_params(self, false)
    }

    fn freeze(&mut self) {
        *self = self.clone().no_grad();
    }

    fn device(&self) -> B::Device {
        self.devices().into_iter().next().unwrap_or_default()
    }
}
