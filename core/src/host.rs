//! Host memory on the CPU backends: which backends keep their tensors there, four
//! operations that Burn's ndarray backend does with copies and Reel does without them, and
//! element-wise formulas in one pass ([`zip_map`]).
//!
//! - Burn's ndarray `reshape` copies every tensor it reshapes (it builds the new shape as a
//!   view and turns the view into a new array), where a reshape of a contiguous tensor only
//!   needs a new shape over the same buffer. On the quickstart's training step those copies
//!   (with the matmul's below) were about 18 % of the CPU time: flattening every parameter
//!   and gradient for the optimizer and back, the model's own reshapes, and the products'
//!   operands. [`reshape`] shares the buffer (ndarray's reference-counted arrays copy on a
//!   later write only where the buffer is still shared, as every ndarray operation of Burn
//!   does).
//! - Burn's ndarray `matmul` reshapes its operands and its result through that `reshape`
//!   (a transposed operand, such as a linear layer's weight, value by value); [`matmul`]
//!   multiplies 2-D operands where they are, [`batched_matmul`] 4-D ones (attention's).
//! - Burn's ndarray `into_data` of a tensor whose buffer is shared walks it one value at a
//!   time; [`into_data`] copies the contiguous values at once, and moves the buffer where
//!   the tensor is its only owner.
//!
//! All four hand every other backend to Burn's own operation (Flex's `reshape` already
//! shares the buffer).

use std::any::TypeId;

use burn::backend::ndarray::NdArrayTensor;
use burn::backend::NdArray;
use burn::tensor::backend::Backend;
use burn::tensor::{Shape, Tensor, TensorData, TensorPrimitive};
use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array2, Array4, ArrayD, ArrayView, ArrayView2, Dimension, Ix2, Ix4};

use crate::backend::downcast_tensor;

/// Whether `B` is the inner backend of `cpu` or `flex` (Burn's ndarray or Flex backend),
/// whose tensors live in host memory: their float32 element-wise operations and matrix
/// products are plain IEEE float32 arithmetic, and [`TensorData`] reaches their values
/// without a transfer. Not their `Autodiff` wrappers.
pub fn is_host<B: Backend>() -> bool {
    let b = TypeId::of::<B>();
    b == TypeId::of::<NdArray>() || b == TypeId::of::<burn::backend::Flex>()
}

/// Whether `B` is Burn's ndarray backend, with or without its `Autodiff` wrapper: the
/// backend whose operations [`reshape`] and [`matmul`] replace.
pub fn is_ndarray<B: Backend>() -> bool {
    let b = TypeId::of::<B>();
    b == TypeId::of::<NdArray>() || b == TypeId::of::<burn::backend::Autodiff<NdArray>>()
}

/// `t` with the shape `shape` (the same number of values, in the same row-major order):
/// `Tensor::reshape`, without its copy on ndarray when `t` is contiguous (float32).
pub fn reshape<B: Backend, const D: usize, const D2: usize>(
    t: Tensor<B, D>,
    shape: [usize; D2],
) -> Tensor<B, D2> {
    match downcast_tensor::<B, NdArray, D>(t) {
        Ok(t) => back(ndarray_reshape(t, shape)),
        Err(t) => t.reshape(shape),
    }
}

/// The values of `t` (`Tensor::into_data`), copied at once rather than one by one on
/// ndarray when another tensor shares its contiguous float32 buffer.
pub fn into_data<B: Backend, const D: usize>(t: Tensor<B, D>) -> TensorData {
    match downcast_tensor::<B, NdArray, D>(t) {
        Ok(t) => ndarray_data(t),
        Err(t) => t.into_data(),
    }
}

