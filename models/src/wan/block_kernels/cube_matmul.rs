//! [`super::matmul`]'s kernels launched through cubek on a plain CubeCL backend: each
//! [`MatmulKernel`] is the cubek `Strategy` that Burn's autotuning builds for that candidate.

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::Mutex;

use burn::tensor::backend::Backend;
use burn::tensor::{DType, ElementConversion, Tensor};
use burn_cubecl::element::BoolElement;
use burn_cubecl::CubeRuntime;
use cubek::matmul::components::tile::TileMatmulKind;
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::matmul::launch::{launch_ref, Strategy};
use cubek::matmul::routines::double_buffering::DoubleBufferingArgs;
use cubek::matmul::routines::double_unit::DoubleUnitSelectionArgs;
use cubek::matmul::routines::ordered_double_buffering::OrderedSelectionArgs;
use cubek::matmul::routines::simple::SimpleArgs;
use cubek::matmul::routines::simple_unit::SimpleUnitSelectionArgs;
use cubek::matmul::routines::{BlueprintStrategy, TileSizeSelection};
use cubek::std::InputBinding;

use super::cube::{empty, prim, wrap};
use super::matmul::{MatmulError, MatmulKernel, CHECK_TOLERANCE};

/// A kind of product, for [`checked`]'s verdicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Kind {
    /// The CubeCL runtime (a build may hold both CUDA and wgpu).
    pub runtime: TypeId,
    /// The kernel.
    pub kernel: MatmulKernel,
    /// `[m, k, n]`.
    pub shape: [usize; 3],
    /// Whether each operand is stored transposed (column-major: its row stride below its
    /// column stride, cubek's rule).
    pub transposed: [bool; 2],
    /// The operands' dtype.
    pub dtype: DType,
}

/// Whether each kind's kernel result matched Burn's matmul, from its first product.
static VERDICTS: Mutex<Option<HashMap<Kind, bool>>> = Mutex::new(None);

/// [`super::matmul::matmul`] on the plain CubeCL backend: `kernel`'s product where it has
/// matched Burn's on the first product of the kind, Burn's otherwise.
pub(super) fn checked<B: Backend, R: CubeRuntime, BT: BoolElement>(
    lhs: Tensor<B, 2>,
    rhs: Tensor<B, 2>,
    kernel: MatmulKernel,
) -> Tensor<B, 2> {
    let ([m, k], [_, n]) = (lhs.dims(), rhs.dims());
    let kind = Kind {
        runtime: TypeId::of::<R>(),
        kernel,
        shape: [m, k, n],
        transposed: [transposed::<B, R, BT>(&lhs), transposed::<B, R, BT>(&rhs)],
        dtype: lhs.dtype(),
    };
    let verdict = verdicts(|v| v.get(&kind).copied());
    match verdict {
        Some(true) => {
            matmul::<B, R, BT>(lhs.clone(), rhs.clone(), kernel).unwrap_or_else(|_| lhs.matmul(rhs))
        }
        Some(false) => lhs.matmul(rhs),
        None => {
            let device = lhs.device();
            // A launch or compilation that fails after cubek returns surfaces at the sync.
            let got = matmul::<B, R, BT>(lhs.clone(), rhs.clone(), kernel).and_then(|out| {
                B::sync(&device)
                    .map(|_| out)
                    .map_err(|e| MatmulError::Refused(one_line(&format!("{e:?}"))))
            });
            let want = lhs.matmul(rhs);
            let (ok, out) = judge(&kind, got, want);
            verdicts(|v| v.insert(kind, ok));
            out
        }
    }
}

