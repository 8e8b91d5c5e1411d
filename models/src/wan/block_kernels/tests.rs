//! The block kernels against the same computations in tensor operations on the same backend:
//! the norms' outputs, statistics and every gradient, for LayerNorm and RMSNorm, on uneven
//! shapes (rows longer than a cube, partial column blocks, one row, many groups), strided and
//! broadcast operands, and through the autodiff operations of `norm_ops`; the column sums and
//! the bias operation; the GELU and its gradient, alone and through its autodiff operation.
//! Run on the wgpu backend (`--features wgpu`; on a machine without a GPU, Mesa's lavapipe)
//! and on CUDA (`--features cuda`).

use super::norms::*;
use super::{cube, kernels_on, BLOCK_KERNELS_ENV};
use crate::wan::bias::{add_bias, add_bias_plain};
use crate::wan::gelu::{autodiff_gelu_tanh, gelu_tanh_backward_plain, gelu_tanh_plain};
use crate::wan::mem_attention::to_f32;
use crate::wan::norm::{layer_norm_affine_plain, rms_norm_plain};
use crate::wan::norm_ops::{autodiff_layer_norm_affine, autodiff_rms_norm};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::FloatDType;
use burn::tensor::{DType, Tensor};
use burn_cubecl::CubeBackend;
use reel_core::rng::StreamRng;

/// `[G, P, dim]`: one value, rows over several cubes and partial column blocks, more columns
/// than a cube has units, more rows than columns, more groups than a grid dimension holds
/// (per-token operands of a long sequence: the scale/shift gradients fall back to tensor
/// operations).
const CASES: [[usize; 3]; 5] = [
    [1, 1, 5],
    [2, 37, 48],
    [3, 17, 300],
    [1, 300, 64],
    [70_000, 1, 3],
];

const EPS: f64 = 1e-6;

/// Normal values of `shape` plus `offset`, from `seed`, on `device`.
pub(super) fn rand<B: Backend, const D: usize>(
    shape: [usize; D],
    seed: u64,
    offset: f32,
    device: &B::Device,
) -> Tensor<B, D> {
    let cpu: Tensor<burn::backend::NdArray, D> =
        StreamRng::from_seed(seed).normal_tensor(shape, &Default::default());
    Tensor::from_data((cpu + offset).into_data(), device)
}

pub(super) fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    to_f32(t).into_data().to_vec::<f32>().expect("float32 data")
}

/// `max |a − b|` relative to `max(1, max |b|)`.
pub(super) fn assert_close<B: Backend, const D: usize>(
    a: Tensor<B, D>,
    b: Tensor<B, D>,
    tol: f32,
    what: &str,
) {
    assert_eq!(a.dims(), b.dims(), "{what}: dims");
    let (a, b) = (values(a), values(b));
    let scale = b.iter().fold(1f32, |m, v| m.max(v.abs()));
    let err = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(
        err <= tol * scale,
        "{what}: max error {err} > {tol} of {scale}"
    );
}

/// The operands of a LayerNorm (`shifted`) or RMSNorm of `dims` with `x` in `dtype`; with
/// `strided`, `x` is a `[P, G, dim]` tensor seen as `[G, P, dim]`.
fn operands<B: Backend>(
    [g, p, dim]: [usize; 3],
    dtype: FloatDType,
    shifted: bool,
    strided: bool,
    device: &B::Device,
) -> Rows<B> {
    let x = match strided {
        true => rand::<B, 3>([p, g, dim], 1, 0.5, device).swap_dims(0, 1),
        false => rand::<B, 3>([g, p, dim], 1, 0.5, device),
    };
    Rows {
        x: x.cast(dtype),
        scale: rand([g, 1, dim], 2, 1.0, device),
        shift: shifted.then(|| rand([g, 1, dim], 3, 0.0, device)),
    }
}

/// The output's dtype: a LayerNorm's is the input's, an RMSNorm's float32.
fn out_dtype<B: Backend>(rows: &Rows<B>) -> DType {
    match rows.shift {
        Some(_) => rows.x.dtype(),
        None => DType::F32,
    }
}

