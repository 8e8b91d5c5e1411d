//! The element-wise block kernels against the same computations in tensor operations on the
//! same backend: the gated residual and both its gradients (groups of one and several rows,
//! a strided gate as the block's modulation chunks are, f16, an output gradient of another
//! dtype), the rotary embedding and its inverse (float32 and f16 inputs, outputs in another
//! dtype, odd head counts), and both through their autodiff operations. Run on the wgpu
//! backend (`--features wgpu`; on a machine without a GPU, Mesa's lavapipe) and on CUDA
//! (`--features cuda`).

use super::elementwise::*;
use super::tests::{assert_close, rand};
use super::{cube, kernels_on, BLOCK_KERNELS_ENV};
use crate::wan::config::WanConfig;
use crate::wan::gate::{autodiff_gated_residual, gated_residual_plain};
use crate::wan::mem_attention::to_f32;
use crate::wan::rope::{autodiff_rope, RopeTables};
use burn::backend::Autodiff;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, FloatDType, Tensor};
use burn_cubecl::CubeBackend;

/// `[G, P, dim]`: one value, groups of many rows with a partial column block, more rows
/// than a chunk holds, many groups of one row.
const GATE_CASES: [[usize; 3]; 4] = [[1, 1, 3], [2, 37, 300], [1, 700, 40], [9, 1, 64]];

/// The gate kernels against tensor operations on `Cube`.
fn check_gate<Cube: Backend>(kernels_run: bool) {
    assert!(
        kernels_run,
        "the block kernels do not run on this backend (is {BLOCK_KERNELS_ENV} off?)"
    );
    let device = Default::default();
    for dims in GATE_CASES {
        let [g, _, dim] = dims;
        // The gate as the block takes it: one chunk of a `[G, 6, dim]` modulation (strided).
        let gate = rand::<Cube, 3>([g, 6, dim], 1, 0.0, &device).narrow(1, 2, 1);
        for (dtype, grad_dtype, tol) in [
            (FloatDType::F32, FloatDType::F32, 1e-5),
            (FloatDType::F16, FloatDType::F16, 2e-3),
            (FloatDType::F16, FloatDType::F32, 2e-3),
        ] {
            let what = format!("{dims:?} {dtype:?}, gradient {grad_dtype:?}");
            let x = rand::<Cube, 3>(dims, 2, 0.0, &device).cast(dtype);
            let y = rand::<Cube, 3>(dims, 3, 0.0, &device).cast(dtype);
            let grad = rand::<Cube, 3>(dims, 4, 0.0, &device).cast(grad_dtype);
            let out = gated_residual(x.clone(), y.clone(), gate.clone());
            let want = gated_residual_ops(x, y.clone(), gate.clone());
            assert_eq!(out.dtype(), want.dtype(), "{what}: output dtype");
            assert_close(out, want, tol, &format!("{what}: output"));
            let y_dtype = y.dtype();
            let dy = gate_dy(grad.clone(), gate.clone(), y_dtype);
            assert_eq!(dy.dtype(), y_dtype, "{what}: y's gradient's dtype");
            let want = gate_dy_ops(grad.clone(), gate.clone(), y_dtype);
            assert_close(dy, want, tol, &format!("{what}: y's gradient"));
            let dgate = gate_dgate(grad.clone(), y.clone());
            assert_eq!(
                dgate.dims(),
                [g, 1, dim],
                "{what}: the gate's gradient's dims"
            );
            assert_close(
                dgate,
                gate_dgate_ops(grad, y),
                1e-4,
                &format!("{what}: the gate's gradient"),
            );
        }
    }
    // Through the autodiff operation, with a gate shared by the batch.
    type Ad<C> = Autodiff<C>;
    for gate_dims in [[2, 1, 24], [1, 1, 24]] {
        let run = |f: fn(_, _, _) -> Tensor<Ad<Cube>, 3>| {
            let leaf = |dims, seed| rand::<Ad<Cube>, 3>(dims, seed, 0.0, &device).require_grad();
            let (x, y, gate) = (
                leaf([2, 50, 24], 5),
                leaf([2, 50, 24], 6),
                leaf(gate_dims, 7),
            );
            let w = rand::<Ad<Cube>, 3>([2, 50, 24], 8, 0.0, &device);
            let out = f(x.clone(), y.clone(), gate.clone());
            let grads = (out.clone() * w).sum().backward();
            let g = |t: &Tensor<Ad<Cube>, 3>| t.grad(&grads).expect("a gradient");
            [out.inner(), g(&x), g(&y), g(&gate)]
        };
        let (got, want) = (run(autodiff_gated_residual), run(gated_residual_plain));
        for (i, (a, b)) in got.into_iter().zip(want).enumerate() {
            assert_close(a, b, 1e-5, &format!("gate op {gate_dims:?}: value {i}"));
        }
    }
}

