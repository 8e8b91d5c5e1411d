//! How the VAE's convolutions run: Burn's `conv3d`, or gathered patches times the kernel as
//! one matrix product per piece of the output (`REEL_VAE_CONV`).
//!
//! On the CubeCL backends built without Burn's `autotune` (the `cuda` default), Burn's
//! `conv3d` is a direct kernel: one thread per output value looping over `C * kt * kh * kw`
//! inputs, on CUDA cores; on ndarray (`backend = "cpu"`) it is a direct multiply-add loop.
//! The Wan VAE's convolutions are large (96 to 384 channels, 3x3x3 kernels, frames of up to
//! 480x832 pixels): the CUDA kernel left the decode of 81x480x832 unfinished after 120 s on
//! an H200 (`bench/results/2026-11-30-NVIDIA-H200-encoders-configs.md`), and ndarray took
//! 194 s to decode 5x64x64. [`ConvImpl::Gemm`] writes the convolution as a product instead:
//! the input, made channels-last and zero-padded once, gives one strided slice per kernel
//! tap; the slices side by side are the patch matrix `[rows, kt * kh * kw * C]`, which is
//! multiplied by the kernel `[kt * kh * kw * C, out]` on the linear layers' matmul kernel
//! (`REEL_MATMUL`; cuBLAS on `cuda`, with TF32 for f32 as PyTorch's cuDNN convolutions use
//! by default). The patch matrix is built for at most [`PIECE_ELEMENTS`] values at a time
//! (a few output frames, or a band of rows of one frame), so its memory stays bounded
//! whatever the frame size. It reaches the product as a view of its rows
//! (`wan::rows::flatten_rows`): on CUDA its rows are pitched (a row of `kt * kh * kw * C`
//! values rounded up to 512 bytes unless that is a multiple already), and Burn's reshape
//! would copy it whole.

use std::sync::OnceLock;

use burn::tensor::module::conv3d;
use burn::tensor::ops::{ConvOptions, PadMode};
use burn::tensor::{backend::Backend, Slice, Tensor};

use crate::wan::matmul::{matmul, pin};
use crate::wan::rows::flatten_rows;

/// The environment variable that chooses [`ConvImpl`]: `gemm` or `burn`.
pub const VAE_CONV_ENV: &str = "REEL_VAE_CONV";

/// Most values of one piece's patch matrix (1 GiB in f32).
pub const PIECE_ELEMENTS: usize = 1 << 28;

/// Which implementation runs the VAE's convolutions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvImpl {
    /// Burn's `conv3d` (on Flex a tiled im2col product; on ndarray, and on CubeCL backends
    /// without `autotune`, a direct kernel).
    Burn,
    /// Patch matrices times the kernel on the linear layers' matmul kernel (module docs).
    Gemm,
    /// cuDNN's convolution on the plain `cuda` backend, as PyTorch runs `nn.Conv3d` (opt-in
    /// until a GPU session has timed it against `gemm`). Where cuDNN cannot run a call
    /// (another backend, no `libcudnn`, no engine), one line on stderr says why and
    /// [`Gemm`](Self::Gemm) runs it.
    Cudnn,
}

impl ConvImpl {
    /// `gemm`, `burn` or `cudnn`.
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim() {
            "gemm" => Some(Self::Gemm),
            "burn" => Some(Self::Burn),
            "cudnn" => Some(Self::Cudnn),
            _ => None,
        }
    }

    /// The name [`Self::parse`] takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Burn => "burn",
            Self::Gemm => "gemm",
            Self::Cudnn => "cudnn",
        }
    }

    /// The implementation on backend `B`: the one [`VAE_CONV_ENV`] names (read once; one line
    /// on stderr when it names none), else [`Burn`](Self::Burn) on Flex, whose convolution is
    /// already a tiled im2col product, and [`Gemm`](Self::Gemm) elsewhere.
    ///
    /// Chosen by measurement (2-core CPU, 2026-11-30, `reel bench --vae wan2.1 --video 5 64 64
    /// --steps 1 --warmup 0`): decode / encode took 30.0 / 17.1 s with `gemm` against 194.2 /
    /// 131.6 s with Burn's on ndarray, and 16.3 / 11.9 s against 5.6 / 3.9 s on Flex.
    pub fn of<B: Backend>() -> Self {
        static SET: OnceLock<Option<ConvImpl>> = OnceLock::new();
        let set = SET.get_or_init(|| {
            let v = std::env::var(VAE_CONV_ENV).ok()?;
            let parsed = Self::parse(&v);
            if parsed.is_none() {
                eprintln!(
                    "reel: {VAE_CONV_ENV}={v}: expected gemm, burn or cudnn; using the default"
                );
            }
            parsed
        });
        set.unwrap_or_else(|| {
            let flex = std::any::TypeId::of::<burn::backend::flex::FlexDevice>();
            if std::any::TypeId::of::<B::Device>() == flex {
                Self::Burn
            } else {
                Self::Gemm
            }
        })
    }
}

