//! One autodiff graph for a model's trained parameters before its forward pass, so that
//! recording the forward costs the host time linear in its length.
//!
//! Burn's autodiff (0.21) keeps one graph per group of connected nodes. Every trained
//! parameter starts as a graph of its own (`require_grad` registers it as a root), and an
//! operation whose inputs sit in different graphs merges them into one of the two: in
//! `burn-autodiff`'s `GraphLocator::merge`, the graph kept is the first of a hash map's
//! iteration, so about half the time the whole activation graph is moved, node by node, into
//! a parameter's one-node graph. A forward pass meets each parameter after a growing graph,
//! so its host time grows with the square of its length: on the 2-core CPU (2026-11-30,
//! `bench/host-overhead.sh`: Wan models of 2 heads of 16 on 4 tokens) the recorded forward
//! took 17, 169 and 761 ms for 10, 30 and 60 blocks, almost all of it in those moves, while
//! the backward grew linearly (5.5, 27, 61 ms). With [`gather_params`]: 6, 21 and 45 ms.
//!
//! [`gather_params`] puts the input and all the trained parameters into one graph first, with
//! one operation of many inputs (one merge of graphs that are all still small), so the
//! forward's operations find their parameters in the activation graph and merge nothing.
//! The operation returns its input unchanged (no kernel runs) and passes the input's
//! gradient through; the parameters get no gradient from it.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::Autodiff;
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};

use super::custom_op::{dispatch, first_input, next_input, output, CustomBackward};

/// How many inputs a gathering operation may have (the carried tensor, the parameters, and
/// untracked fillers up to the size); one operation takes all of a model's parameters up to
/// the largest, so that every parameter's graph is merged into the same one (see [`gather`]).
const SIZES: [usize; 4] = [64, 256, 1024, 4096];

/// `x` unchanged, with `module`'s trained parameters and `x` in one autodiff graph (module
/// docs). On a backend without autodiff, or when no parameter is trained, `x` itself.
pub fn gather_params<B: Backend, M: Module<B>, const D: usize>(
    module: &M,
    x: Tensor<B, D>,
) -> Tensor<B, D> {
    dispatch(Gather { module, x })
}

/// [`gather_params`]'s inputs, for [`dispatch`].
struct Gather<'a, B: Backend, M, const D: usize> {
    module: &'a M,
    x: Tensor<B, D>,
}

impl<B: Backend, M: Module<B>, const D: usize> CustomBackward<B> for Gather<'_, B, M, D> {
    type Output = Tensor<B, D>;

    fn on_autodiff<I: Backend>(self) -> Result<Tensor<B, D>, Self> {
        let Self { module, x } = self;
        let x = match first_input::<B, I, D>(x) {
            Ok(x) => x,
            Err(x) => return Err(Self { module, x }),
        };
        let mut trained = Trained::<I>(Vec::new());
        module.visit(&mut trained);
        Ok(output(gather(x, trained.0)))
    }

    fn otherwise(self) -> Tensor<B, D> {
        self.x
    }
}

/// The trained parameters of a module on `Autodiff<I>`, as autodiff tensors.
struct Trained<I: Backend>(Vec<FloatTensor<Autodiff<I>>>);

impl<B: Backend, I: Backend> ModuleVisitor<B> for Trained<I> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let t = param.val();
        if t.is_require_grad() {
            self.0
                .push(next_input::<B, I, D>(t).into_primitive().tensor());
        }
    }
}

/// `x` after the gathering operation(s) of `params` on `Autodiff<I>`.
///
/// One operation takes them all (up to 4095): `burn-autodiff`'s merge points a merged graph's
/// origin node at the graph kept, but does not record it among that graph's nodes, so when
/// the kept graph is itself merged into another by a later operation, those origins are left
/// pointing at an emptied graph and each is merged again at its next use (at the cost of a
/// whole-graph move half the time). In one operation every parameter is merged once, into
/// the graph that the forward then grows without further merges.
fn gather<I: Backend, const D: usize>(
    x: Tensor<Autodiff<I>, D>,
    params: Vec<FloatTensor<Autodiff<I>>>,
) -> Tensor<Autodiff<I>, D> {
    let mut carried = x.into_primitive().tensor();
    let largest = SIZES[SIZES.len() - 1];
    for group in params.chunks(largest - 1) {
        let inputs = group.len() + 1;
        carried = match SIZES.into_iter().find(|&size| size >= inputs) {
            Some(64) => join::<I, 64>(carried, group),
            Some(256) => join::<I, 256>(carried, group),
            Some(1024) => join::<I, 1024>(carried, group),
            _ => join::<I, 4096>(carried, group),
        };
    }
    Tensor::from_primitive(TensorPrimitive::Float(carried))
}

