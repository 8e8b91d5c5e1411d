//! The pinned matmul kernels against Burn's matmul on the same backend: every kernel, the
//! three layouts of a linear layer's products (`x · wᵀ` with a transposed right operand,
//! `g · w`, `gᵀ · x` with a transposed left operand), uneven shapes, float32 and float16;
//! and the linear product's autodiff operation on a kernel against Burn's product. A kernel
//! may refuse a problem (no cooperative matrices on lavapipe, TMA before Hopper), but the
//! `unit` kernels run on every CubeCL device; a kernel may even be wrong, and then the check
//! of `matmul` must give Burn's product.
//! Run on wgpu (`--features wgpu`, lavapipe without a GPU) and on CUDA (`--features cuda`).

use super::cube_matmul::{judge, Kind};
use super::matmul::{matmul, matmul_on, MatmulError, MatmulKernel, MatmulPin, MATMUL_KERNELS};
use crate::wan::mem_attention::to_f32;
use crate::wan::product::{linear_product, linear_product_plain};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, FloatDType, Tensor};
use burn_cubecl::CubeBackend;
use reel_core::rng::StreamRng;

/// `[m, k, n]`: smaller than one tile, uneven over several tiles.
const SHAPES: [[usize; 3]; 5] = [
    [5, 7, 3],
    [37, 24, 20],
    [64, 64, 64],
    [130, 96, 72],
    [33, 40, 16],
];

/// Normal values of `shape` from `seed` on `device`, in `dtype`.
fn rand<B: Backend>(shape: [usize; 2], seed: u64, dtype: FloatDType) -> Tensor<B, 2> {
    let cpu: Tensor<burn::backend::NdArray, 2> =
        StreamRng::from_seed(seed).normal_tensor(shape, &Default::default());
    Tensor::<B, 2>::from_data(cpu.into_data(), &Default::default()).cast(dtype)
}

/// `max |a − b|` over `max(1, max |b|)`.
fn rel_error<B: Backend>(a: Tensor<B, 2>, b: Tensor<B, 2>) -> f32 {
    let (a, b) = (to_f32(a), to_f32(b));
    let scale = b.clone().abs().max().into_scalar().elem::<f32>().max(1.0);
    (a - b).abs().max().into_scalar().elem::<f32>() / scale
}

/// The three layouts of `[m, k] · [k, n]`, as `(what, lhs, rhs)`.
fn problems<B: Backend>(
    [m, k, n]: [usize; 3],
    dtype: FloatDType,
) -> Vec<(&'static str, Tensor<B, 2>, Tensor<B, 2>)> {
    vec![
        (
            "x · wᵀ",
            rand::<B>([m, k], 1, dtype),
            rand::<B>([n, k], 2, dtype).transpose(),
        ),
        (
            "g · w",
            rand::<B>([m, k], 3, dtype),
            rand::<B>([k, n], 4, dtype),
        ),
        (
            "gᵀ · x",
            rand::<B>([k, m], 5, dtype).transpose(),
            rand::<B>([k, n], 6, dtype),
        ),
    ]
}

/// Every kernel on every problem, alone and through [`matmul`]'s check; prints the names of
/// the kernels that ran every problem. A kernel alone may be wrong (cubek's `double-unit` with
/// a transposed right operand at `[37, 24, 20]` on lavapipe, today): that is reported, and
/// [`matmul`] must then give Burn's product.
pub(super) fn check_kernels<B: Backend>(dtype: FloatDType, tol: f32) {
    let mut ran_all = vec![];
    let mut wrong_alone = vec![];
    for (kernel, name) in MATMUL_KERNELS {
        let mut all = true;
        for shape in SHAPES {
            for (what, lhs, rhs) in problems::<B>(shape, dtype) {
                let want = lhs.clone().matmul(rhs.clone());
                let checked = matmul(lhs.clone(), rhs.clone(), Some(kernel));
                let err = rel_error(checked, want.clone());
                assert!(
                    err <= tol,
                    "{name} {what} {shape:?} {dtype:?}, checked: error {err}"
                );
                match matmul_on(lhs, rhs, kernel) {
                    Ok(got) => {
                        assert_eq!(got.dims(), want.dims(), "{name} {what} {shape:?}: dims");
                        assert_eq!(got.dtype(), want.dtype(), "{name} {what}: dtype");
                        let err = rel_error(got, want);
                        if err > tol {
                            wrong_alone.push(format!("{name} {what} {shape:?}: {err}"));
                        }
                    }
                    Err(MatmulError::Refused(_)) => all = false,
                    Err(e) => panic!("{name} {what}: {e}"),
                }
            }
        }
        if all {
            ran_all.push(name);
        }
    }
    for unit in ["simple-unit", "double-unit"] {
        assert!(
            ran_all.contains(&unit),
            "{unit} runs everywhere; ran: {ran_all:?}"
        );
    }
    eprintln!("matmul kernels that ran every {dtype:?} problem: {ran_all:?}");
    eprintln!("wrong alone (caught by the check): {wrong_alone:?}");
}

