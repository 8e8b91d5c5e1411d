//! The `reel` command line: [`run`] parses the arguments and runs a subcommand.
//!
//! A crate with its own plugins gets a `reel` binary with them in three lines:
//!
//! ```ignore
//! use my_plugins as _; // link the crate so its registrations are kept
//! fn main() -> std::process::ExitCode {
//!     reel::cli::run()
//! }
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::commands;

/// Reel: a typed, reproducible training framework for video diffusion transformers.
#[derive(Parser, Debug)]
#[command(name = "reel", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Train a run from a TOML config.
    Train {
        /// The run config (TOML).
        config: PathBuf,
        /// Override a config value: `--set training.max_steps=100` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// Resume from `latest` or a checkpoint folder.
        #[arg(long)]
        resume: Option<String>,
        /// Output folder (overrides `[runtime] output_dir`).
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Validate a config completely without training.
    Check {
        /// The run config (TOML).
        config: PathBuf,
        /// Override a config value (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
        /// The output folder `reel train --output` would be given (its run folder is checked).
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// List every registered plugin with its summary.
    List,
    /// Benchmark the forward pass and the training step of Wan presets.
    Bench(commands::bench::BenchArgs),
    /// Generate clips from a checkpoint (latents + GIFs).
    Sample(commands::sample::SampleArgs),
    /// Score generated clips with the data's evaluator (caption accuracy); prints JSON.
    Eval(commands::eval::EvalArgs),
    /// Export a checkpoint's role: merged diffusers `transformer/` folder or LoRA adapter file.
    Export(commands::export::ExportArgs),
    /// Data set tools: `reel data export` writes a config's data as parquet or safetensors;
    /// `reel data negative` encodes a negative prompt for `[data] negative_embedding`.
    #[command(subcommand)]
    Data(commands::data::DataCommand),
    /// Turn a folder of clips (videos, GIFs, PNG/JPEG images and frames) and captions into a
    /// FastVideo parquet data set with the Wan VAE and the UMT5 text encoder.
    #[command(args_override_self = true)]
    Preprocess(commands::preprocess::PreprocessArgs),
}

/// Parse the command line, run the subcommand, print any error as one line on stderr.
pub fn run() -> ExitCode {
    crate::panic_hint::install();
    reel_core::kernel_cache::enable();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train {
            config,
            set,
            resume,
            output,
        } => commands::train::run(&config, &set, resume, output),
        Command::Check {
            config,
            set,
            output,
        } => commands::check::run(&config, &set, output.as_deref()),
        Command::List => commands::list::run(),
        Command::Bench(args) => commands::bench::run(&args),
        Command::Sample(args) => commands::sample::run(&args),
        Command::Eval(args) => commands::eval::run(&args),
        Command::Export(args) => commands::export::run(&args),
        Command::Data(cmd) => commands::data::run(&cmd),
        Command::Preprocess(args) => commands::preprocess::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<Reported>() => ExitCode::FAILURE,
        Err(e) => {
            reel_core::console::say(&format!("error: {}", error_line(&e)));
            ExitCode::FAILURE
        }
    }
}

/// An error its command already printed (in step with the other processes of a run, say):
/// [`run`] only exits with failure.
#[derive(Debug)]
pub struct Reported;

impl std::fmt::Display for Reported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the error was reported above")
    }
}

impl std::error::Error for Reported {}

/// `e` and its causes on one line, joined by `: ` as `{e:#}` joins them, but without a cause
/// whose message already ends the line (after a `: `): many errors print their source in their own
/// message and also return it as their source, which `{e:#}` then says twice
/// ("cannot read `x`: no such file: no such file").
pub fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.ends_with(&format!(": {text}")) || line == text {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::error_line;

    /// An error that prints its source in its message and also returns it as its source.
    #[derive(Debug)]
    struct Read {
        path: String,
        source: std::io::Error,
    }

    impl std::fmt::Display for Read {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "cannot read `{}`: {}", self.path, self.source)
        }
    }

    impl std::error::Error for Read {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn a_cause_already_said_is_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = anyhow::Error::new(Read {
            path: "a.json".into(),
            source: io,
        })
        .context("loading the VAE");
        assert_eq!(
            format!("{e:#}"),
            "loading the VAE: cannot read `a.json`: no such file: no such file"
        );
        assert_eq!(
            error_line(&e),
            "loading the VAE: cannot read `a.json`: no such file"
        );
        // Causes that add something stay.
        let e = anyhow::anyhow!("2").context("step 12").context("training");
        assert_eq!(error_line(&e), "training: step 12: 2");
    }
}
