//! Input embeddings: the patch embedding (Conv3d with stride = kernel, computed as
//! patchify + GEMM), its inverse for the output (unpatchify), and the timestep / text
//! condition embedder.

use burn::module::{Module, Param};
use burn::tensor::{activation, backend::Backend, Tensor, TensorData};

use super::init::{join, ParamInit};
use super::linear::Linear;

/// Split a video into non-overlapping patches, features in Conv3d-weight order.
///
/// `x [B, C, F, H, W] -> [B, N, C*pt*ph*pw]` with `N = f*h*w`, `(f, h, w) = (F/pt, H/ph,
/// W/pw)`, token index `(fi*h + hi)*w + wi` (f-major) and feature index
/// `((c*pt + ti)*ph + yi)*pw + xi`. Panics if a dimension is not divisible by its patch size.
pub fn patchify<B: Backend>(x: Tensor<B, 5>, patch: [usize; 3]) -> Tensor<B, 3> {
    let [b, c, f_in, h_in, w_in] = x.dims();
    let [pt, ph, pw] = patch;
    assert!(
        f_in % pt == 0 && h_in % ph == 0 && w_in % pw == 0,
        "video [F, H, W] = [{f_in}, {h_in}, {w_in}] is not divisible by patch_size {patch:?}"
    );
    let (f, h, w) = (f_in / pt, h_in / ph, w_in / pw);
    // Done in steps of at most 6 dimensions (some backends, e.g. ndarray, stop at 6):
    // [B·C, f, pt, h, ph, W] -> [B·C, f, h, pt, ph, W]
    let x = x
        .reshape([b * c, f, pt, h, ph, w_in])
        .permute([0, 1, 3, 2, 4, 5]);
    // [B·C·f·h, pt·ph, w, pw] -> [B·C·f·h, w, pt·ph, pw]: K = (pt, ph, pw)
    let x = x
        .reshape([b * c * f * h, pt * ph, w, pw])
        .permute([0, 2, 1, 3]);
    // [B, C, f, h, w, K] -> [B, f, h, w, C, K]
    x.reshape([b, c, f, h, w, pt * ph * pw])
        .permute([0, 2, 3, 4, 1, 5])
        .reshape([b, f * h * w, c * pt * ph * pw])
}

/// Inverse layout of the output head: `tokens [B, N, pt*ph*pw*C]` with features ordered
/// `(pt, ph, pw, C)` (C innermost, diffusers `reshape(B, f, h, w, pt, ph, pw, C)
/// .permute(0, 7, 1, 4, 2, 5, 3, 6)`) `-> [B, C, f*pt, h*ph, w*pw]`.
pub fn unpatchify<B: Backend>(
    tokens: Tensor<B, 3>,
    grid: [usize; 3],
    patch: [usize; 3],
    channels: usize,
) -> Tensor<B, 5> {
    let [b, n, feat] = tokens.dims();
    let [f, h, w] = grid;
    let [pt, ph, pw] = patch;
    assert_eq!(n, f * h * w, "token count {n} does not match grid {grid:?}");
    assert_eq!(
        feat,
        pt * ph * pw * channels,
        "feature width {feat} does not match patch {patch:?} x {channels} channels"
    );
    // Done in steps of at most 6 dimensions (some backends, e.g. ndarray, stop at 6):
    // [B, N, K, C] -> [B, C, N, K]
    let x = tokens
        .reshape([b, n, pt * ph * pw, channels])
        .permute([0, 3, 1, 2]);
    // [B·C·f, h, w, pt, ph, pw] -> [B·C·f, pt, h, ph, w, pw], i.e. (f, pt, h, ph, w, pw).
    x.reshape([b * channels * f, h, w, pt, ph, pw])
        .permute([0, 3, 1, 4, 2, 5])
        .reshape([b, channels, f * pt, h * ph, w * pw])
}

/// diffusers `patch_embedding`: `Conv3d(in_channels, dim, kernel = stride = patch_size)`.
#[derive(Module, Debug)]
pub struct PatchEmbedding<B: Backend> {
    /// Conv weight `[dim, C, pt, ph, pw]`.
    pub weight: Param<Tensor<B, 5>>,
    /// Conv bias `[dim]`.
    pub bias: Param<Tensor<B, 1>>,
}

impl<B: Backend> PatchEmbedding<B> {
    /// Weight `N(0,1)/sqrt(C*pt*ph*pw)`, zero bias, at `path`.
    pub fn init(init: &ParamInit<B>, path: &str, c: usize, dim: usize, patch: [usize; 3]) -> Self {
        Self {
            weight: init.weight(
                &join(path, "weight"),
                [dim, c, patch[0], patch[1], patch[2]],
            ),
            bias: init.zeros(&join(path, "bias"), [dim]),
        }
    }

