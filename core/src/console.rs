//! Lines for the user on stderr.

use std::io::Write;

/// Write `line` and a newline to stderr in one write. `eprintln!` writes each formatted piece
/// on its own, and a launcher that tags the lines of several processes (`mpirun
/// --tag-output`) splits a line at every piece where another process's output came between.
/// A failed write is ignored (stderr closed: there is no one left to tell).
pub fn say(line: &str) {
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}
