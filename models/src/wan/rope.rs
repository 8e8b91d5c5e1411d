//! 3-axis rotary position embedding (diffusers `WanRotaryPosEmbed`).
//!
//! A head's channels are split `t | h | w` (see [`WanConfig::rope_split`]); each axis uses
//! its own frequencies `10000^(-2j / axis_dim)` and the token's integer grid position on that
//! axis. Angles are computed in f64 on the host, cos/sin stored as f32, and channels rotate
//! in interleaved pairs `(x[2j], x[2j+1])`.
//!
//! [`RopeTables::apply`] is one autodiff operation whose backward is the rotation back, one
//! kernel each way on the plain CubeCL backends (`block_kernels::elementwise`).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{unary, Backward, Ops, OpsKind};
use burn::backend::Autodiff;
use burn::tensor::{backend::Backend, DType, Tensor, TensorData};
use reel_core::host::is_host;

use super::block_kernels::elementwise;
use super::custom_op::{dispatch, first_input, next_input, output, tensor, CustomBackward};
use super::reshape::reshape;

use super::config::WanConfig;

/// RoPE base.
pub const ROPE_THETA: f64 = 10000.0;

/// cos / sin tables of one video grid, `[N, head_dim]` each, repeat-interleaved (channels
/// `2j` and `2j+1` share an angle), as `model.rope(x)` returns them in diffusers.
#[derive(Debug, Clone)]
pub struct RopeTables<B: Backend> {
    /// `cos(angle)` `[N, head_dim]`.
    pub cos: Tensor<B, 2>,
    /// `sin(angle)` `[N, head_dim]`.
    pub sin: Tensor<B, 2>,
    /// The pair swap of [`Self::rotate_swapped`], `[k, k]` for a block of `k` channels (`k`
    /// divides `head_dim`): `(x · swap)[2j] = −x[2j+1]`, `(x · swap)[2j+1] = x[2j]`.
    swap: Tensor<B, 2>,
}

/// Host tables `(cos, sin)`, each `N * head_dim` row-major, for a post-patch `grid = [f, h,
/// w]`. Panics if a grid extent exceeds `max_seq_len` (the diffusers table length).
pub fn rope_host_tables(
    grid: [usize; 3],
    head_dim: usize,
    split: [usize; 3],
    max_seq_len: usize,
) -> (Vec<f32>, Vec<f32>) {
    assert!(
        grid.iter().all(|&g| g <= max_seq_len),
        "post-patch grid {grid:?} exceeds rope_max_seq_len = {max_seq_len}"
    );
    assert_eq!(
        split.iter().sum::<usize>(),
        head_dim,
        "RoPE split {split:?} != head_dim"
    );
    // Per axis, a table [extent, axis_dim] of (cos, sin); angle = pos * 10000^(-2j/axis_dim)
    // in f64, pairs (2j, 2j+1) share one angle.
    let axis_tables: Vec<(Vec<f32>, Vec<f32>)> = split
        .iter()
        .zip(grid)
        .map(|(&d, extent)| {
            let inv: Vec<f64> = (0..d)
                .map(|c| 1.0 / ROPE_THETA.powf(2.0 * (c / 2) as f64 / d as f64))
                .collect();
            let mut cos = Vec::with_capacity(extent * d);
            let mut sin = Vec::with_capacity(extent * d);
            for pos in 0..extent {
                for &f in &inv {
                    let angle = pos as f64 * f;
                    cos.push(angle.cos() as f32);
                    sin.push(angle.sin() as f32);
                }
            }
            (cos, sin)
        })
        .collect();
    let n = grid.iter().product::<usize>();
    let mut cos = Vec::with_capacity(n * head_dim);
    let mut sin = Vec::with_capacity(n * head_dim);
    for fi in 0..grid[0] {
        for hi in 0..grid[1] {
            for wi in 0..grid[2] {
                for (axis, pos) in [fi, hi, wi].into_iter().enumerate() {
                    let d = split[axis];
                    let (c, s) = &axis_tables[axis];
                    cos.extend_from_slice(&c[pos * d..(pos + 1) * d]);
                    sin.extend_from_slice(&s[pos * d..(pos + 1) * d]);
                }
            }
        }
    }
    (cos, sin)
}

