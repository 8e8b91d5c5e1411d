//! The `[method] kind = "adversarial"` configuration: fields, defaults and validation.

use serde::{Deserialize, Serialize};

use reel_core::config::{check, ConfigError};
use reel_core::flow::TimestepDensity;
use reel_core::method::MethodConfig;
use reel_core::model::ModelInfo;
use reel_core::optim::OptimizerPatch;
use reel_core::role::RoleRequirement;

use super::heads::HeadsConfig;
use super::loss::GanLoss;

/// `[method] kind = "adversarial"`: the student learns from discriminator heads on the frozen
/// teacher's hidden states (optionally plus flow matching); the heads learn to tell real
/// noised latents from the student's noised one-step predictions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdversarialConfig {
    /// Density of the student's training σ (before the shift), as in `finetune`.
    #[serde(default)]
    pub sigma_density: TimestepDensity,
    /// Timestep shift of the training σ and of the σ at which real and fake are compared
    /// (drawn from the same density); also the sampling shift. Default 3.
    #[serde(default = "three")]
    pub shift: f64,
    /// `"hinge"` (default) or `"non_saturating"`.
    #[serde(default)]
    pub gan_loss: GanLoss,
    /// Discriminator heads: `{ stride = 4, hidden = 256 }` or `{ blocks = [3, 7] }`.
    #[serde(default)]
    pub heads: HeadsConfig,
    /// Weight of the adversarial term in the student's loss (default 1).
    #[serde(default = "one")]
    pub generator_weight: f64,
    /// Weight of the discriminator's loss (default 1).
    #[serde(default = "one")]
    pub discriminator_weight: f64,
    /// Weight of a flow-matching regression term in the student's loss (default 0 = off).
    #[serde(default)]
    pub flow_matching_weight: f64,
    /// Weight γ of the R1 penalty `γ/2 · ‖∇D(real)‖²` (default 0 = off; finite-difference
    /// estimate, see `adversarial::loss`).
    #[serde(default)]
    pub r1_weight: f64,
    /// Perturbation scale ε of the R1 estimate (default 0.01).
    #[serde(default = "r1_eps")]
    pub r1_epsilon: f64,
    /// The discriminator updates on steps with `step % discriminator_interval == 0`
    /// (default 1: every step); the student updates every step.
    #[serde(default = "one_usize")]
    pub discriminator_interval: usize,
    /// Optimizer overrides of the discriminator heads (over `[optimizer]`).
    #[serde(default)]
    pub discriminator_optimizer: Option<OptimizerPatch>,
    /// Default sampling steps for validation / `reel sample` (default 4).
    #[serde(default = "four")]
    pub sample_steps: usize,
    /// Default guidance scale for sampling (default 1: none).
    #[serde(default = "one")]
    pub guidance_scale: f64,
}

fn one() -> f64 {
    1.0
}
fn three() -> f64 {
    3.0
}
fn r1_eps() -> f64 {
    0.01
}
fn one_usize() -> usize {
    1
}
fn four() -> usize {
    4
}

impl Default for AdversarialConfig {
    fn default() -> Self {
        serde_json::from_str("{}").expect("every field has a default")
    }
}

#[reel_core::plugin(
    name = "adversarial",
    summary = "Adversarial distillation: discriminator heads on the frozen teacher's features (hinge / non-saturating, R1)"
)]
impl MethodConfig for AdversarialConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        self.sigma_density
            .validate()
            .map_err(|e| e.in_section("sigma_density"))?;
        check::positive_f64("shift", self.shift)?;
        self.heads.validate().map_err(|e| e.in_section("heads"))?;
        check::positive_f64("generator_weight", self.generator_weight)?;
        check::positive_f64("discriminator_weight", self.discriminator_weight)?;
        check::non_negative_f64("flow_matching_weight", self.flow_matching_weight)?;
        check::non_negative_f64("r1_weight", self.r1_weight)?;
        check::positive_f64("r1_epsilon", self.r1_epsilon)?;
        // The estimate divides a float32 difference of discriminator outputs by ε²: below
        // 1e-4 it is mostly rounding, and ε² soon becomes 0.
        check::in_range("r1_epsilon", self.r1_epsilon, 1e-4, 10.0)?;
        check::positive_usize("discriminator_interval", self.discriminator_interval)?;
        if let Some(p) = &self.discriminator_optimizer {
            p.validate()
                .map_err(|e| e.in_section("discriminator_optimizer"))?;
        }
        check::sampling_steps("sample_steps", self.sample_steps)?;
        check::positive_f64("guidance_scale", self.guidance_scale)?;
        Ok(())
    }

    fn roles(&self) -> Vec<RoleRequirement> {
        vec![
            RoleRequirement::trainable("student"),
            RoleRequirement::frozen("teacher"),
        ]
    }

    /// The heads' blocks exist in the teacher (their feature network).
    fn check_models(&self, info: &dyn Fn(&str) -> Option<ModelInfo>) -> Result<(), ConfigError> {
        (self.heads.check_feature_network(info("teacher"))).map_err(|e| e.in_section("heads"))
    }

    /// The student can be block-checkpointed (the teacher's feature forwards are not).
    fn supports_gradient_checkpointing(&self) -> bool {
        true
    }
}