/// Whether `got` may stand for `want`, and the product to use; one line on stderr if not.
pub(super) fn judge<B: Backend>(
    kind: &Kind,
    got: Result<Tensor<B, 2>, MatmulError>,
    want: Tensor<B, 2>,
) -> (bool, Tensor<B, 2>) {
    let why = match got {
        Err(e) => e.to_string(),
        Ok(got) => {
            let f32 = |t: Tensor<B, 2>| t.cast(DType::F32);
            let scale = f32(want.clone()).abs().max().into_scalar().elem::<f32>();
            let diff = (f32(got.clone()) - f32(want.clone())).abs().max();
            let err = diff.into_scalar().elem::<f32>() / scale.max(1.0);
            if err <= CHECK_TOLERANCE {
                return (true, got);
            }
            format!("differs from Burn's by {err:.2e} of its largest value")
        }
    };
    eprintln!(
        "reel: matmul kernel {} on {:?} (transposed {:?}, {:?}): {why}; Burn's matmul runs \
         these products",
        kind.kernel, kind.shape, kind.transposed, kind.dtype
    );
    (false, want)
}

/// `f` on the verdicts.
fn verdicts<T>(f: impl FnOnce(&mut HashMap<Kind, bool>) -> T) -> T {
    let mut guard = VERDICTS.lock().unwrap_or_else(|e| e.into_inner());
    f(guard.get_or_insert_with(HashMap::new))
}

/// Whether `t` is stored column-major (a transposed view), as cubek sees it: its row stride
/// below its column stride.
fn transposed<B: Backend, R: CubeRuntime, BT: BoolElement>(t: &Tensor<B, 2>) -> bool {
    let strides = prim::<B, R, BT, 2>(t.clone()).meta.strides().clone();
    strides[0] < strides[1]
}

/// `lhs · rhs` on `kernel`, `B` being the plain CubeCL backend over `R`.
pub(super) fn matmul<B: Backend, R: CubeRuntime, BT: BoolElement>(
    lhs: Tensor<B, 2>,
    rhs: Tensor<B, 2>,
    kernel: MatmulKernel,
) -> Result<Tensor<B, 2>, MatmulError> {
    if matches!(
        kernel,
        MatmulKernel::Cublas
            | MatmulKernel::CublasAsync
            | MatmulKernel::CublasStream
            | MatmulKernel::CublasQueued
    ) {
        return cublas::<B, R, BT>(lhs, rhs, kernel);
    }
    let [m, _] = lhs.dims();
    let [_, n] = rhs.dims();
    let (lhs, rhs) = (prim::<B, R, BT, 2>(lhs), prim::<B, R, BT, 2>(rhs));
    let dtype = lhs.dtype;
    let out = empty(&lhs, &[m, n], dtype);
    let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: dtype.into(),
        rhs: dtype.into(),
        out: dtype.into(),
    });
    let client = lhs.client.clone();
    launch_ref(
        &strategy(kernel),
        &client,
        InputBinding::new(lhs.binding(), dtype.into()),
        InputBinding::new(rhs.binding(), dtype.into()),
        out.clone().binding(),
        &mut dtypes,
    )
    .map_err(|e| MatmulError::Refused(one_line(&format!("{e:?}"))))?;
    Ok(wrap::<B, R, BT, 2>(out))
}

/// `lhs · rhs` by cuBLAS (`kernel` says how it is ordered) where `R` is CUDA; refused
/// elsewhere.
#[cfg_attr(not(feature = "cuda"), allow(clippy::extra_unused_type_parameters))]
fn cublas<B: Backend, R: CubeRuntime, BT: BoolElement>(
    lhs: Tensor<B, 2>,
    rhs: Tensor<B, 2>,
    kernel: MatmulKernel,
) -> Result<Tensor<B, 2>, MatmulError> {
    #[cfg(feature = "cuda")]
    if TypeId::of::<R>() == TypeId::of::<cubecl::cuda::CudaRuntime>() {
        use super::cublas::Order;
        let order = match kernel {
            MatmulKernel::CublasAsync => Order::Device,
            MatmulKernel::CublasStream => Order::Stream,
            MatmulKernel::CublasQueued => Order::Queued,
            _ => Order::Host,
        };
        return super::cublas::matmul::<B, BT>(lhs, rhs, order);
    }
    let _ = (lhs, rhs, kernel);
    Err(MatmulError::Refused(
        "cuBLAS runs on the cuda backend only".into(),
    ))
}