/// Forward and every combination of wanted gradients, kernels against tensor operations, on
/// `Cube` (which must be the plain CubeCL backend the kernels run on).
fn check_rows<Cube: Backend>(kernels_run: bool, dtype: FloatDType, tol: f32) {
    assert!(
        kernels_run,
        "the block kernels do not run on this backend (is {BLOCK_KERNELS_ENV} off?)"
    );
    let device = Default::default();
    let wants = [
        (true, true, true),
        (true, false, false),
        (false, true, false),
        (false, false, true),
    ];
    for dims in CASES {
        for (shifted, strided) in [(true, false), (false, false), (true, true)] {
            let what = format!("{dims:?}, shift {shifted}, strided {strided}, {dtype:?}");
            let rows = operands::<Cube>(dims, dtype, shifted, strided, &device);
            let out = out_dtype(&rows);
            let (y, stats) = forward(rows.clone(), EPS, out);
            let (y_ref, stats_ref) = forward_ops(rows.clone(), EPS, out);
            assert_eq!(y.dtype(), out, "{what}: output dtype");
            assert_close(y, y_ref, tol, &format!("{what}: output"));
            assert_close(
                stats.rstd.clone(),
                stats_ref.rstd,
                1e-5,
                &format!("{what}: rstd"),
            );
            assert_eq!(
                stats.mean.is_some(),
                shifted,
                "{what}: a mean exactly for LayerNorm"
            );
            if let (Some(m), Some(r)) = (stats.mean.clone(), stats_ref.mean) {
                assert_close(m, r, 1e-5, &format!("{what}: mean"));
            }
            // The output gradient: in the output's dtype, or broadcast over the rows.
            let [g, p, dim] = dims;
            let grads = [
                rand::<Cube, 3>(dims, 4, 0.0, &device).cast(out),
                rand::<Cube, 3>([g, 1, dim], 5, 0.0, &device).expand([g, p, dim]),
            ];
            for (i, grad) in grads.into_iter().enumerate() {
                for (x, scale, shift) in wants {
                    let wanted = Wanted { x, scale, shift };
                    let what = format!("{what}, grad {i}, {wanted:?}");
                    let run = |f: fn(_, _, _, _, _) -> Grads<Cube>| {
                        f(
                            grad.clone(),
                            rows.x.clone(),
                            rows.scale.clone(),
                            stats.clone(),
                            wanted,
                        )
                    };
                    let (d, d_ref) = (run(backward), run(backward_ops));
                    compare(d.x, d_ref.x, tol, &format!("{what}: dx"));
                    compare(d.scale, d_ref.scale, 1e-4, &format!("{what}: dscale"));
                    compare(d.shift, d_ref.shift, 1e-4, &format!("{what}: dshift"));
                }
            }
        }
    }
}

/// Both present and close, or both absent.
fn compare<B: Backend>(a: Option<Tensor<B, 3>>, b: Option<Tensor<B, 3>>, tol: f32, what: &str) {
    assert_eq!(a.is_some(), b.is_some(), "{what}: presence");
    if let (Some(a), Some(b)) = (a, b) {
        assert_eq!(a.dtype(), b.dtype(), "{what}: dtype");
        assert_close(a, b, tol, what);
    }
}

