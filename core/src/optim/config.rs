//! Optimizer and learning-rate schedule settings (`[optimizer]`, per-role overrides).

use serde::{Deserialize, Serialize};

use crate::config::{check, ConfigError};

/// Learning-rate schedule shape after the optional linear warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleKind {
    /// Constant learning rate.
    #[default]
    Constant,
    /// Linear decay from `lr` to `min_lr_ratio·lr` at `max_steps`.
    Linear,
    /// Cosine decay from `lr` to `min_lr_ratio·lr` at `max_steps`.
    Cosine,
}

/// AdamW settings plus the learning-rate schedule of one role.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerConfig {
    /// Peak learning rate.
    #[serde(default = "default_lr")]
    pub lr: f64,
    /// Adam `(β1, β2)`.
    #[serde(default = "default_betas")]
    pub betas: [f64; 2],
    /// Adam ε.
    #[serde(default = "default_eps")]
    pub eps: f64,
    /// Decoupled weight decay.
    #[serde(default = "default_wd")]
    pub weight_decay: f64,
    /// Schedule after warm-up.
    #[serde(default)]
    pub schedule: ScheduleKind,
    /// Linear warm-up steps from 0 to `lr`.
    #[serde(default)]
    pub warmup_steps: u64,
    /// Final learning rate as a fraction of `lr` (linear / cosine schedules).
    #[serde(default)]
    pub min_lr_ratio: f64,
    /// Fused AdamW and EMA updates: on the CubeCL backends (`cuda`, `wgpu`) one kernel
    /// launch per group of up to 16 parameter tensors (the gradient norm too), the same
    /// results up to fused multiply-adds; on the CPU backends (`cpu`, `flex`) one loop over
    /// each parameter's memory, bit-identical to the tensor operations. `false` runs Burn
    /// tensor operations. No effect under Burn's `fusion` feature.
    #[serde(default = "default_fused")]
    pub fused: bool,
}

fn default_lr() -> f64 {
    1e-4
}
fn default_betas() -> [f64; 2] {
    [0.9, 0.999]
}
fn default_eps() -> f64 {
    1e-8
}
fn default_wd() -> f64 {
    0.01
}
fn default_fused() -> bool {
    true
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self {
            lr: default_lr(),
            betas: default_betas(),
            eps: default_eps(),
            weight_decay: default_wd(),
            schedule: ScheduleKind::Constant,
            warmup_steps: 0,
            min_lr_ratio: 0.0,
            fused: default_fused(),
        }
    }
}

/// The smallest `lr` and `eps` taken: well above float32's smallest normal number (about
/// 1.2e-38), so neither becomes 0 in the update.
pub const F32_SAFE_MIN: f64 = 1e-30;

/// `value` in [[`F32_SAFE_MIN`], 1].
fn float32_safe(key: &str, value: f64) -> Result<(), ConfigError> {
    check::positive_f64(key, value)?;
    if (F32_SAFE_MIN..=1.0).contains(&value) {
        return Ok(());
    }
    Err(ConfigError::new(
        key,
        format!("expected a number in [1e-30, 1] (the update runs in float32), got {value:e}"),
    ))
}

impl OptimizerConfig {
    /// Check ranges; keys are relative to the optimizer section.
    pub fn validate(&self) -> Result<(), ConfigError> {
        // The update runs in float32: a value below ~1e-38 would become 0 there (an `eps` of
        // 0 divides 0 by 0 where a gradient is 0, and NaN weights follow), one above ~3e38
        // infinity. Bounded to what any recipe uses; lr ≤ 1 also keeps `1 − lr·weight_decay`
        // positive.
        float32_safe("lr", self.lr)?;
        check::in_half_open("betas[0]", self.betas[0], 0.0, 1.0)?;
        check::in_half_open("betas[1]", self.betas[1], 0.0, 1.0)?;
        float32_safe("eps", self.eps)?;
        check::in_range("weight_decay", self.weight_decay, 0.0, 1.0)?;
        check::in_range("min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)?;
        Ok(())
    }

    /// Learning rate at global step `step` (0-based) of a run of `max_steps` steps.
    pub fn lr_at(&self, step: u64, max_steps: u64) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let span = max_steps.saturating_sub(self.warmup_steps).max(1) as f64;
        let progress = ((step - self.warmup_steps) as f64 / span).clamp(0.0, 1.0);
        let min = self.lr * self.min_lr_ratio;
        match self.schedule {
            ScheduleKind::Constant => self.lr,
            ScheduleKind::Linear => self.lr + (min - self.lr) * progress,
            ScheduleKind::Cosine => {
                min + (self.lr - min) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        }
    }
}

/// A partial optimizer table: any field given replaces the base value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerPatch {
    /// See [`OptimizerConfig::lr`].
    pub lr: Option<f64>,
    /// See [`OptimizerConfig::betas`].
    pub betas: Option<[f64; 2]>,
    /// See [`OptimizerConfig::eps`].
    pub eps: Option<f64>,
    /// See [`OptimizerConfig::weight_decay`].
    pub weight_decay: Option<f64>,
    /// See [`OptimizerConfig::schedule`].
    pub schedule: Option<ScheduleKind>,
    /// See [`OptimizerConfig::warmup_steps`].
    pub warmup_steps: Option<u64>,
    /// See [`OptimizerConfig::min_lr_ratio`].
    pub min_lr_ratio: Option<f64>,
    /// See [`OptimizerConfig::fused`].
    pub fused: Option<bool>,
}