/// Zero padding of every frame: `[(top, bottom), (left, right)]`, in rows and columns.
pub type FramePad = [(usize, usize); 2];

/// The same zero padding `p` on every side of a frame.
pub fn even_pad(p: usize) -> FramePad {
    [(p, p); 2]
}

/// `x [B, C, T, H, W]` convolved with `weight [O, C, kt, kh, kw]` plus `bias [O]`, with
/// `stride` `(t, h, w)` and zero padding `pad` around every frame (time is padded by the
/// caller) `-> [B, O, T', H', W']`, on `how`.
pub fn conv3d_with<B: Backend>(
    x: Tensor<B, 5>,
    weight: Tensor<B, 5>,
    bias: Option<Tensor<B, 1>>,
    stride: [usize; 3],
    pad: FramePad,
    how: ConvImpl,
) -> Tensor<B, 5> {
    match how {
        ConvImpl::Burn => {
            let [(top, bottom), (left, right)] = pad;
            // Burn pads both sides alike; other padding is added to the input first.
            let (x, padding) = if top == bottom && left == right {
                (x, [0, top, left])
            } else {
                let zero = PadMode::Constant(0.0);
                (x.pad([(0, 0), (top, bottom), (left, right)], zero), [0; 3])
            };
            conv3d(
                x,
                weight,
                bias,
                ConvOptions::new(stride, padding, [1; 3], 1),
            )
        }
        ConvImpl::Gemm => conv3d_gemm(x, weight, bias, stride, pad, PIECE_ELEMENTS),
        ConvImpl::Cudnn => match on_cudnn(x.clone(), weight.clone(), stride, pad) {
            Some(y) => match bias {
                Some(b) => y + b.reshape([1, weight.dims()[0], 1, 1, 1]),
                None => y,
            },
            None => conv3d_gemm(x, weight, bias, stride, pad, PIECE_ELEMENTS),
        },
    }
}

/// The convolution (no bias) on cuDNN, or `None` after naming why not on stderr (each
/// distinct reason once).
fn on_cudnn<B: Backend>(
    x: Tensor<B, 5>,
    weight: Tensor<B, 5>,
    stride: [usize; 3],
    pad: FramePad,
) -> Option<Tensor<B, 5>> {
    #[cfg(feature = "cuda")]
    let result = crate::wan::fused_attention::cudnn::conv3d_on(x, weight, stride, pad)
        .map_err(|e| e.to_string());
    #[cfg(not(feature = "cuda"))]
    let result: Result<Tensor<B, 5>, String> = {
        let _ = (x, weight, stride, pad);
        Err("this build has no `cuda` feature".into())
    };
    static NOTED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    result
        .map_err(|why| {
            let mut noted = NOTED.lock().unwrap_or_else(|e| e.into_inner());
            if !noted.contains(&why) {
                eprintln!("reel: {VAE_CONV_ENV}=cudnn: {why}; the gemm convolution runs instead");
                noted.push(why);
            }
        })
        .ok()
}

/// Outputs of a convolution along one axis: `len` inputs plus `pad` zeros, kernel `k`,
/// stride `s`; `None` when there is none (the padded axis shorter than the kernel, or a zero
/// stride).
pub(crate) fn out_len(len: usize, pad: usize, k: usize, s: usize) -> Option<usize> {
    let padded = len + pad;
    (padded >= k && s > 0).then(|| (padded - k) / s + 1)
}

