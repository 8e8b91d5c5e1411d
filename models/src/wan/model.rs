//! [`WanModel`]: the diffusers `WanTransformer3DModel` (text-to-video) in Burn.

use std::collections::BTreeMap;

use burn::module::{Module, Param};
use burn::tensor::{backend::Backend, DType, FloatDType, Tensor, TensorData};

use super::block::WanBlock;
use super::config::{WanConfig, WanConfigError};
use super::embeddings::{tokens_to_grid, unpatchify, ConditionEmbedder, PatchEmbedding};
use super::init::{InitKind, ParamInit};
use super::linear::Linear;
use super::mem_attention::{to_dtype, to_f32, AttentionMode};
use super::norm::layer_norm_affine;
use super::param_graph::gather_params;
use super::reshape::reshape;
use super::rope::RopeTables;
use reel_core::config::Precision;

/// A captured tensor of any rank (host-independent: it stays on the device).
#[derive(Debug, Clone)]
pub struct Captured<B: Backend> {
    /// The tensor's shape.
    pub shape: Vec<usize>,
    /// The values, flattened.
    pub flat: Tensor<B, 1>,
}

impl<B: Backend> Captured<B> {
    /// Capture `t`.
    pub fn new<const D: usize>(t: Tensor<B, D>) -> Self {
        let shape = t.dims().to_vec();
        let n = shape.iter().product::<usize>();
        Self {
            shape,
            flat: reshape(t, [n]),
        }
    }

    /// The tensor with its original rank `D` (panics if `D` is not that rank).
    pub fn tensor<const D: usize>(&self) -> Tensor<B, D> {
        let dims: [usize; D] = self
            .shape
            .clone()
            .try_into()
            .unwrap_or_else(|_| panic!("captured tensor has rank {}", self.shape.len()));
        reshape(self.flat.clone(), dims)
    }

    /// Copy to the host with its shape.
    pub fn to_data(&self) -> TensorData {
        let data = self.flat.clone().into_data();
        TensorData {
            shape: self.shape.clone().into(),
            ..data
        }
    }
}

/// Named intermediate tensors of one forward pass (see [`WanModel::forward_with_intermediates`]).
pub type Intermediates<B> = BTreeMap<String, Captured<B>>;

/// The Wan video diffusion transformer. Field names equal the diffusers state-dict keys, so
/// the dotted path of every parameter is its key in `diffusion_pytorch_model.safetensors`.
#[derive(Module, Debug)]
pub struct WanModel<B: Backend> {
    /// Conv3d patch embedding (`patch_embedding.weight [dim, C, pt, ph, pw]`, `.bias`).
    pub patch_embedding: PatchEmbedding<B>,
    /// Timestep and text embedders.
    pub condition_embedder: ConditionEmbedder<B>,
    /// Transformer blocks.
    pub blocks: Vec<WanBlock<B>>,
    /// Output projection `dim -> pt*ph*pw*out_channels`.
    pub proj_out: Linear<B>,
    /// Output-head modulation offsets `[1, 2, dim]` (shift, scale).
    pub scale_shift_table: Param<Tensor<B, 3>>,
    /// The configuration the model was built from.
    pub config: WanConfig,
}

impl WanConfig {
    /// Build a model with seed 0 (see [`Self::init_seeded`]). Panics if the config is
    /// invalid; use [`Self::try_init`] to get the error instead.
    pub fn init<B: Backend>(&self, device: &B::Device) -> WanModel<B> {
        self.init_seeded(device, 0)
    }

