//! `reel`: train, check, sample and evaluate video diffusion transformers.

fn main() -> std::process::ExitCode {
    reel::cli::run()
}