/// The block size of [`RopeTables`]' pair swap for `head_dim`: the largest of 16, 8, 4 and
/// 2 that divides it (`head_dim` is even). A larger block is fewer, larger products.
fn swap_block(head_dim: usize) -> usize {
    [16, 8, 4, 2]
        .into_iter()
        .find(|&k| head_dim.is_multiple_of(k))
        .unwrap_or_else(|| panic!("RoPE head_dim {head_dim} is odd"))
}

/// The `[k, k]` pair swap: column `2j` holds −1 at row `2j+1`, column `2j+1` holds 1 at row
/// `2j`, so a row `x` times it is `(−x[1], x[0], −x[3], x[2], ...)`.
fn pair_swap(k: usize) -> TensorData {
    let mut m = vec![0f32; k * k];
    for j in (0..k).step_by(2) {
        m[(j + 1) * k + j] = -1.0;
        m[j * k + j + 1] = 1.0;
    }
    TensorData::new(m, [k, k])
}

impl<B: Backend> RopeTables<B> {
    /// Tables for a post-patch `grid = [f, h, w]` of a model with config `cfg`.
    pub fn new(cfg: &WanConfig, grid: [usize; 3], device: &B::Device) -> Self {
        let s = cfg.rope_split();
        let hd = cfg.attention_head_dim;
        let (cos, sin) = rope_host_tables(grid, hd, [s.t, s.h, s.w], cfg.rope_max_seq_len);
        let n = grid.iter().product::<usize>();
        Self {
            cos: Tensor::from_data(TensorData::new(cos, [n, hd]), device),
            sin: Tensor::from_data(TensorData::new(sin, [n, hd]), device),
            swap: Tensor::from_data(pair_swap(swap_block(hd)), device),
        }
    }

    /// Panics unless the tables fit `x [B, S, H, D]` (`S` = the grid's `N` tokens, `D` =
    /// `head_dim`).
    pub(crate) fn check(&self, [_, s, _, d]: [usize; 4]) {
        let [n, hd] = self.cos.dims();
        assert_eq!(
            (n, hd),
            (s, d),
            "RoPE tables [{n}, {hd}] do not fit x [.., {s}, .., {d}]"
        );
    }

    /// Rotate `x [B, S, H, D]` (S = N tokens of the grid) -> `[B, S, H, D]` in `out`,
    /// computed in float32: for each pair `(x1, x2) = (x[2j], x[2j+1])`, `out[2j] = x1 cos −
    /// x2 sin`, `out[2j+1] = x1 sin + x2 cos`.
    ///
    /// One operation with its own backward (the rotation back) on Reel's autodiff backends,
    /// which keeps nothing of `x`; on the plain CubeCL backends the forward and the gradient
    /// are one kernel each (`block_kernels::elementwise`), elsewhere the tensor operations of
    /// `rotate_ops`.
    pub fn apply(&self, x: Tensor<B, 4>, out: DType) -> Tensor<B, 4> {
        dispatch(Rope {
            x,
            tables: self.clone(),
            out,
        })
    }

    /// The rotation of [`Self::apply`] in Burn tensor operations, in `x [B, S, H, D]`'s
    /// dtype; with `inverse`, the rotation back: [`Self::rotate_swapped`] on Reel's CPU
    /// backends, [`Self::rotate_plain`] elsewhere (the same float32 values).
    pub(crate) fn rotate_ops(&self, x: Tensor<B, 4>, inverse: bool) -> Tensor<B, 4> {
        match is_host::<B>() {
            true => self.rotate_swapped(x, inverse),
            false => self.rotate_plain(x, inverse),
        }
    }

