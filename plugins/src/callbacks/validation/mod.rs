//! `kind = "validation"`: sample the data's validation prompts during training, write them for
//! people to look at and score them when the data has an evaluator.
//!
//! Every `every_steps` steps (and after the last step with `at_end`), one
//! [`TrainingMethod::sample`](reel_core::method::TrainingMethod::sample) call generates a clip
//! for each of the first `num_prompts` prompts of the data source, with the sampling role's EMA
//! shadow swapped in when `use_ema` is set and a shadow exists. It writes
//! `<run>/samples/step-<N>/`:
//! - `<i>-<caption>.gif`: one looping GIF per prompt (spaces in the caption become `_`);
//! - `sheet.png`: a contact sheet, one row per prompt (labelled with its score and caption),
//!   one column per frame;
//! - `scores.json`: per-clip scores, when the data has an evaluator.
//!
//! The means of the scores become the metrics `val/overall` and `val/<criterion>` (e.g.
//! `val/colour`) of the [`ValidationReport`] every callback receives, and one line is printed:
//! `validation @ step 200: overall 0.875 (colour 1.00, shape 0.88, direction 1.00) -> …/sheet.png`.
//!
//! ```toml
//! [[callbacks]]
//! kind = "validation"
//! every_steps = 100     # required
//! sampling_steps = 8    # default: the method's
//! guidance_scale = 3.0  # default: the method's
//! num_prompts = 8       # the first N prompts of the data
//! seed = 0              # initial-noise seed (the same noise at every validation)
//! use_ema = true        # sample with the EMA shadow when there is one
//! at_end = true         # also validate after the last step
//! ```

pub mod output;

use burn::tensor::backend::AutodiffBackend;
use reel_core::callback::{
    BuildCallback, Callback, CallbackConfig, CallbackContext, CallbackError, StepReport,
    ValidationReport,
};
use reel_core::config::{check, ConfigError};
use reel_core::data::{negative_or_zeros, ClipScore};
use reel_core::method::SampleRequest;
use serde::{Deserialize, Serialize};

pub use self::output::{clip_file_name, display_scale, mean_scores, summary_line};
use super::{io_error, print_line};

fn default_num_prompts() -> usize {
    8
}
fn yes() -> bool {
    true
}

/// Configuration of the `validation` callback.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidationConfig {
    /// Validate after every `every_steps` completed steps (required, >= 1).
    pub every_steps: u64,
    /// Sampling steps (default: the method's own default).
    #[serde(default)]
    pub sampling_steps: Option<usize>,
    /// Classifier-free guidance scale (default: the method's own default).
    #[serde(default)]
    pub guidance_scale: Option<f64>,
    /// How many of the data's validation prompts to sample, from the first (default 8).
    #[serde(default = "default_num_prompts")]
    pub num_prompts: usize,
    /// Seed of the initial noise (default 0); the same at every validation so that clips are
    /// comparable over training.
    #[serde(default)]
    pub seed: u64,
    /// Sample with the sampling role's EMA shadow when it has one (default true).
    #[serde(default = "yes")]
    pub use_ema: bool,
    /// Also validate after the last step (default true).
    #[serde(default = "yes")]
    pub at_end: bool,
}

impl ValidationConfig {
    /// Whether to validate after completing `step` steps (`is_final`: the last step).
    pub fn due(&self, step: u64, is_final: bool) -> bool {
        step.is_multiple_of(self.every_steps.max(1)) || (is_final && self.at_end)
    }
}

#[reel_core::plugin(
    name = "validation",
    summary = "Sample validation prompts: GIFs, a contact sheet and evaluator scores (val/overall)"
)]
impl CallbackConfig for ValidationConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        check::positive_u64("every_steps", self.every_steps)?;
        if let Some(n) = self.sampling_steps {
            check::positive_usize("sampling_steps", n)?;
        }
        if let Some(g) = self.guidance_scale {
            check::positive_f64("guidance_scale", g)?;
        }
        check::positive_usize("num_prompts", self.num_prompts)?;
        Ok(())
    }
}

impl<B: AutodiffBackend> BuildCallback<B> for ValidationConfig {
    fn build_callback(&self) -> Result<Box<dyn Callback<B>>, ConfigError> {
        Ok(Box::new(ValidationCallback::new(self.clone())))
    }
}

/// The runtime `validation` callback.
#[derive(Debug, Clone)]
pub struct ValidationCallback {
    cfg: ValidationConfig,
    warned_no_prompts: bool,
}

impl ValidationCallback {
    /// A callback for `cfg` (assumed validated).
    pub fn new(cfg: ValidationConfig) -> Self {
        Self {
            cfg,
            warned_no_prompts: false,
        }
    }

