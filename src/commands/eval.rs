//! `reel eval`: generate clips for N captions of the data and score them with the data's
//! evaluator (the synthetic data's caption accuracy). Prints JSON.

use std::time::Instant;

use anyhow::Context;
use reel_core::backend::ReelBackend;
use reel_core::data::{negative_or_zeros, ClipScore, DataSource, DataSpec, Prompt};
use reel_core::method::SampleRequest;
use serde::Serialize;

use super::inference::{load, read_config, Source, StandIn};
use super::progress;
use reel_core::with_backend;

/// `reel eval` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct EvalArgs {
    #[command(flatten)]
    source: Source,
    /// Number of clips (captions are taken from the data samples 0..N, so all captions are
    /// covered evenly).
    #[arg(long, default_value_t = 64)]
    clips: usize,
    /// Sampling steps (method default when omitted).
    #[arg(long)]
    steps: Option<usize>,
    /// Guidance scale (omitted: the method's sampling guidance; 1, no CFG, for dmd2).
    #[arg(long)]
    guidance: Option<f64>,
    /// Noise seed.
    #[arg(long, default_value_t = 12345)]
    seed: u64,
    /// Clips per sampling batch.
    #[arg(long, default_value_t = 16)]
    batch: usize,
}

/// The flags' values, checked as `reel sample` checks its own (the validation settings).
fn check_args(args: &EvalArgs) -> anyhow::Result<()> {
    use reel_core::config::check;
    let flag = |e: reel_core::config::ConfigError| anyhow::anyhow!("{}: {}", e.key, e.message);
    check::positive_usize("--clips", args.clips).map_err(flag)?;
    check::positive_usize("--batch", args.batch).map_err(flag)?;
    if let Some(n) = args.steps {
        check::sampling_steps("--steps", n).map_err(flag)?;
    }
    if let Some(g) = args.guidance {
        check::positive_f64("--guidance", g).map_err(flag)?;
    }
    Ok(())
}

/// The prompt of clip `i`: the caption of data sample `i` (modulo the data's length).
fn prompt(source: &dyn DataSource, i: usize) -> anyhow::Result<Prompt> {
    let s = source.get(i % source.len())?;
    (source.prompt_for(&s.caption))
        .with_context(|| format!("no prompt for caption `{}`", s.caption))
}

/// One sampling batch holds, per clip, its noise, latents and prediction and its text
/// embeddings (float32): a `--batch` beyond the host's memory (`available`, `None`: unknown)
/// is refused before sampling, not by aborting when the noise is drawn.
fn check_batch_memory(batch: usize, spec: &DataSpec, available: Option<u64>) -> anyhow::Result<()> {
    let latents = [spec.channels, spec.frames, spec.height, spec.width];
    let latents: u128 = latents.iter().map(|&n| n as u128).product();
    let text = spec.text_len as u128 * spec.text_dim as u128;
    let bytes = batch as u128 * (3 * latents + text) * 4;
    if let Some(available) = available.filter(|&a| bytes > a as u128) {
        anyhow::bail!(
            "--batch {batch}: a batch of clips needs at least {} (noise, latents, prediction and \
             text per clip), more than the {} of memory available: use a smaller --batch",
            reel_core::memory::gib(bytes),
            reel_core::memory::gib(available.into())
        );
    }
    Ok(())
}

/// The JSON report.
#[derive(Debug, Serialize)]
pub struct EvalReport {
    checkpoint: Option<String>,
    ema: bool,
    clips: usize,
    steps: Option<usize>,
    guidance: Option<f64>,
    overall: f64,
    criteria: Vec<(String, f64)>,
    seconds_per_clip: f64,
}

