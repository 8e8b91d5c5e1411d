//! [`Linear`]: a fully connected layer with PyTorch's weight layout and an optional LoRA
//! adapter (PEFT layout: `lora_A.weight [r, in]`, `lora_B.weight [out, r]`).
// `lora_A` / `lora_B` are field names because Burn names parameters after fields, and these
// are PEFT's key names.
#![allow(non_snake_case)]

use burn::module::{Module, Param};
use burn::tensor::{backend::Backend, DType, Tensor};
use reel_core::config::Precision;

use super::bias::add_bias;
use super::gelu_linear::gelu_matmul;
use super::init::{join, ParamInit};
use super::matmul::pin;
use super::mem_attention::to_dtype;
use super::product::linear_product;
use super::reshape::reshape;

/// One LoRA factor: a bare weight matrix, so its key is `<module>.lora_A.weight` (or
/// `lora_B`), as in PEFT where the factors are bias-free `nn.Linear` layers.
#[derive(Module, Debug)]
pub struct LoraWeight<B: Backend> {
    /// `[rank, in_features]` for `lora_A`, `[out_features, rank]` for `lora_B`.
    pub weight: Param<Tensor<B, 2>>,
}

/// `y = x W^T + b` with `weight` stored as `[out_features, in_features]` (PyTorch layout, so
/// checkpoint tensors load without transposition) and an optional `bias` `[out_features]`.
///
/// With a LoRA adapter attached ([`Self::attach_lora`]) the layer computes
/// `y = x W^T + b + s · (x A^T) B^T` with `s = lora_scaling · lora_multiplier` (PEFT's
/// `scaling = alpha / r`, times the runtime scale diffusers passes as
/// `attention_kwargs={"scale": …}`). The base keys stay unchanged; the adapter adds
/// `lora_A.weight` and `lora_B.weight` next to them.
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    /// Weight `[out_features, in_features]`.
    pub weight: Param<Tensor<B, 2>>,
    /// Bias `[out_features]`.
    pub bias: Option<Param<Tensor<B, 1>>>,
    /// LoRA down projection `A` (`lora_A.weight [r, in_features]`), when adapted.
    pub lora_A: Option<LoraWeight<B>>,
    /// LoRA up projection `B` (`lora_B.weight [out_features, r]`), when adapted.
    pub lora_B: Option<LoraWeight<B>>,
    /// PEFT's `scaling = alpha / r` of the adapter (0 without one).
    pub lora_scaling: f64,
    /// Runtime multiplier of the adapter's contribution (1 by default).
    pub lora_multiplier: f64,
    /// Whether `s · B A` has been added into `weight` ([`Self::merge_lora`]); the forward
    /// pass then skips the adapter branch.
    pub lora_merged: bool,
    /// The factor `s` the merged update was added with, which [`Self::unmerge_lora`] takes
    /// back whatever the multiplier became since (0 when not merged).
    pub lora_merged_factor: f64,
    /// Compute precision of the products: with `Bf16` the input and the (float32 master)
    /// weights are cast to bfloat16 for the matrix product. The output has the input's dtype
    /// either way (bfloat16 activations stay bfloat16, float32 inputs get float32 outputs),
    /// and the bias is added in that dtype. Not a parameter.
    pub precision: Precision,
}

impl<B: Backend> Linear<B> {
    /// A layer whose parameters live at `path` (`path.weight`, `path.bias`), weight
    /// `N(0,1)/sqrt(in)`, bias zero, no adapter.
    pub fn init(init: &ParamInit<B>, path: &str, d_in: usize, d_out: usize, bias: bool) -> Self {
        Self::from_params(
            init.weight(&join(path, "weight"), [d_out, d_in]),
            bias.then(|| init.zeros(&join(path, "bias"), [d_out])),
        )
    }

    /// A layer from its weight `[out, in]` and optional bias `[out]`, no adapter.
    pub fn from_params(weight: Param<Tensor<B, 2>>, bias: Option<Param<Tensor<B, 1>>>) -> Self {
        Self {
            weight,
            bias,
            lora_A: None,
            lora_B: None,
            lora_scaling: 0.0,
            lora_multiplier: 1.0,
            lora_merged: false,
            lora_merged_factor: 0.0,
            precision: Precision::F32,
        }
    }

    /// Input width.
    pub fn in_features(&self) -> usize {
        self.weight.lazy_shape()[1]
    }

    /// Output width.
    pub fn out_features(&self) -> usize {
        self.weight.lazy_shape()[0]
    }

    /// Whether a LoRA adapter is attached.
    pub fn has_lora(&self) -> bool {
        self.lora_A.is_some() && self.lora_B.is_some()
    }

    /// Rank of the attached adapter.
    pub fn lora_rank(&self) -> Option<usize> {
        self.lora_A.as_ref().map(|a| a.weight.lazy_shape()[0])
    }

