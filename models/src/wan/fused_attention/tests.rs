//! The fused kernels against the plain attention on the CPU: outputs and the gradients of
//! every input, on uneven shapes (partial cubes and tiles, `Sq ≠ Sk`, `D ≠ Dv`) and on
//! strided inputs. Run on the wgpu backend (`--features wgpu`; on a machine without a GPU,
//! Mesa's lavapipe) and on CUDA (`--features cuda`).

use super::*;
use crate::wan::mem_attention::{fused_kernels_apply, naive_attention};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{ElementConversion, TensorData};
use reel_core::rng::StreamRng;

type Cpu = burn::backend::NdArray;
type CpuAd = Autodiff<Cpu>;

fn rand(shape: [usize; 4], seed: u64) -> TensorData {
    let t: Tensor<Cpu, 4> = StreamRng::from_seed(seed).normal_tensor(shape, &Default::default());
    (t * 1.5).into_data()
}

fn max_abs_diff(a: TensorData, b: TensorData) -> f32 {
    let a = Tensor::<Cpu, 4>::from_data(a, &Default::default());
    let b = Tensor::<Cpu, 4>::from_data(b, &Default::default());
    (a - b).abs().max().into_scalar().elem()
}

/// Output and `(dq, dk, dv)` of `Σ w ∘ f(q, k, v)`; with `strided`, `q`, `k`, `v` are
/// `[B, S, H, D]` tensors viewed as `[B, H, S, D]` (as the Wan blocks pass them).
fn run<A: AutodiffBackend>(
    f: impl Fn(Tensor<A, 4>, Tensor<A, 4>, Tensor<A, 4>) -> Tensor<A, 4>,
    dims: (usize, usize, usize, usize),
    strided: bool,
    device: &A::Device,
) -> [TensorData; 4] {
    let (sq, sk, d, dv) = dims;
    // The leaves; with `strided`, laid out `[B, S, H, C]`.
    let leaf = |[b, h, s, c]: [usize; 4], seed: u64| {
        let shape = if strided { [b, s, h, c] } else { [b, h, s, c] };
        Tensor::<A, 4>::from_data(rand(shape, seed), device).require_grad()
    };
    let view = |t: &Tensor<A, 4>| {
        if strided {
            t.clone().swap_dims(1, 2)
        } else {
            t.clone()
        }
    };
    let (q, k, v) = (
        leaf([2, 3, sq, d], 1),
        leaf([2, 3, sk, d], 2),
        leaf([2, 3, sk, dv], 3),
    );
    let o = f(view(&q), view(&k), view(&v));
    let w = Tensor::<A, 4>::from_data(rand([2, 3, sq, dv], 4), device);
    let g = (o.clone() * w).sum().backward();
    let grad = |t: Tensor<A, 4>| t.grad(&g).expect("a leaf has a gradient").into_data();
    [o.inner().into_data(), grad(q), grad(k), grad(v)]
}

/// `out, dq, dk, dv` of [`run`] within 2e-4 of each other; `context` goes into the message.
fn assert_outputs_close(want: [TensorData; 4], got: [TensorData; 4], context: &str) {
    for (name, (a, b)) in ["out", "dq", "dk", "dv"]
        .iter()
        .zip(want.into_iter().zip(got))
    {
        let diff = max_abs_diff(a, b);
        assert!(diff < 2e-4, "{name} differs by {diff} {context}");
    }
}

const SHAPES: [(usize, usize, usize, usize); 5] = [
    (37, 53, 8, 5),
    (130, 70, 16, 16),
    (20, 7, 24, 24),
    (65, 33, 128, 128),
    (17, 40, 256, 256),
];

/// Every shape of [`SHAPES`], contiguous and strided, through `try_fused_attention` on the
/// autodiff backend `A`, against the naive attention on the CPU.
fn check_against_naive<A: AutodiffBackend>(device: &A::Device) {
    for dims in SHAPES {
        for strided in [false, true] {
            let want = run::<CpuAd>(naive_attention, dims, strided, &Default::default());
            let got = run::<A>(
                |q, k, v| match try_fused_attention(q, k, v) {
                    Ok(o) => o,
                    Err(_) => panic!("no fused kernel for {}", std::any::type_name::<A>()),
                },
                dims,
                strided,
                device,
            );
            assert_outputs_close(
                want,
                got,
                &format!("(sq, sk, d, dv = {dims:?}, strided {strided})"),
            );
        }
    }
}

