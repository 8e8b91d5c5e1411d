//! `kind = "ema"`: an exponential moving average of role weights.
//!
//! After every `every`-th optimizer step the shadow of each named role moves towards the live
//! weights: `e ← d·e + (1−d)·w`. Before `start_step` the shadow tracks the weights exactly
//! (`d = 0`). The first update initialises the shadow from the weights. Steps whose update
//! was skipped (non-finite values) do not move the shadow.
//!
//! The shadow is held by the role ([`RoleHandle::ema_update`]), so the trainer writes it into
//! every checkpoint as `<role>.ema.safetensors` and restores it on resume before
//! [`Callback::on_train_start`]; this callback keeps no state of its own. Validation samples
//! with the shadow when it exists (see [`validation`](super::validation)).
//!
//! ```toml
//! [[callbacks]]
//! kind = "ema"
//! decay = 0.999       # in (0, 1)
//! start_step = 0      # before it, the shadow equals the weights
//! every = 1           # update every N steps
//! roles = ["student"] # trainable roles to average
//! ```

use burn::tensor::backend::AutodiffBackend;
use reel_core::callback::{
    BuildCallback, Callback, CallbackConfig, CallbackContext, CallbackError, StepReport,
};
use reel_core::config::{check, ConfigError};
use reel_core::role::RoleHandle;
use serde::{Deserialize, Serialize};

fn default_decay() -> f64 {
    0.999
}
fn default_every() -> u64 {
    1
}
fn default_roles() -> Vec<String> {
    vec!["student".to_string()]
}

/// Configuration of the `ema` callback.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmaConfig {
    /// Decay `d` of `e ← d·e + (1−d)·w`, in `(0, 1)` (default 0.999).
    #[serde(default = "default_decay")]
    pub decay: f64,
    /// Completed steps before which the shadow tracks the weights exactly (default 0).
    #[serde(default)]
    pub start_step: u64,
    /// Update the shadow every `every` steps (default 1).
    #[serde(default = "default_every")]
    pub every: u64,
    /// Trainable roles to average (default `["student"]`); a role the method does not have is
    /// an error when training starts.
    #[serde(default = "default_roles")]
    pub roles: Vec<String>,
}

impl Default for EmaConfig {
    fn default() -> Self {
        Self {
            decay: default_decay(),
            start_step: 0,
            every: default_every(),
            roles: default_roles(),
        }
    }
}

impl EmaConfig {
    /// The decay used after completing `step` steps: 0 before `start_step`, else `decay`.
    pub fn decay_at(&self, step: u64) -> f64 {
        if step < self.start_step {
            0.0
        } else {
            self.decay
        }
    }

    /// Whether the shadow is updated after completing `step` steps.
    pub fn updates_at(&self, step: u64) -> bool {
        step < self.start_step || step.is_multiple_of(self.every.max(1))
    }
}

#[reel_core::plugin(
    name = "ema",
    summary = "Exponential moving average of role weights, saved with every checkpoint"
)]
impl CallbackConfig for EmaConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if !(self.decay.is_finite() && self.decay > 0.0 && self.decay < 1.0) {
            return Err(ConfigError::new(
                "decay",
                format!("expected a number in (0, 1), got {}", self.decay),
            ));
        }
        check::positive_usize("every", self.every as usize)?;
        if self.roles.is_empty() {
            return Err(ConfigError::new(
                "roles",
                "expected at least one role name, e.g. [\"student\"]",
            ));
        }
        for (i, r) in self.roles.iter().enumerate() {
            if r.is_empty() {
                return Err(ConfigError::new(
                    format!("roles[{i}]"),
                    "expected a role name, got an empty string",
                ));
            }
            if self.roles[..i].contains(r) {
                return Err(ConfigError::new(
                    format!("roles[{i}]"),
                    format!("role `{r}` is listed twice"),
                ));
            }
        }
        Ok(())
    }

    /// The shadow: one float32 copy of each averaged role's trained weights.
    fn copies_of_roles(&self) -> Vec<String> {
        self.roles.clone()
    }
}

impl<B: AutodiffBackend> BuildCallback<B> for EmaConfig {
    fn build_callback(&self) -> Result<Box<dyn Callback<B>>, ConfigError> {
        Ok(Box::new(EmaCallback { cfg: self.clone() }))
    }
}

/// The runtime `ema` callback.
#[derive(Debug, Clone)]
pub struct EmaCallback {
    cfg: EmaConfig,
}

impl EmaCallback {
    /// A callback for `cfg` (assumed validated).
    pub fn new(cfg: EmaConfig) -> Self {
        Self { cfg }
    }

    /// Apply one EMA update with `decay` to every configured role of `roles`.
    pub fn update<B: AutodiffBackend>(&self, roles: Vec<&mut dyn RoleHandle<B>>, decay: f64) {
        for role in roles {
            if self.cfg.roles.iter().any(|r| r == role.name()) {
                role.ema_update(decay);
            }
        }
    }
}

impl<B: AutodiffBackend> Callback<B> for EmaCallback {
    fn name(&self) -> &str {
        "ema"
    }

    /// The shadow is training state: every worker keeps its own, identical copy.
    fn on_every_worker(&self) -> bool {
        true
    }

    fn on_train_start(&mut self, ctx: &mut CallbackContext<B>) -> Result<(), CallbackError> {
        let have: Vec<String> = ctx
            .method
            .roles()
            .iter()
            .map(|r| r.name().to_string())
            .collect();
        for want in &self.cfg.roles {
            if !have.contains(want) {
                return Err(CallbackError::Other(format!(
                    "callback `ema`: role `{want}` is not a trainable role of this method \
                     (trainable roles: {have:?}); fix `roles` of the ema callback"
                )));
            }
        }
        Ok(())
    }

    fn on_step_end(
        &mut self,
        ctx: &mut CallbackContext<B>,
        report: &StepReport,
    ) -> Result<(), CallbackError> {
        if report.skipped || !self.cfg.updates_at(report.step) {
            return Ok(());
        }
        self.update(ctx.method.roles_mut(), self.cfg.decay_at(report.step));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<EmaConfig, String> {
        let cfg: EmaConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        CallbackConfig::validate(&cfg).map_err(|e| e.to_string())?;
        Ok(cfg)
    }

    #[test]
    fn defaults_and_schedule() {
        let cfg = parse("").unwrap();
        assert_eq!(cfg, EmaConfig::default());
        assert_eq!(cfg.roles, ["student"]);
        let cfg = parse("decay = 0.9\nstart_step = 3\nevery = 2").unwrap();
        assert_eq!(
            (1..=6).map(|s| cfg.decay_at(s)).collect::<Vec<_>>(),
            [0.0, 0.0, 0.9, 0.9, 0.9, 0.9]
        );
        // Every step before start_step (tracking), then every 2nd.
        assert_eq!(
            (1..=7).map(|s| cfg.updates_at(s)).collect::<Vec<_>>(),
            [true, true, false, true, false, true, false]
        );
    }

    #[test]
    fn errors_name_the_key() {
        for (text, key) in [
            ("decay = 1.0", "`decay`"),
            ("decay = 0.0", "`decay`"),
            ("every = 0", "`every`"),
            ("roles = []", "`roles`"),
            ("roles = [\"a\", \"a\"]", "`roles[1]`"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(key), "{text}: {err}");
        }
        assert!(parse("decy = 0.5").unwrap_err().contains("decy"));
    }
}