/// [`out_len`] of a convolution the VAE runs: its shape checks keep every axis at least a
/// kernel long.
fn vae_out_len(len: usize, pad: usize, k: usize, s: usize) -> usize {
    out_len(len, pad, k, s).unwrap_or_else(|| {
        panic!("a convolution of kernel {k}, stride {s} over {len} inputs padded by {pad}")
    })
}

/// The sizes of one convolution.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    batch: usize,
    channels: usize,
    kernel: [usize; 3],
    stride: [usize; 3],
    /// Output `(T', H', W')`.
    out: [usize; 3],
}

impl Geometry {
    /// Columns of the patch matrix: `kt * kh * kw * C`.
    fn columns(&self) -> usize {
        self.kernel.iter().product::<usize>() * self.channels
    }

    /// `(frames, rows)` of output per piece so that a piece's patch matrix holds at most
    /// `budget` values: whole frames while one fits, else bands of rows of one frame.
    fn piece(&self, budget: usize) -> (usize, usize) {
        let [t, h, w] = self.out;
        let row = self.batch * w * self.columns();
        let frame = row * h;
        if frame <= budget {
            ((budget / frame).clamp(1, t), h)
        } else {
            (1, (budget / row).clamp(1, h))
        }
    }
}

/// [`ConvImpl::Gemm`] with patch matrices of at most `budget` values.
fn conv3d_gemm<B: Backend>(
    x: Tensor<B, 5>,
    weight: Tensor<B, 5>,
    bias: Option<Tensor<B, 1>>,
    stride: [usize; 3],
    pad: FramePad,
    budget: usize,
) -> Tensor<B, 5> {
    let [batch, channels, t, h, w] = x.dims();
    let [o, _, kt, kh, kw] = weight.dims();
    let [(top, bottom), (left, right)] = pad;
    let g = Geometry {
        batch,
        channels,
        kernel: [kt, kh, kw],
        stride,
        out: [
            vae_out_len(t, 0, kt, stride[0]),
            vae_out_len(h, top + bottom, kh, stride[1]),
            vae_out_len(w, left + right, kw, stride[2]),
        ],
    };
    // Channels-last `[B, T, top + H + bottom, left + W + right, C]`; the kernel as
    // `[kt * kh * kw * C, O]`, rows in the order of the patch columns (tap-major, then
    // channel). With more than one tap the input is padded even by zero: the pad is a
    // channels-last copy, so every tap then reads whole channel rows, where the permuted view
    // of `x` would have each tap read across channels, `T * H * W` values apart.
    let mut xl = x.permute([0, 2, 3, 4, 1]);
    if kt * kh * kw > 1 || top + bottom + left + right > 0 {
        xl = xl.pad(
            [(top, bottom), (left, right), (0, 0)],
            PadMode::Constant(0.0),
        );
    }
    let wm = weight.permute([2, 3, 4, 1, 0]).reshape([g.columns(), o]);
    let bias = bias.map(|b| b.reshape([1, o]));
    let matmul_kernel = pin::<B>().forward;
    let (frames, rows) = g.piece(budget);
    let [t_out, h_out, _] = g.out;
    let mut slabs = Vec::new();
    for t0 in (0..t_out).step_by(frames) {
        let mut bands = Vec::new();
        for h0 in (0..h_out).step_by(rows) {
            let span = [t0..t_out.min(t0 + frames), h0..h_out.min(h0 + rows)];
            let cols = patches(&xl, &g, span);
            let [n, nt, nh, nw, _] = cols.dims();
            let mut y = matmul(flatten_rows(cols), wm.clone(), matmul_kernel);
            if let Some(b) = &bias {
                y = y + b.clone();
            }
            bands.push(y.reshape([n, nt, nh, nw, o]));
        }
        slabs.push(cat(bands, 2));
    }
    cat(slabs, 1).permute([0, 4, 1, 2, 3])
}