    /// The rotation of [`Self::apply`] pair by pair in Burn tensor operations, in `x [B, S,
    /// H, D]`'s dtype; with `inverse`, the rotation back (`sin` negated). The reference
    /// formulation.
    pub fn rotate_plain(&self, x: Tensor<B, 4>, inverse: bool) -> Tensor<B, 4> {
        self.check(x.dims());
        let [b, s, h, d] = x.dims();
        let half = d / 2;
        let pairs = |t: &Tensor<B, 2>| t.clone().reshape([1, s, 1, half, 2]).narrow(4, 0, 1);
        let cos = pairs(&self.cos);
        let sin = match inverse {
            true => pairs(&self.sin).neg(),
            false => pairs(&self.sin),
        };
        let x = x.reshape([b, s, h, half, 2]);
        let x1 = x.clone().narrow(4, 0, 1);
        let x2 = x.narrow(4, 1, 1);
        let o1 = x1.clone() * cos.clone() - x2.clone() * sin.clone();
        let o2 = x1 * sin + x2 * cos;
        Tensor::cat(vec![o1, o2], 4).reshape([b, s, h, d])
    }

    /// [`Self::rotate_plain`] without slicing the pairs apart, for the CPU backends, where a
    /// slice of a last axis of length 2 is a strided copy one value at a time (it made the
    /// rotation four times slower on ndarray and fifteen times on Flex; docs/performance.md,
    /// "RoPE without slices").
    ///
    /// Computed as `x ⊙ cos + (x · swap) ⊙ sin` on rows of `S·H·D` values, `x · swap` being
    /// a matrix product with the constant pair swap. Every value of that product is one `±x`
    /// times 1 plus zeros, so the result is the pairwise formula's float32 value where the
    /// product is exact, as on the CPU; CubeCL's rounds float32 operands to TF32 on CUDA.
    fn rotate_swapped(&self, x: Tensor<B, 4>, inverse: bool) -> Tensor<B, 4> {
        self.check(x.dims());
        let [b, s, h, d] = x.dims();
        let k = self.swap.dims()[0];
        let row = |t: &Tensor<B, 2>| {
            t.clone()
                .reshape([1, s, 1, d])
                .expand([1, s, h, d])
                .reshape([1, s * h * d])
        };
        let swap = match inverse {
            true => self.swap.clone().neg(),
            false => self.swap.clone(),
        };
        let swapped = reshape(x.clone(), [b * s * h * d / k, k]).matmul(swap);
        let swapped = reshape(swapped, [b, s * h * d]);
        let y = reshape(x, [b, s * h * d]) * row(&self.cos) + swapped * row(&self.sin);
        reshape(y, [b, s, h, d])
    }

    /// The tables as tensors of the backend inside `Autodiff<I>` (`B` being that backend).
    fn inner<I: Backend>(self) -> RopeTables<I> {
        RopeTables {
            cos: next_input::<B, I, 2>(self.cos).inner(),
            sin: next_input::<B, I, 2>(self.sin).inner(),
            swap: next_input::<B, I, 2>(self.swap).inner(),
        }
    }
}

/// [`RopeTables::apply`]'s inputs, for [`dispatch`].
struct Rope<B: Backend> {
    x: Tensor<B, 4>,
    tables: RopeTables<B>,
    out: DType,
}

impl<B: Backend> CustomBackward<B> for Rope<B> {
    type Output = Tensor<B, 4>;

    fn on_autodiff<I: Backend>(self) -> Result<Tensor<B, 4>, Self> {
        let Self { x, tables, out } = self;
        let x = match first_input::<B, I, 4>(x) {
            Ok(x) => x,
            Err(x) => return Err(Self { x, tables, out }),
        };
        Ok(output(autodiff_rope(x, tables.inner::<I>(), out)))
    }

    fn otherwise(self) -> Tensor<B, 4> {
        elementwise::rope(self.x, &self.tables, self.out, false)
    }
}

