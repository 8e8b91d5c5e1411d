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
    /// Data set tools: `reel data export` writes a config's data as parquet or safetensors.
    #[command(subcommand)]
    Data(commands::data::DataCommand),
    /// Turn a folder of clips (videos, GIFs, PNG frames) and captions into a FastVideo
    /// parquet data set with the Wan VAE and the UMT5 text encoder.
    #[command(args_override_self = true)]
    Preprocess(commands::preprocess::PreprocessArgs),
}

/// Parse the command line, run the subcommand, print any error as one line on stderr.
pub fn run() -> ExitCode {
    crate::panic_hint::install();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train {
            config,
            set,
            resume,
            output,
        } => commands::train::run(&config, &set, resume, output),
        Command::Check { config, set } => commands::check::run(&config, &set),
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
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