/// The patch matrix of output frames and rows `span` from the padded channels-last input
/// `xl`: `[B, t, h, W', kt * kh * kw * C]`.
fn patches<B: Backend>(
    xl: &Tensor<B, 5>,
    g: &Geometry,
    [ts, hs]: [std::ops::Range<usize>; 2],
) -> Tensor<B, 5> {
    let [kt, kh, kw] = g.kernel;
    let [st, sh, sw] = g.stride;
    let w_out = g.out[2];
    // Input positions `first + i * step` for the outputs `range` of a tap at `offset`.
    let along = |range: &std::ops::Range<usize>, offset: usize, step: usize| {
        let start = range.start * step + offset;
        let end = (range.end - 1) * step + offset + 1;
        Slice::new(start as isize, Some(end as isize), step as isize)
    };
    let mut taps = Vec::with_capacity(kt * kh * kw);
    for dt in 0..kt {
        for dh in 0..kh {
            for dw in 0..kw {
                taps.push(xl.clone().slice([
                    Slice::new(0, None, 1),
                    along(&ts, dt, st),
                    along(&hs, dh, sh),
                    along(&(0..w_out), dw, sw),
                    Slice::new(0, None, 1),
                ]));
            }
        }
    }
    cat(taps, 4)
}

/// `Tensor::cat`, without a copy for a single part.
fn cat<B: Backend>(mut parts: Vec<Tensor<B, 5>>, dim: usize) -> Tensor<B, 5> {
    if parts.len() == 1 {
        return parts.remove(0);
    }
    Tensor::cat(parts, dim)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::ElementConversion;
    use reel_core::rng::StreamRng;

    type TestBackend = burn::backend::NdArray;

    /// One convolution of random values on both implementations on backend `B`, with patch
    /// matrices of `budget` values: the largest difference relative to the largest output.
    pub(super) fn gemm_vs_burn<B: Backend>(
        x: [usize; 5],
        out: usize,
        kernel: [usize; 3],
        stride: [usize; 3],
        pad: FramePad,
        budget: usize,
    ) -> f32 {
        let seed = x.iter().sum::<usize>() * 31 + budget;
        against_burn::<B>((x, out, kernel, stride, pad, seed), |x, w, b| {
            conv3d_gemm(x, w, Some(b), stride, pad, budget)
        })
    }

    /// `run(input, weight, bias)` against Burn's convolution of random values (the case's last
    /// field seeds them) on backend `B`: the largest difference relative to the largest output.
    pub(super) fn against_burn<B: Backend>(
        (x, out, kernel, stride, pad, seed): Case,
        run: impl FnOnce(Tensor<B, 5>, Tensor<B, 5>, Tensor<B, 1>) -> Tensor<B, 5>,
    ) -> f32 {
        let dev = Default::default();
        let mut rng = StreamRng::from_seed(seed as u64);
        let [kt, kh, kw] = kernel;
        let fan_in = (x[1] * kt * kh * kw) as f64;
        let input: Tensor<B, 5> = rng.normal_tensor(x, &dev);
        let weight: Tensor<B, 5> = rng.normal_tensor([out, x[1], kt, kh, kw], &dev);
        let weight = weight.div_scalar(fan_in.sqrt());
        let bias = rng.normal_tensor([out], &dev);
        let want = conv3d_with(
            input.clone(),
            weight.clone(),
            Some(bias.clone()),
            stride,
            pad,
            ConvImpl::Burn,
        );
        let got = run(input, weight, bias);
        assert_eq!(got.dims(), want.dims());
        let scale: f32 = want.clone().abs().max().into_scalar().elem();
        let diff: f32 = (got - want).abs().max().into_scalar().elem();
        diff / scale.max(1e-12)
    }

    /// A convolution to check: input `[B, C, T, H, W]`, out channels, kernel, stride,
    /// padding of every frame and patch budget (or, for [`against_burn`], the seed).
    pub(super) type Case = ([usize; 5], usize, [usize; 3], [usize; 3], FramePad, usize);

    /// [`gemm_vs_burn`] on the CPU for every case, within float32 rounding.
    fn agree(cases: &[Case]) {
        for &(x, out, kernel, stride, padding, budget) in cases {
            let err = gemm_vs_burn::<TestBackend>(x, out, kernel, stride, padding, budget);
            let case =
                format!("x {x:?} o {out} k {kernel:?} s {stride:?} p {padding:?} b {budget}");
            assert!(err < 1e-5, "{case}: relative error {err}");
        }
    }

    #[test]
    fn gemm_equals_burns_convolution_for_the_vae_shapes() {
        // The causal 3x3x3 convolution (time already padded), a pointwise one, the temporal
        // resamplers (3x1x1, stride 1 or 2 in time) and the per-frame 3x3 convolutions (stride
        // 1 with padding, stride 2 without, and stride 2 after a zero row and column at the
        // bottom and right, as the downsamplers pad), on batches of 1 and 2 and odd sizes.
        let all = PIECE_ELEMENTS;
        agree(&[
            ([1, 3, 6, 7, 5], 4, [3, 3, 3], [1, 1, 1], even_pad(1), all),
            ([2, 5, 3, 4, 6], 3, [1, 1, 1], [1, 1, 1], even_pad(0), all),
            ([1, 4, 5, 3, 4], 8, [3, 1, 1], [1, 1, 1], even_pad(0), all),
            ([2, 4, 7, 3, 3], 4, [3, 1, 1], [2, 1, 1], even_pad(0), all),
            ([1, 6, 2, 9, 8], 5, [1, 3, 3], [1, 1, 1], even_pad(1), all),
            ([2, 3, 2, 9, 7], 3, [1, 3, 3], [1, 2, 2], even_pad(0), all),
            (
                [1, 6, 2, 8, 8],
                5,
                [1, 3, 3],
                [1, 2, 2],
                [(0, 1), (0, 1)],
                all,
            ),
            (
                [2, 3, 3, 9, 6],
                4,
                [1, 3, 3],
                [1, 2, 2],
                [(0, 1), (0, 1)],
                all,
            ),
            (
                [1, 2, 2, 5, 7],
                3,
                [1, 3, 3],
                [1, 1, 1],
                [(2, 0), (1, 3)],
                all,
            ),
        ]);
    }

    #[test]
    fn cudnn_off_the_cuda_backend_falls_back_to_the_gemm_convolution() {
        let case = (
            [1, 3, 2, 9, 7],
            4,
            [1, 3, 3],
            [1, 2, 2],
            [(0, 1), (0, 1)],
            5,
        );
        let err = against_burn::<TestBackend>(case, |x, w, b| {
            conv3d_with(x, w, Some(b), case.3, case.4, ConvImpl::Cudnn)
        });
        assert!(err < 1e-5, "relative error {err}");
    }

    #[test]
    fn pieces_of_frames_or_of_rows_give_the_same_convolution() {
        // Pieces of two output frames (a frame's patches: 4 * 4 rows of 27 * 2 values), bands
        // of 3 rows of one frame (the last band shorter), bands of one strided row, and a
        // budget below one row (a row at a time).
        let frame = 4 * 4 * 27 * 2;
        let [rows, row] = [3 * 5 * 54, 2 * 4 * 27];
        agree(&[
            (
                [1, 2, 8, 4, 4],
                3,
                [3, 3, 3],
                [1, 1, 1],
                even_pad(1),
                2 * frame,
            ),
            ([1, 2, 6, 8, 5], 3, [3, 3, 3], [1, 1, 1], even_pad(1), rows),
            ([2, 3, 2, 11, 9], 4, [1, 3, 3], [1, 2, 2], even_pad(0), row),
            ([1, 2, 3, 3, 3], 2, [3, 3, 3], [1, 1, 1], even_pad(1), 1),
        ]);
    }

    #[test]
    fn a_piece_is_whole_frames_while_one_fits_then_bands_of_rows() {
        let g = Geometry {
            batch: 1,
            channels: 2,
            kernel: [3, 3, 3],
            stride: [1; 3],
            out: [4, 5, 6],
        };
        let frame = 5 * 6 * 54;
        assert_eq!(g.piece(10 * frame), (4, 5));
        assert_eq!(g.piece(2 * frame + 1), (2, 5));
        assert_eq!(g.piece(frame), (1, 5));
        assert_eq!(g.piece(frame - 1), (1, 4));
        assert_eq!(g.piece(0), (1, 1));
    }

    #[test]
    fn names_parse_back_and_only_flex_defaults_to_burns_convolution() {
        for how in [ConvImpl::Burn, ConvImpl::Gemm, ConvImpl::Cudnn] {
            assert_eq!(ConvImpl::parse(how.name()), Some(how));
        }
        assert_eq!(ConvImpl::parse("direct"), None);
        if std::env::var(VAE_CONV_ENV).is_err() {
            assert_eq!(ConvImpl::of::<TestBackend>(), ConvImpl::Gemm);
            assert_eq!(ConvImpl::of::<burn::backend::Flex>(), ConvImpl::Burn);
            let autodiff = ConvImpl::of::<burn::backend::Autodiff<burn::backend::Flex>>();
            assert_eq!(autodiff, ConvImpl::Burn);
        }
    }
}

