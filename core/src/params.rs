//! Parameter paths: visit and map the float parameters of any Burn module by their
//! dotted path (`blocks.0.attn1.to_q.weight`).
//!
//! Module field names in Reel equal the upstream checkpoint keys, so the dotted path of a
//! parameter *is* its key in a diffusers safetensors file, in an optimizer-state file and in a
//! checkpoint. Everything that reads or writes tensors by name goes through this module.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::{backend::Backend, Tensor, TensorData};

/// Tracks the current dotted path while a visitor or mapper walks a module tree.
#[derive(Debug, Default, Clone)]
pub struct PathStack {
    parts: Vec<String>,
}

impl PathStack {
    /// Enter a child module named `name`.
    pub fn push(&mut self, name: &str) {
        self.parts.push(name.to_string());
    }
    /// Leave the current child module.
    pub fn pop(&mut self) {
        self.parts.pop();
    }
    /// The dotted path of the current module, or of a leaf `field` under it (Burn reports the
    /// leaf parameter as the last entered module, so `field` is usually empty).
    pub fn joined(&self) -> String {
        self.parts.join(".")
    }
}

/// A float parameter returned by [`named_params`]: its dotted path, id, shape and value.
#[derive(Debug, Clone)]
pub struct NamedParam<B: Backend> {
    /// Dotted path, equal to the checkpoint key.
    pub path: String,
    /// Burn parameter id (stable for the lifetime of the module value).
    pub id: ParamId,
    /// Shape of the parameter.
    pub shape: Vec<usize>,
    /// The parameter value, flattened to one dimension.
    pub flat: Tensor<B, 1>,
}

/// Visits every float parameter together with its dotted path (what [`visit_named`] calls).
pub trait NamedParamVisitor<B: Backend> {
    /// Visit one parameter.
    fn visit<const D: usize>(&mut self, path: &str, param: &Param<Tensor<B, D>>);
}

struct VisitorAdapter<'a, V> {
    path: PathStack,
    inner: &'a mut V,
}

impl<B: Backend, V: NamedParamVisitor<B>> ModuleVisitor<B> for VisitorAdapter<'_, V> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name);
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let path = self.path.joined();
        self.inner.visit(&path, param);
    }
}

/// Call `visitor` on every float parameter of `module` with its dotted path, in module order.
pub fn visit_named<B: Backend, M: Module<B>, V: NamedParamVisitor<B>>(module: &M, visitor: &mut V) {
    let mut adapter = VisitorAdapter {
        path: PathStack::default(),
        inner: visitor,
    };
    module.visit(&mut adapter);
}

struct Collector<B: Backend>(Vec<NamedParam<B>>);

impl<B: Backend> NamedParamVisitor<B> for Collector<B> {
    fn visit<const D: usize>(&mut self, path: &str, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        let shape = value.dims().to_vec();
        let n = shape.iter().product::<usize>();
        self.0.push(NamedParam {
            path: path.to_string(),
            id: param.id,
            shape,
            flat: value.reshape([n]),
        });
    }
}

/// Every float parameter of `module` with its dotted path, in module order.
pub fn named_params<B: Backend, M: Module<B>>(module: &M) -> Vec<NamedParam<B>> {
    let mut c = Collector(Vec::new());
    visit_named(module, &mut c);
    c.0
}

/// Every float parameter of `module` copied to the host, keyed by dotted path.
pub fn named_tensor_data<B: Backend, M: Module<B>>(module: &M) -> Vec<(String, TensorData)> {
    named_params(module)
        .into_iter()
        .map(|p| {
            let mut data = p.flat.into_data();
            data.shape = p.shape.into();
            (p.path, data)
        })
        .collect()
}

/// A float parameter's dotted path and shape, read without initializing lazy parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamShape {
    /// Dotted path, equal to the checkpoint key.
    pub path: String,
    /// Burn parameter id.
    pub id: ParamId,
    /// Shape of the parameter.
    pub shape: Vec<usize>,
}

struct ShapeCollector(Vec<ParamShape>);

impl<B: Backend> NamedParamVisitor<B> for ShapeCollector {
    fn visit<const D: usize>(&mut self, path: &str, param: &Param<Tensor<B, D>>) {
        self.0.push(ParamShape {
            path: path.to_string(),
            id: param.id,
            shape: param.lazy_shape().to_vec(),
        });
    }
}

/// Path, id and shape of every float parameter of `module`, in module order. Unlike
/// [`named_params`] this does not initialize lazily initialized parameters, so it is cheap on
/// a freshly built model that is about to receive pretrained weights.
pub fn named_param_shapes<B: Backend, M: Module<B>>(module: &M) -> Vec<ParamShape> {
    let mut c = ShapeCollector(Vec::new());
    visit_named(module, &mut c);
    c.0
}

/// Values in `module`'s float parameters, counted from their shapes as
/// [`named_param_shapes`] reads them (lazy parameters stay lazy: nothing is allocated).
/// Saturating, so that an absurd configuration counts as more than any memory rather than
/// as a wrapped number.
pub fn num_param_values<B: Backend, M: Module<B>>(module: &M) -> u64 {
    let values = |s: &ParamShape| (s.shape.iter()).fold(1u64, |n, &d| n.saturating_mul(d as u64));
    (named_param_shapes(module).iter()).fold(0u64, |n, s| n.saturating_add(values(s)))
}

/// A transformation applied to every float parameter together with its dotted path.
pub trait NamedParamMapper<B: Backend> {
    /// Map one parameter. Return it unchanged to leave it alone.
    fn map<const D: usize>(
        &mut self,
        path: &str,
        param: Param<Tensor<B, D>>,
    ) -> Param<Tensor<B, D>>;
}

struct MapperAdapter<'a, F> {
    path: PathStack,
    inner: &'a mut F,
}

impl<B: Backend, F: NamedParamMapper<B>> ModuleMapper<B> for MapperAdapter<'_, F> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name);
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let path = self.path.joined();
        self.inner.map(&path, param)
    }
}

/// Apply `mapper` to every float parameter of `module`, passing each parameter's dotted path.
pub fn map_named<B: Backend, M: Module<B>, F: NamedParamMapper<B>>(module: M, mapper: &mut F) -> M {
    let mut adapter = MapperAdapter {
        path: PathStack::default(),
        inner: mapper,
    };
    module.map(&mut adapter)
}