    /// Build a model whose parameters are a deterministic function of `seed` (and each
    /// parameter's key): weights `N(0,1)/sqrt(fan_in)`, biases zero, norm scales one,
    /// modulation tables `N(0,1)/sqrt(dim)`. Parameters are created lazily, so loading
    /// pretrained weights afterwards never generates the random values. Panics if the
    /// config is invalid.
    pub fn init_seeded<B: Backend>(&self, device: &B::Device, seed: u64) -> WanModel<B> {
        self.try_init(device, seed)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Validate the config, then build the model as in [`Self::init_seeded`].
    pub fn try_init<B: Backend>(
        &self,
        device: &B::Device,
        seed: u64,
    ) -> Result<WanModel<B>, WanConfigError> {
        self.validate()?;
        let init = ParamInit::<B>::new(seed, device);
        let dim = self.inner_dim();
        let blocks = (0..self.num_layers)
            .map(|i| {
                WanBlock::init(
                    &init,
                    &format!("blocks.{i}"),
                    self.num_attention_heads,
                    self.attention_head_dim,
                    self.ffn_dim,
                    self.cross_attn_norm,
                    self.eps,
                )
            })
            .collect();
        Ok(WanModel {
            patch_embedding: PatchEmbedding::init(
                &init,
                "patch_embedding",
                self.in_channels,
                dim,
                self.patch_size,
            ),
            condition_embedder: ConditionEmbedder::init(
                &init,
                "condition_embedder",
                dim,
                self.freq_dim,
                self.text_dim,
            ),
            blocks,
            proj_out: Linear::init(&init, "proj_out", dim, self.out_features(), true),
            scale_shift_table: init.param(
                "scale_shift_table",
                [1, 2, dim],
                InitKind::Normal {
                    std: 1.0 / (dim as f64).sqrt(),
                },
            ),
            config: self.clone(),
        })
    }
}

/// Collects intermediates when asked to.
pub(crate) struct Recorder<'a, B: Backend>(pub(crate) Option<&'a mut Intermediates<B>>);

impl<B: Backend> Recorder<'_, B> {
    fn put<const D: usize>(&mut self, name: &str, t: &Tensor<B, D>) {
        if let Some(map) = self.0.as_mut() {
            map.insert(name.to_string(), Captured::new(t.clone()));
        }
    }
}

impl<B: Backend> WanModel<B> {
    /// The same model with every attention (self and cross) using `mode`.
    pub fn with_attention(mut self, mode: AttentionMode) -> Self {
        for block in &mut self.blocks {
            block.attn1.mode = mode;
            block.attn2.mode = mode;
        }
        self
    }

    /// The same model computing in `precision`. `Bf16` computes as a bf16 model under
    /// PyTorch mixed precision does: bfloat16 products of the float32 master weights, and
    /// bfloat16 hidden states from the patch embedding to the output projection (so the
    /// activations kept for the backward pass take half the memory). The LayerNorms with
    /// their modulation, the q/k RMSNorms and RoPE compute in float32 and round their results
    /// to bfloat16; softmax statistics, the timestep and text embeddings and the output stay
    /// float32. Parameters, gradients, optimizer state and checkpoints stay float32 either
    /// way.
    pub fn with_precision(mut self, precision: Precision) -> Self {
        for block in &mut self.blocks {
            block.attn1.precision = precision;
            block.attn2.precision = precision;
        }
        for l in self.linears_mut() {
            l.precision = precision;
        }
        self
    }

    /// The same model with the weight matrices of its linear layers stored in bfloat16, for a
    /// **frozen** role that computes in bf16 (a DMD2 teacher): the products are bitwise those
    /// of [`Self::with_precision`]`(Bf16)` (which rounds the float32 weights to bfloat16 on
    /// every forward), in half the memory for 99 % of the parameters. Biases, norms and
    /// embeddings stay float32. Not for trained roles: their weights, gradients and AdamW
    /// state stay float32.
    pub fn with_bf16_weights(mut self) -> Self {
        for l in self.linears_mut() {
            l.weight = l
                .weight
                .clone()
                .map(|w| w.cast(FloatDType::BF16))
                .set_require_grad(false);
        }
        self
    }

    /// Every linear layer: the condition embedder's, each block's attention and FFN
    /// projections, and `proj_out`.
    fn linears_mut(&mut self) -> Vec<&mut Linear<B>> {
        let c = &mut self.condition_embedder;
        let mut linears = vec![
            &mut c.time_embedder.linear_1,
            &mut c.time_embedder.linear_2,
            &mut c.time_proj,
            &mut c.text_embedder.linear_1,
            &mut c.text_embedder.linear_2,
            &mut self.proj_out,
        ];
        for block in &mut self.blocks {
            for attn in [&mut block.attn1, &mut block.attn2] {
                linears.extend([&mut attn.to_q, &mut attn.to_k, &mut attn.to_v]);
                linears.extend(attn.to_out.iter_mut());
            }
            linears.push(&mut block.ffn.net.0.proj);
            linears.push(&mut block.ffn.net.2);
        }
        linears
    }