impl OptimizerPatch {
    /// Check the ranges of the given fields (as [`OptimizerConfig::validate`] does); keys are
    /// relative to the patch's table.
    pub fn validate(&self) -> Result<(), ConfigError> {
        // The defaults are in range, so any error names a field of the patch.
        self.apply(&OptimizerConfig::default()).validate()
    }

    /// `base` with every given field replaced.
    pub fn apply(&self, base: &OptimizerConfig) -> OptimizerConfig {
        OptimizerConfig {
            lr: self.lr.unwrap_or(base.lr),
            betas: self.betas.unwrap_or(base.betas),
            eps: self.eps.unwrap_or(base.eps),
            weight_decay: self.weight_decay.unwrap_or(base.weight_decay),
            schedule: self.schedule.unwrap_or(base.schedule),
            warmup_steps: self.warmup_steps.unwrap_or(base.warmup_steps),
            min_lr_ratio: self.min_lr_ratio.unwrap_or(base.min_lr_ratio),
            fused: self.fused.unwrap_or(base.fused),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_match_hand_values() {
        let mut c = OptimizerConfig {
            lr: 1.0,
            warmup_steps: 4,
            ..Default::default()
        };
        assert_eq!(c.lr_at(0, 100), 0.25);
        assert_eq!(c.lr_at(3, 100), 1.0);
        assert_eq!(c.lr_at(50, 100), 1.0);
        c.schedule = ScheduleKind::Linear;
        c.min_lr_ratio = 0.5;
        assert!((c.lr_at(4 + 48, 100) - 0.75).abs() < 1e-12);
        c.schedule = ScheduleKind::Cosine;
        c.min_lr_ratio = 0.0;
        assert!((c.lr_at(4 + 48, 100) - 0.5).abs() < 1e-12);
        assert!(c.lr_at(100, 100).abs() < 1e-12);
    }

    #[test]
    fn patch_overrides_only_given_fields() {
        let base = OptimizerConfig::default();
        let p = OptimizerPatch {
            lr: Some(5e-5),
            ..Default::default()
        };
        let r = p.apply(&base);
        assert_eq!(r.lr, 5e-5);
        assert_eq!(r.betas, base.betas);
        p.validate().unwrap();
    }

    #[test]
    fn patch_fields_are_range_checked() {
        for (patch, key) in [
            (
                OptimizerPatch {
                    lr: Some(-1.0),
                    ..Default::default()
                },
                "`lr`",
            ),
            (
                OptimizerPatch {
                    betas: Some([0.9, 1.5]),
                    ..Default::default()
                },
                "`betas[1]`",
            ),
            (
                OptimizerPatch {
                    eps: Some(0.0),
                    ..Default::default()
                },
                "`eps`",
            ),
            (
                OptimizerPatch {
                    weight_decay: Some(2.0),
                    ..Default::default()
                },
                "`weight_decay`",
            ),
            // Values that float32 would turn into 0 or infinity.
            (
                OptimizerPatch {
                    eps: Some(1e-50),
                    ..Default::default()
                },
                "`eps`: expected a number in [1e-30, 1] (the update runs in float32), got 1e-50",
            ),
            (
                OptimizerPatch {
                    lr: Some(1e39),
                    ..Default::default()
                },
                "`lr`",
            ),
        ] {
            let e = patch.validate().expect_err("out of range").to_string();
            assert!(e.contains(key), "missing {key} in: {e}");
        }
    }
}
