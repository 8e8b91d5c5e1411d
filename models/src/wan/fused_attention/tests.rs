//! The fused kernels against the plain attention on the CPU: outputs and the gradients of
//! every input, on uneven shapes (partial cubes and tiles, `Sq ≠ Sk`, `D ≠ Dv`) and on
//! strided inputs. Run on the wgpu backend (`--features wgpu`; on a machine without a GPU,
//! Mesa's lavapipe) and on CUDA (`--features cuda`).

use super::*;
use crate::wan::fused_attention::tiled::Products;
use crate::wan::mem_attention::{fused_kernels_apply, naive_attention};
use burn::backend::Autodiff;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, TensorData};
use burn::tensor::{Tensor, TensorPrimitive};
#[cfg(any(feature = "cuda", feature = "wgpu"))]
use burn_cubecl::CubeBackend;
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

/// `max |want − got|` over `max(1, max |want|)`: the difference relative to the largest value.
fn rel_diff(want: TensorData, got: TensorData) -> f32 {
    let scale = Tensor::<Cpu, 4>::from_data(want.clone(), &Default::default())
        .abs()
        .max()
        .into_scalar()
        .elem::<f32>()
        .max(1.0);
    max_abs_diff(want, got) / scale
}

/// [`rand`] with the keys' rows (seed 2) growing along the sequence (`[B, H, S, D]`, so not
/// for strided runs): later key tiles score far above the earlier maxima, and the forward's
/// online softmax must rescale its output (`rows::STALE_MAX`).
fn rising(shape: [usize; 4], seed: u64) -> TensorData {
    let t = Tensor::<Cpu, 4>::from_data(rand(shape, seed), &Default::default());
    if seed != 2 {
        return t.into_data();
    }
    let s = shape[2];
    let rise = Tensor::<Cpu, 1, burn::tensor::Int>::arange(0..s as i64, &Default::default())
        .float()
        .div_scalar(16.0)
        .add_scalar(1.0)
        .reshape([1, 1, s, 1]);
    (t * rise).into_data()
}

/// Output and `(dq, dk, dv)` of `Σ w ∘ f(q, k, v)`; with `strided`, `q`, `k`, `v` are
/// `[B, S, H, D]` tensors viewed as `[B, H, S, D]` (as the Wan blocks pass them).
fn run<A: AutodiffBackend>(
    f: impl Fn(Tensor<A, 4>, Tensor<A, 4>, Tensor<A, 4>) -> Tensor<A, 4>,
    dims: (usize, usize, usize, usize),
    strided: bool,
    device: &A::Device,
) -> [TensorData; 4] {
    run_with(f, dims, strided, rand, device)
}