/// The check's judgement: a product off by more than the tolerance, or none, is refused and
/// Burn's is used; one within it is used.
pub(super) fn check_judge<B: Backend>() {
    let want = rand::<B>([6, 5], 10, FloatDType::F32);
    let kind = Kind {
        runtime: std::any::TypeId::of::<()>(),
        kernel: MatmulKernel::DoubleMma,
        shape: [6, 4, 5],
        transposed: [false, true],
        dtype: want.dtype(),
    };
    let (ok, _) = judge(&kind, Ok(want.clone() + 1e-4), want.clone());
    assert!(ok, "within the tolerance");
    let (ok, out) = judge(&kind, Ok(want.clone() + 0.5), want.clone());
    assert!(!ok, "0.5 off is refused");
    assert_eq!(rel_error(out, want.clone()), 0.0, "Burn's product is used");
    let (ok, _) = judge(&kind, Err(MatmulError::Refused("no".into())), want);
    assert!(!ok, "a refused product is refused");
}

/// The linear product's autodiff operation on `kernel` against Burn's product.
pub(super) fn check_product<B: Backend>(kernel: MatmulKernel, tol: f32) {
    type Ad<C> = Autodiff<C>;
    type T<C> = Tensor<Ad<C>, 2>;
    let run = |f: &dyn Fn(T<B>, T<B>) -> T<B>| {
        let x = Tensor::<Ad<B>, 2>::from_inner(rand::<B>([37, 24], 7, FloatDType::F32));
        let w = Tensor::<Ad<B>, 2>::from_inner(rand::<B>([20, 24], 8, FloatDType::F32));
        let m = Tensor::<Ad<B>, 2>::from_inner(rand::<B>([37, 20], 9, FloatDType::F32));
        let (x, w) = (x.require_grad(), w.require_grad());
        let y = f(x.clone(), w.clone());
        let grads = (y.clone() * m).sum().backward();
        let dx = x.grad(&grads).expect("x's gradient");
        let dw = w.grad(&grads).expect("w's gradient");
        [y.inner(), dx, dw]
    };
    let got = run(&|x, w| linear_product(x, w, MatmulPin::all(Some(kernel))));
    let want = run(&linear_product_plain);
    for ((g, w), what) in got
        .into_iter()
        .zip(want)
        .zip(["output", "x gradient", "w gradient"])
    {
        let err = rel_error(g, w);
        assert!(err <= tol, "{kernel} {what}: error {err}");
    }
}

/// The tests on the plain CubeCL backend over `$runtime`.
/// `$product_tol`: the unit kernels (exact float32 products) against Burn's product, exact
/// on lavapipe and TF32 on CUDA's tensor cores (4e-4 on an H100, 2026-11-27).
macro_rules! matmul_tests {
    ($name:ident, $runtime:ty, $bool:ty, $product_tol:expr) => {
        mod $name {
            use super::*;
            type Cube = CubeBackend<$runtime, f32, i32, $bool>;

            #[test]
            fn pinned_matmul_kernels_match_burns_matmul() {
                // TF32 products on CUDA's tensor cores: about 1e-3 of the largest value.
                check_kernels::<Cube>(FloatDType::F32, 5e-3);
                check_kernels::<Cube>(FloatDType::F16, 1e-2);
            }

            #[test]
            fn matmul_check_refuses_wrong_products() {
                check_judge::<Cube>();
            }

            #[test]
            fn linear_product_on_a_kernel_matches_burns_product() {
                let _turn = reel_core::parallel::autodiff_turn();
                check_product::<Cube>(MatmulKernel::SimpleUnit, $product_tol);
                check_product::<Cube>(MatmulKernel::DoubleUnit, $product_tol);
            }
        }
    };
}

#[cfg(feature = "wgpu")]
matmul_tests!(wgpu, cubecl::wgpu::WgpuRuntime, u32, 1e-5);

#[cfg(feature = "cuda")]
matmul_tests!(cuda, cubecl::cuda::CudaRuntime, u8, 5e-3);

/// bf16 (the training dtype) on CUDA, where the tensor-core kernels run.
#[cfg(feature = "cuda")]
#[test]
fn cuda_matmul_kernels_in_bf16() {
    let _turn = reel_core::parallel::autodiff_turn();
    type Cube = CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;
    // Which tensor-core kernels run these small, uneven shapes is cubek's business (they may
    // refuse them); whatever `matmul` gives must be right, and the list goes to the log.
    check_kernels::<Cube>(FloatDType::BF16, 2e-2);
    check_product::<Cube>(MatmulKernel::DoubleMma, 5e-3);
}

