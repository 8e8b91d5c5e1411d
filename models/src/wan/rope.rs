//! 3-axis rotary position embedding (diffusers `WanRotaryPosEmbed`).
//!
//! A head's channels are split `t | h | w` (see [`WanConfig::rope_split`]); each axis uses
//! its own frequencies `10000^(-2j / axis_dim)` and the token's integer grid position on that
//! axis. Angles are computed in f64 on the host, cos/sin stored as f32, and channels rotate
//! in interleaved pairs `(x[2j], x[2j+1])`.

use burn::tensor::{backend::Backend, Tensor, TensorData};

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
    /// `cos` of each channel pair, `[1, N, 1, head_dim/2, 1]` (broadcast shape for `apply`).
    cos_pair: Tensor<B, 5>,
    /// `sin` of each channel pair, `[1, N, 1, head_dim/2, 1]`.
    sin_pair: Tensor<B, 5>,
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

impl<B: Backend> RopeTables<B> {
    /// Tables for a post-patch `grid = [f, h, w]` of a model with config `cfg`.
    pub fn new(cfg: &WanConfig, grid: [usize; 3], device: &B::Device) -> Self {
        let s = cfg.rope_split();
        let hd = cfg.attention_head_dim;
        let (cos, sin) = rope_host_tables(grid, hd, [s.t, s.h, s.w], cfg.rope_max_seq_len);
        let n = grid.iter().product::<usize>();
        let pairs = |t: &[f32]| {
            let even: Vec<f32> = t.iter().step_by(2).copied().collect();
            Tensor::from_data(TensorData::new(even, [1, n, 1, hd / 2, 1]), device)
        };
        Self {
            cos_pair: pairs(&cos),
            sin_pair: pairs(&sin),
            cos: Tensor::from_data(TensorData::new(cos, [n, hd]), device),
            sin: Tensor::from_data(TensorData::new(sin, [n, hd]), device),
        }
    }

    /// Rotate `x [B, S, H, D]` (S = N tokens of the grid): for each pair `(x1, x2) =
    /// (x[2j], x[2j+1])`, `out[2j] = x1 cos - x2 sin`, `out[2j+1] = x1 sin + x2 cos`.
    pub fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let [b, s, h, d] = x.dims();
        let half = d / 2;
        let [n, hd] = self.cos.dims();
        assert_eq!(
            (n, hd),
            (s, d),
            "RoPE tables [{n}, {hd}] do not fit x [.., {s}, .., {d}]"
        );
        let (cos, sin) = (self.cos_pair.clone(), self.sin_pair.clone());
        let x = x.reshape([b, s, h, half, 2]);
        let x1 = x.clone().narrow(4, 0, 1);
        let x2 = x.narrow(4, 1, 1);
        let o1 = x1.clone() * cos.clone() - x2.clone() * sin.clone();
        let o2 = x1 * sin + x2 * cos;
        Tensor::cat(vec![o1, o2], 4).reshape([b, s, h, d])
    }
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
        let y = rope.apply(x).into_data().to_vec::<f32>().unwrap();
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
}