    /// Sample, write and score one validation at `ctx.step`. `None` when the data has no
    /// prompts (warned once).
    pub fn run<B: AutodiffBackend>(
        &mut self,
        ctx: &mut CallbackContext<B>,
    ) -> Result<Option<ValidationReport>, CallbackError> {
        let step = ctx.step;
        let prompts: Vec<_> = ctx
            .data
            .prompts()
            .into_iter()
            .take(self.cfg.num_prompts)
            .collect();
        if prompts.is_empty() {
            if !self.warned_no_prompts {
                print_line("reel: warning: validation: the data source has no prompts; skipped");
                self.warned_no_prompts = true;
            }
            return Ok(None);
        }
        let spec = ctx.data.spec();
        let captions: Vec<String> = prompts.iter().map(|p| p.caption.clone()).collect();
        let req = SampleRequest {
            prompts,
            negative: Some(negative_or_zeros(ctx.data)),
            steps: self.cfg.sampling_steps,
            guidance: self.cfg.guidance_scale,
            seed: self.cfg.seed,
            spec,
        };
        let clips = self.sample(ctx, &req)?;
        if clips.len() != captions.len() {
            return Err(CallbackError::Other(format!(
                "validation @ step {step}: the method returned {} clips for {} prompts",
                clips.len(),
                captions.len()
            )));
        }
        if let Some(i) = clips.iter().position(|c| c.len() != spec.latent_numel()) {
            return Err(CallbackError::Other(format!(
                "validation @ step {step}: clip {i} has {} values, expected {} ({spec:?})",
                clips[i].len(),
                spec.latent_numel()
            )));
        }

        let dir = ctx.run_dir.join("samples").join(format!("step-{step}"));
        if dir.exists() {
            // Left over from an interrupted run that got past this step before a resume.
            std::fs::remove_dir_all(&dir).map_err(|e| io_error(&dir, e))?;
        }
        std::fs::create_dir_all(&dir).map_err(|e| io_error(&dir, e))?;
        let scores: Option<Vec<ClipScore>> = ctx.data.evaluator().map(|evaluator| {
            (clips.iter().zip(&captions))
                .map(|(clip, caption)| evaluator.score(clip, &spec, caption))
                .collect()
        });
        let labels: Vec<String> = (captions.iter().enumerate())
            .map(|(i, c)| output::sheet_label(c, scores.as_ref().map(|s| &s[i])))
            .collect();
        let mut files = output::write_clips(&dir, &clips, &captions, &labels, &spec)?;
        let sheet_path = dir.join(output::SHEET_FILE);
        let mut metrics = Vec::new();
        if let Some(scores) = scores {
            metrics = mean_scores(&scores);
            let path = dir.join(output::SCORES_FILE);
            output::write_scores(&path, step, &metrics, &captions, &files, &scores)?;
            files.push(path);
        }
        print_line(&summary_line(step, &metrics, clips.len(), &sheet_path));
        Ok(Some(ValidationReport {
            step,
            metrics,
            files,
        }))
    }

    /// One `sample()` call, with the EMA shadow swapped in (and back out, even on error) when
    /// configured and present.
    fn sample<B: AutodiffBackend>(
        &self,
        ctx: &mut CallbackContext<B>,
        req: &SampleRequest,
    ) -> Result<Vec<Vec<f32>>, CallbackError> {
        let role = ctx.method.sampling_role().to_string();
        let swap = |ctx: &mut CallbackContext<B>| -> bool {
            match ctx
                .method
                .roles_mut()
                .into_iter()
                .find(|r| r.name() == role)
            {
                Some(r) if r.has_ema() => {
                    r.swap_ema();
                    true
                }
                _ => false,
            }
        };
        let swapped = self.cfg.use_ema && swap(ctx);
        let result = ctx.method.sample(req);
        if swapped {
            swap(ctx);
        }
        result.map_err(|e| {
            CallbackError::Other(format!(
                "validation @ step {}: sampling failed: {e}",
                ctx.step
            ))
        })
    }
}

impl<B: AutodiffBackend> Callback<B> for ValidationCallback {
    fn name(&self) -> &str {
        "validation"
    }

    fn on_step_end(
        &mut self,
        ctx: &mut CallbackContext<B>,
        report: &StepReport,
    ) -> Result<(), CallbackError> {
        let _ = report;
        if !self.cfg.due(ctx.step, ctx.is_final) {
            return Ok(());
        }
        if let Some(v) = self.run(ctx)? {
            ctx.validations.push(v);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ValidationConfig, String> {
        let cfg: ValidationConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        CallbackConfig::validate(&cfg).map_err(|e| e.to_string())?;
        Ok(cfg)
    }

    #[test]
    fn config_defaults_schedule_and_errors() {
        let cfg = parse("every_steps = 5").unwrap();
        assert_eq!(
            (cfg.num_prompts, cfg.seed, cfg.use_ema, cfg.at_end),
            (8, 0, true, true)
        );
        assert_eq!((cfg.sampling_steps, cfg.guidance_scale), (None, None));
        assert!(cfg.due(10, false) && !cfg.due(7, false) && cfg.due(7, true));
        let no_end = parse("every_steps = 5\nat_end = false").unwrap();
        assert!(!no_end.due(7, true));
        assert!(parse("").unwrap_err().contains("every_steps"));
        for (text, key) in [
            ("every_steps = 0", "`every_steps`"),
            ("every_steps = 1\nsampling_steps = 0", "`sampling_steps`"),
            ("every_steps = 1\nguidance_scale = -1.0", "`guidance_scale`"),
            ("every_steps = 1\nnum_prompts = 0", "`num_prompts`"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(key), "{text}: {err}");
        }
        assert!(parse("every_steps = 1\nevery = 2")
            .unwrap_err()
            .contains("every"));
    }
}