/// The forward without autodiff (inference) on the inner backend `B`.
fn check_inference<B: Backend>(device: &B::Device) {
    let (q, k, v) = (
        rand([1, 2, 45, 32], 5),
        rand([1, 2, 77, 32], 6),
        rand([1, 2, 77, 16], 7),
    );
    let cpu = Default::default();
    let want = naive_attention(
        Tensor::<Cpu, 4>::from_data(q.clone(), &cpu),
        Tensor::<Cpu, 4>::from_data(k.clone(), &cpu),
        Tensor::<Cpu, 4>::from_data(v.clone(), &cpu),
    );
    let got = try_fused_attention(
        Tensor::<B, 4>::from_data(q, device),
        Tensor::<B, 4>::from_data(k, device),
        Tensor::<B, 4>::from_data(v, device),
    )
    .unwrap_or_else(|_| panic!("no fused kernel for {}", std::any::type_name::<B>()));
    let diff = max_abs_diff(want.into_data(), got.into_data());
    assert!(diff < 2e-5, "inference output differs by {diff}");
}

#[test]
fn tiles_fit_the_shared_memory_budget() {
    assert_eq!(tile_rows(8, 5, 48 << 10), MAX_TILE);
    assert_eq!(tile_rows(128, 128, 48 << 10), 31);
    assert_eq!(tile_rows(256, 256, 48 << 10), 15);
    assert_eq!(tile_rows(128, 128, 16 << 10), 15);
    assert_eq!(tile_rows(8192, 8192, 48 << 10), 1);
    for shared in [16 << 10, 32 << 10, 48 << 10, 228 << 10] {
        for (d, dv) in [(64, 64), (128, 128), (256, 256), (512, 64)] {
            let tile = tile_rows(d, dv, shared);
            assert!(tile * (d + dv + 2) * 4 <= shared.min(TILE_BUDGET * 4));
        }
    }
}

#[test]
fn cpu_backends_get_no_fused_kernel() {
    let t = || Tensor::<CpuAd, 4>::zeros([1, 1, 4, 8], &Default::default());
    assert!(try_fused_attention(t(), t(), t()).is_err());
    assert!(!fused_kernels_apply::<CpuAd>(&Default::default()));
}

/// The fused attention between element-wise operations that Burn's fusion layer defers and
/// fuses: the kernels must see the finished inputs, and later operations their outputs.
fn check_inside_elementwise_chain<A: AutodiffBackend>(device: &A::Device) {
    fn chain<B: AutodiffBackend>(
        att: impl Fn(Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) -> Tensor<B, 4>,
    ) -> impl Fn(Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) -> Tensor<B, 4> {
        move |q, k, v| att(q * 0.5 + 0.1, k.tanh() * 2.0, v * 2.0).tanh() * 3.0
    }
    let dims = (45, 29, 16, 8);
    let want = run::<CpuAd>(chain(naive_attention), dims, true, &Default::default());
    let got = run::<A>(
        chain(|q, k, v| {
            try_fused_attention(q, k, v)
                .unwrap_or_else(|_| panic!("no fused kernel for {}", std::any::type_name::<A>()))
        }),
        dims,
        true,
        device,
    );
    assert_outputs_close(want, got, "inside a chain");
}

/// The kernel tests on the CubeCL backend `$cube` and, with the `fusion` feature, on Burn's
/// fusion layer over it.
macro_rules! backend_tests {
    ($name:ident, $cube:ty) => {
        mod $name {
            use super::*;
            type Cube = $cube;

            #[test]
            fn fused_attention_matches_naive_forward_and_gradients() {
                check_against_naive::<Autodiff<Cube>>(&Default::default());
            }

            #[test]
            fn fused_inference_matches_naive() {
                check_inference::<Cube>(&Default::default());
            }

            #[test]
            fn fused_kernels_apply_with_and_without_autodiff() {
                assert!(fused_kernels_apply::<Cube>(&Default::default()));
                assert!(fused_kernels_apply::<Autodiff<Cube>>(&Default::default()));
                #[cfg(feature = "fusion")]
                {
                    type Fused = burn_fusion::Fusion<Cube>;
                    assert!(fused_kernels_apply::<Fused>(&Default::default()));
                    assert!(fused_kernels_apply::<Autodiff<Fused>>(&Default::default()));
                }
            }

            #[test]
            fn fused_attention_inside_an_elementwise_chain() {
                check_inside_elementwise_chain::<Autodiff<Cube>>(&Default::default());
            }

            #[cfg(feature = "fusion")]
            mod fusion {
                use super::*;
                type Fused = burn_fusion::Fusion<Cube>;

                #[test]
                fn fusion_fused_attention_matches_naive_forward_and_gradients() {
                    check_against_naive::<Autodiff<Fused>>(&Default::default());
                }

                #[test]
                fn fusion_fused_inference_matches_naive() {
                    check_inference::<Fused>(&Default::default());
                }

                #[test]
                fn fusion_fused_attention_inside_an_elementwise_chain() {
                    check_inside_elementwise_chain::<Autodiff<Fused>>(&Default::default());
                }
            }
        }
    };
}

#[cfg(feature = "wgpu")]
backend_tests!(wgpu, CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u32>);

#[cfg(feature = "cuda")]
backend_tests!(cuda, CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>);