/// `a · b` for `a [m, k]` and `b [k, n]` (`Tensor::matmul`): on ndarray with float32 operands
/// that are contiguous or transposed, one product straight from their buffers.
///
/// Burn's ndarray matmul reshapes both operands to `[batch, rows, cols]` and its result back,
/// and its reshape copies each of them (a transposed operand value by value). Here ndarray's
/// `general_mat_mul` reads the operands where they are, with their strides: the same
/// `matrixmultiply` kernel, which packs its operands into panels of the same values whatever
/// their strides, so the results are bit-identical to Burn's (tested).
pub fn matmul<B: Backend>(a: Tensor<B, 2>, b: Tensor<B, 2>) -> Tensor<B, 2> {
    product(a, b, ndarray_matmul)
}

/// `a · b` for `a [b, h, m, k]` and `b [b, h, k, n]` of the same leading sizes (no
/// broadcasting) -> `[b, h, m, n]` (`Tensor::matmul`): on ndarray with float32 operands, each
/// of the `b·h` products read from the operands' buffers with whatever strides they have.
///
/// Attention's operands are views: the heads of `[B, S, H, D]` projections seen as
/// `[B, H, S, D]`, keys transposed, blocks of them. Burn's ndarray matmul copies each such
/// operand whole before it multiplies (its reshape of a view), so a blocked attention that
/// multiplies every query block by all the keys copied the keys once per query block: the
/// copies grew with the square of the batch, 15 % of a 4-clip `reel sample` (2026-12-02).
/// `matrixmultiply` packs any strides into the same panels: the results are bit-identical
/// to Burn's (tested).
pub fn batched_matmul<B: Backend>(a: Tensor<B, 4>, b: Tensor<B, 4>) -> Tensor<B, 4> {
    product(a, b, ndarray_batched_matmul)
}

/// `on_ndarray(a, b)` when `B` is ndarray, Burn's `a.matmul(b)` on every other backend.
fn product<B: Backend, const D: usize>(
    a: Tensor<B, D>,
    b: Tensor<B, D>,
    on_ndarray: fn(Tensor<NdArray, D>, Tensor<NdArray, D>) -> Tensor<NdArray, D>,
) -> Tensor<B, D> {
    match downcast_tensor::<B, NdArray, D>(a) {
        Ok(a) => {
            let b = downcast_tensor::<B, NdArray, D>(b)
                .unwrap_or_else(|_| unreachable!("both operands are tensors of B"));
            back(on_ndarray(a, b))
        }
        Err(a) => a.matmul(b),
    }
}

/// `f` of the values at each position of `inputs` (tensors of one shape), as a new float32
/// tensor: on ndarray, where every input is a contiguous float32 tensor, one pass over their
/// buffers, which are read where they are. Elsewhere (another backend, dtype, layout or
/// shapes) the inputs come back untouched for the caller's tensor operations.
///
/// A formula written as Burn tensor operations on ndarray makes one pass and one new buffer
/// per operation; `f` written with the same float32 operations in the same order gives the
/// same values in one pass (ndarray's element-wise operations are plain IEEE float32
/// arithmetic and `f32::exp`/`f32::ln`, and Rust does not contract `a * b + c` into a fused
/// multiply-add).
pub fn zip_map<B: Backend, const D: usize, const N: usize>(
    inputs: [Tensor<B, D>; N],
    f: impl Fn([f32; N]) -> f32,
) -> Result<Tensor<B, D>, [Tensor<B, D>; N]> {
    if TypeId::of::<B>() != TypeId::of::<NdArray>() {
        return Err(inputs);
    }
    let primitives = inputs.map(|t| {
        downcast_tensor::<B, NdArray, D>(t)
            .unwrap_or_else(|_| unreachable!("B is ndarray"))
            .into_primitive()
    });
    match ndarray_zip_map(&primitives, f) {
        Some(out) => Ok(back(out)),
        None => Err(primitives.map(|p| back(Tensor::from_primitive(p)))),
    }
}

