//! A tensor `[.., cols]` as the matrix `[rows, cols]` of its rows, without a copy where its
//! layout allows one.
//!
//! CubeCL's CUDA runtime allocates most tensors with *pitched* rows: each row of the last
//! dimension starts on an aligned address, so a row of `cols` values takes
//! `(4 cols).next_power_of_two()` bytes clamped to 16–512, rounded up
//! (`cubecl-runtime` `allocator.rs`, `PitchedMemoryLayoutPolicy` and `optimal_align`). A
//! `[.., 81]` float32 tensor thus has a row stride of 128 values. Burn's `reshape` only makes
//! a view of a contiguous tensor (or one whose dimensions it only splits or broadcasts), so
//! merging the leading dimensions of a pitched tensor copies it whole (`burn-std`
//! `reshape_analysis`, then `burn-cubecl` `reshape` → `copy_into`). The merged rows are still
//! evenly strided, though, and the linear layers' kernels read a matrix with a row stride
//! above its width as it is (cuBLAS through its leading dimension, cubek through its
//! strides). [`flatten_rows`] gives that view.

use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use crate::wan::reshape::reshape;

/// `t [d0, .., cols]` as `[d0 · .. , cols]`: on a plain CubeCL backend, a view with the rows'
/// own stride when the leading dimensions are evenly strided ([`row_stride`]); otherwise
/// Burn's `reshape` (which copies a non-contiguous tensor).
pub fn flatten_rows<B: Backend, const D: usize>(t: Tensor<B, D>) -> Tensor<B, 2> {
    let dims = t.dims();
    let cols = dims[D - 1];
    let rows = dims[..D - 1].iter().product::<usize>();
    on_cube_backend!(B, |R, BT| super::cube::flatten_rows::<B, R, BT, D>(
        t,
        [rows, cols]
    ));
    reshape(t, [rows, cols])
}

