//! `kind = "validation"`: sample the data's validation prompts during training, write them for
//! people to look at and score them when the data has an evaluator.
//!
//! Every `every_steps` steps (and after the last step with `at_end`), one
//! [`TrainingMethod::sample`](reel_core::method::TrainingMethod::sample) call generates a clip
//! for each of the first `num_prompts` prompts (of `prompts`, else of the data source), with
//! the sampling role's EMA shadow swapped in when `use_ema` is set and a shadow exists. It
//! writes `<run>/samples/step-<N>/`:
//! - `<i>-<caption>.gif`: one looping GIF per prompt (spaces in the caption become `_`),
//!   and `<i>-<caption>.mp4` beside it for decoded videos when FFmpeg is installed;
//! - `sheet.png`: a contact sheet, one row per prompt (labelled with its score and caption),
//!   one column per frame;
//! - `scores.json`: per-clip scores, when the data has an evaluator.
//!
//! The means of the scores become the metrics `val/overall` and `val/<criterion>` (e.g.
//! `val/colour`) of the [`ValidationReport`] every callback receives, and one line is printed:
//! `validation @ step 200: overall 0.875 (colour 1.00, shape 0.88, direction 1.00) in 00:41 ->
//! …/sheet.png`. While it samples and decodes, the progress bar's line (on a terminal) or a
//! line every 15 s (elsewhere) shows how far it is ([`watch`]).
//!
//! ```toml
//! [[callbacks]]
//! kind = "validation"
//! every_steps = 100     # required
//! sampling_steps = 8    # default: the method's
//! guidance_scale = 3.0  # default: the method's
//! num_prompts = 8       # the first N prompts (default: all of `prompts`, else 8 of the data's)
//! seed = 0              # initial-noise seed (the same noise at every validation)
//! use_ema = true        # sample with the EMA shadow when there is one
//! at_end = true         # also validate after the last step
//! ```

mod models;
pub mod output;
pub mod watch;

use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;
use reel_core::callback::{
    BuildCallback, Callback, CallbackConfig, CallbackContext, CallbackError, StepReport,
    ValidationReport,
};
use reel_core::config::{check, ConfigError};
use reel_core::data::{ClipScore, DataSpec, Prompt, TextCondition};
use reel_core::method::SampleRequest;
use serde::{Deserialize, Serialize};

pub use self::models::{check_data, MediaModels};
pub use self::output::{clip_file_name, display_scale, mean_scores, summary_line};
use super::{io_error, print_line};

/// A media-model error keyed by a setting, as this callback's error (`validation: `key`: ...`).
fn in_table(e: ConfigError) -> CallbackError {
    CallbackError::Other(format!("validation: {e}"))
}

/// The run folder's entry the validations write into (`samples/step-<N>/`).
pub const SAMPLES_DIR: &str = "samples";

/// How many of the data's prompts a validation samples when `num_prompts` is not set.
pub const DATA_PROMPTS: usize = 8;