    /// The compute precision (see [`Self::with_precision`]).
    pub fn precision(&self) -> Precision {
        self.proj_out.precision
    }

    /// The dtype of the hidden states between blocks: bfloat16 for `Bf16`, else float32.
    pub fn activation_dtype(&self) -> DType {
        self.precision().dtype()
    }

    /// Patch embedding `[B, C, F, H, W] -> [B, N, dim]` (computed in float32), in the
    /// activation dtype.
    pub(crate) fn embed_tokens(&self, hidden_states: Tensor<B, 5>) -> Tensor<B, 3> {
        to_dtype(
            self.patch_embedding.forward(hidden_states),
            self.activation_dtype(),
        )
    }

    /// The attention implementation of the first block (all blocks share it).
    pub fn attention_mode(&self) -> AttentionMode {
        self.blocks
            .first()
            .map(|b| b.attn1.mode)
            .unwrap_or_default()
    }

    /// Predict the flow-matching velocity.
    ///
    /// - `hidden_states [B, C_in, F, H, W]` noisy latents (F, H, W divisible by the patch);
    /// - `timestep [B]` float timesteps (fractional values allowed, e.g. `1000 * sigma`);
    /// - `encoder_hidden_states [B, L, text_dim]` text embeddings (no mask);
    ///
    /// returns `[B, C_out, F, H, W]`.
    pub fn forward(
        &self,
        hidden_states: Tensor<B, 5>,
        timestep: Tensor<B, 1>,
        encoder_hidden_states: Tensor<B, 3>,
    ) -> Tensor<B, 5> {
        self.run(
            hidden_states,
            timestep,
            encoder_hidden_states,
            &[],
            Recorder(None),
        )
        .0
    }

    /// [`Self::forward`] plus named intermediates, matching the golden fixture names:
    /// `patch_embed_conv [B, dim, f, h, w]`, `patch_tokens [B, N, dim]`, `rope_cos` /
    /// `rope_sin [N, head_dim]`, `timestep_sinusoid [B, freq_dim]`, `temb [B, dim]`,
    /// `timestep_proj [B, 6*dim]`, `text_embeds [B, L, dim]`, `block0.attn1_out`,
    /// `block0.attn2_out`, `block0.ffn_out` (raw sub-module outputs of block 0, before gates
    /// and residuals), `block_out.<i> [B, N, dim]`, `proj_out_in [B, N, dim]`, `proj_out
    /// [B, N, pt*ph*pw*C_out]`.
    pub fn forward_with_intermediates(
        &self,
        hidden_states: Tensor<B, 5>,
        timestep: Tensor<B, 1>,
        encoder_hidden_states: Tensor<B, 3>,
    ) -> (Tensor<B, 5>, Intermediates<B>) {
        let mut map = Intermediates::new();
        let (out, _) = self.run(
            hidden_states,
            timestep,
            encoder_hidden_states,
            &[],
            Recorder(Some(&mut map)),
        );
        (out, map)
    }

    /// [`Self::forward`] plus the hidden states `[B, N, dim]` (float32) after each block
    /// listed in `blocks` (in the order given; indices may repeat), e.g. for discriminator
    /// heads.
    /// Panics if an index is not below `num_layers`.
    pub fn forward_hidden_states(
        &self,
        hidden_states: Tensor<B, 5>,
        timestep: Tensor<B, 1>,
        encoder_hidden_states: Tensor<B, 3>,
        blocks: &[usize],
    ) -> (Tensor<B, 5>, Vec<Tensor<B, 3>>) {
        if let Some(bad) = blocks.iter().find(|&&i| i >= self.blocks.len()) {
            panic!(
                "block index {bad} out of range: the model has {} blocks",
                self.blocks.len()
            );
        }
        self.run(
            hidden_states,
            timestep,
            encoder_hidden_states,
            blocks,
            Recorder(None),
        )
    }

