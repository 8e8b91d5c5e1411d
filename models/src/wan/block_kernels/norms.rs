//! The block's norms over rows, forward and backward, and the column sums of a bias's
//! gradient ([`sum_rows`]).
//!
//! Written with tensor operations, a modulated LayerNorm is about ten element-wise kernels and
//! two row reductions forward, and about fifteen and four backward, each a pass over the
//! activations; Burn's reductions without autotuning run one unit per output (the H100
//! profile of 2026-11-27: 18 % of a step in reductions, 16 % in multiplies and casts). The
//! kernels do the forward in one pass per row, the input gradient in one, and the scale and
//! shift gradients in one pass over chunks of rows plus a small sum of the chunks.
//!
//! Both paths take the norm in grouped form: `x [G, P, dim]` of any float dtype, whose row
//! `(g, p)` is scaled (and shifted) by row `g` of `scale` (and `shift`) `[G, 1, dim]`, float32.
//! A LayerNorm has a shift (its rows are centred); an RMSNorm has none. The statistics are
//! float32 `[G, P, 1]`. All arithmetic is float32. [`Grouping`] maps a norm over the last
//! axis of a tensor of any rank, with broadcast operands, onto that form.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};

use crate::wan::mem_attention::{to_dtype, to_f32};
use crate::wan::norm::{normalized, rms_normalized};
use crate::wan::reshape::reshape;

/// `t` summed over the axes where `shape` is 1 (the gradient of a broadcast operand).
fn reduce_to<B: Backend, const D: usize>(mut t: Tensor<B, D>, shape: [usize; D]) -> Tensor<B, D> {
    for (axis, &n) in shape.iter().enumerate() {
        if n == 1 && t.dims()[axis] != 1 {
            t = t.sum_dim(axis);
        }
    }
    t
}

/// How a norm over the last axis of `x [.., dim]` (rank `D`) with broadcast operands maps onto
/// the grouped form above: the first `lead` axes of `x` are the groups `G`, the
/// other leading axes the rows `P` of a group, and each operand (`[.., dim]`, every leading
/// axis 1 or that of `x`, all 1 from `lead` on) is expanded to `[G, 1, dim]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grouping<const D: usize> {
    /// The dims of `x`.
    x: [usize; D],
    /// How many leading axes form the groups.
    lead: usize,
}

impl<const D: usize> Grouping<D> {
    /// The fewest group axes that leave every operand constant over each group's rows.
    pub(crate) fn new(x: [usize; D], operands: &[[usize; D]]) -> Self {
        let lead = operands
            .iter()
            .filter_map(|s| (0..D - 1).rev().find(|&i| s[i] != 1).map(|i| i + 1))
            .max()
            .unwrap_or(0);
        Self { x, lead }
    }

    /// `[G, P, dim]`.
    fn dims(&self) -> [usize; 3] {
        let g = self.x[..self.lead].iter().product();
        let p = self.x[self.lead..D - 1].iter().product();
        [g, p, self.x[D - 1]]
    }

    /// An operand's dims expanded to the groups: `x`'s up to `lead`, then 1s, then `dim`.
    fn expanded(&self) -> [usize; D] {
        std::array::from_fn(|i| match i {
            _ if i < self.lead || i == D - 1 => self.x[i],
            _ => 1,
        })
    }

    /// `x` (or its gradient) as `[G, P, dim]`.
    pub(crate) fn rows<B: Backend>(&self, x: Tensor<B, D>) -> Tensor<B, 3> {
        reshape(x, self.dims())
    }

    /// `[G, P, dim]` back to `x`'s dims.
    pub(crate) fn unrows<B: Backend>(&self, t: Tensor<B, 3>) -> Tensor<B, D> {
        reshape(t, self.x)
    }

    /// An operand as `[G, 1, dim]`.
    pub(crate) fn operand<B: Backend>(&self, s: Tensor<B, D>) -> Tensor<B, 3> {
        let [g, _, dim] = self.dims();
        s.expand(self.expanded()).reshape([g, 1, dim])
    }

    /// An operand's gradient `[G, 1, dim]` summed back to the operand's `shape`.
    pub(crate) fn operand_grad<B: Backend>(
        &self,
        d: Tensor<B, 3>,
        shape: [usize; D],
    ) -> Tensor<B, D> {
        reduce_to(reshape(d, self.expanded()), shape)
    }
}

/// A norm's operands in grouped form (module docs).
#[derive(Debug, Clone)]
pub(crate) struct Rows<B: Backend> {
    /// `[G, P, dim]`, any float dtype.
    pub x: Tensor<B, 3>,
    /// `[G, 1, dim]`, float32.
    pub scale: Tensor<B, 3>,
    /// `[G, 1, dim]`, float32: given for a LayerNorm, `None` for an RMSNorm.
    pub shift: Option<Tensor<B, 3>>,
}

/// A forward's row statistics, float32 `[G, P, 1]`.
#[derive(Debug, Clone)]
pub(crate) struct Stats<B: Backend> {
    /// Row means (LayerNorm only).
    pub mean: Option<Tensor<B, 3>>,
    /// Row `1 / sqrt(var + eps)` (LayerNorm) or `1 / sqrt(mean(x²) + eps)` (RMSNorm).
    pub rstd: Tensor<B, 3>,
}

/// Which gradients a backward computes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wanted {
    /// The input's, in its dtype.
    pub x: bool,
    /// The scale's, float32 `[G, 1, dim]`.
    pub scale: bool,
    /// The shift's, float32 `[G, 1, dim]` (LayerNorm only).
    pub shift: bool,
}