/// On the GPU: the gemm convolutions (cuBLAS with TF32 for f32, the `cuda` default) against
/// Burn's direct kernel, at a VAE layer's width.
#[cfg(all(test, feature = "cuda"))]
mod cuda {
    use super::tests::{against_burn, gemm_vs_burn};
    use super::*;

    type Cube = burn_cubecl::CubeBackend<cubecl::cuda::CudaRuntime, f32, i32, u8>;

    #[test]
    fn cuda_vae_conv_gemm_matches_burns_direct_kernel() {
        assert_eq!(ConvImpl::of::<Cube>(), ConvImpl::Gemm, "the cuda default");
        // The causal 3x3x3 convolution at 96 channels whole and in bands of 5 rows, and a
        // strided per-frame one; TF32 products against Burn's float32 kernel.
        let [all, bands] = [PIECE_ELEMENTS, 28 * 2592 * 5];
        let cases: [super::tests::Case; 3] = [
            ([1, 96, 6, 20, 28], 96, [3, 3, 3], [1; 3], even_pad(1), all),
            (
                [1, 96, 6, 20, 28],
                96,
                [3, 3, 3],
                [1; 3],
                even_pad(1),
                bands,
            ),
            (
                [2, 32, 3, 17, 15],
                64,
                [1, 3, 3],
                [1, 2, 2],
                [(0, 1), (0, 1)],
                all,
            ),
        ];
        for (x, out, kernel, stride, padding, budget) in cases {
            let err = gemm_vs_burn::<Cube>(x, out, kernel, stride, padding, budget);
            assert!(
                err <= 1e-2,
                "x {x:?} k {kernel:?} b {budget}: relative error {err}"
            );
        }
    }