fn eval<B: ReelBackend>(
    args: &EvalArgs,
    loaded: &reel_core::config::LoadedConfig,
) -> anyhow::Result<EvalReport> {
    let mut l = load::<B>(&args.source, loaded, StandIn::Nothing)?;
    let evaluator = l
        .source
        .evaluator()
        .context("this data source has no evaluator")?;
    let spec = l.source.spec();
    let negative = negative_or_zeros(&*l.source);
    let batch = args.batch.min(args.clips);
    check_batch_memory(batch, &spec, reel_core::memory::host_memory_available())?;
    let t0 = Instant::now();
    let bar = progress::bar(args.clips as u64, "clips");
    let mut scores: Vec<ClipScore> = vec![];
    // The prompts of one batch at a time: `--clips` can be large without holding them all.
    for start in (0..args.clips).step_by(batch) {
        let chunk = (start..args.clips.min(start + batch))
            .map(|i| prompt(&*l.source, i))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let req = SampleRequest {
            prompts: chunk.clone(),
            negative: Some(negative.clone()),
            steps: args.steps,
            guidance: args.guidance,
            seed: args.seed,
            // Clip `i`'s noise whatever `--batch` is.
            first_index: start,
            spec,
            progress: None,
        };
        let clips = l.method.sample(&req)?;
        for (clip, p) in clips.iter().zip(&chunk) {
            scores.push(evaluator.score(clip, &spec, &p.caption));
        }
        bar.set_position(scores.len() as u64);
        if bar.is_hidden() {
            eprintln!("reel eval: {}/{} clips", scores.len(), args.clips);
        }
    }
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64() / args.clips as f64;
    let n = scores.len().max(1) as f64;
    let overall = scores.iter().map(|s| s.overall as f64).sum::<f64>() / n;
    let mut criteria: Vec<(String, f64)> = vec![];
    if let Some(first) = scores.first() {
        for (i, (name, _)) in first.criteria.iter().enumerate() {
            let mean = scores
                .iter()
                .map(|s| s.criteria.get(i).map(|c| c.1 as f64).unwrap_or(0.0))
                .sum::<f64>()
                / n;
            criteria.push((name.clone(), mean));
        }
    }
    Ok(EvalReport {
        checkpoint: l.checkpoint.map(|c| c.display().to_string()),
        ema: l.ema,
        clips: scores.len(),
        steps: args.steps,
        guidance: args.guidance,
        overall,
        criteria,
        seconds_per_clip: secs,
    })
}

/// Run `reel eval`.
pub fn run(args: &EvalArgs) -> anyhow::Result<()> {
    check_args(args)?;
    let loaded = read_config(&args.source)?;
    super::inference::check_steps(args.steps, &loaded)?;
    let report = with_backend!(loaded.config.runtime.backend, |B| eval::<B>(args, &loaded))?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: EvalArgs,
    }

    fn check(flags: &[&str]) -> Result<(), String> {
        let argv = ["reel-eval", "run"].iter().chain(flags);
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        check_args(&cli.args).map_err(|e| e.to_string())
    }

    /// Each flag out of range is refused naming it, before any model is loaded.
    #[test]
    fn flags_out_of_range_are_refused_by_name() {
        check(&[]).unwrap();
        check(&[
            "--clips",
            "3",
            "--batch",
            "1",
            "--steps",
            "4",
            "--guidance",
            "2.5",
        ])
        .unwrap();
        for (flags, want) in [
            (&["--clips", "0"][..], "--clips: expected an integer >= 1"),
            (&["--batch", "0"], "--batch: expected an integer >= 1"),
            (&["--steps", "0"], "--steps: expected an integer >= 1"),
            (&["--steps", "99999999999999"], "--steps: expected at most"),
            (
                &["--guidance", "nan"],
                "--guidance: expected a positive number",
            ),
            (&["--guidance=-1"], "--guidance: expected a positive number"),
        ] {
            let err = check(flags).unwrap_err();
            assert!(err.contains(want), "{flags:?}: {err}");
        }
    }

    /// A batch whose clips cannot all be held is refused naming `--batch`; the clips are
    /// counted in u128, so no batch overflows the count.
    #[test]
    fn a_batch_beyond_memory_is_refused() {
        let spec = DataSpec {
            channels: 4,
            frames: 2,
            height: 4,
            width: 4,
            text_len: 8,
            text_dim: 16,
        };
        let latents = (spec.channels * spec.frames * spec.height * spec.width) as u64;
        let per_clip = (3 * latents + (spec.text_len * spec.text_dim) as u64) * 4;
        check_batch_memory(4, &spec, Some(4 * per_clip)).unwrap();
        check_batch_memory(4, &spec, None).unwrap();
        let e = check_batch_memory(5, &spec, Some(4 * per_clip)).unwrap_err();
        assert!(e.to_string().contains("--batch 5"), "{e}");
        assert!(check_batch_memory(usize::MAX, &spec, Some(u64::MAX)).is_err());
    }
}
