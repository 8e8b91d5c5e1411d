//! The `[method] kind = "dmd2"` configuration: fields, defaults and validation.

use serde::{Deserialize, Serialize};

use reel_core::config::{check, ConfigError};
use reel_core::flow::shift_sigma;
use reel_core::method::MethodConfig;
use reel_core::model::ModelInfo;
use reel_core::optim::OptimizerPatch;
use reel_core::role::RoleRequirement;

use super::loss::CfgForm;
use super::rollout::DenoisingSchedule;
use crate::adversarial::{GanLoss, HeadsConfig};

/// Where the point the student denoises comes from (FastVideo `rollout_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Rollout {
    /// From pure noise through the student's own few-step trajectory (text-only data works).
    #[default]
    Simulate,
    /// A data latent noised to a listed step.
    DataLatent,
}

/// `[method] kind = "dmd2"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dmd2Config {
    /// How the student's input is produced: `"simulate"` (default) or `"data_latent"`.
    #[serde(default)]
    pub rollout: Rollout,
    /// The student's model timesteps, strictly decreasing, each in `1..=1000` (FastVideo
    /// `dmd_denoising_steps`; default `[1000, 750, 500, 250]`).
    #[serde(default = "default_steps")]
    pub denoising_steps: Vec<u32>,
    /// Map the listed timesteps through the shifted schedule (`σ = shift(t/1000)`) instead of
    /// `σ = t/1000` (FastVideo `warp_denoising_step`; default false).
    #[serde(default)]
    pub warp_denoising_steps: bool,
    /// Timestep shift of the score σ (and of warped steps). Default 3 (FastVideo's Wan
    /// `flow_shift` default; its Wan DMD2 example sets 8).
    #[serde(default = "default_shift")]
    pub shift: f64,
    /// Guidance of the teacher's real score (FastVideo `real_score_guidance_scale`; default
    /// 4.5, its Wan example).
    #[serde(default = "default_guidance")]
    pub guidance_scale: f64,
    /// CFG parameterisation of the real score: `"uncond"` (default, `uncond + g·(cond −
    /// uncond)`) or `"legacy"` (`cond + g·(cond − uncond)`).
    #[serde(default)]
    pub cfg_form: CfgForm,
    /// Lower bound of the score σ as a fraction of the schedule (default 0.02).
    #[serde(default = "default_min_ratio")]
    pub min_timestep_ratio: f64,
    /// Upper bound of the score σ (default 0.98).
    #[serde(default = "default_max_ratio")]
    pub max_timestep_ratio: f64,
    /// The student updates on steps with `step % generator_update_interval == 0` (0-based;
    /// default 5). The critic updates every step.
    #[serde(default = "default_interval")]
    pub generator_update_interval: u64,
    /// Critic optimizer settings on top of `[optimizer]` (FastVideo `fake_score_*`); a
    /// `[models.critic.optimizer]` table still overrides these.
    #[serde(default)]
    pub critic_optimizer: Option<OptimizerPatch>,
    /// Default sampling steps for validation / `reel sample` (default: all listed steps; at
    /// most that many).
    #[serde(default)]
    pub sample_steps: Option<usize>,
    /// Weight of the adversarial term added to the student's loss (DMD2's GAN loss):
    /// discriminator heads on the critic's hidden states judge the student's sample, noised
    /// to a score σ. Default 0 = off; set together with `gan_discriminator_weight`.
    #[serde(default)]
    pub gan_generator_weight: f64,
    /// Weight of the discriminator loss (real data latents vs the student's samples, noised
    /// to the same score σ) added to the critic's loss; it trains the heads (role
    /// `discriminator`, critic optimizer settings) and the critic's backbone, as in DMD2.
    /// Default 0 = off.
    #[serde(default)]
    pub gan_discriminator_weight: f64,
    /// `"hinge"` (default) or `"non_saturating"`.
    #[serde(default)]
    pub gan_loss: GanLoss,
    /// Discriminator heads on the critic: `{ stride = 4, hidden = 256 }` or `{ blocks = [..] }`.
    #[serde(default)]
    pub gan_heads: HeadsConfig,
}

fn default_steps() -> Vec<u32> {
    vec![1000, 750, 500, 250]
}
fn default_shift() -> f64 {
    3.0
}
fn default_guidance() -> f64 {
    4.5
}
fn default_min_ratio() -> f64 {
    0.02
}
fn default_max_ratio() -> f64 {
    0.98
}
fn default_interval() -> u64 {
    5
}