    /// cuDNN's convolution (`REEL_VAE_CONV=cudnn`) against Burn's direct kernel: the causal
    /// 3x3x3 at 96 channels, a downsampler's 1x3x3 (stride 2, one zero row and column), the
    /// temporal 3x1x1 (stride 2) and a pointwise one, on cuDNN itself (not the fallback).
    #[test]
    fn cuda_vae_cudnn_conv_matches_burns_direct_kernel() {
        use crate::wan::fused_attention::cudnn::conv3d_on;
        let cases: [super::tests::Case; 4] = [
            ([1, 96, 6, 20, 28], 96, [3, 3, 3], [1; 3], even_pad(1), 0),
            (
                [2, 32, 3, 17, 15],
                64,
                [1, 3, 3],
                [1, 2, 2],
                [(0, 1), (0, 1)],
                0,
            ),
            ([1, 48, 5, 6, 10], 48, [3, 1, 1], [2, 1, 1], even_pad(0), 0),
            ([1, 40, 2, 9, 11], 24, [1, 1, 1], [1; 3], even_pad(0), 0),
        ];
        for (x, out, kernel, stride, pad, seed) in cases {
            let err = against_burn::<Cube>((x, out, kernel, stride, pad, seed), |x, w, b| {
                let y = conv3d_on(x, w, stride, pad).unwrap_or_else(|e| panic!("{e}"));
                y + b.reshape([1, out, 1, 1, 1])
            });
            assert!(err <= 1e-2, "x {x:?} k {kernel:?}: relative error {err}");
        }
    }
}
