//! `reel-custom`: the `reel` command line with this crate's plugins linked in.

use custom_method as _;

fn main() -> std::process::ExitCode {
    reel::cli::run()
}