impl Default for Dmd2Config {
    fn default() -> Self {
        Self {
            rollout: Rollout::Simulate,
            denoising_steps: default_steps(),
            warp_denoising_steps: false,
            shift: default_shift(),
            guidance_scale: default_guidance(),
            cfg_form: CfgForm::Uncond,
            min_timestep_ratio: default_min_ratio(),
            max_timestep_ratio: default_max_ratio(),
            generator_update_interval: default_interval(),
            critic_optimizer: None,
            sample_steps: None,
            gan_generator_weight: 0.0,
            gan_discriminator_weight: 0.0,
            gan_loss: GanLoss::default(),
            gan_heads: HeadsConfig::default(),
        }
    }
}

impl Dmd2Config {
    /// Whether the student (generator) updates at 0-based global step `step`.
    pub fn generator_due(&self, step: u64) -> bool {
        step.is_multiple_of(self.generator_update_interval.max(1))
    }

    /// The student's schedule.
    pub fn schedule(&self) -> DenoisingSchedule {
        DenoisingSchedule::new(&self.denoising_steps, self.warp_denoising_steps, self.shift)
    }

    /// A score σ from a uniform draw `u ∈ [0, 1)`: shifted, then clamped to
    /// `[min_timestep_ratio, max_timestep_ratio]` (FastVideo `_sample_score_timestep`).
    pub fn score_sigma(&self, u: f64) -> f64 {
        shift_sigma(u, self.shift).clamp(self.min_timestep_ratio, self.max_timestep_ratio)
    }

    /// Whether the adversarial terms are on (both GAN weights > 0).
    pub fn gan_enabled(&self) -> bool {
        self.gan_generator_weight > 0.0 && self.gan_discriminator_weight > 0.0
    }

    /// Default number of sampling steps.
    pub fn default_sample_steps(&self) -> usize {
        self.sample_steps.unwrap_or(self.denoising_steps.len())
    }
}

#[reel_core::plugin(
    name = "dmd2",
    summary = "DMD2 distillation: few-step student vs frozen teacher (real score) and trained critic (fake score)"
)]
impl MethodConfig for Dmd2Config {
    fn validate(&self) -> Result<(), ConfigError> {
        let steps = &self.denoising_steps;
        if steps.is_empty() {
            return Err(ConfigError::new(
                "denoising_steps",
                "expected at least one timestep",
            ));
        }
        for (i, &t) in steps.iter().enumerate() {
            if !(1..=1000).contains(&t) {
                return Err(ConfigError::new(
                    format!("denoising_steps[{i}]"),
                    format!("expected a timestep in 1..=1000, got {t}"),
                ));
            }
            if i > 0 && t >= steps[i - 1] {
                return Err(ConfigError::new(
                    format!("denoising_steps[{i}]"),
                    format!(
                        "timesteps must be strictly decreasing, got {} then {t}",
                        steps[i - 1]
                    ),
                ));
            }
        }
        check::positive_f64("shift", self.shift)?;
        check::non_negative_f64("guidance_scale", self.guidance_scale)?;
        check::in_range("min_timestep_ratio", self.min_timestep_ratio, 0.0, 1.0)?;
        check::in_range("max_timestep_ratio", self.max_timestep_ratio, 0.0, 1.0)?;
        if self.max_timestep_ratio == 0.0 {
            return Err(ConfigError::new(
                "max_timestep_ratio",
                "must be above 0: at a score σ of 0 the critic's, the teacher's and the data's \
                 x0 agree, and the DMD gradient is 0 at every step",
            ));
        }
        if self.min_timestep_ratio > self.max_timestep_ratio {
            return Err(ConfigError::new(
                "min_timestep_ratio",
                format!(
                    "must not exceed max_timestep_ratio ({} > {})",
                    self.min_timestep_ratio, self.max_timestep_ratio
                ),
            ));
        }
        check::positive_u64("generator_update_interval", self.generator_update_interval)?;
        if let Some(p) = &self.critic_optimizer {
            p.validate().map_err(|e| e.in_section("critic_optimizer"))?;
        }
        check::non_negative_f64("gan_generator_weight", self.gan_generator_weight)?;
        check::non_negative_f64("gan_discriminator_weight", self.gan_discriminator_weight)?;
        if (self.gan_generator_weight > 0.0) != (self.gan_discriminator_weight > 0.0) {
            let (set, unset) = if self.gan_generator_weight > 0.0 {
                ("gan_generator_weight", "gan_discriminator_weight")
            } else {
                ("gan_discriminator_weight", "gan_generator_weight")
            };
            return Err(ConfigError::new(
                unset,
                format!("expected a number > 0 when `{set}` is set (the adversarial terms are used together)"),
            ));
        }
        self.gan_heads
            .validate()
            .map_err(|e| e.in_section("gan_heads"))?;
        if let Some(n) = self.sample_steps {
            check::sampling_steps("sample_steps", n)?;
            if n > steps.len() {
                return Err(ConfigError::new(
                    "sample_steps",
                    format!(
                        "at most the {} entries of denoising_steps, got {n}",
                        steps.len()
                    ),
                ));
            }
        }
        Ok(())
    }

