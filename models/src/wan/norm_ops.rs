//! The block's norms as single autodiff operations whose backward keeps only the input.
//!
//! Written with Burn tensor operations, the modulated LayerNorm `LN(x) · scale + shift` makes
//! Burn's autodiff keep two float32 copies of the activations for the backward pass (the
//! centred input and the normalized output), and the q/k RMSNorm `x · rstd · w` keeps two
//! more (the float32 input and `x · rstd`): in a bf16 run, 16 bytes per element where the
//! input itself takes 2. Here each norm is one operation (`LayerNormBackward`,
//! `RmsNormBackward`) that keeps its input in its own dtype, one or two float32 values per
//! row and its (small) float32 scale or weight, and recomputes the normalized input in the
//! backward pass.
//!
//! Both passes take the norm in the grouped form of `block_kernels::norms` (`Grouping`),
//! which runs them as fused CubeCL kernels on the plain CubeCL backends and, elsewhere, as
//! exactly what the plain formulations in [`super::norm`] compute (same operations, same
//! order; the backward is the closed form). The operations run on Reel's autodiff backends
//! (`wan::custom_op`); anywhere else the grouped forward runs without an own backward.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Tensor};

use super::block_kernels::norms::{self, Grouping, Rows, Stats, Wanted};
use super::custom_op::{register, tensor};
use super::mem_attention::{to_dtype, to_f32};
use super::reshape::reshape;

/// The backward of the affine LayerNorm `y = LN(x) · scale + shift` of rank `D`.
#[derive(Debug)]
struct LayerNormBackward<const D: usize>;

/// What the LayerNorm keeps for its backward pass.
#[derive(Debug, Clone)]
struct LayerNormState<B: Backend, const D: usize> {
    /// The input, in its own dtype.
    x: FloatTensor<B>,
    /// Row means `[G, P, 1]`, float32.
    mean: FloatTensor<B>,
    /// Row `1 / sqrt(var + eps)` `[G, P, 1]`, float32.
    rstd: FloatTensor<B>,
    /// The scale operand `[G, 1, dim]` (float32).
    scale: FloatTensor<B>,
    /// The scale's and shift's shapes as given.
    shapes: [[usize; D]; 2],
    /// The dtypes of `scale` and `shift` as given (their gradients take them).
    dtypes: (DType, DType),
    /// The grouped form.
    groups: Grouping<D>,
}

impl<B: Backend, const D: usize> Backward<B, 3> for LayerNormBackward<D> {
    type State = LayerNormState<B, D>;

    fn backward(
        self,
        ops: Ops<Self::State, 3>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let s = ops.state;
        let [px, pscale, pshift] = ops.parents.map(|n| n.map(|n| n.id));
        let g = s.groups.rows(tensor::<B, D>(grads.consume::<B>(&ops.node)));
        let wanted = Wanted {
            x: px.is_some(),
            scale: pscale.is_some(),
            shift: pshift.is_some(),
        };
        let stats = Stats {
            mean: Some(tensor(s.mean)),
            rstd: tensor(s.rstd),
        };
        let x = s.groups.rows(tensor::<B, D>(s.x));
        let d = norms::backward(g, x, tensor(s.scale), stats, wanted);
        let operand = |d: Option<Tensor<B, 3>>, i: usize, dtype| {
            let d = s
                .groups
                .operand_grad(d.expect("a wanted gradient"), s.shapes[i]);
            to_dtype(d, dtype).into_primitive().tensor()
        };
        register::<B>(grads, pshift, || operand(d.shift, 1, s.dtypes.1));
        register::<B>(grads, pscale, || operand(d.scale, 0, s.dtypes.0));
        register::<B>(grads, px, || {
            let dx = d.x.expect("a wanted gradient");
            s.groups.unrows(dx).into_primitive().tensor()
        });
    }
}