    /// `x [B, C, F, H, W] -> tokens [B, N, dim]` (token order f, then h, then w), i.e.
    /// `conv(x).flatten(2).transpose(1, 2)`.
    pub fn forward(&self, x: Tensor<B, 5>) -> Tensor<B, 3> {
        let w = self.weight.val();
        let [dim, c, pt, ph, pw] = w.dims();
        let patches = patchify(x, [pt, ph, pw]);
        let [b, n, k] = patches.dims();
        let w = w.reshape([dim, c * pt * ph * pw]);
        let y = patches.reshape([b * n, k]).matmul(w.transpose()) + self.bias.val().unsqueeze();
        y.reshape([b, n, dim])
    }
}

/// Tokens `[B, N, dim]` back to the Conv3d output layout `[B, dim, f, h, w]`.
pub fn tokens_to_grid<B: Backend>(tokens: Tensor<B, 3>, grid: [usize; 3]) -> Tensor<B, 5> {
    let [b, _, dim] = tokens.dims();
    tokens
        .reshape([b, grid[0], grid[1], grid[2], dim])
        .permute([0, 4, 1, 2, 3])
}

/// Frequencies of diffusers' `get_timestep_embedding(..., flip_sin_to_cos=True,
/// downscale_freq_shift=0)`, computed with the same float32 steps as PyTorch:
/// `exp(float32(-ln(10000) * i) / half)` for `i < half = dim / 2`.
pub fn timestep_frequencies(dim: usize) -> Vec<f32> {
    let half = dim / 2;
    let neg_log = -(10000f64.ln()) as f32;
    (0..half)
        .map(|i| {
            let exponent = (neg_log * i as f32) / half as f32;
            // exp evaluated in f64 and rounded: the correctly rounded float32 result.
            (exponent as f64).exp() as f32
        })
        .collect()
}

/// Sinusoidal timestep embedding `t [B] -> [B, dim]`, ordered `[cos | sin]` (zero-padded
/// when `dim` is odd).
pub fn timestep_sinusoid<B: Backend>(t: Tensor<B, 1>, dim: usize) -> Tensor<B, 2> {
    let [b] = t.dims();
    let freqs = timestep_frequencies(dim);
    let half = freqs.len();
    let freqs = Tensor::<B, 2>::from_data(TensorData::new(freqs, [1, half]), &t.device());
    let args = t.unsqueeze_dim::<2>(1) * freqs;
    let mut parts = vec![args.clone().cos(), args.sin()];
    if dim % 2 == 1 {
        parts.push(Tensor::zeros([b, 1], &parts[0].device()));
    }
    Tensor::cat(parts, 1)
}

/// diffusers `TimestepEmbedding`: `linear_1 -> SiLU -> linear_2`.
#[derive(Module, Debug)]
pub struct TimestepEmbedding<B: Backend> {
    /// `freq_dim -> dim`.
    pub linear_1: Linear<B>,
    /// `dim -> dim`.
    pub linear_2: Linear<B>,
}

impl<B: Backend> TimestepEmbedding<B> {
    /// `[B, freq_dim] -> [B, dim]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.linear_2
            .forward(activation::silu(self.linear_1.forward(x)))
    }
}

/// diffusers `PixArtAlphaTextProjection(act_fn="gelu_tanh")`: `linear_1 -> GELU(tanh) ->
/// linear_2`.
#[derive(Module, Debug)]
pub struct TextProjection<B: Backend> {
    /// `text_dim -> dim`.
    pub linear_1: Linear<B>,
    /// `dim -> dim`.
    pub linear_2: Linear<B>,
}

impl<B: Backend> TextProjection<B> {
    /// `[B, L, text_dim] -> [B, L, dim]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.linear_2.forward_gelu(self.linear_1.forward(x))
    }
}

/// Outputs of [`ConditionEmbedder::forward`].
#[derive(Debug, Clone)]
pub struct Conditions<B: Backend> {
    /// Sinusoidal timestep embedding `[B, freq_dim]`.
    pub timestep_sinusoid: Tensor<B, 2>,
    /// Timestep embedding `[B, dim]` (used by the output head).
    pub temb: Tensor<B, 2>,
    /// Block modulation `time_proj(SiLU(temb))` `[B, 6*dim]`.
    pub timestep_proj: Tensor<B, 2>,
    /// Projected text `[B, L, dim]`.
    pub text_embeds: Tensor<B, 3>,
}