/// [`run`] on leaves made by `data(shape, seed)`.
fn run_with<A: AutodiffBackend>(
    f: impl Fn(Tensor<A, 4>, Tensor<A, 4>, Tensor<A, 4>) -> Tensor<A, 4>,
    dims: (usize, usize, usize, usize),
    strided: bool,
    data: impl Fn([usize; 4], u64) -> TensorData,
    device: &A::Device,
) -> [TensorData; 4] {
    let (sq, sk, d, dv) = dims;
    // The leaves; with `strided`, laid out `[B, S, H, C]`.
    let leaf = |[b, h, s, c]: [usize; 4], seed: u64| {
        let shape = if strided { [b, s, h, c] } else { [b, h, s, c] };
        Tensor::<A, 4>::from_data(data(shape, seed), device).require_grad()
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

/// Shapes `(sq, sk, d, dv)` of the fused kernels' checks: uneven lengths, `d ≠ dv`, head dims
/// that are not powers of two, and the shorter tiles of head dims 128 and 256. Only the first
/// has head dims under 32: Mesa's software Vulkan driver (CI's lavapipe) takes minutes to
/// compile these kernels at small head dims (it unrolls the short head-dim loops inside the
/// 32-row tile loop, and its LLVM then schedules one very long block). From an empty shader
/// cache (2026-12-01, 2 cores), this check took 70 s at head dims 16 and 229 s at 24, and 3 s
/// at 48 and at 40/36: 344 s in all before, 45 s now (docs/architecture.md, "Tests").
const SHAPES: [(usize, usize, usize, usize); 5] = [
    (37, 53, 8, 5),
    (130, 70, 48, 48),
    (20, 7, 40, 36),
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
                |q, k, v| match try_fused_attention(q, k, v, false) {
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

/// Head dims `(d, dv)` of the forward checks of Reel's kernels: above 32, as in [`SHAPES`].
const FORWARD_DIMS: (usize, usize) = (64, 48);

/// Head dims `(d, dv)` of the checks of cubek's flash routines: multiples of the 16-wide tiles
/// of its tensor-core routine (the CUDA test), and small, because lavapipe compiles its unit
/// routine longer as they grow (from an empty shader cache, 2026-12-01: 22 s at 32/16, 60 s
/// at 48/40, 189 s at 64/48 beside a build).
const CUBEK_DIMS: (usize, usize) = (32, 16);

/// Inputs of the forward-only checks at head dims `(d, dv)`: `q [1, 2, 45, d]`,
/// `k [1, 2, 77, d]`, `v [1, 2, 77, dv]` (uneven lengths), and the naive output on the CPU.
fn forward_case((d, dv): (usize, usize)) -> ([TensorData; 3], TensorData) {
    let (q, k, v) = (
        rand([1, 2, 45, d], 5),
        rand([1, 2, 77, d], 6),
        rand([1, 2, 77, dv], 7),
    );
    let cpu = Default::default();
    let want = naive_attention(
        Tensor::<Cpu, 4>::from_data(q.clone(), &cpu),
        Tensor::<Cpu, 4>::from_data(k.clone(), &cpu),
        Tensor::<Cpu, 4>::from_data(v.clone(), &cpu),
    );
    ([q, k, v], want.into_data())
}

/// A forward no gradient flows through on `B`, within `tol` of the naive attention on the
/// CPU (`flash`: the tensor-core kernel where the device has one): inference on the inner
/// backend, or on an autodiff backend with untracked inputs (a frozen teacher).
fn check_inference<B: Backend>(device: &B::Device, flash: bool, tol: f32) {
    let ([q, k, v], want) = forward_case(FORWARD_DIMS);
    let got = try_fused_attention(
        Tensor::<B, 4>::from_data(q, device),
        Tensor::<B, 4>::from_data(k, device),
        Tensor::<B, 4>::from_data(v, device),
        flash,
    )
    .unwrap_or_else(|_| panic!("no fused kernel for {}", std::any::type_name::<B>()));
    let diff = max_abs_diff(want, got.into_data());
    assert!(
        diff < tol,
        "inference output (flash {flash}) differs by {diff}"
    );
}

/// cubek's flash forward with `routine` on the CubeCL backend `R`, its queries padded to a
/// multiple of `rows`, contiguous and on the `[B, S, H, D]`-as-`[B, H, S, D]` views the Wan
/// blocks pass: float16 tiles, so within 1e-2.
fn check_cubek_flash<R: CubeRuntime>(
    device: &R::Device,
    routine: flash::FlashRoutine,
    rows: usize,
) {
    type K<R> = CubeBackend<R, f32, i32, u32>;
    let ([q, k, v], want) = forward_case(CUBEK_DIMS);
    for strided in [false, true] {
        let t = |d: &TensorData| {
            let t = Tensor::<K<R>, 4>::from_data(d.clone(), device);
            let t = if strided {
                // Stored `[B, S, H, D]`, seen as `[B, H, S, D]`.
                let stored = t.swap_dims(1, 2).into_data();
                Tensor::<K<R>, 4>::from_data(stored, device).swap_dims(1, 2)
            } else {
                t
            };
            t.into_primitive().tensor()
        };
        let o = flash::flash_forward_padded(t(&q), t(&k), t(&v), routine, rows)
            .unwrap_or_else(|e| panic!("{routine:?} flash forward cannot run: {e:?}"));
        assert_eq!(
            o.meta.shape().dims::<4>(),
            [1, 2, 45, CUBEK_DIMS.1],
            "{routine:?} rows {rows}"
        );
        let got = Tensor::<K<R>, 4>::from_primitive(TensorPrimitive::Float(o)).into_data();
        let diff = max_abs_diff(want.clone(), got);
        eprintln!(
            "{routine:?} flash forward (rows {rows}, strided {strided}): max abs diff {diff:.2e}"
        );
        assert!(
            diff < 1e-2,
            "{routine:?} (rows {rows}, strided {strided}): differs by {diff}"
        );
    }
}

/// The fused and the tiled (unit products) kernels on the CubeCL backend `R` give the output
/// and the gradients laid out like their inputs: `[B, H, S, D]`, and `[B, S, H, D]` seen as
/// `[B, H, S, D]` (what the Wan blocks pass, and what makes merging the heads a view), with
/// the strides the runtime gives a fresh tensor of that stored shape.
fn check_layouts<R: CubeRuntime>(device: &R::Device) {
    type K<R> = CubeBackend<R, f32, i32, u32>;
    let (b, h, sq, sk, d, dv) = (2, 3, 37, 21, 8, 5);
    for strided in [false, true] {
        let t = |[b, h, s, c]: [usize; 4]| {
            let t = if strided {
                Tensor::<K<R>, 4>::ones([b, s, h, c], device).swap_dims(1, 2)
            } else {
                Tensor::<K<R>, 4>::ones([b, h, s, c], device)
            };
            t.into_primitive().tensor()
        };
        // What a fresh tensor of the stored shape has on this runtime (contiguous, or with
        // padded rows where the runtime pitches its allocations, as CUDA does).
        let strides = |[b, h, s, c]: [usize; 4]| {
            let stored = if strided { [b, s, h, c] } else { [b, h, s, c] };
            let fresh = empty_device_dtype::<R>(
                R::client(device),
                device.clone(),
                Shape::new(stored),
                DType::F32,
            );
            let st = fresh.meta.strides();
            if strided {
                vec![st[0], st[2], st[1], st[3]]
            } else {
                st.to_vec()
            }
        };
        let dims = [[b, h, sq, dv], [b, h, sq, d], [b, h, sk, d], [b, h, sk, dv]];
        let (q, k, v) = (t(dims[1]), t(dims[2]), t(dims[3]));
        let d_out = t(dims[0]);
        let (o, lse) = forward(q.clone(), k.clone(), v.clone());
        let (dq, dk, dvt) = backward(
            q.clone(),
            k.clone(),
            v.clone(),
            o.clone(),
            lse,
            d_out.clone(),
        );
        let qkv = (q.clone(), k.clone(), v.clone());
        let (to, tlse) = tiled::forward(q, k, v, Products::Units).expect("unit products run");
        let (tq, tk, tv) = tiled::backward(qkv, to.clone(), tlse, d_out, Products::Units)
            .expect("unit products run");
        for (kernel, outs) in [("fused", [o, dq, dk, dvt]), ("tiled", [to, tq, tk, tv])] {
            for ((name, out), dims) in ["out", "dq", "dk", "dv"].iter().zip(outs).zip(dims) {
                assert_eq!(out.meta.shape().dims::<4>(), dims, "{kernel} {name} shape");
                assert_eq!(
                    out.meta.strides().to_vec(),
                    strides(dims),
                    "{kernel} {name} strides (inputs strided: {strided})"
                );
            }
        }
    }
}

/// Shapes of the tiled kernels' tests: uneven lengths (partial tiles and cubes), `Sq ≠ Sk`,
/// head dims that are not multiples of 16, `D ≠ Dv`, and head dims up to 64; all fit 32 KiB
/// of shared memory in float32 (the software Vulkan driver's limit).
const TILED_SHAPES: [(usize, usize, usize, usize); 4] = [
    (37, 53, 8, 5),
    (130, 70, 16, 16),
    (20, 7, 24, 24),
    (65, 33, 48, 64),
];

/// `f` of `t` and, inside it, the attention with its inputs cast to `dtype` and its output
/// cast back to float32 (the gradients flow back through the casts).
fn in_dtype<B: Backend>(
    dtype: burn::tensor::FloatDType,
    att: impl Fn(Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) -> Tensor<B, 4>,
) -> impl Fn(Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) -> Tensor<B, 4> {
    move |q, k, v| {
        att(q.cast(dtype), k.cast(dtype), v.cast(dtype)).cast(burn::tensor::FloatDType::F32)
    }
}

/// `data`'s values rounded to `dtype` (nearest), kept in float32.
fn rounded(data: TensorData, dtype: burn::tensor::FloatDType) -> TensorData {
    data.convert_dtype(dtype.into()).convert::<f32>()
}

/// The tiled kernels with `products` on `K` (inputs in `dtype`) against the naive attention
/// on the CPU: outputs and gradients within `tol` of the largest reference value, on every
/// shape of [`TILED_SHAPES`] and `more`, contiguous and strided; and the tiled kernels
/// themselves ran (no fallback to the fused ones).
fn check_tiled<K: FusedKernels>(
    device: &K::Device,
    products: Products,
    dtype: burn::tensor::FloatDType,
    tol: f32,
    more: &[(usize, usize, usize, usize)],
) {
    let shapes: Vec<_> = TILED_SHAPES.iter().chain(more).copied().collect();
    for &(sq, sk, d, dv) in &shapes {
        let t = |s: [usize; 4]| {
            Tensor::<K, 4>::zeros(s, device)
                .cast(dtype)
                .into_primitive()
                .tensor()
        };
        let (q, k, v) = (t([2, 3, sq, d]), t([2, 3, sk, d]), t([2, 3, sk, dv]));
        let (o, lse) =
            K::tiled_forward(q.clone(), k.clone(), v.clone(), products).unwrap_or_else(|| {
                panic!("tiled forward ({products:?}) cannot run {sq} {sk} {d} {dv}")
            });
        assert!(
            K::tiled_backward((q, k, v), o.clone(), lse, o, products).is_some(),
            "tiled backward ({products:?}) cannot run {sq} {sk} {d} {dv}"
        );
    }
    // Every shape contiguous and strided, then keys whose scores rise along the sequence.
    let cases = shapes
        .iter()
        .flat_map(|&dims| [(dims, false, rand as fn(_, _) -> _), (dims, true, rand)])
        .chain([((40, 150, 16, 16), false, rising as fn(_, _) -> _)]);
    let mut worst = 0.0f32;
    for (dims, strided, data) in cases {
        // The leaves rounded to `dtype` for both sides, so that the difference is the kernels'
        // own: with keys that rise along the sequence, bf16's rounding of the inputs alone
        // moves the scores by several hundredths (4e-2 of the output's max at 150 keys).
        let data = |shape, seed| rounded(data(shape, seed), dtype);
        let want = run_with::<CpuAd>(naive_attention, dims, strided, data, &Default::default());
        let tiled = |q, k, v| autodiff_attention_with(q, k, v, false, Some(products));
        let got = run_with::<Autodiff<K>>(in_dtype(dtype, tiled), dims, strided, data, device);
        for (name, (a, b)) in ["out", "dq", "dk", "dv"]
            .iter()
            .zip(want.into_iter().zip(got))
        {
            let diff = rel_diff(a, b);
            worst = worst.max(diff);
            assert!(
                diff < tol,
                "tiled {products:?} {dtype:?}: {name} differs by {diff} of its max \
                 (sq, sk, d, dv = {dims:?}, strided {strided})"
            );
        }
    }
    eprintln!("tiled {products:?} {dtype:?}: largest difference {worst:.2e} of the max");
}

/// The tiled kernels' staging reads vectors of several elements where every tensor's layout
/// allows (a contiguous head dim that the vector size divides, as it divides the other
/// strides), one element where any tensor's does not.
fn check_vector_sizes<R: CubeRuntime>(device: &R::Device) {
    type B<R> = CubeBackend<R, f32, i32, u32>;
    let t = |s: [usize; 4]| Tensor::<B<R>, 4>::zeros(s, device);
    let cube = |t: Tensor<B<R>, 4>| t.into_primitive().tensor();
    let wide = cube(t([2, 3, 37, 16]));
    let n = tiled::vector_size(&[&wide]);
    assert!(
        n > 1 && 16 % n == 0,
        "contiguous head dim 16: vectors of {n}"
    );
    // `[B, S, H, C]` seen as `[B, H, S, C]`: still a contiguous head dim.
    let swapped = cube(t([2, 37, 3, 16]).swap_dims(1, 2));
    assert_eq!(tiled::vector_size(&[&wide, &swapped]), n);
    let odd = cube(t([2, 3, 37, 5]));
    assert_eq!(tiled::vector_size(&[&wide, &odd]), 1, "head dim 5");
    // Head dim 16 but a last-dim stride of 37: no vectors.
    let transposed = cube(t([2, 3, 16, 37]).swap_dims(2, 3));
    assert_eq!(
        tiled::vector_size(&[&wide, &transposed]),
        1,
        "strided head dim"
    );
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
    let _turn = reel_core::parallel::autodiff_turn();
    let t = || Tensor::<CpuAd, 4>::zeros([1, 1, 4, 8], &Default::default());
    assert!(try_fused_attention(t(), t(), t(), false).is_err());
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
            try_fused_attention(q, k, v, false)
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
    ($name:ident, $cube:ty, $runtime:ty) => {
        mod $name {
            use super::*;
            type Cube = $cube;

            #[test]
            fn fused_attention_matches_naive_forward_and_gradients() {
                let _turn = reel_core::parallel::autodiff_turn();
                check_against_naive::<Autodiff<Cube>>(&Default::default());
            }

            #[test]
            fn fused_inference_matches_naive() {
                check_inference::<Cube>(&Default::default(), false, 2e-5);
            }

            #[test]
            fn flash_forwards_match_naive() {
                let _turn = reel_core::parallel::autodiff_turn();
                // The tensor-core kernel (float16 tiles) where the device has one, else the
                // fused kernel; with and without autodiff.
                check_inference::<Cube>(&Default::default(), true, 1e-2);
                check_inference::<Autodiff<Cube>>(&Default::default(), true, 1e-2);
                check_inference::<Autodiff<Cube>>(&Default::default(), false, 2e-5);
            }

            #[test]
            fn cubek_unit_flash_forward_matches_naive() {
                // Unpadded, and padded as the tensor-core routine pads its queries (45 → 64).
                for rows in [1, 64] {
                    check_cubek_flash::<$runtime>(
                        &Default::default(),
                        flash::FlashRoutine::Unit,
                        rows,
                    );
                }
            }

            #[test]
            fn outputs_and_gradients_are_laid_out_like_the_inputs() {
                check_layouts::<$runtime>(&Default::default());
            }

            #[test]
            fn tiled_staging_reads_vectors_where_the_layout_allows() {
                check_vector_sizes::<$runtime>(&Default::default());
            }

            #[test]
            fn tiled_unit_products_match_naive_forward_and_gradients() {
                let _turn = reel_core::parallel::autodiff_turn();
                let f32 = burn::tensor::FloatDType::F32;
                check_tiled::<Cube>(&Default::default(), Products::Units, f32, 2e-5, &[]);
                // Half-precision operands in shared memory, float32 statistics.
                let f16 = burn::tensor::FloatDType::F16;
                check_tiled::<Cube>(&Default::default(), Products::Units, f16, 1e-2, &[]);
                // Other launch shapes, each checked to launch as chosen at head dims `(d, dv)`
                // (float32). (The choice is process-wide; any valid shape gives other tests
                // the same results.)
                let client = <$runtime as cubecl::Runtime>::client(&Default::default());
                let have = client.properties().hardware.max_shared_memory_size;
                let check_spec = |spec: &str, (d, dv): (usize, usize)| {
                    let choice: tiles::TileChoice = spec.parse().expect("a valid spec");
                    tiles::set_tiles(choice);
                    for kernel in tiles::Kernel::ALL {
                        let used = tiles::tile_shape(kernel, d, dv, 4, have, tiles::Cores::Units);
                        if let Some(chosen) = choice.get(kernel) {
                            assert_eq!(used, Some(chosen), "{spec}: {kernel:?} with {have} bytes");
                        }
                    }
                    check_tiled::<Cube>(&Default::default(), Products::Units, f32, 2e-5, &[]);
                };
                // 8, 2 and 1 planes, rows shared by 16 units; streamed tiles prefetched into
                // registers; the cube's rows split among planes, 16 each, with 1 and 2 planes
                // (`r` changes nothing with unit products). The largest head dims of
                // `TILED_SHAPES` run the choice.
                for spec in [
                    "forward=16x32x256,backward_q=16x16x64,backward_kv=16x16x32",
                    "forward=16x32x128p,backward_q=16x16x128p,backward_kv=16x16x64p",
                    "forward=16x32x32w,backward_q=16x16x32rw,backward_kv=16x16x32pw",
                    "forward=32x16x64pw",
                    // `m` (manual `mma`) is CUDA's: elsewhere the strips forward runs (with
                    // `p`, prefetching into registers).
                    "forward=32x16x64m",
                    "forward=32x16x64mp",
                ] {
                    check_spec(spec, (48, 64));
                }
                // Two planes' strips in the backward: 32-row cubes fit lavapipe's 32 KiB at the
                // smaller head dims of `TILED_SHAPES` (the larger ones take the defaults).
                check_spec("32x16x64w", (16, 16));
                check_spec("32x16x64m", (16, 16));
                tiles::set_tiles(tiles::TileChoice::default());
            }

            #[test]
            fn flash_training_without_tensor_cores_falls_back_to_the_fused_kernels() {
                let _turn = reel_core::parallel::autodiff_turn();
                // Float32 inputs have no tensor-core product: the tracked forward and the
                // backward of `attention = "flash"` run the fused kernels.
                let dims = TILED_SHAPES[0];
                let want = run::<CpuAd>(naive_attention, dims, true, &Default::default());
                let flash = |q, k, v| autodiff_attention(q, k, v, true);
                let got = run::<Autodiff<Cube>>(flash, dims, true, &Default::default());
                assert_outputs_close(want, got, "(flash, float32)");
            }

            #[test]
            fn fused_kernels_apply_with_and_without_autodiff() {
                let _turn = reel_core::parallel::autodiff_turn();
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
                let _turn = reel_core::parallel::autodiff_turn();
                check_inside_elementwise_chain::<Autodiff<Cube>>(&Default::default());
            }

            #[cfg(feature = "fusion")]
            mod fusion {
                use super::*;
                type Fused = burn_fusion::Fusion<Cube>;

                #[test]
                fn fusion_fused_attention_matches_naive_forward_and_gradients() {
                    let _turn = reel_core::parallel::autodiff_turn();
                    check_against_naive::<Autodiff<Fused>>(&Default::default());
                }

                #[test]
                fn fusion_fused_inference_matches_naive() {
                    check_inference::<Fused>(&Default::default(), false, 2e-5);
                    check_inference::<Fused>(&Default::default(), true, 2e-5);
                }

                #[test]
                fn fusion_tiled_unit_products_match_naive_forward_and_gradients() {
                    let _turn = reel_core::parallel::autodiff_turn();
                    // The tiled kernels as custom fusion operations.
                    let f32 = burn::tensor::FloatDType::F32;
                    check_tiled::<Fused>(&Default::default(), Products::Units, f32, 2e-5, &[]);
                }

                #[test]
                fn fusion_fused_attention_inside_an_elementwise_chain() {
                    let _turn = reel_core::parallel::autodiff_turn();
                    check_inside_elementwise_chain::<Autodiff<Fused>>(&Default::default());
                }
            }
        }
    };
}

#[cfg(feature = "wgpu")]
backend_tests!(
    wgpu,
    CubeBackend<cubecl::wgpu::WgpuRuntime, f32, i32, u32>,
    cubecl::wgpu::WgpuRuntime
);

#[cfg(feature = "cuda")]
backend_tests!(
    cuda,
    CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>,
    cubecl::cuda::CudaRuntime
);

/// The tensor-core routine itself, on a GPU with tensor cores.
#[cfg(feature = "cuda")]
#[test]
fn cuda_tensor_core_flash_forward_matches_naive() {
    check_cubek_flash::<cubecl::cuda::CudaRuntime>(
        &Default::default(),
        flash::FlashRoutine::Accelerated,
        flash::STAGE_ROWS,
    );
}

/// The tiled training kernels on tensor cores (bf16 and f16 inputs, float32 accumulation),
/// after the same kernels with unit products in bf16, so that a failure tells the tile
/// instructions from the rest of the kernel; also at Wan's head dim 128.
#[cfg(feature = "cuda")]
#[test]
fn cuda_tensor_core_tiled_attention_matches_naive() {
    let _turn = reel_core::parallel::autodiff_turn();
    type Cube = CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;
    // Reel's kernels, not cuDNN's (the `cuda` default of `flash`), on this test's thread.
    cudnn::choose(Some(cudnn::Flash::Reel));
    let wan = [(200, 150, 128, 128)];
    let (bf16, f16) = (
        burn::tensor::FloatDType::BF16,
        burn::tensor::FloatDType::F16,
    );
    check_tiled::<Cube>(&Default::default(), Products::Units, bf16, 3e-2, &wan);
    check_tiled::<Cube>(&Default::default(), Products::TensorCores, bf16, 3e-2, &wan);
    check_tiled::<Cube>(&Default::default(), Products::TensorCores, f16, 1e-2, &wan);
}

/// The tensor-core kernels with other launch shapes: the output and the backward's sums in
/// register fragments (`r`), 8 planes per cube, 128-row forward cubes, streamed tiles
/// prefetched (`p`), the cube's rows split among planes (`w`), their combinations, and the
/// kernels on manual `mma` instructions (`m`: 4 and 8 planes, 64- and 32-row tiles, with and
/// without asynchronous copies). (The
/// choice is process-wide; any valid shape gives other tests the same results.)
#[cfg(feature = "cuda")]
#[test]
fn cuda_tensor_core_tiled_launch_shapes_match_naive() {
    let _turn = reel_core::parallel::autodiff_turn();
    type Cube = CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;
    cudnn::choose(Some(cudnn::Flash::Reel));
    let wan = [(200, 150, 128, 128)];
    let (bf16, f16) = (
        burn::tensor::FloatDType::BF16,
        burn::tensor::FloatDType::F16,
    );
    // The manual-MMA kernels first (never run before this test), in bf16 and f16, staging
    // each tile in turn and with asynchronous copies into two buffers (`p`).
    let mma = "forward=64x64x128m,backward_q=64x32x128m,backward_kv=64x32x128m";
    let copies = "forward=64x64x128mp,backward_q=64x32x128mp,backward_kv=64x32x128mp";
    for (spec, dtype, tol) in [
        (mma, bf16, 3e-2),
        (mma, f16, 1e-2),
        (copies, bf16, 3e-2),
        (copies, f16, 1e-2),
        (
            "forward=128x64x256mp,backward_q=128x32x256mp,backward_kv=128x32x256mp",
            bf16,
            3e-2,
        ),
        (
            "forward=128x64x256m,backward_q=128x32x256m,backward_kv=128x32x256m",
            bf16,
            3e-2,
        ),
        (
            "forward=64x32x128m,backward_q=64x64x128m,backward_kv=64x64x128m",
            bf16,
            3e-2,
        ),
        ("64x64x128r", bf16, 3e-2),
        (
            "forward=128x64x256,backward_q=64x64x256r,backward_kv=32x64x128r",
            bf16,
            3e-2,
        ),
        ("64x64x128p", bf16, 3e-2),
        (
            "forward=64x64x256p,backward_q=64x64x256rp,backward_kv=32x64x128rp",
            bf16,
            3e-2,
        ),
        ("64x64x128w", bf16, 3e-2),
        (
            "forward=128x64x256pw,backward_q=64x64x128pw,backward_kv=64x32x128pw",
            bf16,
            3e-2,
        ),
        ("64x64x128rw", bf16, 3e-2),
        (
            "forward=128x64x256rpw,backward_q=64x64x256rp,backward_kv=64x32x128rpw",
            bf16,
            3e-2,
        ),
    ] {
        tiles::set_tiles(spec.parse().expect("a valid spec"));
        eprintln!("tiles {spec} ({dtype:?})");
        check_tiled::<Cube>(&Default::default(), Products::TensorCores, dtype, tol, &wan);
    }
    tiles::set_tiles(tiles::TileChoice::default());
}

/// cuDNN's attention (the `cuda` default of `flash`), forward and backward: at Wan's shapes (256 and
/// 8190 tokens, random inputs) against Reel's tiled kernels, and against the naive attention in
/// bf16 and f16, contiguous and strided. cuDNN runs the shapes whose head dims are multiples
/// of 8 (Wan's 128 among them) and Reel's tiled kernels the others; a missing `libcudnn`, or a
/// graph no cuDNN engine takes, fails the first calls with cuDNN's reason. All of it twice:
/// called from this thread (`cudnn`), and queued on CubeCL's server thread (`cudnn-queued`),
/// where every call after a key's first returns before cuDNN has run.
#[cfg(feature = "cuda")]
#[test]
fn cuda_cudnn_attention_matches_naive() {
    let _turn = reel_core::parallel::autodiff_turn();
    for flash in [cudnn::Flash::Cudnn, cudnn::Flash::CudnnQueued] {
        cudnn::choose(Some(flash));
        let queued = cudnn::queued_runs();
        check_cudnn_attention(flash);
        cudnn::choose(None);
        // (A process-wide count: other tests' threads may queue calls too.)
        let queued = cudnn::queued_runs() - queued;
        if flash == cudnn::Flash::CudnnQueued {
            assert!(queued > 0, "no call was queued (stderr may say why)");
        }
    }
}

/// [`cuda_cudnn_attention_matches_naive`] with `flash` chosen on this thread.
#[cfg(feature = "cuda")]
fn check_cudnn_attention(flash: cudnn::Flash) {
    type Cube = CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;
    let device = Default::default();
    let (bf16, f16) = (
        burn::tensor::FloatDType::BF16,
        burn::tensor::FloatDType::F16,
    );
    let t = |s: [usize; 4]| {
        let normal = burn::tensor::Distribution::Normal(0.0, 1.0);
        Tensor::<Cube, 4>::random(s, normal, &device)
            .cast(bf16)
            .into_primitive()
            .tensor()
    };
    let data = |t: burn_cubecl::tensor::CubeTensor<cubecl::cuda::CudaRuntime>| {
        Tensor::<Cube, 4>::from_primitive(TensorPrimitive::Float(t))
            .cast(burn::tensor::FloatDType::F32)
            .into_data()
    };
    // Wan's heads at 256 tokens and at 8190 (21×30×52 latents: off the 128 grid), random
    // inputs, against Reel's tiled kernels: the output and the three gradients. Twice each:
    // the second call of a key is the one queued.
    let tc = Products::TensorCores;
    for tokens in [256, 256, 8190, 8190] {
        let [q, k, v, d_out] = [0; 4].map(|_| t([1, 12, tokens, 128]));
        let (o, lse) = cudnn::forward(q.clone(), k.clone(), v.clone()).unwrap_or_else(|e| {
            panic!("{flash:?}: cuDNN's forward cannot run Wan's {tokens} tokens: {e}")
        });
        let grads = cudnn::backward(
            [q.clone(), k.clone(), v.clone()],
            o.clone(),
            lse,
            d_out.clone(),
        )
        .unwrap_or_else(|e| {
            panic!("{flash:?}: cuDNN's backward cannot run Wan's {tokens} tokens: {e}")
        });
        let (o_reel, lse_reel) = tiled::forward(q.clone(), k.clone(), v.clone(), tc)
            .unwrap_or_else(|e| panic!("Reel's tiled forward: {e:?}"));
        let (dq, dk, dv) = tiled::backward((q, k, v), o_reel.clone(), lse_reel, d_out, tc)
            .unwrap_or_else(|e| panic!("Reel's tiled backward: {e:?}"));
        let pairs = [
            ("o", o_reel, o),
            ("dq", dq, grads[0].clone()),
            ("dk", dk, grads[1].clone()),
        ];
        for (name, want, got) in pairs.into_iter().chain([("dv", dv, grads[2].clone())]) {
            let diff = rel_diff(data(want), data(got));
            assert!(
                diff < 3e-2,
                "{flash:?}, {tokens} tokens: cuDNN's {name} differs from Reel's by {diff} of its max"
            );
        }
    }
    let wan = [(200, 150, 128, 128), (64, 300, 64, 64)];
    let before = cudnn::runs();
    check_tiled::<Cube>(&device, Products::TensorCores, bf16, 3e-2, &wan);
    check_tiled::<Cube>(&device, Products::TensorCores, f16, 1e-2, &wan);
    let after = cudnn::runs();
    // Each extra shape: one forward and backward alone, then contiguous and strided, in two
    // dtypes, all on cuDNN: the key counts off the 128 grid (150, 300) too, behind the
    // padding mask on cuDNN 9.15.0 and older (`cudnn::padding`).
    let version = cudnn::present().unwrap_or_else(|e| panic!("{e}"));
    let ran = (after.0 - before.0, after.1 - before.1);
    let want = 6 * wan.len();
    assert!(
        ran.0 >= want && ran.1 >= want,
        "{flash:?}: cuDNN {version} ran {} forwards and {} backwards, not at least {want} of \
         each; the rest fell back to Reel's kernels",
        ran.0,
        ran.1
    );
}

/// cuDNN's saved statistics are Reel's: a cuDNN forward followed by Reel's tiled backward, and
/// Reel's forward followed by cuDNN's backward, give the gradients of Reel's forward and
/// backward, and both forwards the same log-sum-exp. Both forwards write the statistics
/// packed; at 200 queries CubeCL would pad them (strides `[H·256, 256, 1]`), so a layout one
/// side assumed but the buffer does not have fails here (the halves fall back alone when cuDNN
/// refuses one call).
#[cfg(feature = "cuda")]
#[test]
fn cuda_cudnn_and_reel_halves_agree() {
    use burn::tensor::{Distribution, FloatDType};
    type Cube = CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;
    type Prim = burn_cubecl::tensor::CubeTensor<cubecl::cuda::CudaRuntime>;
    let device = Default::default();
    let t = |s: [usize; 4]| -> Prim {
        Tensor::<Cube, 4>::random(s, Distribution::Normal(0.0, 1.0), &device)
            .cast(FloatDType::BF16)
            .into_primitive()
            .tensor()
    };
    // 150 keys: off the 128 grid, so behind the padding mask on cuDNN 9.15.0 and older.
    let (b, h, sq, sk, d) = (2, 3, 200, 150, 128);
    let (q, k, v, d_out) = (
        t([b, h, sq, d]),
        t([b, h, sk, d]),
        t([b, h, sk, d]),
        t([b, h, sq, d]),
    );
    let tc = Products::TensorCores;
    let reel_backward = |o: Prim, lse: Prim| {
        let qkv = (q.clone(), k.clone(), v.clone());
        tiled::backward(qkv, o, lse, d_out.clone(), tc)
            .unwrap_or_else(|e| panic!("Reel's tiled backward: {e:?}"))
    };
    let cudnn_backward = |o: Prim, lse: Prim| {
        let [dq, dk, dv] =
            cudnn::backward([q.clone(), k.clone(), v.clone()], o, lse, d_out.clone())
                .unwrap_or_else(|e| panic!("cuDNN's backward: {e}"));
        (dq, dk, dv)
    };
    let data = |t: Prim| {
        Tensor::<Cube, 4>::from_primitive(TensorPrimitive::Float(t))
            .cast(FloatDType::F32)
            .into_data()
    };
    let stats = |t: Prim| {
        let [b, h, s] = t.meta.shape().dims();
        Tensor::<Cube, 3>::from_primitive(TensorPrimitive::Float(t))
            .reshape([b, h, s, 1])
            .into_data()
    };
    let (o, lse) = tiled::forward(q.clone(), k.clone(), v.clone(), tc)
        .unwrap_or_else(|e| panic!("Reel's tiled forward: {e:?}"));
    let (o_dnn, lse_dnn) = cudnn::forward(q.clone(), k.clone(), v.clone())
        .unwrap_or_else(|e| panic!("cuDNN's forward: {e}"));
    let lse_diff = max_abs_diff(stats(lse.clone()), stats(lse_dnn.clone()));
    assert!(
        lse_diff < 1e-2,
        "log-sum-exp: Reel's and cuDNN's differ by {lse_diff}"
    );
    let want = reel_backward(o.clone(), lse.clone());
    let halves = [
        (
            "cuDNN's forward, Reel's backward",
            reel_backward(o_dnn, lse_dnn),
        ),
        ("Reel's forward, cuDNN's backward", cudnn_backward(o, lse)),
    ];
    for (what, got) in halves {
        let pairs = [
            ("dq", &want.0, got.0),
            ("dk", &want.1, got.1),
            ("dv", &want.2, got.2),
        ];
        for (name, want, got) in pairs {
            let diff = rel_diff(data(want.clone()), data(got));
            assert!(diff < 3e-2, "{what}: {name} differs by {diff} of its max");
        }
    }
}