    /// Attach an adapter: `a [r, in]`, `b [out, r]`, `scaling = alpha / r`. Replaces any
    /// previous adapter (unmerged). Panics on shapes that do not fit the layer.
    pub fn attach_lora(&mut self, a: Param<Tensor<B, 2>>, b: Param<Tensor<B, 2>>, scaling: f64) {
        let (sa, sb) = (a.lazy_shape(), b.lazy_shape());
        let (d_in, d_out) = (self.in_features(), self.out_features());
        assert!(
            sa[1] == d_in && sb[0] == d_out && sa[0] == sb[1],
            "LoRA shapes A {:?} / B {:?} do not fit a {d_in} -> {d_out} layer",
            sa.as_slice(),
            sb.as_slice()
        );
        self.lora_A = Some(LoraWeight { weight: a });
        self.lora_B = Some(LoraWeight { weight: b });
        self.lora_scaling = scaling;
        self.lora_multiplier = 1.0;
        self.lora_merged = false;
        self.lora_merged_factor = 0.0;
    }

    /// Drop the adapter (the weight keeps any merged update).
    pub fn detach_lora(&mut self) {
        self.lora_A = None;
        self.lora_B = None;
        self.lora_scaling = 0.0;
        self.lora_multiplier = 1.0;
        self.lora_merged = false;
        self.lora_merged_factor = 0.0;
    }

    /// The effective factor of the adapter branch (`scaling · multiplier`).
    pub fn lora_factor(&self) -> f64 {
        self.lora_scaling * self.lora_multiplier
    }

    /// `factor · B A` `[out, in]`, detached from any autodiff graph.
    fn lora_delta(&self, factor: f64) -> Option<Tensor<B, 2>> {
        let (a, b) = (self.lora_A.as_ref()?, self.lora_B.as_ref()?);
        let delta = b.weight.val().detach().matmul(a.weight.val().detach());
        Some(delta.mul_scalar(factor))
    }

    fn add_to_weight(&mut self, delta: Tensor<B, 2>) {
        let weight = self.weight.clone();
        self.weight = weight.map(|w| {
            let require_grad = w.is_require_grad();
            let merged = w.detach().add(delta);
            if require_grad {
                merged.require_grad()
            } else {
                merged
            }
        });
    }

    /// Fold the adapter into the weight, `W ← W + s · B A` (diffusers `fuse_lora`, with the
    /// current multiplier). The adapter is kept so [`Self::unmerge_lora`] can undo it.
    /// Returns whether anything was merged (false without an adapter or when merged).
    pub fn merge_lora(&mut self) -> bool {
        if self.lora_merged {
            return false;
        }
        let factor = self.lora_factor();
        let Some(delta) = self.lora_delta(factor) else {
            return false;
        };
        self.add_to_weight(delta);
        self.lora_merged = true;
        self.lora_merged_factor = factor;
        true
    }

    /// Undo [`Self::merge_lora`], `W ← W − s · B A` with the `s` it was merged with (equal to
    /// the base weight up to float rounding, whatever multiplier was set since). Returns
    /// whether anything was unmerged.
    pub fn unmerge_lora(&mut self) -> bool {
        if !self.lora_merged {
            return false;
        }
        let Some(delta) = self.lora_delta(self.lora_merged_factor) else {
            return false;
        };
        self.add_to_weight(delta.neg());
        self.lora_merged = false;
        self.lora_merged_factor = 0.0;
        true
    }

