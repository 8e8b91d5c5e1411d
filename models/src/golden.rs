//! The Wan golden fixtures (diffusers' outputs, [`reel_core::fixtures::WAN`]) read for the
//! parity tests, and the comparisons they make: shared by this crate's unit tests
//! (`wan::parity`), its integration tests and the method golden tests of `reel-methods`.
//!
//! These are test helpers: a missing or unreadable fixture file panics with its path, so the
//! calling test fails and says what to fix.

use std::collections::BTreeMap;
use std::path::PathBuf;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};
use reel_core::io::read_safetensors;
use reel_core::params::PathStack;

use crate::{WanConfig, WanModel};

/// The golden fixture folder (`$REEL_WAN_FIXTURES`, else the repository's
/// `tests/fixtures/wan_tiny`). Panics (the test fails) when it is incomplete.
pub fn fixtures_dir() -> PathBuf {
    reel_core::fixtures::WAN.require(&[
        "config.json",
        "model.safetensors",
        "inputs.safetensors",
        "outputs.safetensors",
        "train_step.safetensors",
    ])
}

/// All tensors of the fixture file `name` (in [`fixtures_dir`]), keyed by name.
pub fn fixture(name: &str) -> BTreeMap<String, TensorData> {
    let path = fixtures_dir().join(name);
    read_safetensors(&path)
        .unwrap_or_else(|e| panic!("cannot read fixture: {e}"))
        .0
}

/// The fixture model's config (`config.json`).
pub fn fixture_config() -> WanConfig {
    let path = fixtures_dir().join("config.json");
    WanConfig::from_json_file(&path)
        .unwrap_or_else(|e| panic!("cannot read fixture config {}: {e}", path.display()))
}

/// The fixture model A (`model.safetensors`) on backend `B`.
pub fn fixture_model<B: Backend>(device: &B::Device) -> WanModel<B> {
    let model = fixture_config().init::<B>(device);
    model
        .load_weights(fixtures_dir().join("model.safetensors"))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A tensor of rank `D` from host data.
pub fn tensor<B: Backend, const D: usize>(data: &TensorData, device: &B::Device) -> Tensor<B, D> {
    Tensor::from_data(data.clone(), device)
}

/// Host f32 values of `data` (panics when they are not float32).
pub fn values(data: &TensorData) -> Vec<f32> {
    data.to_vec::<f32>()
        .unwrap_or_else(|e| panic!("expected float32 values: {e:?}"))
}

/// `(max |got - want|, max |want|)`; panics on a shape mismatch or a non-finite value of `got`,
/// naming the tensor `name`.
pub fn max_err(name: &str, got: &TensorData, want: &TensorData) -> (f64, f64) {
    assert_eq!(got.shape, want.shape, "{name}: shape");
    let (g, w) = (values(got), values(want));
    let mut err = 0f64;
    let mut scale = 0f64;
    for (a, b) in g.iter().zip(&w) {
        assert!(a.is_finite(), "{name}: non-finite value");
        err = err.max((*a as f64 - *b as f64).abs());
        scale = scale.max((*b as f64).abs());
    }
    (err, scale)
}

/// The gradient of every float parameter of `module`, keyed by dotted path (the checkpoint
/// key); panics naming the first parameter that has none.
pub fn named_grads<B: AutodiffBackend, M: Module<B>>(
    module: &M,
    grads: &B::Gradients,
) -> BTreeMap<String, TensorData> {
    collect_grads(module, grads, true)
}

/// The gradients `grads` holds for parameters of `module` (one stage of a checkpointed
/// backward holds only its own; a frozen parameter has none), keyed by dotted path.
pub fn present_grads<B: AutodiffBackend, M: Module<B>>(
    module: &M,
    grads: &B::Gradients,
) -> BTreeMap<String, TensorData> {
    collect_grads(module, grads, false)
}

fn collect_grads<B: AutodiffBackend, M: Module<B>>(
    module: &M,
    grads: &B::Gradients,
    all: bool,
) -> BTreeMap<String, TensorData> {
    struct V<'a, B: AutodiffBackend> {
        path: PathStack,
        grads: &'a B::Gradients,
        all: bool,
        out: BTreeMap<String, TensorData>,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for V<'_, B> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name);
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let path = self.path.joined();
            match param.val().grad(self.grads) {
                Some(g) => {
                    self.out.insert(path, g.into_data());
                }
                None if self.all => panic!("no gradient for `{path}`"),
                None => {}
            }
        }
    }
    let mut v = V::<B> {
        path: PathStack::default(),
        grads,
        all,
        out: BTreeMap::new(),
    };
    module.visit(&mut v);
    v.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(v: &[f32]) -> TensorData {
        TensorData::new(v.to_vec(), [v.len()])
    }

    #[test]
    fn max_err_is_the_largest_difference_beside_the_largest_reference() {
        let (err, scale) = max_err("t", &data(&[1.0, -2.5, 3.0]), &data(&[1.5, -2.0, -4.0]));
        assert_eq!((err, scale), (7.0, 4.0));
    }

    #[test]
    #[should_panic(expected = "t: shape")]
    fn max_err_refuses_another_shape() {
        max_err("t", &data(&[1.0, 2.0]), &data(&[1.0, 2.0, 3.0]));
    }

    #[test]
    #[should_panic(expected = "t: non-finite value")]
    fn max_err_refuses_a_non_finite_value() {
        max_err("t", &data(&[f32::NAN]), &data(&[0.0]));
    }
}