/// One operation of `N` inputs: `carried`, the tensors of `group` (at most `N - 1`) and, for
/// the rest, an untracked tensor (autodiff leaves untracked inputs out of the graph); its
/// output is `carried`'s value.
fn join<I: Backend, const N: usize>(
    carried: FloatTensor<Autodiff<I>>,
    group: &[FloatTensor<Autodiff<I>>],
) -> FloatTensor<Autodiff<I>> {
    assert!(
        group.len() < N,
        "{} tensors joined by {N} inputs",
        group.len()
    );
    let filler = <FloatTensor<Autodiff<I>>>::new(carried.primitive.clone());
    let nodes: [_; N] = std::array::from_fn(|i| match i {
        0 => carried.node.clone(),
        i => group.get(i - 1).unwrap_or(&filler).node.clone(),
    });
    Backward::<I, N>::prepare::<NoCheckpointing>(JoinBackward, nodes)
        .compute_bound()
        .stateless(carried.primitive)
}

/// The backward of a join: the output's gradient goes to the carried input only.
#[derive(Debug)]
struct JoinBackward;

impl<B: Backend, const N: usize> Backward<B, N> for JoinBackward {
    type State = ();

    fn backward(self, ops: Ops<(), N>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let g = grads.consume::<B>(&ops.node);
        if let Some(carried) = &ops.parents[0] {
            grads.register::<B>(carried.id, g);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    type Ad = Autodiff<burn::backend::NdArray>;

    /// Parameters `p_i [2]` (values depending on `i`), trained or frozen.
    #[derive(Module, Debug)]
    struct Many<B: Backend> {
        params: Vec<Param<Tensor<B, 1>>>,
    }

    fn many(n: usize, trained: bool) -> Many<Ad> {
        let dev = Default::default();
        let params = (0..n)
            .map(|i| {
                let v = vec![(i as f32 * 0.37).sin(), (i as f32 * 0.11).cos()];
                let t = Tensor::<Ad, 1>::from_data(TensorData::new(v, [2]), &dev);
                Param::from_tensor(t).set_require_grad(trained)
            })
            .collect();
        Many { params }
    }

    /// `sum_i sum((x * p_i)^2)` for `x [2]`, with `x` gathered first or not: the loss, the
    /// gradient of `x` and those of the trained parameters, as host values.
    fn grads(m: &Many<Ad>, gathered: bool) -> (Vec<f32>, Vec<f32>, Vec<Vec<f32>>) {
        let x0 = Tensor::<Ad, 1>::from_data(
            TensorData::new(vec![0.5f32, -1.5], [2]),
            &Default::default(),
        )
        .require_grad();
        let x = if gathered {
            gather_params(m, x0.clone())
        } else {
            x0.clone()
        };
        let terms: Vec<_> = m
            .params
            .iter()
            .map(|p| (x.clone() * p.val()).powi_scalar(2).sum())
            .collect();
        let loss = Tensor::cat(terms, 0).sum();
        let host = |t: Tensor<burn::backend::NdArray, 1>| t.into_data().to_vec::<f32>().unwrap();
        let g = loss.backward();
        let gx = host(x0.grad(&g).expect("x has a gradient"));
        let gp = m
            .params
            .iter()
            .filter_map(|p| p.val().grad(&g))
            .map(host)
            .collect();
        (host(loss.inner()), gx, gp)
    }

    /// Every group size, and more parameters than one operation takes (4100: a join of 4096
    /// inputs, then one of 64): the forward value and every gradient are bit for bit those
    /// of the plain forward.
    #[test]
    fn gathering_changes_no_value_and_no_gradient() {
        let _turn = reel_core::parallel::autodiff_turn();
        for n in [1, 62, 63, 200, 1000, 4100] {
            let m = many(n, true);
            let (plain, gathered) = (grads(&m, false), grads(&m, true));
            assert_eq!(gathered.2.len(), n, "{n} parameters have gradients");
            assert_eq!(gathered, plain, "{n} parameters");
        }
    }

    /// Frozen parameters are not gathered (nothing to merge) and the input's gradient still
    /// flows; without autodiff the input comes back as it is.
    #[test]
    fn frozen_parameters_and_plain_backends_pass_the_input_through() {
        let _turn = reel_core::parallel::autodiff_turn();
        let m = many(3, false);
        let (plain, gathered) = (grads(&m, false), grads(&m, true));
        assert!(gathered.2.is_empty());
        assert_eq!(gathered, plain);

        type Plain = burn::backend::NdArray;
        let dev = Default::default();
        let module = Many::<Plain> {
            params: vec![Param::from_tensor(Tensor::ones([2], &dev))],
        };
        let x =
            Tensor::<Plain, 2>::from_data(TensorData::new(vec![1f32, 2., 3., 4.], [2, 2]), &dev);
        let y = gather_params(&module, x.clone());
        assert_eq!(y.into_data(), x.into_data());
    }
}