    fn roles(&self) -> Vec<RoleRequirement> {
        vec![
            RoleRequirement::trainable("student"),
            RoleRequirement::frozen("teacher"),
            RoleRequirement::trainable("critic"),
        ]
    }

    /// The student samples with its `denoising_steps`, no more.
    fn max_sampling_steps(&self) -> Option<(usize, &'static str)> {
        Some((self.denoising_steps.len(), "denoising_steps"))
    }

    /// The student and the critic can each be block-checkpointed (the GAN terms' judge
    /// forwards through the critic are not).
    fn supports_gradient_checkpointing(&self) -> bool {
        true
    }

    /// With the GAN terms on, the heads' blocks exist in the critic (their feature network).
    fn check_models(&self, info: &dyn Fn(&str) -> Option<ModelInfo>) -> Result<(), ConfigError> {
        let critic = info("critic").filter(|_| self.gan_enabled());
        (self.gan_heads.check_feature_network(critic)).map_err(|e| e.in_section("gan_heads"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &str) -> Result<Dmd2Config, String> {
        let c: Dmd2Config = toml::from_str(extra).map_err(|e| e.to_string())?;
        MethodConfig::validate(&c).map_err(|e| e.to_string())?;
        Ok(c)
    }

    #[test]
    fn defaults_and_cadence() {
        let c = parse("").unwrap();
        assert_eq!(c, Dmd2Config::default());
        assert_eq!(c.default_sample_steps(), 4);
        let due: Vec<u64> = (0..11).filter(|&s| c.generator_due(s)).collect();
        assert_eq!(due, vec![0, 5, 10]);
        assert!((c.score_sigma(0.0) - 0.02).abs() < 1e-12);
        assert!((c.score_sigma(0.999_999) - 0.98).abs() < 1e-12);
        assert!((c.score_sigma(0.5) - 0.75).abs() < 1e-12);
    }

    #[test]
    fn bad_values_name_their_keys() {
        for (text, key) in [
            ("denoising_steps = []", "`denoising_steps`"),
            ("denoising_steps = [1000, 1000]", "`denoising_steps[1]`"),
            ("denoising_steps = [1001]", "`denoising_steps[0]`"),
            ("shift = 0.0", "`shift`"),
            ("guidance_scale = -1.0", "`guidance_scale`"),
            (
                "min_timestep_ratio = 0.9\nmax_timestep_ratio = 0.5",
                "`min_timestep_ratio`",
            ),
            ("max_timestep_ratio = 1.5", "`max_timestep_ratio`"),
            (
                "generator_update_interval = 0",
                "`generator_update_interval`",
            ),
            ("critic_optimizer = { lr = -1.0 }", "`critic_optimizer.lr`"),
            ("sample_steps = 5", "`sample_steps`"),
            ("gan_generator_weight = -1.0", "`gan_generator_weight`"),
            ("gan_generator_weight = 0.5", "`gan_discriminator_weight`"),
            ("gan_discriminator_weight = 0.5", "`gan_generator_weight`"),
            (
                "gan_generator_weight = 1.0\ngan_discriminator_weight = 1.0\ngan_heads = { hidden = 0 }",
                "`gan_heads.hidden`",
            ),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(key), "{text}: {e}");
        }
        assert!(parse("rollout = \"data\"").is_err());
        assert!(parse("cfg_form = \"legacy\"\nrollout = \"data_latent\"").is_ok());
        assert!(parse("unknown = 1").is_err());
        assert!(parse("gan_heads = { strides = 2 }").is_err());
        let gan = parse("gan_generator_weight = 0.1\ngan_discriminator_weight = 0.1\ngan_loss = \"non_saturating\"").unwrap();
        assert!(gan.gan_enabled());
        assert!(!Dmd2Config::default().gan_enabled());
    }
}