fn yes() -> bool {
    true
}
fn default_fps() -> f64 {
    16.0
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
    /// How many prompts to sample, from the first: by default every one of `prompts`, else
    /// the data's first [`DATA_PROMPTS`].
    #[serde(default)]
    pub num_prompts: Option<usize>,
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
    /// A diffusers Wan VAE folder (`vae/`): the sampled latents are decoded and written as
    /// videos (GIF, and MP4 when FFmpeg is installed) with a labelled contact sheet.
    #[serde(default)]
    pub vae: Option<PathBuf>,
    /// Undo the `latents_mean`/`latents_std` normalisation before decoding (default true:
    /// the form `fastvideo_parquet`'s default `normalize = "wan"` trains on).
    #[serde(default = "yes")]
    pub denormalize: bool,
    /// Decode in spatial tiles of this many pixels: a multiple of the VAE's spatial compression
    /// (8 for Wan2.1's), at least twice it; checked against the VAE's `config.json`.
    #[serde(default)]
    pub vae_tile: Option<usize>,
    /// Frame rate of the written videos (default 16, Wan's).
    #[serde(default = "default_fps")]
    pub fps: f64,
    /// A diffusers UMT5 folder (`text_encoder/`) to encode `prompts` and `negative_prompt`.
    #[serde(default)]
    pub text_encoder: Option<PathBuf>,
    /// The tokenizer (`tokenizer.json` or its folder) for `text_encoder` (default: the
    /// `tokenizer.json` in `text_encoder`'s folder, else in the `tokenizer/` folder beside it,
    /// the diffusers layout).
    #[serde(default)]
    pub tokenizer: Option<PathBuf>,
    /// Captions to sample instead of the data's validation prompts (needs `text_encoder`).
    #[serde(default)]
    pub prompts: Vec<String>,
    /// The negative prompt of classifier-free guidance (needs `text_encoder`; default: the
    /// data's negative text, else zeros).
    #[serde(default)]
    pub negative_prompt: Option<String>,
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
            check::sampling_steps("sampling_steps", n)?;
        }
        if let Some(g) = self.guidance_scale {
            check::positive_f64("guidance_scale", g)?;
        }
        if let Some(n) = self.num_prompts {
            check::positive_usize("num_prompts", n)?;
        }
        check::positive_f64("fps", self.fps)?;
        check::in_range("fps", self.fps, 0.0, 1000.0)?;
        if let Some(t) = self.vae_tile {
            check::positive_usize("vae_tile", t)?;
            if self.vae.is_none() {
                return Err(ConfigError::new(
                    "vae_tile",
                    "it is for decoding with a `vae`, and none is given",
                ));
            }
        }
        if self.tokenizer.is_some() && self.text_encoder.is_none() {
            return Err(ConfigError::new(
                "text_encoder",
                "a `tokenizer` is for a `text_encoder`, and none is given",
            ));
        }
        if self.text_encoder.is_none() {
            if !self.prompts.is_empty() {
                return Err(ConfigError::new(
                    "prompts",
                    "encoding prompts needs a `text_encoder`",
                ));
            }
            if self.negative_prompt.is_some() {
                return Err(ConfigError::new(
                    "negative_prompt",
                    "encoding it needs a `text_encoder`",
                ));
            }
        }
        Ok(())
    }

    /// `vae`, `text_encoder` and `tokenizer` open as the first validation will open them:
    /// each folder's `config.json` parses and its weight files' headers read in full (no
    /// tensors are loaded), and the tokenizer loads.
    fn check_files(&self, resolve: &dyn Fn(&Path) -> PathBuf) -> Result<(), ConfigError> {
        models::check_files(self, resolve)
    }

    fn run_outputs(&self) -> Vec<String> {
        vec![format!("{SAMPLES_DIR}/")]
    }

    fn sampling_steps(&self) -> Option<usize> {
        self.sampling_steps
    }

    fn check_data(
        &self,
        spec: &DataSpec,
        resolve: &dyn Fn(&Path) -> PathBuf,
    ) -> Result<(), ConfigError> {
        models::check_data(self, spec, resolve)
    }
}

impl<B: AutodiffBackend> BuildCallback<B> for ValidationConfig {
    fn build_callback(&self) -> Result<Box<dyn Callback<B>>, ConfigError> {
        Ok(Box::new(ValidationCallback::<B>::new(self.clone())))
    }
}

/// The runtime `validation` callback.
pub struct ValidationCallback<B: AutodiffBackend> {
    cfg: ValidationConfig,
    warned_no_prompts: std::cell::Cell<bool>,
    /// The VAE (and, until the prompts are encoded, the text encoder), loaded at the first
    /// validation.
    models: Option<MediaModels<B::InnerBackend>>,
    /// The prompts and the negative text, encoded at the first validation: the text encoder
    /// (UMT5-XXL: about 23 GB in float32) is then dropped rather than held on the training
    /// device for the rest of the run.
    texts: Option<(Vec<Prompt>, TextCondition)>,
}

impl<B: AutodiffBackend> ValidationCallback<B> {
    /// A callback for `cfg` (assumed validated).
    pub fn new(cfg: ValidationConfig) -> Self {
        Self {
            cfg,
            warned_no_prompts: std::cell::Cell::new(false),
            models: None,
            texts: None,
        }
    }

    /// The prompts to sample and the negative text: encoded once, then the text encoder is
    /// dropped.
    fn texts(
        &mut self,
        ctx: &CallbackContext<B>,
        spec: &DataSpec,
    ) -> Result<(Vec<Prompt>, TextCondition), CallbackError> {
        if self.texts.is_none() {
            let models = self.models.as_mut().expect("loaded before the texts");
            let prompts = (models.prompts(&self.cfg, ctx.data, spec)).map_err(in_table)?;
            let negative = (models.negative(&self.cfg, ctx.data, spec)).map_err(in_table)?;
            models.text = None;
            self.texts = Some((prompts, negative));
        }
        Ok(self.texts.clone().expect("encoded above"))
    }