/// A backward's gradients, those [`Wanted`].
#[derive(Debug)]
pub(crate) struct Grads<B: Backend> {
    /// `[G, P, dim]` in the input's dtype.
    pub x: Option<Tensor<B, 3>>,
    /// `[G, 1, dim]` float32.
    pub scale: Option<Tensor<B, 3>>,
    /// `[G, 1, dim]` float32.
    pub shift: Option<Tensor<B, 3>>,
}

/// The norm's output `xhat · scale (+ shift)` `[G, P, dim]` in `out`, and its statistics.
pub(crate) fn forward<B: Backend>(rows: Rows<B>, eps: f64, out: DType) -> (Tensor<B, 3>, Stats<B>) {
    on_cube!(B, |R, BT| super::cube::norm_forward::<B, R, BT>(
        rows, eps, out
    ));
    forward_ops(rows, eps, out)
}

/// The gradients of the norm that [`forward`] computed on `x` with `scale`, from the output
/// gradient `grad [G, P, dim]` (any float dtype).
pub(crate) fn backward<B: Backend>(
    grad: Tensor<B, 3>,
    x: Tensor<B, 3>,
    scale: Tensor<B, 3>,
    stats: Stats<B>,
    wanted: Wanted,
) -> Grads<B> {
    on_cube!(B, |R, BT| super::cube::norm_backward::<B, R, BT>(
        grad, x, scale, stats, wanted
    ));
    backward_ops(grad, x, scale, stats, wanted)
}

/// Column sums `[C]`, float32, of `t [R, C]` (any float dtype): the gradient of a bias added
/// to every row. On the kernels: partial sums over about `sqrt(R)` chunks of rows, one unit
/// per column, then a small sum of the chunks.
pub(crate) fn sum_rows<B: Backend>(t: Tensor<B, 2>) -> Tensor<B, 1> {
    on_cube!(B, |R, BT| super::cube::sum_rows::<B, R, BT>(t));
    sum_rows_ops(t)
}

/// [`sum_rows`] with tensor operations.
pub(crate) fn sum_rows_ops<B: Backend>(t: Tensor<B, 2>) -> Tensor<B, 1> {
    let cols = t.dims()[1];
    reshape(to_f32(t).sum_dim(0), [cols])
}

/// [`forward`] with tensor operations: the operations (and their order) of the plain
/// formulations in [`crate::wan::norm`].
pub(crate) fn forward_ops<B: Backend>(
    rows: Rows<B>,
    eps: f64,
    out: DType,
) -> (Tensor<B, 3>, Stats<B>) {
    let x = to_f32(rows.x);
    let (y, stats) = match rows.shift {
        Some(shift) => {
            let (xhat, mean, rstd) = normalized(x, eps);
            let mean = Some(mean);
            (xhat * rows.scale + shift, Stats { mean, rstd })
        }
        None => {
            let (xhat, rstd) = rms_normalized(x, eps);
            (xhat * rows.scale, Stats { mean: None, rstd })
        }
    };
    (to_dtype(y, out), stats)
}

/// [`backward`] with tensor operations (the closed forms).
pub(crate) fn backward_ops<B: Backend>(
    grad: Tensor<B, 3>,
    x: Tensor<B, 3>,
    scale: Tensor<B, 3>,
    stats: Stats<B>,
    wanted: Wanted,
) -> Grads<B> {
    let x_dtype = x.dtype();
    let g = to_f32(grad);
    let rstd = stats.rstd;
    let centered = stats.mean.is_some();
    let xhat = match stats.mean {
        Some(mean) => (to_f32(x) - mean) * rstd.clone(),
        None => to_f32(x) * rstd.clone(),
    };
    let shift = (wanted.shift && centered).then(|| g.clone().sum_dim(1));
    let scale_grad = wanted.scale.then(|| (g.clone() * xhat.clone()).sum_dim(1));
    let dx = wanted.x.then(|| {
        let gs = g * scale;
        let mean_gsx = (gs.clone() * xhat.clone()).mean_dim(2);
        let core = match centered {
            true => gs.clone() - gs.mean_dim(2) - xhat * mean_gsx,
            false => gs - xhat * mean_gsx,
        };
        to_dtype(core * rstd, x_dtype)
    });
    Grads {
        x: dx,
        scale: scale_grad,
        shift,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grouping_takes_the_fewest_leading_axes_that_hold_the_operands() {
        let dims = |x, ops: &[[usize; 3]]| Grouping::new(x, ops).dims();
        assert_eq!(dims([2, 5, 8], &[[2, 1, 8], [1, 1, 8]]), [2, 5, 8]);
        assert_eq!(dims([2, 5, 8], &[[1, 1, 8]]), [1, 10, 8]);
        assert_eq!(dims([2, 5, 8], &[[1, 5, 8], [2, 1, 8]]), [10, 1, 8]);
        assert_eq!(dims([2, 5, 8], &[]), [1, 10, 8]);
        let g = Grouping::new([2, 3, 4, 8], &[[2, 3, 1, 8]]);
        assert_eq!((g.dims(), g.expanded()), ([6, 4, 8], [2, 3, 1, 8]));
        let g = Grouping::new([2, 3, 4, 8], &[[1, 3, 1, 8]]);
        assert_eq!((g.dims(), g.expanded()), ([6, 4, 8], [2, 3, 1, 8]));
    }
}
