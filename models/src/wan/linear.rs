//! [`Linear`]: a fully connected layer with PyTorch's weight layout.

use burn::module::{Module, Param};
use burn::tensor::{backend::Backend, Tensor};

use super::init::{join, ParamInit};

/// `y = x W^T + b` with `weight` stored as `[out_features, in_features]` (PyTorch layout, so
/// checkpoint tensors load without transposition) and an optional `bias` `[out_features]`.
///
/// Adapters (LoRA) are meant to be added later as extra optional fields next to `weight`
/// (e.g. `lora_A` / `lora_B`), which keeps the base keys unchanged.
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    /// Weight `[out_features, in_features]`.
    pub weight: Param<Tensor<B, 2>>,
    /// Bias `[out_features]`.
    pub bias: Option<Param<Tensor<B, 1>>>,
}

impl<B: Backend> Linear<B> {
    /// A layer whose parameters live at `path` (`path.weight`, `path.bias`), weight
    /// `N(0,1)/sqrt(in)`, bias zero.
    pub fn init(init: &ParamInit<B>, path: &str, d_in: usize, d_out: usize, bias: bool) -> Self {
        Self {
            weight: init.weight(&join(path, "weight"), [d_out, d_in]),
            bias: bias.then(|| init.zeros(&join(path, "bias"), [d_out])),
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

    /// Apply the layer to the last dimension: `[..., in] -> [..., out]`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let dims = x.dims();
        let d_in = dims[D - 1];
        let rows = dims[..D - 1].iter().product::<usize>();
        let w = self.weight.val();
        let d_out = w.dims()[0];
        // Flatten to 2-D so every backend runs one plain GEMM.
        let y = x.reshape([rows, d_in]).matmul(w.transpose());
        let y = match &self.bias {
            Some(b) => y + b.val().unsqueeze_dim::<2>(0),
            None => y,
        };
        let mut out = dims;
        out[D - 1] = d_out;
        y.reshape(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    type B = burn::backend::Flex;

    #[test]
    fn matches_torch_layout() {
        let dev = Default::default();
        let lin = Linear::<B> {
            weight: Param::from_data(
                TensorData::new(vec![1.0f32, 2., 3., 4., 5., 6.], [2, 3]),
                &dev,
            ),
            bias: Some(Param::from_data(
                TensorData::new(vec![0.5f32, -1.0], [2]),
                &dev,
            )),
        };
        let x = Tensor::<B, 3>::from_data(
            TensorData::new(vec![1.0f32, 0., -1., 2., 1., 0.], [1, 2, 3]),
            &dev,
        );
        let y = lin.forward(x).into_data().to_vec::<f32>().unwrap();
        // row 1: [1,0,-1] -> [1-3, 4-6] + b = [-1.5, -3.0]; row 2: [2,1,0] -> [4, 13] + b
        assert_eq!(y, vec![-1.5, -3.0, 4.5, 12.0]);
        assert_eq!((lin.in_features(), lin.out_features()), (3, 2));
    }
}
