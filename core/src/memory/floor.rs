//! The memory a run's roles hold on each device whatever its step does, counted from the
//! config alone: a model too large for the device (a 14B preset on one 80 GB GPU, trained
//! in full) is refused before any weight is read, where it would otherwise fail with an
//! out-of-memory panic after minutes of loading.
//!
//! The count is a floor, not an estimate of the peak: it holds what every step must keep
//! (weights, AdamW's moments, one role's backward) and none of what
//! a step allocates and frees (the intermediates of a block, attention workspaces, the
//! frozen roles' forwards, the allocator's slack). The callbacks' copies of trained weights
//! (an EMA's shadow) are counted. See docs/performance.md, "What a run needs in memory", for
//! the floor against measured peaks.

use std::fmt;

use super::{gib, size, Available};
use crate::config::{ConfigError, Precision};

/// How a role's weights are trained, which decides what it holds per parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Training {
    /// Not trained (`trainable = false`): its weights only, bfloat16 ones under
    /// `dtype = "bf16"` (at least 2 bytes a parameter then, 4 otherwise).
    Frozen,
    /// Trained through an adapter: float32 base weights (4 bytes a parameter), and the
    /// adapter's own parameters ([`RoleState::adapter_params`]) as a role trained in full.
    Adapter,
    /// Trained in full: float32 weights, gradients and AdamW's two moments (16 bytes a
    /// parameter).
    Full,
}

/// One role as the floor counts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleState {
    /// The role's name (`student`).
    pub name: String,
    /// Parameters of its model, an adapter's not counted; `None` when its architecture does
    /// not tell them from the config ([`crate::model::ModelConfig::num_params`]).
    pub params: Option<u64>,
    /// Parameters of its adapter (0 without one, or when the architecture does not tell them:
    /// [`crate::model::ModelConfig::num_adapter_params`]), each held as float32 weights,
    /// gradients and two AdamW moments.
    pub adapter_params: u64,
    /// How it is trained.
    pub training: Training,
    /// Bytes of the hidden states its backward keeps at least on one device: each block's
    /// input (`batch × tokens × hidden` values, in the run's activation precision), which
    /// gradient checkpointing keeps too. Zero for a frozen role, and for an adapter role
    /// without checkpointing (its frozen blocks before the first adapted one keep nothing).
    /// Saturates at `u128::MAX`.
    pub block_inputs: u128,
    /// Whether a callback keeps a float32 copy of its trained weights (an EMA's shadow): of
    /// every parameter for a role trained in full, of the adapter's for an adapter role.
    pub copied: bool,
}

/// What the roles hold on each device for a whole run, by part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryFloor {
    /// Every role's weights.
    pub weights: u128,
    /// AdamW's two float32 moments of every role trained in full.
    pub moments: u128,
    /// The callbacks' float32 copies of trained weights (EMA shadows).
    pub copies: u128,
    /// The largest backward (the roles run theirs one after another): a role's float32
    /// gradients or its blocks' kept inputs, whichever is larger (a backward frees each
    /// block's input as it makes that block's gradients), or both under gradient
    /// accumulation (the earlier micro-batches' gradients wait through the next backward).
    pub backward: u128,
    /// The role of [`Self::backward`] (`None` without a trained role).
    pub backward_role: Option<String>,
    /// Roles whose size is unknown, left out.
    pub uncounted: Vec<String>,
    /// Bytes of frozen float32 weights that `runtime.dtype = "bf16"` would halve (zero in a
    /// bf16 run), for the error's advice.
    pub frozen_f32: u128,
    /// Bytes of the moments that belong to adapters (part of [`Self::moments`]), for the
    /// error's advice: a lower rank, where a role trained in full would take an adapter.
    pub adapter_moments: u128,
}