/// [`zip_map`] on ndarray; `None` unless every input is a contiguous float32 array of one
/// shape.
fn ndarray_zip_map<const D: usize, const N: usize>(
    inputs: &[TensorPrimitive<NdArray>; N],
    f: impl Fn([f32; N]) -> f32,
) -> Option<Tensor<NdArray, D>> {
    let mut slices: Vec<&[f32]> = Vec::with_capacity(N);
    let mut shape: Option<&[usize]> = None;
    for input in inputs {
        let TensorPrimitive::Float(NdArrayTensor::F32(storage)) = input else {
            return None;
        };
        let view = storage.view();
        if *shape.get_or_insert(storage.shape()) != storage.shape() {
            return None;
        }
        slices.push(view.to_slice()?);
    }
    let n = slices.first()?.len();
    let values: Vec<f32> = (0..n)
        .map(|i| f(std::array::from_fn(|j| slices[j][i])))
        .collect();
    Some(float(ArrayD::from_shape_vec(shape?.to_vec(), values).ok()?))
}

/// [`matmul`] on ndarray.
fn ndarray_matmul(a: Tensor<NdArray, 2>, b: Tensor<NdArray, 2>) -> Tensor<NdArray, 2> {
    let (a, b) = (a.into_primitive(), b.into_primitive());
    if let Some((x, y)) = f32_views::<Ix2>(&a, &b) {
        if plain_or_transposed(&x) && plain_or_transposed(&y) && x.ncols() == y.nrows() {
            let mut c = Array2::<f32>::zeros((x.nrows(), y.ncols()));
            general_mat_mul(1.0, &x, &y, 0.0, &mut c);
            return float(c.into_dyn());
        }
    }
    burn_matmul(a, b)
}

/// [`batched_matmul`] on ndarray: float32 operands of matching leading sizes and
/// non-negative strides, one `general_mat_mul` per `[m, k] · [k, n]` pair; anything else
/// goes to Burn's matmul.
fn ndarray_batched_matmul(a: Tensor<NdArray, 4>, b: Tensor<NdArray, 4>) -> Tensor<NdArray, 4> {
    let (a, b) = (a.into_primitive(), b.into_primitive());
    if let Some((x, y)) = f32_views::<Ix4>(&a, &b) {
        let (xs, ys) = (x.dim(), y.dim());
        let forward = |s: &[isize]| s.iter().all(|&s| s >= 0);
        if (xs.0, xs.1, xs.3) == (ys.0, ys.1, ys.2) && forward(x.strides()) && forward(y.strides())
        {
            let mut c = Array4::<f32>::zeros((xs.0, xs.1, xs.2, ys.3));
            for i in 0..xs.0 {
                for j in 0..xs.1 {
                    let mut out = c.slice_mut(s![i, j, .., ..]);
                    let (l, r) = (x.slice(s![i, j, .., ..]), y.slice(s![i, j, .., ..]));
                    general_mat_mul(1.0, &l, &r, 0.0, &mut out);
                }
            }
            return float(c.into_dyn());
        }
    }
    burn_matmul(a, b)
}

/// Both operands as float32 views of `D` dimensions; `None` for another dtype or rank.
fn f32_views<'a, D: Dimension>(
    a: &'a TensorPrimitive<NdArray>,
    b: &'a TensorPrimitive<NdArray>,
) -> Option<(ArrayView<'a, f32, D>, ArrayView<'a, f32, D>)> {
    match (a, b) {
        (
            TensorPrimitive::Float(NdArrayTensor::F32(x)),
            TensorPrimitive::Float(NdArrayTensor::F32(y)),
        ) => Some((
            x.view().into_dimensionality::<D>().ok()?,
            y.view().into_dimensionality::<D>().ok()?,
        )),
        _ => None,
    }
}

