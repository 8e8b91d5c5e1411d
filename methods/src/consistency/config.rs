//! The `[method] kind = "consistency"` configuration: fields, defaults and validation.

use serde::{Deserialize, Serialize};

use reel_core::config::{check, ConfigError};
use reel_core::method::MethodConfig;
use reel_core::role::RoleRequirement;

use super::loss::{DistanceLoss, PredDecay};
use super::schedule::PhaseSchedule;
use super::solver::EulerSolver;
use crate::dmd2::CfgForm;

/// The network whose prediction from the teacher's next point is the student's target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TargetNetwork {
    /// An exponential moving average of the student (decay `ema_decay`), kept by the method
    /// as the role `target` and saved with every checkpoint (FastVideo `--use_ema`).
    #[default]
    Ema,
    /// The student itself, without gradients through the target (FastVideo's default).
    Student,
}

/// `[method] kind = "consistency"`: phased consistency distillation of a few-step student
/// from a frozen teacher.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsistencyConfig {
    /// Points `N` of the Euler discretisation of the flow ODE (FastVideo
    /// `num_euler_timesteps`; default 50).
    #[serde(default = "fifty")]
    pub num_euler_timesteps: usize,
    /// Phases per step, FastVideo's format: `"2000-2,4000-4,6000-8"` (up to step 2000 two
    /// phases, then four, then eight from step 4001 on) or a bare count such as `"4"`
    /// (default). Each count must be at most `num_euler_timesteps`.
    #[serde(default = "four_str")]
    pub multi_phased_distill_schedule: String,
    /// Timestep shift of the Euler grid (and of sampling). Default 3.
    #[serde(default = "three")]
    pub shift: f64,
    /// Guidance baked into the teacher's Euler step (FastVideo `distill_cfg`; default 3).
    #[serde(default = "three")]
    pub distill_cfg: f64,
    /// How `distill_cfg` combines the teacher's predictions: `"legacy"` (default, FastVideo's
    /// `cond + w·(cond − uncond)`) or `"uncond"` (`uncond + w·(cond − uncond)`). A
    /// combination that ignores `uncond` (`legacy` with 0, `uncond` with 1) skips the
    /// unconditional pass.
    #[serde(default = "legacy")]
    pub cfg_form: CfgForm,
    /// `"huber"` (default, pseudo-Huber) or `"l2"`.
    #[serde(default)]
    pub loss: DistanceLoss,
    /// Constant `c` of the pseudo-Huber loss (FastVideo: 0.001).
    #[serde(default = "huber_c")]
    pub huber_c: f64,
    /// Weight of the prediction-decay regulariser on the student's phase-end prediction
    /// (default 0 = off).
    #[serde(default)]
    pub pred_decay_weight: f64,
    /// `"l1"` (default, `mean|p|`) or `"l2"` (`mean p²`).
    #[serde(default)]
    pub pred_decay_type: PredDecay,
    /// `"ema"` (default) or `"student"`.
    #[serde(default)]
    pub target: TargetNetwork,
    /// Decay of the EMA target, in `[0, 1)` (FastVideo `ema_decay`; default 0.95).
    #[serde(default = "ema_decay")]
    pub ema_decay: f64,
    /// Default sampling steps (phases) for validation / `reel sample` (default: the last
    /// phase count of the schedule).
    #[serde(default)]
    pub sample_steps: Option<usize>,
    /// Default guidance scale for sampling (default 1: none, the guidance is distilled in).
    #[serde(default = "one")]
    pub guidance_scale: f64,
}

fn fifty() -> usize {
    50
}
fn four_str() -> String {
    "4".into()
}
fn three() -> f64 {
    3.0
}
fn one() -> f64 {
    1.0
}
fn legacy() -> CfgForm {
    CfgForm::Legacy
}
fn huber_c() -> f64 {
    0.001
}
fn ema_decay() -> f64 {
    0.95
}

impl Default for ConsistencyConfig {
    fn default() -> Self {
        serde_json::from_str("{}").expect("every field has a default")
    }
}

impl ConsistencyConfig {
    /// The parsed phase schedule (call after [`MethodConfig::validate`]).
    pub fn schedule(&self) -> PhaseSchedule {
        self.multi_phased_distill_schedule
            .parse()
            .unwrap_or_else(|e| panic!("phase schedule was validated: {e}"))
    }

    /// The Euler grid.
    pub fn solver(&self) -> EulerSolver {
        EulerSolver::new(self.num_euler_timesteps, self.shift)
    }