/// The backward of [`RopeTables::apply`]: the output gradient rotated back. Its state is the
/// tables and the input's dtype.
#[derive(Debug)]
struct RopeBackward;

impl<B: Backend> Backward<B, 1> for RopeBackward {
    type State = (RopeTables<B>, DType);

    fn backward(
        self,
        ops: Ops<Self::State, 1>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let (tables, x_dtype) = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            elementwise::rope(tensor::<B, 4>(grad), &tables, x_dtype, true)
                .into_primitive()
                .tensor()
        });
    }
}

/// [`RopeTables::apply`] as one autodiff operation on `Autodiff<B, C>`, with `tables` on `B`.
pub(crate) fn autodiff_rope<B: Backend, C: CheckpointStrategy>(
    x: Tensor<Autodiff<B, C>, 4>,
    tables: RopeTables<B>,
    out: DType,
) -> Tensor<Autodiff<B, C>, 4> {
    let x_dtype = x.dtype();
    let x = x.into_primitive().tensor();
    let y = elementwise::rope(tensor::<B, 4>(x.primitive), &tables, out, false)
        .into_primitive()
        .tensor();
    let y = match RopeBackward
        .prepare::<C>([x.node])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish((tables, x_dtype), y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    tensor(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    type B = burn::backend::Flex;

    #[test]
    fn tables_follow_t_h_w_blocks_and_interleave() {
        // head_dim 16 -> split (8, 4, 4); token (f=1, h=2, w=3) of a [2, 3, 4] grid.
        let (cos, _sin) = rope_host_tables([2, 3, 4], 16, [8, 4, 4], 32);
        let tok = (3 + 2) * 4 + 3;
        let row = &cos[tok * 16..tok * 16 + 16];
        let expect = |pos: f64, d: usize, c: usize| {
            (pos / 10000f64.powf(2.0 * (c / 2) as f64 / d as f64)).cos() as f32
        };
        for (c, v) in row[..8].iter().enumerate() {
            assert_eq!(*v, expect(1.0, 8, c));
        }
        for c in 0..4 {
            assert_eq!(row[8 + c], expect(2.0, 4, c));
            assert_eq!(row[12 + c], expect(3.0, 4, c));
        }
        assert_eq!(row[0], row[1]);
    }

    #[test]
    fn apply_rotates_interleaved_pairs() {
        let dev = Default::default();
        let cfg = WanConfig::preset("wan-tiny").unwrap();
        let rope = RopeTables::<B>::new(&cfg, [1, 1, 2], &dev);
        let vals: Vec<f32> = (0..2 * 16).map(|i| i as f32 * 0.1).collect();
        let x = Tensor::<B, 4>::from_data(TensorData::new(vals.clone(), [1, 2, 1, 16]), &dev);
        let y = rope
            .apply(x, DType::F32)
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        let cos = rope.cos.into_data().to_vec::<f32>().unwrap();
        let sin = rope.sin.into_data().to_vec::<f32>().unwrap();
        for i in 0..16 {
            let j = i / 2 * 2;
            let (x1, x2) = (vals[j], vals[j + 1]);
            let want = if i % 2 == 0 {
                x1 * cos[i] - x2 * sin[i]
            } else {
                x1 * sin[i] + x2 * cos[i]
            };
            // token 0 (all positions zero) is the identity
            assert_eq!(y[i], want);
        }
        // token 1 (w = 1) rotates only the last 4 channels
        for i in 16..28 {
            assert_eq!(y[i], vals[i]);
        }
        assert_ne!(y[28], vals[28]);
    }

    #[test]
    fn the_swap_product_equals_the_pairwise_rotation_for_every_block_size() {
        let dev = Default::default();
        assert!(is_host::<burn::backend::NdArray>() && is_host::<B>());
        assert!(!is_host::<burn::backend::Autodiff<B>>());
        // head_dim 6, 12, 24, 48: swap blocks of 2, 4, 8 and 16 channels.
        for (hd, block) in [(6, 2), (12, 4), (24, 8), (48, 16)] {
            let mut cfg = WanConfig::preset("wan-tiny").unwrap();
            cfg.attention_head_dim = hd;
            let grid = [2, 2, 3];
            let tables = RopeTables::<B>::new(&cfg, grid, &dev);
            assert_eq!(tables.swap.dims(), [block, block]);
            let (b, n, h) = (2, 12, 3);
            let vals: Vec<f32> = (0..b * n * h * hd)
                .map(|i| (i as f32 * 0.61 + 0.3).sin() * 3.0)
                .collect();
            let x = Tensor::<B, 4>::from_data(TensorData::new(vals.clone(), [b, n, h, hd]), &dev);
            let cos = tables.cos.clone().into_data().to_vec::<f32>().unwrap();
            let sin = tables.sin.clone().into_data().to_vec::<f32>().unwrap();
            for inverse in [false, true] {
                let y = tables.rotate_swapped(x.clone(), inverse);
                let y = y.into_data().to_vec::<f32>().unwrap();
                for (i, &got) in y.iter().enumerate() {
                    let (c, t) = (i % hd, i / (h * hd) % n);
                    let (co, si) = (cos[t * hd + c], sin[t * hd + c]);
                    let si = if inverse { -si } else { si };
                    let j = i - c % 2;
                    let (x1, x2) = (vals[j], vals[j + 1]);
                    let want = match c % 2 {
                        0 => x1 * co - x2 * si,
                        _ => x1 * si + x2 * co,
                    };
                    assert_eq!(got, want, "head_dim {hd}, inverse {inverse}, value {i}");
                }
            }
        }
    }

    #[test]
    fn the_operation_matches_the_plain_rotation_and_its_gradient() {
        let _turn = reel_core::parallel::autodiff_turn();
        type Ad = burn::backend::Autodiff<B>;
        let dev = Default::default();
        let cfg = WanConfig::preset("wan-tiny").unwrap();
        let rope = RopeTables::<Ad>::new(&cfg, [2, 2, 3], &dev);
        let hd = cfg.attention_head_dim;
        let n = 2 * 12 * 3 * hd;
        let vals = |phase: f32| (0..n).map(|i| (i as f32 * 0.37 + phase).sin()).collect();
        let data = |phase| TensorData::new::<f32, _>(vals(phase), [2, 12, 3, hd]);
        let w = Tensor::<Ad, 4>::from_data(data(1.3), &dev);
        let run = |f: &dyn Fn(Tensor<Ad, 4>) -> Tensor<Ad, 4>| {
            let x = Tensor::<Ad, 4>::from_data(data(0.2), &dev).require_grad();
            let y = f(x.clone());
            let grads = (y.clone() * w.clone()).sum().backward();
            let g = x.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap();
            (y.into_data().to_vec::<f32>().unwrap(), g)
        };
        let (y, g) = run(&|x| rope.apply(x, DType::F32));
        let (y_ref, g_ref) = run(&|x| rope.rotate_plain(x, false));
        assert_eq!(y, y_ref, "the same float32 rotation");
        for (a, b) in g.iter().zip(&g_ref) {
            assert!((a - b).abs() <= 1e-6, "{a} vs {b}");
        }
        // bf16 out: the float32 rotation rounded once.
        let x = Tensor::<B, 4>::from_data(data(0.2), &dev);
        let tables = RopeTables::<B>::new(&cfg, [2, 2, 3], &dev);
        let y16 = tables.apply(x.clone(), DType::BF16);
        assert_eq!(y16.dtype(), DType::BF16);
        let want = tables.rotate_plain(x, false).cast(DType::BF16);
        assert_eq!(
            y16.into_data().convert::<f32>().to_vec::<f32>().unwrap(),
            want.into_data().convert::<f32>().to_vec::<f32>().unwrap()
        );
    }
}