/// The autodiff norms (kernels) against their plain formulations (tensor operations) on
/// `Autodiff<Cube>`: outputs and gradients, with modulation-, weight- and token-shaped
/// operands.
fn check_autodiff<Cube: Backend>(dtype: FloatDType, tol: f32) {
    type Ad<C> = Autodiff<C>;
    let device = Default::default();
    let shape = [2, 9, 40];
    let operands = [[[2, 1, 40], [1, 1, 40]], [[1, 9, 40], [2, 1, 40]]];
    for [scale_shape, shift_shape] in operands {
        let leaves = || {
            (
                rand::<Ad<Cube>, 3>(shape, 6, 0.3, &device)
                    .cast(dtype)
                    .require_grad(),
                rand::<Ad<Cube>, 3>(scale_shape, 7, 1.0, &device).require_grad(),
                rand::<Ad<Cube>, 3>(shift_shape, 8, 0.0, &device).require_grad(),
            )
        };
        let w = rand::<Ad<Cube>, 3>(shape, 9, 0.0, &device);
        let run = |f: fn(_, _, _, f64) -> Tensor<Ad<Cube>, 3>| {
            let (x, scale, shift) = leaves();
            let y = f(x.clone(), scale.clone(), shift.clone(), EPS);
            let grads = (to_f32(y.clone()) * w.clone()).sum().backward();
            let g = |t: &Tensor<Ad<Cube>, 3>| t.grad(&grads).expect("a gradient");
            (y.inner(), [g(&x), g(&scale), g(&shift)])
        };
        let (y, grads) = run(autodiff_layer_norm_affine);
        let (y_ref, grads_ref) = run(layer_norm_affine_plain);
        let what = format!("LayerNorm, scale {scale_shape:?}, shift {shift_shape:?}");
        assert_close(y, y_ref, tol, &format!("{what}: output"));
        for (i, (g, r)) in grads.into_iter().zip(grads_ref).enumerate() {
            assert_close(g, r, tol, &format!("{what}: gradient {i}"));
        }
    }
    let x = rand::<Ad<Cube>, 4>([2, 5, 3, 24], 10, 0.2, &device).cast(dtype);
    let weight = rand::<Ad<Cube>, 1>([24], 11, 1.0, &device);
    let run = |f: fn(_, _, f64) -> Tensor<Ad<Cube>, 4>| {
        let (x, weight) = (x.clone().require_grad(), weight.clone().require_grad());
        let y = f(x.clone(), weight.clone(), EPS);
        let grads = (y.clone() * y.clone()).sum().backward();
        let gx = x.grad(&grads).expect("a gradient").reshape([2, 15, 24]);
        let gw = weight.grad(&grads).expect("a gradient").reshape([1, 1, 24]);
        (y.inner().reshape([2, 15, 24]), gx, gw)
    };
    let ((y, gx, gw), (y_ref, gx_ref, gw_ref)) = (run(autodiff_rms_norm), run(rms_norm_plain));
    assert_close(y, y_ref, tol, "RMSNorm output");
    assert_close(gx, gx_ref, tol, "RMSNorm x gradient");
    assert_close(gw, gw_ref, tol, "RMSNorm weight gradient");
}

/// The column sums against `sum_dim`: one row, partial column blocks, more rows than a chunk
/// holds, a transposed input, f16; and the bias operation's gradients on `Autodiff<Cube>`.
fn check_sum_rows<Cube: Backend>(kernels_run: bool) {
    assert!(
        kernels_run,
        "the column-sum kernel does not run on this backend"
    );
    let device = Default::default();
    for [r, c] in [[1, 1], [37, 48], [300, 600], [1000, 3]] {
        let t = rand::<Cube, 3>([1, r, c], 12, 0.5, &device).reshape([r, c]);
        let transposed = rand::<Cube, 3>([1, c, r], 13, 0.5, &device)
            .reshape([c, r])
            .transpose();
        for (t, tol) in [
            (t.clone(), 1e-5),
            (transposed, 1e-5),
            (t.cast(FloatDType::F16), 1e-3),
        ] {
            let what = format!("[{r}, {c}] {:?}", t.dtype());
            let (got, want) = (sum_rows(t.clone()), sum_rows_ops(t));
            assert_eq!(got.dtype(), DType::F32, "{what}: float32 sums");
            assert_close(got.unsqueeze::<3>(), want.unsqueeze::<3>(), tol, &what);
        }
    }
    type Ad<C> = Autodiff<C>;
    let run = |f: fn(_, _) -> Tensor<Ad<Cube>, 2>| {
        let y = rand::<Ad<Cube>, 3>([1, 50, 24], 14, 0.0, &device)
            .reshape([50, 24])
            .require_grad();
        let bias = rand::<Ad<Cube>, 1>([24], 15, 0.0, &device).require_grad();
        let w = rand::<Ad<Cube>, 3>([1, 50, 24], 16, 0.0, &device).reshape([50, 24]);
        let grads = (f(y.clone(), bias.clone()) * w).sum().backward();
        let dy = y.grad(&grads).expect("a gradient").unsqueeze::<3>();
        (dy, bias.grad(&grads).expect("a gradient").unsqueeze::<3>())
    };
    let ((dy, db), (dy_ref, db_ref)) = (run(add_bias), run(add_bias_plain));
    assert_close(dy, dy_ref, 0.0, "bias op: y's gradient");
    assert_close(db, db_ref, 1e-5, "bias op: the bias's gradient");
}