/// Panics unless `scale` and `shift` broadcast into `x` (each leading axis 1 or that of `x`).
fn check_operands<const D: usize>(x: [usize; D], scale: [usize; D], shift: [usize; D]) {
    let fits = |d: [usize; D]| d.iter().zip(&x).all(|(&n, &m)| n == 1 || n == m);
    assert!(
        fits(scale) && fits(shift),
        "LayerNorm scale {scale:?} / shift {shift:?} must broadcast into x {x:?} (each \
         axis 1 or that of x)"
    );
}

/// [`super::norm::layer_norm_affine`]'s operands in the grouped form (float32 scale and
/// shift), and the grouping; panics unless the operands broadcast into `x`.
fn layer_norm_rows<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    scale: Tensor<B, D>,
    shift: Tensor<B, D>,
) -> (Grouping<D>, Rows<B>) {
    check_operands(x.dims(), scale.dims(), shift.dims());
    let groups = Grouping::new(x.dims(), &[scale.dims(), shift.dims()]);
    let rows = Rows {
        x: groups.rows(x),
        scale: groups.operand(to_f32(scale)),
        shift: Some(groups.operand(to_f32(shift))),
    };
    (groups, rows)
}

/// [`super::norm::layer_norm_affine`] on any backend without an own backward: the fused
/// kernels on the plain CubeCL backends, the plain formulation's operations elsewhere.
pub(crate) fn layer_norm_affine_rows<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    scale: Tensor<B, D>,
    shift: Tensor<B, D>,
    eps: f64,
) -> Tensor<B, D> {
    let dtype = x.dtype();
    let (groups, rows) = layer_norm_rows(x, scale, shift);
    groups.unrows(norms::forward(rows, eps, dtype).0)
}