impl MemoryFloor {
    /// The floor of `roles` in a run computing in `precision`, `accumulating` gradients over
    /// several micro-batches or not.
    pub fn of(roles: &[RoleState], precision: Precision, accumulating: bool) -> Self {
        let mut floor = Self {
            weights: 0,
            moments: 0,
            copies: 0,
            backward: 0,
            backward_role: None,
            uncounted: vec![],
            frozen_f32: 0,
            adapter_moments: 0,
        };
        for role in roles {
            let Some(p) = role.params.map(u128::from) else {
                floor.uncounted.push(role.name.clone());
                continue;
            };
            // Bytes a parameter of the model itself holds as weights.
            let weight_bytes = match role.training {
                Training::Frozen if precision == Precision::Bf16 => 2,
                _ => 4,
            };
            // The parameters trained (all, an adapter's, or none): float32 weights (the
            // adapter's on top of the base), gradients, two moments, the EMA's copy.
            let trained = match role.training {
                Training::Frozen => 0,
                Training::Adapter => u128::from(role.adapter_params),
                Training::Full => p,
            };
            let extra_weights = match role.training {
                Training::Adapter => trained * 4,
                _ => 0,
            };
            let weights = (p * weight_bytes).saturating_add(extra_weights);
            floor.weights = floor.weights.saturating_add(weights);
            if role.training == Training::Frozen && weight_bytes == 4 {
                floor.frozen_f32 = floor.frozen_f32.saturating_add(p * 4);
            }
            floor.moments = floor.moments.saturating_add(trained.saturating_mul(8));
            if role.training == Training::Adapter {
                floor.adapter_moments = (floor.adapter_moments).saturating_add(trained * 8);
            }
            if role.copied {
                floor.copies = floor.copies.saturating_add(trained.saturating_mul(4));
            }
            let gradients = trained.saturating_mul(4);
            let backward = match accumulating {
                true => gradients.saturating_add(role.block_inputs),
                false => gradients.max(role.block_inputs),
            };
            if role.training != Training::Frozen && backward > floor.backward {
                floor.backward = backward;
                floor.backward_role = Some(role.name.clone());
            }
        }
        floor
    }

    /// Bytes of all parts (at most `u128::MAX`).
    pub fn total(&self) -> u128 {
        self.weights
            .saturating_add(self.moments)
            .saturating_add(self.copies)
            .saturating_add(self.backward)
    }

    /// Refuse a floor that `available` cannot hold for each of the workers sharing it: an
    /// error keyed `models` naming the parts, the memory and what would make it fit.
    pub fn check(&self, available: &Available) -> Result<(), ConfigError> {
        let need = self.total().saturating_mul(u128::from(available.workers));
        if need <= u128::from(available.bytes) {
            return Ok(());
        }
        let workers = match available.workers {
            1 => String::new(),
            n => format!(", {} for the {n} workers sharing it", gib(need)),
        };
        Err(ConfigError::new(
            "models",
            format!(
                "the roles need {self}{workers}, more than the {} of {}; to fit: {}",
                gib(u128::from(available.bytes)),
                available.of,
                self.advice(available.workers).join("; ")
            ),
        ))
    }

    /// What would lower the floor, as far as its parts tell.
    fn advice(&self, workers: u64) -> Vec<String> {
        let mut advice = vec!["train fewer or smaller roles".to_string()];
        if self.moments > self.adapter_moments {
            advice.push("train a LoRA adapter instead of a whole model".into());
        }
        if self.adapter_moments > 0 {
            advice.push("a lower LoRA `rank` (an adapter's parameters grow with it)".into());
        }
        if self.backward_role.is_some() {
            advice.push(
                "fewer tokens per device (`data.batch_size`, the clips' frames and size)".into(),
            );
        }
        if self.frozen_f32 > 0 {
            advice.push(format!(
                "`runtime.dtype = \"bf16\"` (frozen roles keep bfloat16 weights: {} less)",
                gib(self.frozen_f32 / 2)
            ));
        }
        if workers > 1 {
            advice.push("fewer workers sharing this memory".into());
        }
        advice
    }
}

