//! 3-D convolutions on cuDNN (`REEL_VAE_CONV=cudnn`, opt-in): the VAE's convolutions as
//! PyTorch's `nn.Conv3d` runs them on a GPU, an engine of cuDNN's heuristics (implicit GEMM on
//! tensor cores, TF32 for float32) in place of the patch matrix that the `gemm` path writes
//! to memory and reads back.
//!
//! Shapes: `x [N, C, T, H, W]`, `w [O, C, kt, kh, kw]`, `y [N, O, T', H', W']`, float32,
//! each handed to cuDNN packed channels-first (a tensor laid out otherwise, CubeCL's pitched
//! rows included, is copied first). The bias is added by the caller.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Shape, Tensor, TensorPrimitive};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeBackend;
use cubecl::cuda::CudaRuntime;
use reel_core::backend::downcast_tensor;

use super::graph::{Desc, TensorSpec, F32};
use super::ops;
use super::run::{self, Call, PlanKey};
use super::CudnnError;
use crate::vae::conv_gemm::out_len;

/// The plain CUDA backend as Reel builds it.
type Cuda = CubeBackend<CudaRuntime, f32, i32, u8>;

/// The tensors' uids in the graph and variant pack.
const X: i64 = 1;
const W: i64 = 2;
const Y: i64 = 3;

/// What a plan depends on: the dims and strides of `x`, `w` and `y`, the convolution's
/// strides, and its zero padding before and after each spatial dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct ConvKey {
    pub(super) dims: [[i64; 5]; 3],
    pub(super) strides: [[i64; 5]; 3],
    pub(super) stride: [i64; 3],
    pub(super) pre: [i64; 3],
    pub(super) post: [i64; 3],
}

impl ConvKey {
    /// The key of packed float32 `x [N, C, T, H, W]` and `w [O, C, kt, kh, kw]`, with
    /// `stride` and padding `pre`/`post`: its output dims are checked and derived here.
    pub(super) fn new(
        x: [usize; 5],
        w: [usize; 5],
        stride: [usize; 3],
        pre: [usize; 3],
        post: [usize; 3],
    ) -> Result<Self, CudnnError> {
        let unsupported = |why: String| Err(CudnnError::Unsupported(why));
        if x[1] != w[1] {
            return unsupported(format!("x {x:?} and w {w:?} differ in channels"));
        }
        let mut y = [x[0], w[0], 0, 0, 0];
        for i in 0..3 {
            let Some(len) = out_len(x[i + 2], pre[i] + post[i], w[i + 2], stride[i]) else {
                return unsupported(format!(
                    "x {x:?}, kernel {w:?}, stride {stride:?}, padding {pre:?}/{post:?}: no output"
                ));
            };
            y[i + 2] = len;
        }
        let dims = [x, w, y];
        let wide = |a: [usize; 3]| a.map(|v| v as i64);
        Ok(Self {
            dims: dims.map(|d| d.map(|v| v as i64)),
            strides: dims.map(packed_strides),
            stride: wide(stride),
            pre: wide(pre),
            post: wide(post),
        })
    }

    /// `y`'s dims.
    fn out(&self) -> [usize; 5] {
        self.dims[2].map(|v| v as usize)
    }

    /// The graph: one convolution.
    pub(super) fn ops(&self) -> Result<Vec<Desc>, CudnnError> {
        let spec = |i: usize, uid: i64| {
            TensorSpec::device(uid, F32, self.dims[i], self.strides[i]).build()
        };
        let (x, w, y) = (spec(0, X)?, spec(1, W)?, spec(2, Y)?);
        let conv = ops::convolution_forward([&x, &w, &y], &self.stride, &self.pre, &self.post)?;
        Ok(vec![conv])
    }
}

/// Row-major strides of packed `dims`.
fn packed_strides(dims: [usize; 5]) -> [i64; 5] {
    let mut strides = [1i64; 5];
    for i in (0..4).rev() {
        strides[i] = strides[i + 1] * dims[i + 1] as i64;
    }
    strides
}

/// `y [N, O, T', H', W']` (packed) of float32 `x [N, C, T, H, W]` and `w [O, C, kt, kh, kw]`
/// on cuDNN, with `stride` and zero padding `pre` before and `post` after each of `T, H, W`.
pub fn conv3d(
    x: CubeTensor<CudaRuntime>,
    w: CubeTensor<CudaRuntime>,
    stride: [usize; 3],
    pre: [usize; 3],
    post: [usize; 3],
) -> Result<CubeTensor<CudaRuntime>, CudnnError> {
    super::present()?;
    if x.dtype != DType::F32 || w.dtype != DType::F32 {
        return Err(CudnnError::Unsupported(format!(
            "a convolution of {:?} by {:?} (cuDNN's convolution here takes float32)",
            x.dtype, w.dtype
        )));
    }
    let rank5 = |t: &CubeTensor<CudaRuntime>| -> Result<[usize; 5], CudnnError> {
        let s = t.meta.shape();
        <[usize; 5]>::try_from(&s[..])
            .map_err(|_| CudnnError::Unsupported(format!("a convolution of a {s:?} tensor")))
    };
    let key = ConvKey::new(rank5(&x)?, rank5(&w)?, stride, pre, post)?;
    // Packed row-major, as the key describes them (`into_contiguous` copies only a tensor
    // that is not).
    let (x, w) = (into_contiguous(x), into_contiguous(w));
    let y = empty_device_contiguous_dtype(
        x.client.clone(),
        x.device.clone(),
        Shape::from(key.out().to_vec()),
        DType::F32,
    );
    run::execute(Call {
        key: PlanKey::Conv(key),
        graph: &|| key.ops(),
        tensors: &[(X, &x), (W, &w), (Y, &y)],
        scalars: &[],
    })?;
    Ok(y)
}