/// `s` on one line (cubek's messages span several).
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The cubek strategy of `kernel`, with the arguments autotuning gives that candidate.
fn strategy(kernel: MatmulKernel) -> Strategy {
    use MatmulKernel as K;
    use TileMatmulKind::{Cmma, Mma};
    let args = |tile_matmul, multi_rows| SimpleArgs {
        tile_matmul,
        multi_rows,
    };
    let simple =
        |tile_matmul, multi_rows| BlueprintStrategy::Inferred(args(tile_matmul, multi_rows));
    let ordered = |tile_matmul, rows| {
        BlueprintStrategy::Inferred(OrderedSelectionArgs {
            partition_k: Some(2),
            row_count: Some(rows),
            rows_per_plane: Some(2),
            tile_matmul,
        })
    };
    let double = |tile_matmul, specialized| {
        BlueprintStrategy::Inferred(DoubleBufferingArgs {
            tile_matmul,
            specialized,
        })
    };
    let largest = TileSizeSelection::MaxTileSize;
    match kernel {
        K::SimpleUnit => {
            Strategy::SimpleUnit(BlueprintStrategy::Inferred(SimpleUnitSelectionArgs {
                tile_size: largest,
            }))
        }
        K::DoubleUnit => {
            Strategy::DoubleUnit(BlueprintStrategy::Inferred(DoubleUnitSelectionArgs {
                tile_size: largest,
            }))
        }
        K::SimpleCmma => Strategy::SimpleCyclicCmma(simple(Cmma, false)),
        K::SimpleMma => Strategy::SimpleCyclicMma(simple(Mma, false)),
        K::SimpleMultiRowCmma => Strategy::SimpleCyclicCmma(simple(Cmma, true)),
        K::SimpleMultiRowMma => Strategy::SimpleCyclicMma(simple(Mma, true)),
        K::OrderedCmma => Strategy::OrderedDoubleCmma(ordered(Cmma, 4)),
        K::OrderedMma => Strategy::OrderedDoubleMma(ordered(Mma, 4)),
        K::Ordered8Cmma => Strategy::OrderedDoubleCmma(ordered(Cmma, 8)),
        K::Ordered8Mma => Strategy::OrderedDoubleMma(ordered(Mma, 8)),
        K::DoubleCmma => Strategy::DoubleCyclicCmma(double(Cmma, false)),
        K::DoubleMma => Strategy::DoubleCyclicMma(double(Mma, false)),
        K::DoubleSpecializedCmma => Strategy::DoubleCyclicCmma(double(Cmma, true)),
        K::DoubleSpecializedMma => Strategy::DoubleCyclicMma(double(Mma, true)),
        K::SpecializedCmma => {
            Strategy::SpecializedCyclicCmma(BlueprintStrategy::Inferred(().into()))
        }
        K::SpecializedMma => Strategy::SpecializedCyclicMma(BlueprintStrategy::Inferred(().into())),
        K::TmaCmma => Strategy::SimpleTmaCmma(BlueprintStrategy::Inferred(args(Cmma, false))),
        K::TmaMma => Strategy::SimpleTmaMma(BlueprintStrategy::Inferred(args(Mma, false))),
        K::SpecializedTmaCmma => {
            Strategy::SpecializedTmaCmma(BlueprintStrategy::Inferred(().into()))
        }
        K::SpecializedTmaMma => Strategy::SpecializedTmaMma(BlueprintStrategy::Inferred(().into())),
        K::Cublas | K::CublasAsync | K::CublasStream | K::CublasQueued => {
            unreachable!("cuBLAS products are not launched through cubek")
        }
    }
}
