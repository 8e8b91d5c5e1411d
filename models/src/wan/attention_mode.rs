//! [`AttentionMode`]: which attention implementation a Wan role runs
//! (`[models.<role>] attention = "..."`).

use serde::{Deserialize, Serialize};

/// Query length from which [`AttentionMode::Auto`] switches to the memory-efficient kernel.
pub const AUTO_MIN_TOKENS: usize = 1024;

/// Which attention implementation the model uses (`[models.<role>] attention = "..."`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionMode {
    /// Memory-efficient when the query has at least [`AUTO_MIN_TOKENS`] tokens, plain below.
    #[default]
    Auto,
    /// Always the plain `softmax(QKᵀ/√d)·V` (materialises the score matrix).
    Naive,
    /// Always the blocked kernel with its own backward.
    MemoryEfficient,
    /// Reel's fused CubeCL attention kernels (forward and backward) on the `cuda` and `wgpu`
    /// backends, with or without Burn's fusion layer (cargo feature `fusion`); the
    /// memory-efficient blocked version on every other backend.
    Fused,
    /// [`Self::Fused`] on tensor cores where the device has them: bf16/f16 attention runs
    /// Reel's tiled tensor-core kernels (`fused_attention::tiled`) for the forward, with or
    /// without gradients, and the backward; float32 forwards no gradient flows through (a
    /// frozen teacher, DMD2's rollouts and critic scoring, sampling) run Burn's flash
    /// attention kernel (`cubek-attention`: float16 tiles, float32 accumulation; not under
    /// Burn's `fusion` feature); everything else runs the fused kernels. In a `cuda` build the
    /// bf16/f16 attention runs on NVIDIA's cuDNN (`fused_attention::cudnn`) where it can, unless
    /// `REEL_FLASH=reel`.
    Flash,
}

impl AttentionMode {
    /// Whether this mode uses the memory-efficient kernel for `seq_q` query tokens.
    pub fn use_memory_efficient(self, seq_q: usize) -> bool {
        match self {
            AttentionMode::Auto => seq_q >= AUTO_MIN_TOKENS,
            AttentionMode::Naive => false,
            AttentionMode::MemoryEfficient | AttentionMode::Fused | AttentionMode::Flash => true,
        }
    }
}
