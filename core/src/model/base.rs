//! The runtime model traits: [`DiffusionModel`] (what every method calls), [`TrainableModel`]
//! (what a trainable role also needs) and [`DynModel`], the type-erased trainable model a
//! role owns.

use std::fmt::{self, Debug};
use std::ops::Deref;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;

use super::ModelInfo;
use crate::role::{FlatParam, ParamValues, RoleModule};

type Inner<B> = <B as AutodiffBackend>::InnerBackend;

/// A diffusion transformer as methods see it: a velocity prediction from noisy latents,
/// timesteps and text, plus a hook on the hidden states of its blocks.
pub trait DiffusionModel<B: Backend>: Send + Debug {
    /// Channels, text width, patch, hidden width and depth.
    fn info(&self) -> ModelInfo;

    /// Predict the flow-matching velocity.
    ///
    /// - `latents [B, in_channels, F, H, W]` noisy latents (F, H, W multiples of the patch);
    /// - `timesteps [B]` model timesteps (`1000·σ`, fractional values allowed);
    /// - `text [B, L, text_dim]` text embeddings;
    ///
    /// returns `[B, out_channels, F, H, W]`.
    fn forward(
        &self,
        latents: Tensor<B, 5>,
        timesteps: Tensor<B, 1>,
        text: Tensor<B, 3>,
    ) -> Tensor<B, 5>;

    /// [`Self::forward`] plus the hidden states `[B, N, hidden_size]` after each block listed
    /// in `blocks` (in the order given; indices below `info().num_layers`), e.g. for
    /// discriminator heads.
    fn forward_hidden_states(
        &self,
        latents: Tensor<B, 5>,
        timesteps: Tensor<B, 1>,
        text: Tensor<B, 3>,
        blocks: &[usize],
    ) -> (Tensor<B, 5>, Vec<Tensor<B, 3>>);
}

/// A boxed model is a model (e.g. the `Box<dyn DiffusionModel<_>>` of a frozen role).
impl<B: Backend, M: DiffusionModel<B> + ?Sized> DiffusionModel<B> for Box<M> {
    fn info(&self) -> ModelInfo {
        (**self).info()
    }
    fn forward(
        &self,
        latents: Tensor<B, 5>,
        timesteps: Tensor<B, 1>,
        text: Tensor<B, 3>,
    ) -> Tensor<B, 5> {
        (**self).forward(latents, timesteps, text)
    }
    fn forward_hidden_states(
        &self,
        latents: Tensor<B, 5>,
        timesteps: Tensor<B, 1>,
        text: Tensor<B, 3>,
        blocks: &[usize],
    ) -> (Tensor<B, 5>, Vec<Tensor<B, 3>>) {
        (**self).forward_hidden_states(latents, timesteps, text, blocks)
    }
}

/// The loss a checkpointed backward applies to the prediction `[B, C, F, H, W]`.
pub type LossFn<'a, B> = Box<dyn FnOnce(Tensor<B, 5>) -> Tensor<B, 1> + 'a>;

/// A diffusion model a role can train: parameters addressable by path ([`RoleModule`]), a
/// no-autodiff copy for sampling, and optionally a memory-saving backward.
pub trait TrainableModel<B: AutodiffBackend>: DiffusionModel<B> + RoleModule<B> {
    /// The model without autodiff (no graph, no gradients), for sampling and targets.
    fn valid(&self) -> Box<dyn DiffusionModel<Inner<B>>>;

    /// Forward, `loss(prediction)` and backward, handing each stage's gradients to `sink`
    /// (summed over all calls they equal the plain backward's). Returns the loss, detached.
    ///
    /// The default runs one plain backward; an architecture with block-level activation
    /// checkpointing overrides it to keep less in memory.
    fn backward_checkpointed(
        &self,
        latents: Tensor<B, 5>,
        timesteps: Tensor<B, 1>,
        text: Tensor<B, 3>,
        loss: LossFn<'_, B>,
        sink: &mut dyn FnMut(&B::Gradients),
    ) -> Tensor<B, 1> {
        let loss = loss(self.forward(latents, timesteps, text));
        let grads = loss.backward();
        sink(&grads);
        loss.detach()
    }
}

/// A trainable model of any architecture: what [`BuildContext::model`] returns and a role
/// owns (`TrainableRole<B, DynModel<B>>`). Derefs to [`TrainableModel`].
///
/// [`BuildContext::model`]: crate::method::BuildContext::model
pub struct DynModel<B: AutodiffBackend>(Box<dyn TrainableModel<B>>);

impl<B: AutodiffBackend> DynModel<B> {
    /// Wrap a model.
    pub fn new(model: impl TrainableModel<B> + 'static) -> Self {
        Self(Box::new(model))
    }

    /// The same model with every parameter frozen (no gradients): a frozen role that must
    /// stay on the autodiff backend, e.g. a feature network gradients flow through.
    pub fn frozen(mut self) -> Self {
        self.0.freeze();
        self
    }
}

impl<B: AutodiffBackend> Deref for DynModel<B> {
    type Target = dyn TrainableModel<B>;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl<B: AutodiffBackend> DiffusionModel<B> for DynModel<B> {
    fn info(&self) -> ModelInfo {
        self.0.info()
    }
    fn forward(
        &self,
        latents: Tensor<B, 5>,
        timesteps: Tensor<B, 1>,
        text: Tensor<B, 3>,
    ) -> Tensor<B, 5> {
        self.0.forward(latents, timesteps, text)
    }
    fn forward_hidden_states(
        &self,
        latents: Tensor<B, 5>,
        timesteps: Tensor<B, 1>,
        text: Tensor<B, 3>,
        blocks: &[usize],
    ) -> (Tensor<B, 5>, Vec<Tensor<B, 3>>) {
        self.0
            .forward_hidden_states(latents, timesteps, text, blocks)
    }
}

impl<B: AutodiffBackend> Debug for DynModel<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<B: AutodiffBackend> RoleModule<B> for DynModel<B> {
    fn param_grads(&self, grads: &B::Gradients) -> ParamValues<B> {
        self.0.param_grads(grads)
    }
    fn trainable_params(&self) -> Vec<FlatParam<Inner<B>>> {
        self.0.trainable_params()
    }
    fn replace_params(&mut self, values: &mut ParamValues<B>, old: Option<&mut ParamValues<B>>) {
        self.0.replace_params(values, old)
    }
    fn all_params(&self) -> Vec<FlatParam<Inner<B>>> {
        self.0.all_params()
    }
    fn freeze(&mut self) {
        self.0.freeze()
    }
    fn device(&self) -> B::Device {
        self.0.device()
    }
}