/// diffusers `WanTimeTextImageEmbedding` (text-to-video part).
#[derive(Module, Debug)]
pub struct ConditionEmbedder<B: Backend> {
    /// Timestep MLP.
    pub time_embedder: TimestepEmbedding<B>,
    /// `dim -> 6*dim` block modulation projection.
    pub time_proj: Linear<B>,
    /// Text projection.
    pub text_embedder: TextProjection<B>,
    /// Width of the sinusoidal timestep embedding.
    pub freq_dim: usize,
}

impl<B: Backend> ConditionEmbedder<B> {
    /// Parameters at `path` (`path.time_embedder.linear_1`, ...).
    pub fn init(
        init: &ParamInit<B>,
        path: &str,
        dim: usize,
        freq_dim: usize,
        text_dim: usize,
    ) -> Self {
        let te = join(path, "time_embedder");
        let tx = join(path, "text_embedder");
        Self {
            time_embedder: TimestepEmbedding {
                linear_1: Linear::init(init, &join(&te, "linear_1"), freq_dim, dim, true),
                linear_2: Linear::init(init, &join(&te, "linear_2"), dim, dim, true),
            },
            time_proj: Linear::init(init, &join(path, "time_proj"), dim, 6 * dim, true),
            text_embedder: TextProjection {
                linear_1: Linear::init(init, &join(&tx, "linear_1"), text_dim, dim, true),
                linear_2: Linear::init(init, &join(&tx, "linear_2"), dim, dim, true),
            },
            freq_dim,
        }
    }

    /// `timestep [B]` (float, fractional allowed), `encoder_hidden_states [B, L, text_dim]`.
    pub fn forward(
        &self,
        timestep: Tensor<B, 1>,
        encoder_hidden_states: Tensor<B, 3>,
    ) -> Conditions<B> {
        let timestep_sinusoid = timestep_sinusoid(timestep, self.freq_dim);
        let temb = self.time_embedder.forward(timestep_sinusoid.clone());
        let timestep_proj = self.time_proj.forward(activation::silu(temb.clone()));
        let text_embeds = self.text_embedder.forward(encoder_hidden_states);
        Conditions {
            timestep_sinusoid,
            temb,
            timestep_proj,
            text_embeds,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{module::conv3d, ops::ConvOptions};

    type B = burn::backend::Flex;

    #[test]
    fn patch_embedding_equals_strided_conv3d() {
        let dev = Default::default();
        let init = ParamInit::<B>::new(3, &dev);
        let pe = PatchEmbedding::init(&init, "p", 3, 5, [2, 2, 3]);
        let pe = PatchEmbedding {
            bias: init.param(
                "p.bias",
                [5],
                super::super::init::InitKind::Normal { std: 1.0 },
            ),
            ..pe
        };
        let x: Tensor<B, 5> =
            reel_core::rng::StreamRng::from_seed(2).normal_tensor([2, 3, 4, 6, 9], &dev);
        let tokens = pe.forward(x.clone());
        let conv = conv3d(
            x,
            pe.weight.val(),
            Some(pe.bias.val()),
            ConvOptions::new([2, 2, 3], [0, 0, 0], [1, 1, 1], 1),
        );
        let grid = tokens_to_grid(tokens, [2, 3, 3]);
        assert_eq!(grid.dims(), conv.dims());
        let err = (grid - conv).abs().max().into_scalar();
        assert!(err < 1e-5, "{err}");
    }

    #[test]
    fn unpatchify_inverts_patchify() {
        let dev = Default::default();
        let (c, patch) = (3, [2, 3, 2]);
        let x: Tensor<B, 5> =
            reel_core::rng::StreamRng::from_seed(3).normal_tensor([2, c, 4, 6, 8], &dev);
        // patchify gives (C, pt, ph, pw) features; the head expects (pt, ph, pw, C).
        let p = patchify(x.clone(), patch);
        let [b, n, _] = p.dims();
        let p = p
            .reshape([b, n, c, 12])
            .swap_dims(2, 3)
            .reshape([b, n, 12 * c]);
        let y = unpatchify(p, [2, 2, 4], patch, c);
        assert_eq!(
            y.into_data().to_vec::<f32>().unwrap(),
            x.into_data().to_vec::<f32>().unwrap()
        );
    }

    #[test]
    fn sinusoid_is_cos_then_sin() {
        let dev = Default::default();
        let t = Tensor::<B, 1>::from_data(TensorData::new(vec![0.0f32, 2.0], [2]), &dev);
        let e = timestep_sinusoid(t, 7).into_data().to_vec::<f32>().unwrap();
        assert_eq!(&e[..7], &[1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
        assert!((e[7] - 2.0f32.cos()).abs() < 1e-6);
        assert!((e[10] - 2.0f32.sin()).abs() < 1e-6);
        assert_eq!(e[13], 0.0);
    }
}