    /// Apply the layer to the last dimension: `[..., in] -> [..., out]`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.apply(x, false)
    }

    /// `self.forward(gelu_tanh(u))` (the FFN's output projection), with the GELU and the
    /// product as one autodiff operation that keeps only `u` and the weight for the backward
    /// pass ([`super::gelu_linear`]). An unmerged LoRA adapter's down projection is a second
    /// such operation on the same `u` (the GELU is computed twice; its output is never
    /// kept). `[..., in] -> [..., out]`, the same values as `forward(gelu_tanh(u))`.
    pub fn forward_gelu<const D: usize>(&self, u: Tensor<B, D>) -> Tensor<B, D> {
        self.apply(u, true)
    }

    /// The adapter's factors and factor when it is attached, unmerged and non-zero.
    fn active_lora(&self) -> Option<(&LoraWeight<B>, &LoraWeight<B>, f64)> {
        match (&self.lora_A, &self.lora_B, self.lora_merged) {
            (Some(a), Some(b), false) if self.lora_factor() != 0.0 => {
                Some((a, b, self.lora_factor()))
            }
            _ => None,
        }
    }

    /// [`Self::forward`] of `x`, or of `gelu_tanh(x)` when `gelu_input`.
    fn apply<const D: usize>(&self, x: Tensor<B, D>, gelu_input: bool) -> Tensor<B, D> {
        let dims = x.dims();
        let d_in = dims[D - 1];
        let rows = dims[..D - 1].iter().product::<usize>();
        let w = self.weight.val();
        let d_out = w.dims()[0];
        // Flatten to 2-D so every backend runs one plain GEMM.
        let x = reshape(x, [rows, d_in]);
        let dtype = x.dtype();
        // Products in bf16 for `Bf16`, else in the input's dtype (the weights follow it).
        let compute_dtype = match self.precision {
            Precision::Bf16 => DType::BF16,
            Precision::F32 => dtype,
        };
        let compute = |t: Tensor<B, 2>| to_dtype(t, compute_dtype);
        let restore = |t: Tensor<B, 2>| to_dtype(t, dtype);
        // `x · mᵀ` (or `GELU(x) · mᵀ`) in the compute dtype, for the weight and LoRA's `A`;
        // `x` is cast once (the GELU casts its own output).
        // With matmul kernels pinned (`REEL_MATMUL`), the products and their gradients run
        // on the kernels pinned for their layouts; on ndarray, without Burn's copies.
        let x = if gelu_input { x } else { compute(x) };
        let pinned = pin::<B>();
        let own_product = pinned.any() || reel_core::host::is_ndarray::<B>();
        let times = |m: Tensor<B, 2>| match (gelu_input, own_product) {
            (true, _) => gelu_matmul(x.clone(), compute(m)),
            (false, false) => x.clone().matmul(compute(m).transpose()),
            (false, true) => linear_product(x.clone(), compute(m), pinned),
        };
        let mut y = restore(times(w));
        if let Some(b) = &self.bias {
            y = add_bias(y, to_dtype(b.val(), dtype));
        }
        if let Some((a, b, s)) = self.active_lora() {
            let low = times(a.weight.val());
            y = y + restore(low.matmul(compute(b.weight.val()).transpose())).mul_scalar(s);
        }
        let mut out = dims;
        out[D - 1] = d_out;
        reshape(y, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    type B = burn::backend::Flex;

    fn param<const D: usize>(v: Vec<f32>, shape: [usize; D]) -> Param<Tensor<B, D>> {
        Param::from_data(TensorData::new(v, shape), &Default::default())
    }

    fn layer() -> Linear<B> {
        Linear::from_params(
            param(vec![1.0f32, 2., 3., 4., 5., 6.], [2, 3]),
            Some(param(vec![0.5f32, -1.0], [2])),
        )
    }

    fn input() -> Tensor<B, 3> {
        let x = TensorData::new(vec![1.0f32, 0., -1., 2., 1., 0.], [1, 2, 3]);
        Tensor::from_data(x, &Default::default())
    }

    #[test]
    fn matches_torch_layout() {
        let lin = layer();
        let y = lin.forward(input()).into_data().to_vec::<f32>().unwrap();
        // row 1: [1,0,-1] -> [1-3, 4-6] + b = [-1.5, -3.0]; row 2: [2,1,0] -> [4, 13] + b
        assert_eq!(y, vec![-1.5, -3.0, 4.5, 12.0]);
        assert_eq!((lin.in_features(), lin.out_features()), (3, 2));
        assert!(!lin.has_lora());
    }

    #[test]
    fn lora_branch_merge_and_unmerge() {
        let mut lin = layer();
        // A = [1, 1, 1] (r = 1), B = [1, -2]^T, scaling 0.5, multiplier 2 -> factor 1.
        lin.attach_lora(
            param(vec![1.0, 1.0, 1.0], [1, 3]),
            param(vec![1.0, -2.0], [2, 1]),
            0.5,
        );
        lin.lora_multiplier = 2.0;
        assert_eq!(lin.lora_rank(), Some(1));
        // A x: row 1 -> 0, row 2 -> 3; B (A x): [0, 0], [3, -6].
        let want = vec![-1.5f32, -3.0, 7.5, 6.0];
        assert_eq!(
            lin.forward(input()).into_data().to_vec::<f32>().unwrap(),
            want
        );
        assert!(lin.merge_lora());
        assert!(!lin.merge_lora(), "merging twice is a no-op");
        assert_eq!(
            lin.forward(input()).into_data().to_vec::<f32>().unwrap(),
            want
        );
        assert!(lin.unmerge_lora());
        let w = lin.weight.val().into_data().to_vec::<f32>().unwrap();
        assert_eq!(w, vec![1.0, 2., 3., 4., 5., 6.]);
        lin.detach_lora();
        assert_eq!(
            lin.forward(input()).into_data().to_vec::<f32>().unwrap(),
            vec![-1.5, -3.0, 4.5, 12.0]
        );
    }
}
