//! Block-level activation checkpointing: a training forward + backward that keeps only each
//! block's input `[B, N, dim]` and recomputes the block in the backward pass.
//!
//! Burn 0.21 runs backward steps under its autodiff graph lock, so a custom operation cannot
//! re-run a tracked forward inside its own backward. The recomputation is therefore staged
//! here, as one backward pass per stage, each on a small graph:
//!
//! 1. embeddings (patch embedding, timestep and text conditions) with a graph;
//! 2. the blocks without a graph, keeping each block's input;
//! 3. the output head and the loss, from the last hidden state as a leaf; backward;
//! 4. each block in reverse, recomputed from its saved input, backward of
//!    `Σ out ∘ grad_out`, passing the input's gradient down;
//! 5. backward through the embeddings with the gradients the blocks and head gave them.
//!
//! Every parameter's gradient equals the plain backward's up to float rounding (tested), at
//! the cost of one more forward of every block. Activation memory drops from all of every
//! block's intermediates to one block's plus one `[B, N, dim]` tensor per block.

use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;

use super::mem_attention::to_f32;
use super::model::{Recorder, WanModel};
use super::rope::RopeTables;

/// A gradient, or nothing yet.
fn add<B: AutodiffBackend, const D: usize>(
    acc: Option<Tensor<B::InnerBackend, D>>,
    g: Option<Tensor<B::InnerBackend, D>>,
) -> Option<Tensor<B::InnerBackend, D>> {
    match (acc, g) {
        (Some(a), Some(g)) => Some(a + g),
        (a, g) => a.or(g),
    }
}

/// `Σ t ∘ g` as a float32 scalar on the autodiff backend (zero contribution when `g` is
/// `None`); `t` and `g` share a dtype (bfloat16 for the hidden states of a bf16 run).
fn dot<B: AutodiffBackend, const D: usize>(
    t: Tensor<B, D>,
    g: Option<Tensor<B::InnerBackend, D>>,
) -> Option<Tensor<B, 1>> {
    g.map(|g| to_f32((t * Tensor::from_inner(g)).sum()))
}

