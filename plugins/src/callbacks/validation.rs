//! `kind = "validation"`: sample the data's validation prompts during training, write them for
//! people to look at and score them when the data has an evaluator.
//!
//! Every `every_steps` steps (and after the last step with `at_end`), one
//! [`TrainingMethod::sample`](reel_core::method::TrainingMethod::sample) call generates a clip
//! for each of the first `num_prompts` prompts of the data source, with the sampling role's EMA
//! shadow swapped in when `use_ema` is set and a shadow exists. It writes
//! `<run>/samples/step-<N>/`:
//! - `<i>-<caption>.gif`: one looping GIF per prompt (spaces in the caption become `_`);
//! - `sheet.png`: a contact sheet, one row per prompt, one column per frame;
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

use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;
use reel_core::callback::{
    BuildCallback, Callback, CallbackConfig, CallbackContext, CallbackError, StepReport,
    ValidationReport,
};
use reel_core::config::{check, ConfigError};
use reel_core::data::{negative_or_zeros, ClipScore, DataSpec};
use reel_core::method::SampleRequest;
use serde::{Deserialize, Serialize};

use super::{io_error, print_line};
use crate::data::clip_to_rgb;
use crate::media::{contact_sheet, write_gif, write_png};

reel_core::register_plugin!(
    Callback,
    "validation",
    "Sample validation prompts: GIFs, a contact sheet and evaluator scores (val/overall)"
);

/// Frame delay of the GIFs, in hundredths of a second.
const GIF_DELAY_CS: u16 = 12;

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

#[typetag::serde(name = "validation")]
impl CallbackConfig for ValidationConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.every_steps == 0 {
            return Err(ConfigError::new(
                "every_steps",
                "expected an integer >= 1, got 0",
            ));
        }
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

/// File name of clip `i`: `<i>-<caption>.gif`, spaces as `_`, other characters that are not
/// alphanumeric, `-` or `.` dropped (`clip` for an empty caption).
pub fn clip_file_name(i: usize, caption: &str) -> String {
    let mut stem: String = caption
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('_'),
            c if c.is_alphanumeric() || c == '-' || c == '_' || c == '.' => Some(c),
            _ => None,
        })
        .take(80)
        .collect();
    if stem.is_empty() {
        stem = "clip".into();
    }
    format!("{i}-{stem}.gif")
}

/// Upscaling factor of GIFs and sheets: 8, less for large latents (at most ~256 px a side).
pub fn display_scale(spec: &DataSpec) -> u32 {
    (256 / spec.height.max(spec.width).max(1)).clamp(1, 8) as u32
}

/// Mean scores over clips: `("val/overall", ..)` first, then `val/<criterion>` in the order
/// the criteria first appear.
pub fn mean_scores(scores: &[ClipScore]) -> Vec<(String, f64)> {
    if scores.is_empty() {
        return Vec::new();
    }
    let n = scores.len() as f64;
    let mut out = vec![(
        "val/overall".to_string(),
        scores.iter().map(|s| s.overall as f64).sum::<f64>() / n,
    )];
    let mut sums: Vec<(String, f64)> = Vec::new();
    for s in scores {
        for (name, v) in &s.criteria {
            match sums.iter_mut().find(|(k, _)| k == name) {
                Some((_, acc)) => *acc += *v as f64,
                None => sums.push((name.clone(), *v as f64)),
            }
        }
    }
    out.extend(sums.into_iter().map(|(k, v)| (format!("val/{k}"), v / n)));
    out
}

