//! One writer per run folder: the run's first worker holds `<run>/.lock` (an advisory lock of
//! the operating system, released when the process ends however it ends) while it trains. A
//! second `reel train` on the folder (a scheduler requeueing a job whose first copy still
//! runs, a command typed twice) is refused, rather than both writing the same checkpoints and
//! one pruning the other's save in progress.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::Path;

use super::{io_err, run_dir_error, TrainError};
use crate::config::LoadedConfig;
use crate::console::say;

/// The lock file's name in a run folder.
const LOCK_FILE: &str = ".lock";

/// Take `<run_dir>/.lock` for this process, writing its id in it; the returned file holds the
/// lock until dropped. A folder another process holds is an error keyed where the folder came
/// from (`output`, else `runtime.output_dir`) naming that process; a file system without
/// locks (some network ones) runs unlocked, with a warning.
pub(super) fn lock_run_dir(
    loaded: &LoadedConfig,
    output: Option<&Path>,
    run_dir: &Path,
) -> Result<Option<File>, TrainError> {
    let path = run_dir.join(LOCK_FILE);
    let mut file = (OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false))
    .open(&path)
    .map_err(|e| io_err(&path, e))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = match holder.trim() {
                "" => "another process".to_string(),
                pid => format!("process {pid}"),
            };
            let message = format!(
                "`{}` is being trained by {holder} (it holds {}): wait for it to end or stop \
                 it, or train into another folder (`--output`)",
                run_dir.display(),
                path.display()
            );
            return Err(run_dir_error(loaded, output, message).into());
        }
        Err(TryLockError::Error(e)) => {
            say(&format!(
                "reel: warning: {}: cannot lock the run folder ({e}); nothing stops a second \
                 `reel train` on it while this one runs",
                path.display()
            ));
            return Ok(None);
        }
    }
    // Who holds it, for the message above (the lock, not this text, is what counts): the
    // process id, and the machine where one is known (a run folder on a shared file system
    // may be trained from another node).
    let mut holder = std::process::id().to_string();
    if let Some(host) = crate::console::host_name() {
        holder = format!("{holder} on {host}");
    }
    let written = (file.set_len(0))
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(holder.as_bytes()));
    written.map_err(|e| io_err(&path, e))?;
    Ok(Some(file))
}
