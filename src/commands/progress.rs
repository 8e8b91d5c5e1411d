//! Progress output of the long-running subcommands (`reel preprocess`, `reel eval`,
//! `reel sample`): a bar on a terminal; on a log file or a pipe, no bar, and lines that end in
//! a newline.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar over `n` items named `unit` (`"clips"`) on a terminal, hidden otherwise.
pub(crate) fn bar(n: u64, unit: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let template = format!("{{bar:30}} {{pos}}/{{len}} {unit}, {{elapsed}} (ETA {{eta}})");
    let style =
        ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar());
    ProgressBar::new(n).with_style(style)
}

/// One line on stderr, above `bar` when it is shown.
pub(crate) fn say(bar: &ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}