    /// Output head: `(table + temb).chunk(2)` -> shift, scale; `LN(x) * (1 + scale) + shift`
    /// (float32), projection (in the dtype of `x`) and unpatchify. `x [B, N, dim]`, `temb [B,
    /// dim]` -> `[B, C_out, F, H, W]` float32.
    pub(crate) fn head(
        &self,
        x: Tensor<B, 3>,
        temb: Tensor<B, 2>,
        grid: [usize; 3],
        rec: &mut Recorder<'_, B>,
    ) -> Tensor<B, 5> {
        let cfg = &self.config;
        let head = self.scale_shift_table.val() + temb.unsqueeze_dim::<3>(1);
        let shift = head.clone().narrow(1, 0, 1);
        let scale = head.narrow(1, 1, 1);
        let x = layer_norm_affine(x, scale + 1.0, shift, cfg.eps);
        rec.put("proj_out_in", &x);
        let y = to_f32(self.proj_out.forward(x));
        rec.put("proj_out", &y);
        unpatchify(y, grid, cfg.patch_size, cfg.out_channels)
    }

    fn run(
        &self,
        hidden_states: Tensor<B, 5>,
        timestep: Tensor<B, 1>,
        encoder_hidden_states: Tensor<B, 3>,
        keep: &[usize],
        mut rec: Recorder<'_, B>,
    ) -> (Tensor<B, 5>, Vec<Tensor<B, 3>>) {
        let cfg = &self.config;
        let [b, c, f_in, h_in, w_in] = hidden_states.dims();
        assert_eq!(
            c, cfg.in_channels,
            "hidden_states has {c} channels, the model expects in_channels = {}",
            cfg.in_channels
        );
        assert_eq!(timestep.dims(), [b], "timestep must have shape [{b}]");
        let [bt, _, td] = encoder_hidden_states.dims();
        assert_eq!(
            (bt, td),
            (b, cfg.text_dim),
            "encoder_hidden_states must be [{b}, L, {}]",
            cfg.text_dim
        );
        let [pt, ph, pw] = cfg.patch_size;
        let grid = [f_in / pt, h_in / ph, w_in / pw];
        let dim = cfg.inner_dim();
        let device = hidden_states.device();

        // The trained parameters join the input's autodiff graph first, so that recording
        // the forward merges no graphs (`param_graph`).
        let hidden_states = gather_params(self, hidden_states);
        // Patch embedding: [B, C, F, H, W] -> [B, N, dim].
        let mut x = self.embed_tokens(hidden_states);
        if rec.0.is_some() {
            rec.put("patch_embed_conv", &tokens_to_grid(x.clone(), grid));
            rec.put("patch_tokens", &x);
        }

        let rope = RopeTables::<B>::new(cfg, grid, &device);
        rec.put("rope_cos", &rope.cos);
        rec.put("rope_sin", &rope.sin);

        let cond = self
            .condition_embedder
            .forward(timestep, encoder_hidden_states);
        rec.put("timestep_sinusoid", &cond.timestep_sinusoid);
        rec.put("temb", &cond.temb);
        rec.put("timestep_proj", &cond.timestep_proj);
        rec.put("text_embeds", &cond.text_embeds);
        let modulation = reshape(cond.timestep_proj, [b, 6, dim]);

        let mut kept: Vec<Option<Tensor<B, 3>>> = vec![None; self.blocks.len()];
        for (i, block) in self.blocks.iter().enumerate() {
            let out =
                block.forward_detailed(x, modulation.clone(), cond.text_embeds.clone(), &rope);
            if i == 0 {
                rec.put("block0.attn1_out", &out.attn1_out);
                rec.put("block0.attn2_out", &out.attn2_out);
                rec.put("block0.ffn_out", &out.ffn_out);
            }
            x = out.hidden_states;
            rec.put(&format!("block_out.{i}"), &x);
            if keep.contains(&i) {
                kept[i] = Some(to_f32(x.clone()));
            }
        }

        let out = self.head(x, cond.temb, grid, &mut rec);

        let hidden = keep
            .iter()
            .map(|&i| kept[i].clone().expect("kept block output"))
            .collect();
        (out, hidden)
    }
}