/// The GELU kernels against the tensor formulation: saturated and small values, a transposed
/// input, f16, an output gradient of another dtype, and the autodiff operation.
fn check_gelu<Cube: Backend>(kernels_run: bool) {
    assert!(kernels_run, "the block kernels do not run on this backend");
    let device = Default::default();
    let x = rand::<Cube, 3>([1, 70, 130], 17, 0.0, &device).reshape([70, 130]) * 4.0;
    let grad = rand::<Cube, 3>([1, 70, 130], 18, 0.0, &device).reshape([70, 130]);
    let transposed = x.clone().transpose();
    let cases = [
        (x.clone(), grad.clone(), 1e-5),
        (transposed, grad.clone().transpose(), 1e-5),
        (
            x.clone().cast(FloatDType::F16),
            grad.clone().cast(FloatDType::F16),
            2e-3,
        ),
        (x.clone().cast(FloatDType::F16), grad.clone(), 2e-3),
    ];
    for (i, (x, grad, tol)) in cases.into_iter().enumerate() {
        let y = super::gelu::forward(x.clone());
        assert_eq!(y.dtype(), x.dtype(), "case {i}: the output keeps the dtype");
        let three = |t: Tensor<Cube, 2>| t.unsqueeze::<3>();
        assert_close(
            three(y),
            three(gelu_tanh_plain(x.clone())),
            tol,
            &format!("GELU {i}"),
        );
        let dx = super::gelu::backward(x.clone(), grad.clone());
        assert_eq!(
            dx.dtype(),
            x.dtype(),
            "case {i}: the gradient has the input's dtype"
        );
        let want = gelu_tanh_backward_plain(x, grad);
        assert_close(three(dx), three(want), tol, &format!("GELU gradient {i}"));
    }
    type Ad<C> = Autodiff<C>;
    let run = |f: fn(Tensor<Ad<Cube>, 2>) -> Tensor<Ad<Cube>, 2>| {
        let x = Tensor::<Ad<Cube>, 2>::from_inner(x.clone()).require_grad();
        let w = Tensor::<Ad<Cube>, 2>::from_inner(grad.clone());
        let y = f(x.clone());
        let grads = (y.clone() * w).sum().backward();
        (
            y.inner().unsqueeze::<3>(),
            x.grad(&grads).expect("a gradient").unsqueeze::<3>(),
        )
    };
    let ((y, dx), (y_ref, dx_ref)) = (run(autodiff_gelu_tanh), run(gelu_tanh_plain));
    assert_close(y, y_ref, 1e-5, "GELU autodiff output");
    assert_close(dx, dx_ref, 1e-5, "GELU autodiff gradient");
}

/// The tests on the plain CubeCL backend over `$runtime`.
macro_rules! backend_tests {
    ($name:ident, $runtime:ty, $bool:ty) => {
        mod $name {
            use super::*;
            type Cube = CubeBackend<$runtime, f32, i32, $bool>;

            fn on_kernels() -> bool {
                kernels_on() && cube::is::<Cube, $runtime, $bool>()
            }

            #[test]
            fn norms_match_tensor_operations() {
                check_rows::<Cube>(on_kernels(), FloatDType::F32, 1e-5);
                check_rows::<Cube>(on_kernels(), FloatDType::F16, 2e-3);
            }

            #[test]
            fn column_sums_match_sum_dim() {
                let _turn = reel_core::parallel::autodiff_turn();
                check_sum_rows::<Cube>(on_kernels());
            }

            #[test]
            fn gelu_matches_tensor_operations() {
                let _turn = reel_core::parallel::autodiff_turn();
                check_gelu::<Cube>(on_kernels());
            }

            #[test]
            fn norm_autodiff_operations_on_kernels_match_the_plain_formulations() {
                let _turn = reel_core::parallel::autodiff_turn();
                check_autodiff::<Cube>(FloatDType::F32, 1e-5);
                check_autodiff::<Cube>(FloatDType::F16, 2e-3);
            }
        }
    };
}

#[cfg(feature = "wgpu")]
backend_tests!(wgpu, cubecl::wgpu::WgpuRuntime, u32);

#[cfg(feature = "cuda")]
backend_tests!(cuda, cubecl::cuda::CudaRuntime, u8);

/// bf16 (the training dtype), where the device has it.
#[cfg(feature = "cuda")]
#[test]
fn cuda_block_kernels_in_bf16() {
    let _turn = reel_core::parallel::autodiff_turn();
    type Cube = CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;
    let on_kernels = kernels_on() && cube::is::<Cube, cubecl::cuda::CudaRuntime, u8>();
    check_gelu::<Cube>(on_kernels);
    check_rows::<Cube>(on_kernels, FloatDType::BF16, 1e-2);
    check_autodiff::<Cube>(FloatDType::BF16, 1e-2);
}
