//! Discriminator heads over a feature network's hidden states.
//!
//! A feature network (the frozen teacher, or DMD2's critic) runs on the noisy sample and
//! exposes the hidden states `[B, N, dim]` after selected blocks
//! ([`DiffusionModel::forward_hidden_states`]; no copy of the model code). Each
//! selected block gets one small head: parameter-free LayerNorm, `Linear(dim, hidden)`,
//! SiLU, `Linear(hidden, 1)`, then the mean over tokens: one logit per sample `[B]`. The
//! heads are a module of their own, trained as a role with its own optimizer.

use burn::module::Module;
use burn::tensor::activation::silu;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

use reel_core::config::ConfigError;
use reel_core::model::{DiffusionModel, ModelInfo};
use reel_models::wan::init::{join, ParamInit};
use reel_models::wan::linear::Linear;
use reel_models::wan::norm::layer_norm;

/// Which blocks of the feature network get a head, and the heads' width.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeadsConfig {
    /// A head after every `stride`-th block (blocks `stride−1, 2·stride−1, …`, 0-based;
    /// default 4). Ignored when `blocks` is given.
    #[serde(default = "default_stride")]
    pub stride: usize,
    /// Explicit 0-based block indices (overrides `stride`).
    #[serde(default)]
    pub blocks: Option<Vec<usize>>,
    /// Hidden width of each head's MLP.
    #[serde(default = "default_hidden")]
    pub hidden: usize,
    /// Seed of the heads' initial weights.
    #[serde(default)]
    pub init_seed: u64,
}

fn default_stride() -> usize {
    4
}

fn default_hidden() -> usize {
    256
}

impl Default for HeadsConfig {
    fn default() -> Self {
        Self {
            stride: default_stride(),
            blocks: None,
            hidden: default_hidden(),
            init_seed: 0,
        }
    }
}

/// The widest head's hidden layer (a typo beyond it would allocate tens of gigabytes at the
/// first step).
pub const MAX_HIDDEN: usize = 65536;

impl HeadsConfig {
    /// Check what needs no model: `hidden` and `stride` at least 1, `blocks` not empty.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=MAX_HIDDEN).contains(&self.hidden) {
            return Err(ConfigError::new(
                "hidden",
                format!("from 1 to {MAX_HIDDEN}, got {}", self.hidden),
            ));
        }
        if self.blocks.as_ref().is_some_and(|b| b.is_empty()) {
            return Err(ConfigError::new(
                "blocks",
                "an empty list selects no block: give at least one index or use `stride`",
            ));
        }
        if self.blocks.is_none() && self.stride == 0 {
            return Err(ConfigError::new("stride", "must be at least 1"));
        }
        Ok(())
    }

    /// Check the selected blocks against the feature network's shape facts, when its
    /// architecture tells them from the config (`None`: checked when the heads are built).
    pub fn check_feature_network(&self, feature: Option<ModelInfo>) -> Result<(), ConfigError> {
        match feature {
            Some(f) => self.block_indices(f.num_layers).map(drop),
            None => Ok(()),
        }
    }

    /// The selected block indices for a feature network with `num_layers` blocks; errors name
    /// the key (`stride`, `blocks`, `hidden`).
    pub fn block_indices(&self, num_layers: usize) -> Result<Vec<usize>, ConfigError> {
        self.validate()?;
        let picked: Vec<usize> = match &self.blocks {
            Some(list) => {
                if let Some(bad) = list.iter().find(|&&i| i >= num_layers) {
                    return Err(ConfigError::new(
                        "blocks",
                        format!(
                            "block {bad} does not exist: the feature network has {num_layers} blocks (0..{num_layers})"
                        ),
                    ));
                }
                let mut v = list.clone();
                v.sort_unstable();
                v.dedup();
                v
            }
            None => {
                if self.stride > num_layers {
                    return Err(ConfigError::new(
                        "stride",
                        format!(
                            "expected 1..={num_layers} (the feature network has {num_layers} blocks), got {}",
                            self.stride
                        ),
                    ));
                }
                (1..=num_layers / self.stride)
                    .map(|k| k * self.stride - 1)
                    .collect()
            }
        };
        Ok(picked)
    }

    /// Heads for a feature network of width `dim` with `num_layers` blocks.
    pub fn init<B: Backend>(
        &self,
        dim: usize,
        num_layers: usize,
        device: &B::Device,
    ) -> Result<DiscriminatorHeads<B>, ConfigError> {
        let blocks = self.block_indices(num_layers)?;
        let init = ParamInit::<B>::new(self.init_seed, device);
        let heads = blocks
            .iter()
            .enumerate()
            .map(|(i, _)| Head::init(&init, &format!("heads.{i}"), dim, self.hidden))
            .collect();
        Ok(DiscriminatorHeads { heads, blocks })
    }
}

/// One head: `LN → Linear(dim, hidden) → SiLU → Linear(hidden, 1) → mean over tokens`.
#[derive(Module, Debug)]
pub struct Head<B: Backend> {
    /// `[hidden, dim]` projection.
    pub fc1: Linear<B>,
    /// `[1, hidden]` logit projection.
    pub fc2: Linear<B>,
}

impl<B: Backend> Head<B> {
    fn init(init: &ParamInit<B>, path: &str, dim: usize, hidden: usize) -> Self {
        Self {
            fc1: Linear::init(init, &join(path, "fc1"), dim, hidden, true),
            fc2: Linear::init(init, &join(path, "fc2"), hidden, 1, true),
        }
    }