    /// Sample, write and score one validation at `ctx.step`. `None` when the data has no
    /// prompts (warned once).
    pub fn run(
        &mut self,
        ctx: &mut CallbackContext<B>,
    ) -> Result<Option<ValidationReport>, CallbackError> {
        let step = ctx.step;
        let started = std::time::Instant::now();
        if self.models.is_none() {
            self.models = Some(MediaModels::load(&self.cfg, ctx.device).map_err(in_table)?);
        }
        let spec = ctx.data.spec();
        let (prompts, negative) = self.texts(ctx, &spec)?;
        let models = self.models.as_ref().expect("loaded above");
        if prompts.is_empty() {
            if !self.warned_no_prompts.replace(true) {
                print_line("reel: warning: validation: the data source has no prompts; skipped");
            }
            return Ok(None);
        }
        let captions: Vec<String> = prompts.iter().map(|p| p.caption.clone()).collect();
        let req = SampleRequest {
            prompts,
            negative: Some(negative),
            steps: self.cfg.sampling_steps,
            guidance: self.cfg.guidance_scale,
            seed: self.cfg.seed,
            first_index: 0,
            spec,
            progress: Some(watch::sampling_watcher(step)),
        };
        let clips = self.sample(ctx, &req)?;
        output::check_clips(&clips, captions.len(), &spec)
            .map_err(|e| CallbackError::Other(format!("validation @ step {step}: {e}")))?;

        let dir = ctx.run_dir.join(SAMPLES_DIR).join(format!("step-{step}"));
        if dir.exists() {
            // A leftover made since the run started (its start set older ones aside).
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
        if models.decoder.is_some() {
            watch::show_decoding(step, clips.len());
        }
        let style = models.style(&spec, &self.cfg);
        // Keyed errors unprefixed: the step's prefix below names the callback.
        let frames = (models.frames(&clips, &spec))
            .map(|f| f.map_err(|e| CallbackError::Other(e.to_string())));
        let mut files = output::write_clips(&dir, frames, &captions, &labels, &style)
            .map_err(|e| CallbackError::Other(format!("validation @ step {step}: {e}")))?;
        let sheet_path = dir.join(output::SHEET_FILE);
        let mut metrics = Vec::new();
        if let Some(scores) = scores {
            metrics = mean_scores(&scores);
            let path = dir.join(output::SCORES_FILE);
            output::write_scores(&path, step, &metrics, &captions, &scores)?;
            files.push(path);
        }
        let seconds = started.elapsed().as_secs_f64();
        print_line(&summary_line(
            step,
            &metrics,
            clips.len(),
            seconds,
            &sheet_path,
        ));
        Ok(Some(ValidationReport {
            step,
            metrics,
            files,
        }))
    }

    /// One `sample()` call, with the EMA shadow swapped in (and back out, even on error) when
    /// configured and present.
    fn sample(
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

impl<B: AutodiffBackend> Callback<B> for ValidationCallback<B> {
    fn name(&self) -> &str {
        "validation"
    }

    /// The samples of steps after the run's start (an abandoned timeline's) are set aside,
    /// not replaced by this run's.
    fn on_train_start(&mut self, ctx: &mut CallbackContext<B>) -> Result<(), CallbackError> {
        let samples = ctx.run_dir.join(SAMPLES_DIR);
        let moved = output::set_aside_later_samples(&samples, ctx.step);
        if let Some(aside) = moved.map_err(|e| io_error(&samples, e))? {
            print_line(&format!(
                "reel: validation: samples of steps after {} moved to {} (kept; delete them \
                 when no longer needed)",
                ctx.step,
                aside.display()
            ));
        }
        Ok(())
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
            (None, 0, true, true)
        );
        assert_eq!((cfg.sampling_steps, cfg.guidance_scale), (None, None));
        assert!(cfg.due(10, false) && !cfg.due(7, false) && cfg.due(7, true));
        let no_end = parse("every_steps = 5\nat_end = false").unwrap();
        assert!(!no_end.due(7, true));
        assert!(parse("").unwrap_err().contains("every_steps"));
        for (text, key) in [
            ("every_steps = 0", "`every_steps`"),
            ("every_steps = 1\nsampling_steps = 0", "`sampling_steps`"),
            (
                "every_steps = 1\nsampling_steps = 99999999999999",
                "`sampling_steps`: expected at most 100000",
            ),
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