/// The row stride of `[rows, cols]`, the leading dimensions of `shape` merged into `rows`
/// with `strides`, when that matrix is a view of the same memory with packed rows: the last
/// dimension has stride 1 (or one value), each leading dimension's stride is the next one's
/// times its size (dimensions of size 1 aside), and the rows do not overlap. `None` for an
/// empty tensor or a rank below 2.
// Only the CubeCL backends' view uses it (and the tests).
#[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
pub(crate) fn row_stride(shape: &[usize], strides: &[usize]) -> Option<usize> {
    let (&cols, leading) = shape.split_last()?;
    if leading.is_empty() || shape.contains(&0) || (cols > 1 && strides[shape.len() - 1] != 1) {
        return None;
    }
    // The (stride, size) of the innermost leading dimension met so far, of size above 1.
    let mut inner: Option<(usize, usize)> = None;
    let mut row = None;
    for (&size, &stride) in leading.iter().zip(strides).rev() {
        if size == 1 {
            continue;
        }
        match inner {
            None => row = Some(stride),
            Some((s, n)) if stride == s * n => {}
            Some(_) => return None,
        }
        inner = Some((stride, size));
    }
    match row {
        // Every leading dimension has size 1: one row, packed.
        None => Some(cols),
        Some(r) if r >= cols => Some(r),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    #[test]
    fn evenly_strided_rows_merge_into_one_stride() {
        // Packed, and pitched (rows of 81 values 128 apart) as CUDA allocates them.
        assert_eq!(row_stride(&[2, 3, 4, 5], &[60, 20, 5, 1]), Some(5));
        assert_eq!(row_stride(&[2, 3, 4, 81], &[1536, 512, 128, 1]), Some(128));
        // Dimensions of size 1 take any stride; so does a last dimension of one value.
        assert_eq!(row_stride(&[2, 1, 4, 81], &[512, 7, 128, 1]), Some(128));
        assert_eq!(row_stride(&[1, 1, 9], &[3, 3, 1]), Some(9));
        assert_eq!(row_stride(&[6, 4, 1], &[8, 2, 5]), Some(2));
    }

    #[test]
    fn other_layouts_are_not_views_of_rows() {
        // A gap between the leading dimensions (a slice of the third), a permuted view, a
        // strided last dimension, overlapping rows, and no rows at all.
        assert_eq!(row_stride(&[2, 3, 81], &[512, 128, 1]), None);
        assert_eq!(row_stride(&[3, 2, 4], &[4, 12, 1]), None);
        assert_eq!(row_stride(&[4, 5], &[10, 2]), None);
        assert_eq!(row_stride(&[4, 5], &[3, 1]), None);
        assert_eq!(row_stride(&[0, 5], &[5, 1]), None);
        assert_eq!(row_stride(&[5], &[1]), None);
    }

    #[test]
    fn flattening_keeps_every_value_in_its_row() {
        type B = burn::backend::NdArray;
        let dev = Default::default();
        let values: Vec<f32> = (0..2 * 3 * 4).map(|v| v as f32).collect();
        let t = Tensor::<B, 3>::from_data(TensorData::new(values.clone(), [2, 3, 4]), &dev);
        let m = flatten_rows(t);
        assert_eq!(m.dims(), [6, 4]);
        assert_eq!(m.into_data(), TensorData::new(values, [6, 4]));
    }
}

/// On a CubeCL backend: rows 128 values apart with 81 in use (a view of a wider tensor here;
/// CUDA's pitched layout gives the same strides) flatten into a view of the same memory, and every
/// product that takes it agrees with the product of a packed copy.
#[cfg(all(test, any(feature = "cuda", feature = "wgpu")))]
mod cube_tests {
    use super::*;
    use crate::wan::block_kernels::cube::{prim, wrap, Cube};
    use crate::wan::block_kernels::matmul::{matmul_on, MatmulError, MATMUL_KERNELS};
    use burn::tensor::{ElementConversion, Int};
    use burn_cubecl::element::BoolElement;
    use burn_cubecl::CubeRuntime;
    use cubecl::zspace::metadata::Metadata;

    fn check_view<R: CubeRuntime, BT: BoolElement>() {
        let dev = Default::default();
        let base = Tensor::<Cube<R, BT>, 1, Int>::arange(0..2 * 3 * 128, &dev)
            .float()
            .div_scalar(100.0)
            .reshape([2, 3, 128]);
        // The first 81 values of each row, as a view (Burn's `slice` copies a slice whose
        // end is not on the memory alignment).
        let mut p = prim::<Cube<R, BT>, R, BT, 3>(base);
        *p.meta = Metadata::new([2, 3, 81], [384, 128, 1]);
        let sliced = wrap::<Cube<R, BT>, R, BT, 3>(p);
        let keep = sliced.clone();
        let view = flatten_rows(sliced);
        let p = prim::<Cube<R, BT>, R, BT, 2>(view.clone());
        assert_eq!(
            p.meta.strides().to_vec(),
            vec![128, 1],
            "rows keep their stride"
        );
        assert!(
            !p.handle.can_mut(),
            "the view shares the sliced tensor's memory"
        );
        let packed = keep.reshape([6, 81]);
        assert_eq!(view.clone().into_data(), packed.clone().into_data());
        let w = Tensor::<Cube<R, BT>, 1, Int>::arange(0..81 * 5, &dev)
            .float()
            .div_scalar(400.0)
            .reshape([81, 5]);
        let want = packed.matmul(w.clone());
        let scale: f32 = want.clone().abs().max().into_scalar().elem();
        // Relative to the largest value: within TF32 rounding on CUDA's tensor cores.
        let off = |got: Tensor<Cube<R, BT>, 2>| -> f32 {
            (got - want.clone()).abs().max().into_scalar().elem::<f32>() / scale
        };
        assert!(off(view.clone().matmul(w.clone())) <= 5e-3, "Burn's matmul");
        for (kernel, name) in MATMUL_KERNELS {
            match matmul_on(view.clone(), w.clone(), kernel) {
                Ok(got) => assert!(off(got) <= 5e-3, "{name} on the view"),
                Err(MatmulError::Refused(_)) => {}
                Err(e) => panic!("{name}: {e}"),
            }
        }
    }

    #[cfg(feature = "wgpu")]
    #[test]
    fn wgpu_strided_rows_flatten_into_a_view() {
        check_view::<cubecl::wgpu::WgpuRuntime, u32>();
    }

    /// Also: CUDA allocates a `[2, 3, 81]` float32 tensor with rows 128 values apart, the
    /// layout the module docs describe.
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_pitched_rows_flatten_into_a_view() {
        use cubecl::cuda::CudaRuntime;
        check_view::<CudaRuntime, u8>();
        let dev = Default::default();
        let half = Tensor::<Cube<CudaRuntime, u8>, 3>::ones([1, 3, 81], &dev);
        let made = Tensor::cat(vec![half.clone(), half], 0);
        let p = prim::<Cube<CudaRuntime, u8>, CudaRuntime, u8, 3>(made);
        assert_eq!(p.meta.strides().to_vec(), vec![384, 128, 1], "pitched rows");
    }
}