    /// `x [B, N, dim]` -> logits `[B]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 1> {
        let [b, n, _] = x.dims();
        let h = silu(self.fc1.forward(layer_norm(x, 1e-6)));
        self.fc2.forward(h).reshape([b, n]).mean_dim(1).reshape([b])
    }
}

/// The discriminator: one [`Head`] per selected block of the feature network.
#[derive(Module, Debug)]
pub struct DiscriminatorHeads<B: Backend> {
    /// The heads, in the order of `blocks`.
    pub heads: Vec<Head<B>>,
    /// Feature-network block index each head reads (ascending).
    #[module(skip)]
    pub blocks: Vec<usize>,
}

impl<B: Backend> DiscriminatorHeads<B> {
    /// The feature-network blocks whose hidden states the heads read (pass them to
    /// `forward_hidden_states`).
    pub fn blocks(&self) -> &[usize] {
        &self.blocks
    }

    /// Logits `[B]` of every head for noisy latents `x [B, C, F, H, W]` at model timesteps
    /// `t [B]` with text `[B, L, text_dim]`, read from the hidden states of the feature
    /// network `net`. Gradients reach whatever of `net`, `x` and the heads is tracked.
    pub fn judge(
        &self,
        net: &dyn DiffusionModel<B>,
        x: Tensor<B, 5>,
        t: Tensor<B, 1>,
        text: Tensor<B, 3>,
    ) -> Vec<Tensor<B, 1>> {
        let (_, features) = net.forward_hidden_states(x, t, text, &self.blocks);
        self.forward(features)
    }

    /// Logits `[B]` of every head from the hidden states `features[i] [B, N, dim]` of
    /// `blocks()[i]`. Panics when the counts differ (an internal wiring error).
    pub fn forward(&self, features: Vec<Tensor<B, 3>>) -> Vec<Tensor<B, 1>> {
        assert_eq!(
            features.len(),
            self.heads.len(),
            "{} feature maps for {} discriminator heads",
            features.len(),
            self.heads.len()
        );
        self.heads
            .iter()
            .zip(features)
            .map(|(h, x)| h.forward(x))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reel_core::rng::StreamRng;
    use reel_models::WanConfig;

    type B = burn::backend::NdArray;
    type Ad = burn::backend::Autodiff<B>;

    fn cfg(stride: usize, blocks: Option<Vec<usize>>) -> HeadsConfig {
        HeadsConfig {
            stride,
            blocks,
            ..HeadsConfig::default()
        }
    }

    #[test]
    fn block_selection_by_stride_or_list() {
        assert_eq!(
            cfg(5, None).block_indices(30).unwrap(),
            [4, 9, 14, 19, 24, 29]
        );
        assert_eq!(cfg(1, None).block_indices(3).unwrap(), [0, 1, 2]);
        assert_eq!(cfg(2, None).block_indices(5).unwrap(), [1, 3]);
        assert_eq!(
            cfg(9, Some(vec![7, 2, 7])).block_indices(8).unwrap(),
            [2, 7],
            "an explicit list overrides stride, sorted and deduplicated"
        );
        for (c, key) in [
            (cfg(0, None), "stride"),
            (cfg(9, None), "stride"),
            (cfg(1, Some(vec![])), "blocks"),
            (cfg(1, Some(vec![8])), "blocks"),
            (
                HeadsConfig {
                    hidden: 0,
                    ..HeadsConfig::default()
                },
                "hidden",
            ),
        ] {
            let e = c.block_indices(8).unwrap_err().to_string();
            assert!(e.contains(key), "{e}");
        }
    }

    /// Heads read the feature network's hidden states through the model's hook, give one
    /// logit per sample, and gradients reach the heads (and, when the input needs them,
    /// the input) but no parameter of a frozen feature network.
    #[test]
    fn heads_over_wan_hidden_states() {
        let _turn = reel_core::parallel::autodiff_turn();
        let dev = Default::default();
        let wan = WanConfig::preset("wan-tiny").unwrap();
        let feature = wan.init_seeded::<Ad>(&dev, 1).no_grad();
        let heads = cfg(1, None)
            .init::<Ad>(wan.inner_dim(), wan.num_layers, &dev)
            .unwrap();
        assert_eq!(heads.blocks(), [0, 1]);
        let mut rng = StreamRng::from_seed(2);
        let x: Tensor<Ad, 5> = rng
            .normal_tensor::<Ad, 5>([3, wan.in_channels, 2, 4, 4], &dev)
            .require_grad();
        let text: Tensor<Ad, 3> = rng.normal_tensor([3, 5, wan.text_dim], &dev);
        let t = Tensor::<Ad, 1>::from_floats([500.0, 100.0, 900.0], &dev);
        let (_, feats) = feature.forward_hidden_states(x.clone(), t, text, heads.blocks());
        let logits = heads.forward(feats);
        assert_eq!(logits.len(), 2);
        assert_eq!(logits[0].dims(), [3]);
        let loss = super::super::GanLoss::Hinge.generator_heads(logits);
        let grads = loss.backward();
        assert!(
            x.grad(&grads).is_some(),
            "the generator signal reaches the input"
        );
        let head_w = heads.heads[0].fc1.weight.val();
        assert!(head_w.grad(&grads).is_some(), "heads get gradients");
        let frozen = feature.blocks[0].attn1.to_q.weight.val();
        assert!(
            frozen.grad(&grads).is_none(),
            "a frozen feature network gets none"
        );
    }
}