/// [`conv3d`] on backend `B` when `B` is the plain CUDA backend (an error naming the backend
/// otherwise), frames padded by `[(top, bottom), (left, right)]` and time not at all.
pub fn conv3d_on<B: Backend>(
    x: Tensor<B, 5>,
    w: Tensor<B, 5>,
    stride: [usize; 3],
    [(top, bottom), (left, right)]: [(usize, usize); 2],
) -> Result<Tensor<B, 5>, CudnnError> {
    let not_cuda = || {
        let name = std::any::type_name::<B>();
        CudnnError::Unsupported(format!("the backend {name} is not the plain cuda one"))
    };
    let x = downcast_tensor::<B, Cuda, 5>(x).map_err(|_| not_cuda())?;
    let w = downcast_tensor::<B, Cuda, 5>(w).map_err(|_| not_cuda())?;
    let (x, w) = (x.into_primitive().tensor(), w.into_primitive().tensor());
    let y = conv3d(x, w, stride, [0, top, left], [0, bottom, right])?;
    let y = Tensor::<Cuda, 5>::from_primitive(TensorPrimitive::Float(y));
    downcast_tensor::<Cuda, B, 5>(y).map_err(|_| not_cuda())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_cudnn_conv_keys_derive_the_output_and_refuse_what_has_none() {
        // The VAE's causal 3x3x3 (time padded by the caller), a downsampler's 1x3x3 with
        // stride 2 after one zero row and column, and its temporal 3x1x1 with stride 2.
        let k = ConvKey::new(
            [1, 96, 6, 20, 28],
            [96, 96, 3, 3, 3],
            [1; 3],
            [0, 1, 1],
            [0, 1, 1],
        );
        assert_eq!(k.unwrap().out(), [1, 96, 4, 20, 28]);
        let k = ConvKey::new(
            [2, 8, 1, 9, 8],
            [8, 8, 1, 3, 3],
            [1, 2, 2],
            [0; 3],
            [0, 1, 1],
        );
        let k = k.unwrap();
        assert_eq!(k.out(), [2, 8, 1, 4, 4]);
        assert_eq!(k.strides[0], [576, 72, 72, 8, 1]);
        let k = ConvKey::new([1, 4, 5, 3, 3], [4, 4, 3, 1, 1], [2, 1, 1], [0; 3], [0; 3]);
        assert_eq!(k.unwrap().out(), [1, 4, 2, 3, 3]);
        assert!(ConvKey::new([1, 4, 2, 3, 3], [4, 4, 3, 1, 1], [1; 3], [0; 3], [0; 3]).is_err());
        assert!(ConvKey::new([1, 4, 2, 3, 3], [4, 5, 1, 1, 1], [1; 3], [0; 3], [0; 3]).is_err());
    }

    /// cuDNN's heuristics propose engines for the VAE's convolutions on an H100 described by
    /// its properties; like `cuda_cudnn_heuristics_take_the_graphs`, this needs `libcudnn`
    /// (9.8 or later) but no GPU: `bench/cudnn-check.sh` runs it without one.
    #[test]
    fn cuda_cudnn_heuristics_take_the_conv_graphs() {
        use super::super::graph::{assert_engines, described_device, H100};
        let version = super::super::present().unwrap_or_else(|e| panic!("{e}"));
        if version < 90800 {
            eprintln!("cuDNN {version} cannot describe a device (9.8 can): not checked here");
            return;
        }
        let device = described_device(H100).unwrap_or_else(|e| panic!("the H100: {e}"));
        let cases = [
            (
                [1, 96, 6, 34, 34],
                [96, 96, 3, 3, 3],
                [1; 3],
                [0, 1, 1],
                [0, 1, 1],
            ),
            (
                [1, 3, 6, 256, 256],
                [96, 3, 3, 3, 3],
                [1; 3],
                [0, 1, 1],
                [0, 1, 1],
            ),
            (
                [1, 96, 4, 64, 64],
                [96, 96, 1, 3, 3],
                [1, 2, 2],
                [0; 3],
                [0, 1, 1],
            ),
            (
                [1, 384, 5, 8, 8],
                [384, 384, 3, 1, 1],
                [2, 1, 1],
                [0; 3],
                [0; 3],
            ),
            (
                [1, 192, 4, 32, 32],
                [384, 192, 1, 1, 1],
                [1; 3],
                [0; 3],
                [0; 3],
            ),
        ];
        for (x, w, stride, pre, post) in cases {
            let what = format!("x {x:?} w {w:?} stride {stride:?} pad {pre:?}/{post:?}");
            let key = ConvKey::new(x, w, stride, pre, post).unwrap_or_else(|e| panic!("{e}"));
            assert_engines(&device, &what, key.ops());
        }
    }
}
