//! Lines for the user on stderr, and the machine's name they may give.

use std::io::Write;

/// Write `line` and a newline to stderr in one write. `eprintln!` writes each formatted piece
/// on its own, and a launcher that tags the lines of several processes (`mpirun
/// --tag-output`) splits a line at every piece where another process's output came between.
/// A failed write is ignored (stderr closed: there is no one left to tell).
pub fn say(line: &str) {
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// This machine's name as the system tells it (`HOSTNAME`, else Linux's `/proc`, else
/// `/etc/hostname`), trimmed; `None` where none is known.
pub fn host_name() -> Option<String> {
    let raw = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())?;
    let name = raw.trim();
    (!name.is_empty()).then(|| name.to_string())
}