/// [`super::norm::layer_norm_affine`] as one autodiff operation on `Autodiff<B, C>`.
pub fn autodiff_layer_norm_affine<B: Backend, C: CheckpointStrategy, const D: usize>(
    x: Tensor<Autodiff<B, C>, D>,
    scale: Tensor<Autodiff<B, C>, D>,
    shift: Tensor<Autodiff<B, C>, D>,
    eps: f64,
) -> Tensor<Autodiff<B, C>, D> {
    let shapes = [scale.dims(), shift.dims()];
    let dtypes = (scale.dtype(), shift.dtype());
    let (x, scale, shift) = (
        x.into_primitive().tensor(),
        scale.into_primitive().tensor(),
        shift.into_primitive().tensor(),
    );
    let x_inner = tensor::<B, D>(x.primitive.clone());
    let dtype = x_inner.dtype();
    let (groups, rows) = layer_norm_rows(
        x_inner,
        tensor::<B, D>(scale.primitive),
        tensor::<B, D>(shift.primitive),
    );
    let scale32 = rows.scale.clone();
    let (y, stats) = norms::forward(rows, eps, dtype);
    let y = groups.unrows(y).into_primitive().tensor();
    let out = match LayerNormBackward::<D>
        .prepare::<C>([x.node, scale.node, shift.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let state = LayerNormState {
                x: x.primitive,
                mean: stats
                    .mean
                    .expect("a LayerNorm's mean")
                    .into_primitive()
                    .tensor(),
                rstd: stats.rstd.into_primitive().tensor(),
                scale: scale32.into_primitive().tensor(),
                shapes,
                dtypes,
                groups,
            };
            prep.finish(state, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    tensor(out)
}

/// The backward of the RMSNorm `y = x · rstd · w` of rank `D`.
#[derive(Debug)]
struct RmsNormBackward<const D: usize>;

impl<B: Backend, const D: usize> Backward<B, 2> for RmsNormBackward<D> {
    /// The input (its own dtype), row `1 / sqrt(mean(x²) + eps)` `[1, P, 1]` and the weight
    /// `[1, 1, dim]` (float32), and the weight's dtype.
    type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>, DType);

    fn backward(
        self,
        ops: Ops<Self::State, 2>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let (x, rstd, w, w_dtype) = ops.state;
        let [px, pw] = ops.parents.map(|n| n.map(|n| n.id));
        let x = tensor::<B, D>(x);
        let dims = x.dims();
        let groups = Grouping::new(dims, &[]);
        let g = groups.rows(tensor::<B, D>(grads.consume::<B>(&ops.node)));
        let wanted = Wanted {
            x: px.is_some(),
            scale: pw.is_some(),
            shift: false,
        };
        let stats = Stats {
            mean: None,
            rstd: tensor(rstd),
        };
        let d = norms::backward(g, groups.rows(x), tensor(w), stats, wanted);
        register::<B>(grads, pw, || {
            let dw = reshape(d.scale.expect("a wanted gradient"), [dims[D - 1]]);
            to_dtype(dw, w_dtype).into_primitive().tensor()
        });
        register::<B>(grads, px, || {
            let dx = d.x.expect("a wanted gradient");
            groups.unrows(dx).into_primitive().tensor()
        });
    }
}

/// [`super::norm::rms_norm`]'s operands in the grouped form: one group.
fn rms_rows<B: Backend, const D: usize>(x: Tensor<B, D>, w32: Tensor<B, 1>) -> Rows<B> {
    let dim = w32.dims()[0];
    Rows {
        x: Grouping::new(x.dims(), &[]).rows(x),
        scale: reshape(w32, [1, 1, dim]),
        shift: None,
    }
}

/// [`super::norm::rms_norm`] on any backend without an own backward: the fused kernels on
/// the plain CubeCL backends, the plain formulation's operations elsewhere.
pub(crate) fn rms_norm_rows<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 1>,
    eps: f64,
) -> Tensor<B, D> {
    let dims = x.dims();
    let rows = rms_rows(x, to_f32(weight));
    reshape(norms::forward(rows, eps, DType::F32).0, dims)
}

/// [`super::norm::rms_norm`] as one autodiff operation on `Autodiff<B, C>`.
pub fn autodiff_rms_norm<B: Backend, C: CheckpointStrategy, const D: usize>(
    x: Tensor<Autodiff<B, C>, D>,
    weight: Tensor<Autodiff<B, C>, 1>,
    eps: f64,
) -> Tensor<Autodiff<B, C>, D> {
    let w_dtype = weight.dtype();
    let dims = x.dims();
    let (x, weight) = (
        x.into_primitive().tensor(),
        weight.into_primitive().tensor(),
    );
    let w32 = to_f32(tensor::<B, 1>(weight.primitive));
    let rows = rms_rows(tensor::<B, D>(x.primitive.clone()), w32);
    let w32 = rows.scale.clone();
    let (y, stats) = norms::forward(rows, eps, DType::F32);
    let y = reshape(y, dims).into_primitive().tensor();
    let out = match RmsNormBackward::<D>
        .prepare::<C>([x.node, weight.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            let rstd = stats.rstd.into_primitive().tensor();
            let state = (x.primitive, rstd, w32.into_primitive().tensor(), w_dtype);
            prep.finish(state, y)
        }
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    tensor(out)
}

#[cfg(test)]
mod tests {
    use super::super::norm::{
        layer_norm_affine, layer_norm_affine_plain, rms_norm, rms_norm_plain,
    };
    use super::*;
    use burn::tensor::backend::AutodiffBackend;
    use burn::tensor::{FloatDType, TensorData};

    type NdAd = Autodiff<burn::backend::NdArray>;
    type FlexAd = Autodiff<burn::backend::Flex>;

    /// A deterministic, irregular tensor of `shape` (values within about ±2 around `offset`).
    fn det<B: Backend, const D: usize>(shape: [usize; D], phase: f32, offset: f32) -> Tensor<B, D> {
        let n = shape.iter().product::<usize>();
        let v: Vec<f32> = (0..n)
            .map(|i| offset + 2.0 * (i as f32 * 0.731 + phase).sin() * (i as f32 * 0.177).cos())
            .collect();
        Tensor::from_data(TensorData::new(v, shape), &Default::default())
    }

    fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
        to_f32(t).into_data().to_vec::<f32>().unwrap()
    }

    fn assert_close(a: &[f32], b: &[f32], rel: f32, what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1.0);
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= rel * scale, "{what}[{i}]: {x} vs {y}");
        }
    }

    /// Output and gradients (x, scale, shift; `None` where not tracked) of
    /// `sum(w ∘ LN(x) · scale + shift)`, the inputs tracked as `track` says.
    #[allow(clippy::type_complexity)]
    fn layer_norm_case<B: AutodiffBackend>(
        f: fn(Tensor<B, 3>, Tensor<B, 3>, Tensor<B, 3>, f64) -> Tensor<B, 3>,
        [scale_shape, shift_shape]: [[usize; 3]; 2],
        dtype: FloatDType,
        track: [bool; 3],
    ) -> (Vec<f32>, [Option<Vec<f32>>; 3]) {
        let shape = [2, 5, 8];
        let tracked = |t: Tensor<B, 3>, on: bool| if on { t.require_grad() } else { t };
        let x = tracked(det::<B, 3>(shape, 0.3, 0.5).cast(dtype), track[0]);
        let scale = tracked(det::<B, 3>(scale_shape, 1.1, 1.0), track[1]);
        let shift = tracked(det::<B, 3>(shift_shape, 2.7, 0.0), track[2]);
        let y = f(x.clone(), scale.clone(), shift.clone(), 1e-6);
        assert_eq!(y.dtype(), x.dtype(), "the output keeps the input's dtype");
        let w = det::<B, 3>(shape, 4.2, 0.2);
        let grads = (to_f32(y.clone()) * w).sum().backward();
        let g = |t: &Tensor<B, 3>| {
            t.grad(&grads).map(|g| {
                assert_eq!(
                    (g.dims(), g.dtype()),
                    (t.dims(), t.dtype()),
                    "gradient shape"
                );
                values(g)
            })
        };
        (values(y), [g(&x), g(&scale), g(&shift)])
    }

    #[test]
    fn layer_norm_matches_the_plain_formulation_and_its_gradients() {
        let _turn = reel_core::parallel::autodiff_turn();
        // Modulation ([B, 1, dim]), an affine weight ([1, 1, dim]), a mix of the two, and
        // per-token operands (groups of one row each, the shift expanded over the batch).
        let shapes = [
            [[2, 1, 8]; 2],
            [[1, 1, 8]; 2],
            [[2, 1, 8], [1, 1, 8]],
            [[2, 5, 8], [1, 5, 8]],
        ];
        let tracks = [
            [true; 3],
            [false, true, true],
            [false, false, true],
            [true, false, false],
        ];
        for shapes in shapes {
            for track in tracks {
                let case = |f| layer_norm_case::<NdAd>(f, shapes, FloatDType::F32, track);
                let (y, grads) = case(layer_norm_affine);
                let (y_ref, grads_ref) = case(layer_norm_affine_plain);
                assert_eq!(y, y_ref, "the forward is the same computation");
                for (i, (g, r)) in grads.iter().zip(&grads_ref).enumerate() {
                    assert_eq!(g.is_some(), track[i], "gradient {i} exactly when tracked");
                    assert_eq!(g.is_some(), r.is_some(), "gradient {i} presence");
                    if let (Some(g), Some(r)) = (g, r) {
                        assert_close(g, r, 2e-6, &format!("gradient {i} of {shapes:?}"));
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "must broadcast into x")]
    fn a_scale_wider_than_x_is_refused() {
        let _turn = reel_core::parallel::autodiff_turn();
        let x = det::<NdAd, 3>([2, 1, 8], 0.3, 0.5).require_grad();
        let scale = det::<NdAd, 3>([2, 5, 8], 1.1, 1.0);
        let _ = layer_norm_affine(x, scale, det::<NdAd, 3>([1, 1, 8], 2.7, 0.0), 1e-6);
    }

    /// Output and gradients (x, weight) of `sum(w ∘ rms_norm(x, weight))`.
    fn rms_case<B: AutodiffBackend>(
        f: fn(Tensor<B, 4>, Tensor<B, 1>, f64) -> Tensor<B, 4>,
        dtype: FloatDType,
    ) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let shape = [2, 3, 2, 6];
        let x = det::<B, 4>(shape, 0.9, 0.3).cast(dtype).require_grad();
        let weight = det::<B, 1>([6], 1.7, 1.0).require_grad();
        let y = f(x.clone(), weight.clone(), 1e-6);
        assert_eq!(y.dtype(), DType::F32, "the RMSNorm's result is float32");
        let grads = (y.clone() * det::<B, 4>(shape, 3.3, 0.1)).sum().backward();
        let gx = x.grad(&grads).expect("x has a gradient");
        assert_eq!(gx.dtype(), x.dtype(), "x's gradient has its dtype");
        let gw = weight.grad(&grads).expect("the weight has a gradient");
        (values(y), values(gx), values(gw))
    }

    #[test]
    fn rms_norm_matches_the_plain_formulation_and_its_gradients() {
        let _turn = reel_core::parallel::autodiff_turn();
        let (y, gx, gw) = rms_case::<NdAd>(rms_norm, FloatDType::F32);
        let (y_ref, gx_ref, gw_ref) = rms_case::<NdAd>(rms_norm_plain, FloatDType::F32);
        assert_eq!(y, y_ref, "the forward is the same computation");
        assert_close(&gx, &gx_ref, 2e-6, "x gradient");
        assert_close(&gw, &gw_ref, 2e-6, "weight gradient");
    }

    #[test]
    fn bf16_inputs_compute_in_float32() {
        let _turn = reel_core::parallel::autodiff_turn();
        // Only the input (and the LayerNorm's output) are rounded to bf16.
        let ln =
            |dtype| layer_norm_case::<FlexAd>(layer_norm_affine, [[2, 1, 8]; 2], dtype, [true; 3]);
        let ((y16, g16), (y32, g32)) = (ln(FloatDType::BF16), ln(FloatDType::F32));
        assert_close(&y16, &y32, 2e-2, "LayerNorm output");
        for (i, (a, b)) in g16.iter().zip(&g32).enumerate() {
            assert_close(
                a.as_ref().unwrap(),
                b.as_ref().unwrap(),
                3e-2,
                &format!("grad {i}"),
            );
        }
        let (y16, gx16, gw16) = rms_case::<FlexAd>(rms_norm, FloatDType::BF16);
        let (y32, gx32, gw32) = rms_case::<FlexAd>(rms_norm, FloatDType::F32);
        assert_close(&y16, &y32, 2e-2, "RMSNorm output");
        assert_close(&gx16, &gx32, 3e-2, "RMSNorm x gradient");
        assert_close(&gw16, &gw32, 3e-2, "RMSNorm weight gradient");
    }

    #[test]
    fn without_autodiff_the_plain_formulations_run() {
        type B = burn::backend::NdArray;
        let x = det::<B, 3>([2, 3, 4], 0.1, 0.0);
        let (s, b) = (
            det::<B, 3>([1, 1, 4], 0.5, 1.0),
            det::<B, 3>([1, 1, 4], 0.9, 0.0),
        );
        assert_eq!(
            values(layer_norm_affine(x.clone(), s.clone(), b.clone(), 1e-6)),
            values(layer_norm_affine_plain(x.clone(), s, b, 1e-6))
        );
        let w = det::<B, 1>([4], 0.2, 1.0);
        assert_eq!(
            values(rms_norm(x.clone(), w.clone(), 1e-6)),
            values(rms_norm_plain(x, w, 1e-6))
        );
    }
}