/// The RoPE kernel and its inverse against tensor operations on `Cube`, and the autodiff
/// operation against Burn's autodiff of the tensor operations.
fn check_rope<Cube: Backend>(kernels_run: bool) {
    assert!(kernels_run, "the block kernels do not run on this backend");
    let device = Default::default();
    let cfg = WanConfig::preset("wan-tiny").expect("the tiny preset");
    let hd = cfg.attention_head_dim;
    for (grid, b, heads) in [([1, 1, 1], 1, 1), ([2, 3, 5], 2, 3), ([3, 4, 7], 1, 2)] {
        let tables = RopeTables::<Cube>::new(&cfg, grid, &device);
        let s = grid.iter().product::<usize>();
        let x = rand::<Cube, 4>([b, s, heads, hd], 9, 0.0, &device) * 2.0;
        for (input, out, tol) in [
            (FloatDType::F32, DType::F32, 1e-5),
            (FloatDType::F32, DType::F16, 2e-3),
            (FloatDType::F16, DType::F32, 1e-5),
        ] {
            let x = x.clone().cast(input);
            for inverse in [false, true] {
                let what = format!("grid {grid:?}, {input:?} -> {out:?}, inverse {inverse}");
                let got = rope(x.clone(), &tables, out, inverse);
                assert_eq!(got.dtype(), out, "{what}: output dtype");
                let want = rope_ops(x.clone(), &tables, out, inverse);
                assert_close(got, want, tol, &what);
            }
            // The inverse undoes the rotation.
            let back = rope(
                rope(x.clone(), &tables, DType::F32, false),
                &tables,
                DType::F32,
                true,
            );
            assert_close(
                back,
                to_f32(x.clone()),
                1e-5,
                &format!("grid {grid:?}: round trip"),
            );
        }
    }
    type Ad<C> = Autodiff<C>;
    let grid = [2, 3, 4];
    let tables = RopeTables::<Ad<Cube>>::new(&cfg, grid, &device);
    let inner_tables = RopeTables::<Cube>::new(&cfg, grid, &device);
    let x = rand::<Ad<Cube>, 4>([2, 24, 2, hd], 10, 0.0, &device);
    let w = rand::<Ad<Cube>, 4>([2, 24, 2, hd], 11, 0.0, &device);
    let run = |f: &dyn Fn(Tensor<Ad<Cube>, 4>) -> Tensor<Ad<Cube>, 4>| {
        let x = x.clone().require_grad();
        let y = f(x.clone());
        let grads = (y.clone() * w.clone()).sum().backward();
        (y.inner(), x.grad(&grads).expect("a gradient"))
    };
    let (y, dx) = run(&|x| autodiff_rope(x, inner_tables.clone(), DType::F32));
    let (y_ref, dx_ref) = run(&|x| tables.rotate_plain(x, false));
    assert_close(y, y_ref, 1e-5, "RoPE op: output");
    assert_close(dx, dx_ref, 1e-5, "RoPE op: gradient");
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
            fn gated_residual_matches_tensor_operations() {
                let _turn = reel_core::parallel::autodiff_turn();
                check_gate::<Cube>(on_kernels());
            }

            #[test]
            fn rope_matches_tensor_operations() {
                let _turn = reel_core::parallel::autodiff_turn();
                check_rope::<Cube>(on_kernels());
            }
        }
    };
}

#[cfg(feature = "wgpu")]
backend_tests!(wgpu, cubecl::wgpu::WgpuRuntime, u32);

#[cfg(feature = "cuda")]
backend_tests!(cuda, cubecl::cuda::CudaRuntime, u8);