/// cuBLAS on CUDA, in each of its orderings (host syncs, flags on the device, CubeCL's own
/// stream from this thread and from CubeCL's server thread), runs every problem (a missing `libcublas` fails here rather than falling back
/// quietly) in float32 (TF32), float16 and bf16; operands inside wider buffers (a column
/// slice's leading dimension, rows from an offset); the linear product's autodiff operation
/// on it; and a chain of products and CubeCL additions, each consuming the last one's output
/// with no host sync between them, which gives garbage if the streams are not ordered.
#[cfg(feature = "cuda")]
#[test]
fn cuda_cublas_runs_every_problem() {
    let _turn = reel_core::parallel::autodiff_turn();
    type Cube = CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;
    let orderings = [
        MatmulKernel::Cublas,
        MatmulKernel::CublasAsync,
        MatmulKernel::CublasStream,
        MatmulKernel::CublasQueued,
    ];
    for kernel in orderings {
        let check = |what: &str, lhs: Tensor<Cube, 2>, rhs: Tensor<Cube, 2>, tol: f32| {
            let want = lhs.clone().matmul(rhs.clone());
            let got =
                matmul_on(lhs, rhs, kernel).unwrap_or_else(|e| panic!("{kernel} {what}: {e}"));
            assert_eq!(got.dims(), want.dims(), "{kernel} {what}: dims");
            assert_eq!(got.dtype(), want.dtype(), "{kernel} {what}: dtype");
            let err = rel_error(got, want);
            assert!(err <= tol, "{kernel} {what}: error {err}");
        };
        for (dtype, tol) in [
            (FloatDType::F32, 5e-3),
            (FloatDType::F16, 1e-2),
            (FloatDType::BF16, 2e-2),
        ] {
            for shape in SHAPES {
                for (what, lhs, rhs) in problems::<Cube>(shape, dtype) {
                    check(&format!("{what} {shape:?} {dtype:?}"), lhs, rhs, tol);
                }
            }
        }
        let wide = rand::<Cube>([50, 40], 11, FloatDType::BF16);
        let lhs = wide.clone().slice([3..40, 5..29]);
        let rhs = wide.slice([10..34, 0..20]);
        check("slices of a wider matrix", lhs.clone(), rhs.clone(), 2e-2);
        let rhs = lhs.clone().transpose().slice([0..24, 0..20]);
        check("a slice by a transposed slice", lhs, rhs, 2e-2);
        check_product::<Cube>(kernel, 5e-3);
        check_chain::<Cube>(kernel);
        // A device ordering that failed goes back to host syncs, whose results are right:
        // only this says that `cublas-async` itself worked (stderr says why it did not).
        if kernel == MatmulKernel::CublasAsync {
            assert!(
                !super::cublas::device_order_failed(),
                "cublas-async went back to host syncs"
            );
        }
    }
    // With libcublas loadable (the test fails above otherwise), cuBLAS on CubeCL's stream is
    // the default on the plain CUDA backend, under autodiff too; Burn's matmul under fusion.
    let cublas = MatmulPin::all(Some(MatmulKernel::CublasStream));
    assert_eq!(super::matmul::default_pin::<Cube>(), cublas);
    assert_eq!(super::matmul::default_pin::<Autodiff<Cube>>(), cublas);
}

/// CUPTI finds the CUDA stream CubeCL runs a thread's kernels on (`cublas-stream` does not
/// fall back to host syncs here), the same handle each time; another thread, with a CubeCL
/// stream id of its own, finds its own, and its products (made there, and queued on CubeCL's
/// server thread) and additions stay in order.
#[cfg(feature = "cuda")]
#[test]
fn cuda_cublas_stream_is_cubecls() {
    use cubecl::cuda::CudaRuntime;
    type Cube = CubeBackend<CudaRuntime, f32, i32, u8>;
    let found = || {
        let t = rand::<Cube>([4, 4], 1, FloatDType::F32);
        let t = super::cube::prim::<Cube, CudaRuntime, u8, 2>(t);
        super::cublas_stream::cubecl_stream(&t).unwrap_or_else(|e| panic!("{e}")) as usize
    };
    let stream = found();
    assert_ne!(stream, 0);
    assert_eq!(found(), stream, "found again");
    let other = std::thread::spawn(move || {
        check_chain::<Cube>(MatmulKernel::CublasStream);
        check_chain::<Cube>(MatmulKernel::CublasQueued);
        found()
    })
    .join()
    .expect("the other thread's chain");
    assert_ne!(other, 0);
    eprintln!("CubeCL's streams: {stream:#x} here, {other:#x} on another thread");
}

/// 64 steps `x ← x · w + x0` (`w` scaled so that `x` keeps its size), each product on the
/// last addition's output and each addition (a CubeCL kernel) on the last product's, on
/// `kernel` and on Burn's matmul, compared once at the end (no sync in between).
#[cfg(feature = "cuda")]
fn check_chain<B: Backend>(kernel: MatmulKernel) {
    let w = rand::<B>([256, 256], 12, FloatDType::F32).mul_scalar(1.0 / 32.0);
    let x0 = rand::<B>([300, 256], 13, FloatDType::F32);
    let (mut got, mut want) = (x0.clone(), x0.clone());
    for _ in 0..64 {
        got = matmul_on(got, w.clone(), kernel).unwrap_or_else(|e| panic!("{kernel}: {e}"));
        got = got + x0.clone();
        want = want.matmul(w.clone()) + x0.clone();
    }
    let err = rel_error(got, want);
    assert!(err <= 5e-2, "{kernel}: a chain of 64 products: error {err}");
}