/// The printed summary line of one validation.
pub fn summary_line(step: u64, metrics: &[(String, f64)], clips: usize, sheet: &Path) -> String {
    let scores = match metrics.split_first() {
        Some(((_, overall), rest)) => {
            let parts: Vec<String> = rest
                .iter()
                .map(|(k, v)| format!("{} {v:.2}", k.trim_start_matches("val/")))
                .collect();
            if parts.is_empty() {
                format!("overall {overall:.3}")
            } else {
                format!("overall {overall:.3} ({})", parts.join(", "))
            }
        }
        None => format!("{clips} clips"),
    };
    format!("validation @ step {step}: {scores} -> {}", sheet.display())
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
        let scale = display_scale(&spec);
        let media = |e: crate::media::MediaError| CallbackError::Other(format!("validation: {e}"));
        let mut files: Vec<PathBuf> = Vec::new();
        let mut frames_all = Vec::with_capacity(clips.len());
        for (i, (clip, caption)) in clips.iter().zip(&captions).enumerate() {
            let frames = clip_to_rgb(clip, &spec);
            let path = dir.join(clip_file_name(i, caption));
            write_gif(&path, &frames, spec.width, spec.height, scale, GIF_DELAY_CS)
                .map_err(media)?;
            files.push(path);
            frames_all.push(frames);
        }
        let (sheet, w, h) = contact_sheet(&frames_all, spec.width, spec.height, scale);
        let sheet_path = dir.join("sheet.png");
        write_png(&sheet_path, &sheet, w, h).map_err(media)?;
        files.push(sheet_path.clone());

        let mut metrics = Vec::new();
        if let Some(evaluator) = ctx.data.evaluator() {
            let scores: Vec<ClipScore> = clips
                .iter()
                .zip(&captions)
                .map(|(clip, caption)| evaluator.score(clip, &spec, caption))
                .collect();
            metrics = mean_scores(&scores);
            let per_clip: Vec<serde_json::Value> = scores
                .iter()
                .zip(&captions)
                .zip(&files)
                .map(|((s, caption), file)| {
                    let criteria: serde_json::Map<String, serde_json::Value> = s
                        .criteria
                        .iter()
                        .map(|(k, v)| (k.clone(), serde_json::json!(v)))
                        .collect();
                    serde_json::json!({
                        "caption": caption,
                        "file": file.file_name().map(|f| f.to_string_lossy().to_string()),
                        "overall": s.overall,
                        "criteria": criteria,
                    })
                })
                .collect();
            let doc = serde_json::json!({ "step": step, "metrics": metrics.iter().map(|(k, v)| (k.clone(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>(), "clips": per_clip });
            let path = dir.join("scores.json");
            let text = serde_json::to_string_pretty(&doc).expect("scores serialize");
            std::fs::write(&path, text).map_err(|e| io_error(&path, e))?;
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

    #[test]
    fn file_names_scale_and_means() {
        assert_eq!(
            clip_file_name(3, "a red square moving left"),
            "3-a_red_square_moving_left.gif"
        );
        assert_eq!(clip_file_name(0, "../x/y?"), "0-..xy.gif");
        assert_eq!(clip_file_name(1, ""), "1-clip.gif");
        let spec = |h, w| DataSpec {
            channels: 4,
            frames: 4,
            height: h,
            width: w,
            text_len: 8,
            text_dim: 32,
        };
        assert_eq!(display_scale(&spec(16, 16)), 8);
        assert_eq!(display_scale(&spec(60, 104)), 2);
        assert_eq!(display_scale(&spec(512, 512)), 1);
        let score = |c: f32, s: f32, overall: f32| ClipScore {
            criteria: vec![("colour".into(), c), ("shape".into(), s)],
            overall,
        };
        let m = mean_scores(&[score(1.0, 1.0, 1.0), score(1.0, 0.0, 0.0)]);
        assert_eq!(
            m,
            [
                ("val/overall".to_string(), 0.5),
                ("val/colour".to_string(), 1.0),
                ("val/shape".to_string(), 0.5)
            ]
        );
        let line = summary_line(4, &m, 2, Path::new("runs/x/samples/step-4/sheet.png"));
        assert_eq!(
            line,
            "validation @ step 4: overall 0.500 (colour 1.00, shape 0.50) -> runs/x/samples/step-4/sheet.png"
        );
        assert!(summary_line(4, &[], 2, Path::new("s.png")).contains("2 clips"));
    }
}