/// A float32 array as a tensor.
fn float<const D: usize>(array: ArrayD<f32>) -> Tensor<NdArray, D> {
    let t: NdArrayTensor = array.into_shared().into();
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// Burn's own matmul of two primitives.
fn burn_matmul<const D: usize>(
    a: TensorPrimitive<NdArray>,
    b: TensorPrimitive<NdArray>,
) -> Tensor<NdArray, D> {
    Tensor::<NdArray, D>::from_primitive(a).matmul(Tensor::from_primitive(b))
}

/// Whether `m` is row-major or column-major (a transposed row-major matrix) without gaps.
fn plain_or_transposed(m: &ArrayView2<'_, f32>) -> bool {
    m.is_standard_layout() || m.t().is_standard_layout()
}

/// [`reshape`] on ndarray.
fn ndarray_reshape<const D: usize, const D2: usize>(
    t: Tensor<NdArray, D>,
    shape: [usize; D2],
) -> Tensor<NdArray, D2> {
    let array = match t.into_primitive() {
        TensorPrimitive::Float(NdArrayTensor::F32(storage)) => storage.into_shared(),
        other => return Tensor::<NdArray, D>::from_primitive(other).reshape(shape),
    };
    if !array.is_standard_layout() {
        let t = Tensor::<NdArray, D>::from_primitive(TensorPrimitive::Float(array.into()));
        return t.reshape(shape);
    }
    let from = array.shape().to_vec();
    match array.into_shape_with_order(shape.to_vec()) {
        Ok(array) => Tensor::from_primitive(TensorPrimitive::Float(array.into())),
        Err(e) => panic!("reshape of {from:?} to {shape:?}: {e}"),
    }
}

/// [`into_data`] on ndarray.
fn ndarray_data<const D: usize>(t: Tensor<NdArray, D>) -> TensorData {
    let primitive = t.into_primitive();
    if let TensorPrimitive::Float(NdArrayTensor::F32(storage)) = &primitive {
        if !storage.is_unique() {
            if let Some(values) = storage.view().as_slice() {
                return TensorData::new(values.to_vec(), Shape::from(storage.shape().to_vec()));
            }
        }
    }
    Tensor::<NdArray, D>::from_primitive(primitive).into_data()
}

/// `t` as a tensor of `B`, which is ndarray.
fn back<B: Backend, const D: usize>(t: Tensor<NdArray, D>) -> Tensor<B, D> {
    downcast_tensor::<NdArray, B, D>(t)
        .unwrap_or_else(|_| panic!("the backend was ndarray a moment ago"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::DType;

    type B = NdArray;

    fn t23() -> Tensor<B, 2> {
        let v: Vec<f32> = (0..6).map(|i| i as f32 * 1.5 - 2.0).collect();
        Tensor::from_data(TensorData::new(v, [2, 3]), &Default::default())
    }

    fn values<const D: usize>(t: Tensor<B, D>) -> (Vec<usize>, Vec<f32>) {
        let dims = t.dims().to_vec();
        (
            dims,
            t.into_data()
                .convert::<f32>()
                .to_vec()
                .expect("float values"),
        )
    }

    /// Whether `t`'s float32 buffer has no other owner than `t`.
    fn unique<const D: usize>(t: Tensor<B, D>) -> bool {
        matches!(
            t.into_primitive(),
            TensorPrimitive::Float(NdArrayTensor::F32(s)) if s.is_unique()
        )
    }

    #[test]
    fn reshape_equals_burns_reshape_for_every_layout_and_dtype() {
        let cases: Vec<(&str, Tensor<B, 2>)> = vec![
            ("contiguous", t23()),
            ("transposed", t23().swap_dims(0, 1)),
            ("float64", t23().cast(DType::F64)),
        ];
        for (what, t) in cases {
            let [r, c] = t.dims();
            assert_eq!(
                values(reshape(t.clone(), [c, 1, r])),
                values(t.clone().reshape([c, 1, r])),
                "{what}"
            );
            assert_eq!(
                values(reshape(t.clone(), [r * c])),
                values(t.reshape([r * c])),
                "{what}"
            );
        }
    }

    /// The reshaped tensor shares the buffer, and writing to either leaves the other as it
    /// was.
    #[test]
    fn reshape_shares_the_buffer_and_copies_on_write() {
        let a = t23();
        let before = values(a.clone());
        let b = reshape(a.clone(), [6]);
        match (a.clone().into_primitive(), b.clone().into_primitive()) {
            (
                TensorPrimitive::Float(NdArrayTensor::F32(x)),
                TensorPrimitive::Float(NdArrayTensor::F32(y)),
            ) => assert_eq!(x.view().as_ptr(), y.view().as_ptr(), "not the same buffer"),
            _ => panic!("float32 ndarray tensors expected"),
        }
        let doubled = b.mul_scalar(2.0);
        assert_eq!(
            values(a.clone()),
            before,
            "the write reached the shared buffer"
        );
        let (_, d) = values(doubled);
        assert_eq!(d, before.1.iter().map(|v| v * 2.0).collect::<Vec<_>>());
        // Burn's own reshape copies: its result owns its buffer alone; this one does not.
        assert!(unique(a.clone().reshape([6])));
        assert!(!unique(reshape(a.clone(), [6])));
    }

    #[test]
    fn into_data_of_a_shared_or_strided_tensor_equals_burns() {
        let a = t23();
        let _kept = a.clone();
        assert_eq!(into_data(a.clone()), a.clone().into_data());
        let strided = a.swap_dims(0, 1);
        assert_eq!(into_data(strided.clone()), strided.into_data());
        let flex = Tensor::<burn::backend::Flex, 1>::from_floats([1.0, 2.0], &Default::default());
        assert_eq!(into_data(flex.clone()), flex.into_data());
    }

    fn det(rows: usize, cols: usize, phase: f32) -> Tensor<B, 2> {
        let v: Vec<f32> = (0..rows * cols)
            .map(|i| (i as f32 * 0.61 + phase).sin() * 3.0)
            .collect();
        Tensor::from_data(TensorData::new(v, [rows, cols]), &Default::default())
    }

    /// Every layout the product takes from the buffers (plain and transposed operands), with
    /// sizes past `matrixmultiply`'s blocks, and the layouts it hands to Burn (a column
    /// slice, float64): bit-identical to Burn's matmul.
    #[test]
    fn matmul_equals_burns_bit_for_bit_for_every_layout() {
        let (m, k, n) = (37, 300, 19);
        let lhs = [
            ("plain", det(m, k, 0.1)),
            ("transposed", det(k, m, 0.1).transpose()),
        ];
        let rhs = [
            ("plain", det(k, n, 0.7)),
            ("transposed", det(n, k, 0.7).transpose()),
        ];
        for (la, a) in &lhs {
            for (lb, b) in &rhs {
                let ours = matmul(a.clone(), b.clone()).into_data();
                assert_eq!(ours, a.clone().matmul(b.clone()).into_data(), "{la} x {lb}");
            }
        }
        let sliced = det(m, k + 5, 0.3).narrow(1, 2, k);
        let b = det(k, n, 0.9);
        let burn = sliced.clone().matmul(b.clone()).into_data();
        assert_eq!(matmul(sliced, b.clone()).into_data(), burn, "column slice");
        let (a64, b64) = (det(m, k, 0.2).cast(DType::F64), b.cast(DType::F64));
        let burn = a64.clone().matmul(b64.clone()).into_data();
        assert_eq!(matmul(a64, b64).into_data(), burn, "float64");
    }

    /// `[b, s, h, d]` values seen as `[b, h, s, d]`, as attention sees its projections.
    fn heads(b: usize, s: usize, h: usize, d: usize, phase: f32) -> Tensor<B, 4> {
        det(b * s, h * d, phase)
            .reshape([b, s, h, d])
            .swap_dims(1, 2)
    }

    /// Attention's operands (head views, transposed keys, blocks of both, a contiguous
    /// product) with sizes past `matrixmultiply`'s blocks: bit-identical to Burn's matmul;
    /// float64 and broadcast operands go to Burn's.
    #[test]
    fn batched_matmul_equals_burns_bit_for_bit_for_attentions_views() {
        let (b, h, s, d) = (2, 3, 70, 40);
        let (q, k) = (heads(b, s, h, d, 0.1), heads(b, s, h, d, 0.5));
        let kt = k.clone().swap_dims(2, 3);
        let scores = q.clone().matmul(kt.clone());
        let cases: Vec<(&str, Tensor<B, 4>, Tensor<B, 4>)> = vec![
            ("q · kᵀ", q.clone(), kt.clone()),
            (
                "blocks",
                q.clone().narrow(2, 9, 30),
                kt.clone().narrow(3, 20, 33),
            ),
            ("p · v", scores.clone(), k.clone()),
            ("pᵀ · q", scores.swap_dims(2, 3), q.clone()),
            (
                "contiguous",
                q.clone().reshape([b * h * s * d]).reshape([b, h, s, d]),
                kt,
            ),
        ];
        for (what, x, y) in cases {
            let want = x.clone().matmul(y.clone()).into_data();
            assert_eq!(batched_matmul(x, y).into_data(), want, "{what}");
        }
        let (q64, k64) = (q.clone().cast(DType::F64), k.clone().cast(DType::F64));
        let want = q64.clone().matmul(k64.clone().swap_dims(2, 3)).into_data();
        assert_eq!(batched_matmul(q64, k64.swap_dims(2, 3)).into_data(), want);
        let one = k.narrow(0, 0, 1).swap_dims(2, 3);
        let want = q.clone().matmul(one.clone()).into_data();
        assert_eq!(batched_matmul(q, one).into_data(), want, "broadcast");
    }

    #[test]
    fn zip_map_runs_on_contiguous_float32_and_hands_back_the_rest() {
        let f = |[a, b]: [f32; 2]| a * 2.0 - b;
        let (a, b) = (t23(), t23() * 0.5 + 1.0);
        let want = values(a.clone() * 2.0 - b.clone());
        let Ok(got) = zip_map([a.clone(), b.clone()], f) else {
            panic!("contiguous float32 tensors of ndarray take the loop")
        };
        assert_eq!(values(got), want);
        let Ok(exp) = zip_map([a.clone()], |[x]| x.exp()) else {
            panic!("one input takes the loop")
        };
        assert_eq!(values(exp), values(a.clone().exp()));

        let handed_back: Vec<(&str, [Tensor<B, 2>; 2])> = vec![
            (
                "strided",
                [a.clone().swap_dims(0, 1), b.clone().swap_dims(0, 1)],
            ),
            ("float64", [a.clone().cast(DType::F64), b.clone()]),
            ("shapes", [a.clone(), b.clone().reshape([3, 2])]),
        ];
        for (what, inputs) in handed_back {
            let want: Vec<_> = inputs.iter().map(|t| values(t.clone())).collect();
            let Err(back) = zip_map(inputs, f) else {
                panic!("{what}: took the loop")
            };
            let got: Vec<_> = back.into_iter().map(values).collect();
            assert_eq!(got, want, "{what}: the inputs come back as they were");
        }
        let dev = Default::default();
        let flex = Tensor::<burn::backend::Flex, 1>::from_data(
            TensorData::new(vec![1.0f32; 4], [4]),
            &dev,
        );
        assert!(zip_map([flex], |[x]| x).is_err(), "other backends");
    }

    #[test]
    fn only_the_plain_cpu_backends_are_host_backends() {
        assert!(is_host::<NdArray>() && is_host::<burn::backend::Flex>());
        assert!(!is_host::<burn::backend::Autodiff<NdArray>>());
    }

    #[test]
    fn ndarray_is_ndarray_with_or_without_autodiff() {
        assert!(is_ndarray::<NdArray>() && is_ndarray::<burn::backend::Autodiff<NdArray>>());
        assert!(!is_ndarray::<burn::backend::Flex>());
        assert!(!is_ndarray::<burn::backend::Autodiff<burn::backend::Flex>>());
    }
}