impl<B: AutodiffBackend> WanModel<B> {
    /// Forward, `loss(prediction)` and backward with block-level activation checkpointing.
    ///
    /// Inputs as in [`WanModel::forward`]; `loss` maps the prediction `[B, C_out, F, H, W]`
    /// to a scalar `[1]`. Each stage's gradients are handed to `sink` as soon as they exist
    /// (parameters of that stage only); summing them over all calls gives the gradients of
    /// the plain `loss(forward(..)).backward()`. Returns the loss (detached).
    pub fn backward_checkpointed(
        &self,
        hidden_states: Tensor<B, 5>,
        timestep: Tensor<B, 1>,
        encoder_hidden_states: Tensor<B, 3>,
        loss: impl FnOnce(Tensor<B, 5>) -> Tensor<B, 1>,
        mut sink: impl FnMut(&B::Gradients),
    ) -> Tensor<B, 1> {
        let cfg = &self.config;
        let [b, _, f, h, w] = hidden_states.dims();
        let [pt, ph, pw] = cfg.patch_size;
        let grid = [f / pt, h / ph, w / pw];
        let dim = cfg.inner_dim();
        let device = hidden_states.device();

        // 1. Embeddings, tracked.
        let x0 = self.embed_tokens(hidden_states);
        let cond = self
            .condition_embedder
            .forward(timestep, encoder_hidden_states);
        let modulation = cond.timestep_proj.reshape([b, 6, dim]);
        let (text, temb) = (cond.text_embeds, cond.temb);

        // 2. Blocks without a graph; keep each block's input.
        let rope_inner = RopeTables::<B::InnerBackend>::new(cfg, grid, &device);
        let rope = RopeTables::<B>::new(cfg, grid, &device);
        let (mod_in, text_in) = (modulation.clone().inner(), text.clone().inner());
        let mut inputs = Vec::with_capacity(self.blocks.len());
        let mut x = x0.clone().inner();
        for block in &self.blocks {
            let inner = burn::module::AutodiffModule::valid(block);
            inputs.push(x.clone());
            x = inner.forward(x, mod_in.clone(), text_in.clone(), &rope_inner);
        }

        // 3. Head and loss from the last hidden state as a leaf.
        let x_leaf = Tensor::<B, 3>::from_inner(x).require_grad();
        let temb_leaf = Tensor::<B, 2>::from_inner(temb.clone().inner()).require_grad();
        let pred = self.head(x_leaf.clone(), temb_leaf.clone(), grid, &mut Recorder(None));
        let loss = loss(pred);
        let grads = loss.backward();
        sink(&grads);
        let mut g_x = x_leaf.grad(&grads);
        let g_temb = temb_leaf.grad(&grads);
        drop(grads);

        // 4. Blocks in reverse, recomputed from their inputs.
        let (mut g_mod, mut g_text) = (None, None);
        for (block, input) in self.blocks.iter().zip(inputs).rev() {
            let Some(g_out) = g_x.take() else { break };
            let x_leaf = Tensor::<B, 3>::from_inner(input).require_grad();
            let mod_leaf = Tensor::<B, 3>::from_inner(mod_in.clone()).require_grad();
            let text_leaf = Tensor::<B, 3>::from_inner(text_in.clone()).require_grad();
            let out = block.forward(x_leaf.clone(), mod_leaf.clone(), text_leaf.clone(), &rope);
            let grads = (out * Tensor::from_inner(g_out)).sum().backward();
            sink(&grads);
            g_x = x_leaf.grad(&grads);
            g_mod = add::<B, 3>(g_mod, mod_leaf.grad(&grads));
            g_text = add::<B, 3>(g_text, text_leaf.grad(&grads));
        }

        // 5. Embeddings, with the gradients of their outputs.
        let terms: Vec<Tensor<B, 1>> = [
            dot(x0, g_x),
            dot(modulation, g_mod),
            dot(text, g_text),
            dot(temb, g_temb),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !terms.is_empty() {
            let grads = Tensor::cat(terms, 0).sum().backward();
            sink(&grads);
        }
        loss.detach()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WanConfig;
    use reel_core::optim::OptimizerConfig;
    use reel_core::rng::StreamRng;
    use reel_core::role::TrainableRole;

    type Ad = burn::backend::Autodiff<burn::backend::NdArray>;

    /// Every parameter gradient and the loss, plain and checkpointed, for a config.
    fn both(cfg: &WanConfig, lora: bool) {
        let dev = Default::default();
        let mut model = cfg.init_seeded::<Ad>(&dev, 4);
        if lora {
            let spec = crate::LoraSpec {
                rank: 2,
                alpha: 2.0,
                target_modules: vec!["to_q".into(), "ffn.net.2".into()],
                dropout: 0.0,
                init_seed: Some(1),
            };
            model = crate::apply_lora(model, &spec, 0).unwrap();
        }
        let mut rng = StreamRng::from_seed(3);
        let [pt, ph, pw] = cfg.patch_size;
        let x: Tensor<Ad, 5> =
            rng.normal_tensor([2, cfg.in_channels, 2 * pt, 4 * ph, 3 * pw], &dev);
        let target: Tensor<Ad, 5> =
            rng.normal_tensor([2, cfg.out_channels, 2 * pt, 4 * ph, 3 * pw], &dev);
        let ctx: Tensor<Ad, 3> = rng.normal_tensor([2, 5, cfg.text_dim], &dev);
        let t = Tensor::<Ad, 1>::from_floats([700.0, 30.0], &dev);
        let loss_fn = |p: Tensor<Ad, 5>| (p - target.clone()).square().mean();
        let n_params = reel_core::params::named_params(&model).len();
        // The role's gradient collector keys every trainable parameter's gradient by path.
        let role = TrainableRole::new("student", model, OptimizerConfig::default(), None, 1);
        let model = role.model();

        let plain = loss_fn(model.forward(x.clone(), t.clone(), ctx.clone()));
        let plain_grads = plain.clone().backward();
        let mut stages = Vec::new();
        let ck =
            model.backward_checkpointed(x, t, ctx, loss_fn, |g| stages.push(role.collect_grads(g)));
        let (a, b) = (plain.into_scalar(), ck.into_scalar());
        assert!((a - b).abs() < 1e-6, "loss {a} vs {b}");
        // Every trainable parameter got exactly one gradient, equal to the plain one.
        let mut seen = std::collections::BTreeMap::new();
        for (name, g) in stages.into_iter().flatten() {
            assert!(
                seen.insert(name.clone(), g).is_none(),
                "{name} got two gradients"
            );
        }
        let plain = role.collect_grads(&plain_grads);
        if lora {
            assert!(
                plain.iter().all(|(n, _)| n.contains(".lora_")),
                "only adapters train"
            );
        } else {
            assert_eq!(plain.len(), n_params);
        }
        assert_eq!(
            seen.len(),
            plain.len(),
            "every trainable parameter has a gradient"
        );
        for (name, want) in plain {
            let got = &seen[&name];
            let scale: f32 = want.clone().abs().max().into_scalar();
            let err: f32 = (got.clone() - want).abs().max().into_scalar();
            assert!(
                err <= 1e-5 * scale.max(1e-3),
                "{name}: {err:.3e} (max |g| {scale:.3e})"
            );
        }
    }

    #[test]
    fn checkpointed_gradients_equal_plain_backward() {
        let _turn = reel_core::parallel::autodiff_turn();
        both(&WanConfig::preset("wan-tiny").unwrap(), false);
    }

    #[test]
    fn checkpointed_gradients_with_temporal_patch_and_lora() {
        let _turn = reel_core::parallel::autodiff_turn();
        let mut c = WanConfig::preset("wan-tiny").unwrap();
        c.patch_size = [2, 1, 1];
        c.num_layers = 3;
        c.cross_attn_norm = false;
        both(&c, true);
    }
}