    /// Default number of sampling steps.
    pub fn default_sample_steps(&self) -> usize {
        self.sample_steps
            .unwrap_or_else(|| self.schedule().final_phases())
    }
}

#[reel_core::plugin(
    name = "consistency",
    summary = "Multi-phase consistency distillation: Euler solver over the teacher with distilled CFG, pseudo-Huber loss, EMA target"
)]
impl MethodConfig for ConsistencyConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let n = self.num_euler_timesteps;
        check::sampling_steps("num_euler_timesteps", n)?;
        let key = "multi_phased_distill_schedule";
        let schedule: PhaseSchedule = self
            .multi_phased_distill_schedule
            .parse()
            .map_err(|e: String| ConfigError::new(key, e))?;
        if schedule.max_phases() > n {
            return Err(ConfigError::new(
                key,
                format!(
                    "a phase count of {} exceeds num_euler_timesteps = {n} (each phase needs at least one Euler point)",
                    schedule.max_phases()
                ),
            ));
        }
        check::positive_f64("shift", self.shift)?;
        check::non_negative_f64("distill_cfg", self.distill_cfg)?;
        check::non_negative_f64("pred_decay_weight", self.pred_decay_weight)?;
        // c² enters the float32 loss: 1e-12 to 1e3 keeps it a normal float32.
        check::positive_f64("huber_c", self.huber_c)?;
        check::in_range("huber_c", self.huber_c, 1e-12, 1e3)?;
        check::in_half_open("ema_decay", self.ema_decay, 0.0, 1.0)?;
        if let Some(s) = self.sample_steps {
            check::sampling_steps("sample_steps", s)?;
            if s > n {
                return Err(ConfigError::new(
                    "sample_steps",
                    format!("at most num_euler_timesteps = {n}, got {s}"),
                ));
            }
        }
        check::positive_f64("guidance_scale", self.guidance_scale)?;
        Ok(())
    }

    fn roles(&self) -> Vec<RoleRequirement> {
        vec![
            RoleRequirement::trainable("student"),
            RoleRequirement::frozen("teacher"),
        ]
    }

    fn max_sampling_steps(&self) -> Option<(usize, &'static str)> {
        Some((self.num_euler_timesteps, "num_euler_timesteps"))
    }

    /// The student can be block-checkpointed.
    fn supports_gradient_checkpointing(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConsistencyConfig, String> {
        let c: ConsistencyConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        MethodConfig::validate(&c).map_err(|e| e.to_string())?;
        Ok(c)
    }

    #[test]
    fn defaults() {
        let c = parse("").unwrap();
        assert_eq!(c, ConsistencyConfig::default());
        assert_eq!(c.num_euler_timesteps, 50);
        assert_eq!(c.schedule(), PhaseSchedule::constant(4));
        assert_eq!(c.default_sample_steps(), 4);
        assert_eq!(
            (c.cfg_form, c.target),
            (CfgForm::Legacy, TargetNetwork::Ema)
        );
        let c = parse("multi_phased_distill_schedule = \"100-2,200-8\"").unwrap();
        assert_eq!(c.default_sample_steps(), 8);
        assert_eq!(c.schedule().phases_at(150), 8);
    }

    #[test]
    fn bad_values_name_their_keys() {
        for (text, key) in [
            ("num_euler_timesteps = 0", "`num_euler_timesteps`"),
            (
                "multi_phased_distill_schedule = \"2-4,1-8\"",
                "`multi_phased_distill_schedule`",
            ),
            (
                "num_euler_timesteps = 6\nmulti_phased_distill_schedule = \"8\"",
                "`multi_phased_distill_schedule`",
            ),
            ("shift = 0.0", "`shift`"),
            ("distill_cfg = -1.0", "`distill_cfg`"),
            ("huber_c = 0.0", "`huber_c`"),
            ("pred_decay_weight = -0.1", "`pred_decay_weight`"),
            ("ema_decay = 1.0", "`ema_decay`"),
            ("sample_steps = 51", "`sample_steps`"),
            ("sample_steps = 0", "`sample_steps`"),
            (
                "num_euler_timesteps = 1000000",
                "`num_euler_timesteps`: expected at most",
            ),
            ("guidance_scale = 0.0", "`guidance_scale`"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(key), "{text}: {e}");
        }
        for text in [
            "loss = \"l1\"",
            "target = \"teacher\"",
            "pred_decay_type = \"l3\"",
            "unknown = 1",
        ] {
            assert!(parse(text).is_err(), "{text}");
        }
        assert!(parse("loss = \"l2\"\ntarget = \"student\"\npred_decay_type = \"l2\"").is_ok());
    }
}