impl fmt::Display for MemoryFloor {
    /// `at least 21.2 GiB per device (weights 5.3 GiB, AdamW moments 10.6 GiB, `student`'s
    /// backward 5.3 GiB)`, and the roles left out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.total() == u128::MAX {
            return write!(f, "more bytes per device than can be counted");
        }
        write!(
            f,
            "at least {} per device (weights {}",
            size(self.total()),
            size(self.weights)
        )?;
        if self.moments > 0 {
            write!(f, ", AdamW moments {}", size(self.moments))?;
        }
        if self.copies > 0 {
            write!(f, ", EMA copies {}", size(self.copies))?;
        }
        if let Some(role) = &self.backward_role {
            write!(f, ", `{role}`'s backward {}", size(self.backward))?;
        }
        write!(f, ")")?;
        if !self.uncounted.is_empty() {
            let names: Vec<String> = self.uncounted.iter().map(|n| format!("`{n}`")).collect();
            write!(f, "; not counted: {} (size unknown)", names.join(", "))?;
        }
        Ok(())
    }
}

/// Bytes of the inputs a trained role's blocks keep: `batch × tokens × hidden × blocks`
/// values of `precision`'s activations (bfloat16 under `bf16`, else float32). `None`: more
/// than a `u128` counts.
pub fn block_input_bytes(
    batch: usize,
    tokens: usize,
    hidden: usize,
    blocks: usize,
    precision: Precision,
) -> Option<u128> {
    let bytes = match precision {
        Precision::Bf16 => 2,
        Precision::F32 => 4,
    };
    [batch, tokens, hidden, blocks]
        .iter()
        .try_fold(bytes, |acc: u128, &d| acc.checked_mul(d as u128))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(name: &str, params: u64, training: Training, block_inputs: u128) -> RoleState {
        RoleState {
            name: name.into(),
            params: Some(params),
            adapter_params: 0,
            training,
            block_inputs,
            copied: false,
        }
    }

    #[test]
    fn each_kind_of_role_holds_its_bytes_and_one_backward_counts() {
        let p = 1000;
        let roles = [
            role("student", p, Training::Full, 6000),
            role("critic", 2 * p, Training::Full, 100),
            role("teacher", 3 * p, Training::Frozen, 0),
        ];
        let f32 = MemoryFloor::of(&roles, Precision::F32, false);
        assert_eq!(f32.weights, 4 * (p + 2 * p + 3 * p) as u128);
        assert_eq!(f32.moments, 8 * 3 * p as u128);
        // The critic's 8000 bytes of gradients outweigh the student's 6000 of block inputs
        // (and its 4000 of gradients): a backward holds the larger of the two.
        assert_eq!(f32.backward, 4 * 2 * p as u128);
        assert_eq!(f32.backward_role.as_deref(), Some("critic"));
        assert_eq!(f32.total(), f32.weights + f32.moments + f32.backward);
        // Accumulating, the student's 4000 + 6000 hold together and are the largest.
        let acc = MemoryFloor::of(&roles, Precision::F32, true);
        assert_eq!(acc.backward, 4 * p as u128 + 6000);
        assert_eq!(acc.backward_role.as_deref(), Some("student"));
        // Under bf16 the frozen teacher's weights halve; the trained roles keep float32.
        let bf16 = MemoryFloor::of(&roles, Precision::Bf16, false);
        assert_eq!(f32.weights - bf16.weights, 2 * 3 * p as u128);
        assert_eq!(bf16.moments, f32.moments);
        assert_eq!((f32.frozen_f32, bf16.frozen_f32), (4 * 3 * p as u128, 0));

        // An EMA of the student: one float32 copy; of an adapter role, the adapter's.
        let mut followed = roles.clone();
        followed[0].copied = true;
        let ema = MemoryFloor::of(&followed, Precision::F32, false);
        assert_eq!(ema.copies, 4 * p as u128);
        assert_eq!(ema.total() - f32.total(), 4 * p as u128);
        assert!(ema.to_string().contains("EMA copies"), "{ema}");

        let mut lora = [role("student", p, Training::Adapter, 500)];
        lora[0].copied = true;
        let floor = MemoryFloor::of(&lora, Precision::Bf16, false);
        assert_eq!(
            (floor.weights, floor.moments, floor.backward),
            (4000, 0, 500)
        );
        assert_eq!(floor.copies, 0);
        // 200 adapter parameters: float32 weights, moments, gradients and the EMA's copy.
        lora[0].adapter_params = 200;
        let floor = MemoryFloor::of(&lora, Precision::Bf16, false);
        assert_eq!((floor.weights, floor.moments), (4000 + 800, 1600));
        assert_eq!((floor.copies, floor.backward), (800, 800));
    }

    #[test]
    fn roles_of_unknown_size_are_named_and_left_out() {
        let mut unknown = role("critic", 0, Training::Full, 0);
        unknown.params = None;
        let floor = MemoryFloor::of(
            &[role("student", 10, Training::Full, 0), unknown],
            Precision::F32,
            false,
        );
        assert_eq!(floor.total(), 160);
        assert_eq!(floor.uncounted, ["critic"]);
        let text = floor.to_string();
        assert!(text.contains("not counted: `critic`"), "{text}");
        assert!(text.contains("`student`'s backward"), "{text}");
    }

    #[test]
    fn a_floor_above_the_memory_is_refused_with_its_parts_and_advice() {
        let gib = 1u64 << 30;
        let floor = MemoryFloor::of(
            &[role("student", 2 * gib, Training::Full, 0)],
            Precision::F32,
            false,
        );
        let fits = |bytes, workers| Available {
            bytes,
            of: "device 0 (a GPU)".into(),
            workers,
        };
        floor.check(&fits(32 * gib, 1)).unwrap();
        let e = floor.check(&fits(32 * gib - 1, 1)).unwrap_err();
        assert_eq!(e.key, "models");
        for want in [
            "at least 32.0 GiB per device",
            "weights 8.0 GiB",
            "AdamW moments 16.0 GiB",
            "`student`'s backward 8.0 GiB",
            "more than the 32.0 GiB of device 0 (a GPU)",
            "LoRA",
            "`data.batch_size`",
        ] {
            assert!(e.message.contains(want), "missing {want:?} in {e}");
        }
        for not in ["bf16", "workers"] {
            assert!(!e.message.contains(not), "no frozen role, one worker: {e}");
        }
        // Two workers on one device need twice the bytes, and fewer would help.
        let e = floor.check(&fits(40 * gib, 2)).unwrap_err();
        assert!(e.message.contains("64.0 GiB for the 2 workers"), "{e}");
        assert!(e.message.contains("fewer workers"), "{e}");
        // A frozen float32 role beside an adapter: bf16 would halve its weights, and LoRA is
        // not advised again.
        let with_teacher = MemoryFloor::of(
            &[
                role("student", 4 * gib, Training::Adapter, 0),
                role("teacher", 8 * gib, Training::Frozen, 0),
            ],
            Precision::F32,
            false,
        );
        let e = with_teacher.check(&fits(32 * gib, 1)).unwrap_err();
        assert!(e.message.contains("`runtime.dtype = \"bf16\"`"), "{e}");
        assert!(e.message.contains("16.0 GiB less"), "{e}");
        assert!(!e.message.contains("LoRA"), "{e}");
        // An adapter too large itself: a lower rank, not "train a LoRA adapter".
        let mut big = role("student", gib, Training::Adapter, 0);
        big.adapter_params = 2 * gib;
        let e = MemoryFloor::of(&[big], Precision::F32, false)
            .check(&fits(32 * gib, 1))
            .unwrap_err();
        assert!(e.message.contains("a lower LoRA `rank`"), "{e}");
        assert!(!e.message.contains("instead of a whole model"), "{e}");
    }

    #[test]
    fn a_floor_past_any_count_says_so() {
        let floor = MemoryFloor::of(
            &[role("student", 1, Training::Full, u128::MAX)],
            Precision::F32,
            true,
        );
        assert_eq!(floor.total(), u128::MAX);
        assert_eq!(
            floor.to_string(),
            "more bytes per device than can be counted"
        );
    }

    #[test]
    fn block_inputs_count_every_block_in_the_activation_precision() {
        let f32 = block_input_bytes(2, 8190, 1536, 30, Precision::F32).unwrap();
        assert_eq!(f32, 4 * 2 * 8190 * 1536 * 30);
        let bf16 = block_input_bytes(2, 8190, 1536, 30, Precision::Bf16).unwrap();
        assert_eq!(2 * bf16, f32);
        assert_eq!(
            block_input_bytes(usize::MAX, usize::MAX, usize::MAX, 2, Precision::F32),
            None
        );
    }
}
