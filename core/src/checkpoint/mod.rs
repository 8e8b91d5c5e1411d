//! Checkpoints at step granularity.
//!
//! `<run>/checkpoints/step-<N>/` holds every trainable role's weights (`<role>.safetensors`,
//! diffusers key names), optimizer state (`<role>.optim.safetensors`), EMA shadow
//! (`<role>.ema.safetensors`), callback state, `state.json` (step, data cursor, seed, method
//! state), the resolved `config.toml`, and `manifest.json` (SHA-256 of every file), written
//! last. The folder is assembled under a temporary name and renamed into place; `latest` is
//! then replaced atomically. A crash at any point leaves the previous checkpoint intact.

mod manifest;

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use burn::tensor::TensorData;
use serde::{Deserialize, Serialize};

pub use manifest::*;

use crate::fault;
use crate::io::{read_safetensors, sync_dir, write_safetensors};

/// Errors writing or reading checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file operation failed (disk full, permissions...).
    #[error("{path}: {message}")]
    Io {
        /// File or folder involved.
        path: PathBuf,
        /// The OS error.
        message: String,
    },
    /// A file's tensors do not fit the role the config builds: a checkpoint or published
    /// weights of another config (another model size, adapter rank or target list), or a
    /// file edited by hand.
    #[error(
        "{path}: {message} (the config builds the role differently from the run that wrote this file)"
    )]
    DoesNotFit {
        /// The weights, optimizer or EMA file.
        path: PathBuf,
        /// Which tensors differ ([`crate::role::RoleStateError`]).
        message: String,
    },
    /// A checkpoint is incomplete or corrupted.
    #[error("checkpoint {dir} is damaged: {reason}")]
    Damaged {
        /// The checkpoint folder.
        dir: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// No usable checkpoint exists.
    #[error("no intact checkpoint found under {dir}")]
    NoCheckpoint {
        /// The checkpoints folder searched.
        dir: PathBuf,
    },
    /// `--resume` named a path that does not exist.
    #[error(
        "{path} does not exist: `--resume` takes `latest` (this run's newest checkpoint), a run \
         folder (its newest), or a checkpoint folder such as runs/x/checkpoints/step-00000100"
    )]
    NotFound {
        /// The path given.
        path: PathBuf,
    },
    /// `--resume` named a file, or a folder that is neither a run nor a checkpoint.
    #[error(
        "{path} is not a checkpoint: `--resume` takes `latest` (this run's newest checkpoint), \
         a run folder (its newest), or a checkpoint folder such as \
         runs/x/checkpoints/step-00000100"
    )]
    NotACheckpoint {
        /// The path given.
        path: PathBuf,
    },
    /// The checkpoint was written by a run with a different model/method config.
    #[error("checkpoint {dir} was written by a different config (models/method differ): refusing to resume")]
    ConfigMismatch {
        /// The checkpoint folder.
        dir: PathBuf,
    },
}

impl CheckpointError {
    /// The tensors of `path` that do not fit a role's state ([`CheckpointError::DoesNotFit`]).
    pub fn does_not_fit(path: &Path, e: &crate::role::RoleStateError) -> Self {
        CheckpointError::DoesNotFit {
            path: path.to_path_buf(),
            message: e.to_string(),
        }
    }

    /// An I/O error on `path`.
    pub fn io(path: &Path, e: impl std::fmt::Display) -> Self {
        CheckpointError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        }
    }
}

/// Trainer state stored in `state.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Completed steps.
    pub step: u64,
    /// Data loader cursor (samples consumed).
    pub data_cursor: u64,
    /// Data-parallel workers of the run that wrote it (0 in checkpoints from before
    /// data parallelism: one). The state does not depend on it; resume reports a change.
    #[serde(default)]
    pub workers: usize,
    /// Run seed.
    pub seed: u64,
    /// Optimizer steps per role.
    pub optimizer_steps: BTreeMap<String, u64>,
    /// Method state ([`crate::method::TrainingMethod::state`]).
    pub method_state: serde_json::Value,
    /// A stamp (size, hash of both ends) of each role's `weights` file or folder, by role:
    /// a resume warns when one changed. Absent when no role names weights.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub weights: BTreeMap<String, String>,
    /// The shapes of the run's samples: `reel sample` reads them when the run's data is not
    /// at hand (absent in checkpoints from before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_spec: Option<crate::data::DataSpec>,
    /// How many samples the run's data set had: a resume warns when it changed, since the
    /// data cursor then maps to other samples (absent in checkpoints from before it was
    /// recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_len: Option<u64>,
    /// Steps the run has skipped for non-finite values so far (`training.non_finite =
    /// "skip"`), so that a resumed run's count is the whole run's (absent: none, or a
    /// checkpoint from before it was recorded).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_steps: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl TrainerState {
    /// Read the `state.json` of checkpoint folder `dir`.
    pub fn read(dir: &Path) -> Result<Self, CheckpointError> {
        let path = dir.join(STATE_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| CheckpointError::io(&path, e))?;
        serde_json::from_str(&text).map_err(|e| CheckpointError::Damaged {
            dir: dir.to_path_buf(),
            reason: format!("{STATE_FILE}: {e}"),
        })
    }
}

/// Whether a verified checkpoint (its folder and manifest) was written by a config that
/// fits the one asking; see [`CheckpointStore::resolve_accepting`].
pub type Accept<'a> = &'a dyn Fn(&Path, &Manifest) -> bool;

/// The `checkpoints/` folder of a run.
#[derive(Debug, Clone)]
pub struct CheckpointStore {
    root: PathBuf,
    keep_last: usize,
}

/// A checkpoint being assembled in a temporary folder.
#[derive(Debug)]
pub struct PendingCheckpoint {
    dir: PathBuf,
    step: u64,
}

impl PendingCheckpoint {
    /// The temporary folder (callbacks write their files here).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Write a file (fsynced).
    pub fn write_bytes(&self, name: &str, bytes: &[u8]) -> Result<(), CheckpointError> {
        fault::point("checkpoint-file");
        injected_disk_full(&self.dir.join(name))?;
        write_synced(&self.dir.join(name), bytes)
    }

    /// Write tensors as a safetensors file (fsynced, as every safetensors write is).
    pub fn write_tensors(
        &self,
        name: &str,
        tensors: &[(String, TensorData)],
        metadata: Option<HashMap<String, String>>,
    ) -> Result<(), CheckpointError> {
        fault::point("checkpoint-file");
        let p = self.dir.join(name);
        injected_disk_full(&p)?;
        write_safetensors(&p, tensors, metadata).map_err(|e| CheckpointError::io(&p, e))
    }
}

/// A failed save removes its temporary folder (a full disk gets its space back); after a
/// successful commit the folder has been renamed and there is nothing to remove.
impl Drop for PendingCheckpoint {
    fn drop(&mut self) {
        if self.dir.exists() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// The error a fault point that stands for a full disk gives.
const INJECTED_DISK_FULL: &str = "No space left on device (os error 28) [injected by REEL_FAULT]";

/// The `checkpoint-disk-full` fault point: a write error as a full disk gives it.
fn injected_disk_full(path: &Path) -> Result<(), CheckpointError> {
    if fault::fires("checkpoint-disk-full") {
        return Err(CheckpointError::io(path, INJECTED_DISK_FULL));
    }
    Ok(())
}

/// Folder name of the checkpoint after `step` completed steps.
pub fn step_dir_name(step: u64) -> String {
    format!("step-{step:08}")
}

/// The step of a checkpoint folder's name (`step-N`); `None` for any other name.
pub fn step_of(name: &str) -> Option<u64> {
    name.strip_prefix("step-")?.parse().ok()
}

/// The step of a previous copy that a re-save moved aside (`.old-step-N-<pid>`).
fn step_set_aside(name: &str) -> Option<u64> {
    let (step, pid) = name.strip_prefix(".old-step-")?.rsplit_once('-')?;
    pid.parse::<u32>().ok()?;
    step.parse().ok()
}

/// Whether `dir` has no manifest or one that is not JSON of a manifest: a folder no resume can
/// take. A manifest that cannot be read now (a permission, a network file system's hiccup) is
/// not taken for one, so pruning never deletes an intact checkpoint for it.
fn lacks_manifest(dir: &Path) -> bool {
    match fs::read_to_string(dir.join(MANIFEST)) {
        Ok(text) => serde_json::from_str::<Manifest>(&text).is_err(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// A path's last component, lossily as text.
fn file_name(path: &Path) -> String {
    path.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

impl CheckpointStore {
    /// The store under `<run_dir>/checkpoints`.
    pub fn new(run_dir: &Path, keep_last: usize) -> Self {
        Self {
            root: run_dir.join("checkpoints"),
            keep_last: keep_last.max(1),
        }
    }

    /// A store over an existing `checkpoints/` folder, for reading (nothing is pruned).
    pub fn at(checkpoints: &Path) -> Self {
        Self {
            root: checkpoints.to_path_buf(),
            keep_last: usize::MAX,
        }
    }

    /// The `checkpoints/` folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The folder of the checkpoint after `step` completed steps, written or not.
    pub fn step_dir(&self, step: u64) -> PathBuf {
        self.root.join(step_dir_name(step))
    }

    /// Start a checkpoint for `step` in a fresh temporary folder.
    pub fn begin(&self, step: u64) -> Result<PendingCheckpoint, CheckpointError> {
        fs::create_dir_all(&self.root).map_err(|e| CheckpointError::io(&self.root, e))?;
        let dir = self.root.join(format!(
            ".tmp-{}-{}",
            step_dir_name(step),
            std::process::id()
        ));
        if dir.exists() {
            fs::remove_dir_all(&dir).map_err(|e| CheckpointError::io(&dir, e))?;
        }
        fs::create_dir_all(&dir).map_err(|e| CheckpointError::io(&dir, e))?;
        Ok(PendingCheckpoint { dir, step })
    }

    /// Finish a checkpoint: hash every file, write the manifest, rename the folder into place,
    /// point `latest` at it, prune old checkpoints. Returns the final folder.
    pub fn commit(
        &self,
        pending: PendingCheckpoint,
        config_fingerprint: &str,
    ) -> Result<PathBuf, CheckpointError> {
        let mut files = BTreeMap::new();
        collect_files(&pending.dir, &pending.dir, &mut files)?;
        let manifest = Manifest {
            format: FORMAT_VERSION,
            step: pending.step,
            config_fingerprint: config_fingerprint.to_string(),
            files,
        };
        let text = serde_json::to_string_pretty(&manifest).expect("manifest serializes");
        fault::point("checkpoint-manifest");
        write_synced(&pending.dir.join(MANIFEST), text.as_bytes())?;
        sync_dir(&pending.dir);
        let final_dir = self.step_dir(pending.step);
        // Re-saving a step (a damaged copy skipped at resume, or a step an interrupt saved
        // again): move the old copy aside, and delete it only once the new one is in place.
        let trash = self.root.join(format!(
            ".old-{}-{}",
            step_dir_name(pending.step),
            std::process::id()
        ));
        // The old copy goes back if the rename fails; had the process died between the
        // renames instead, `list` reads it under its hidden name until a new copy of the
        // step is in place. A pointer naming the step goes first: between the renames it
        // would name a missing folder.
        let latest = self.root.join("latest");
        if final_dir.exists() && pointer_names(&latest, pending.step) {
            let _ = fs::remove_file(&latest);
            sync_dir(&self.root);
        }
        crate::io::rename_replacing(&pending.dir, &final_dir, &trash, "checkpoint-rename")
            .map_err(|e| CheckpointError::io(&final_dir, e))?;
        sync_dir(&self.root);
        let _ = fs::remove_dir_all(&trash);
        // The checkpoint is complete. The pointer is replaced (atomically) before old
        // checkpoints are pruned, so that it always names one that exists and an interrupt
        // at any moment leaves one. A pointer that cannot be written (a full disk) is only a
        // warning, as `--resume latest` does not read it: the old pointer goes then, before
        // the prune, so that it never names a pruned checkpoint.
        fault::point("checkpoint-latest");
        let pointed = match fault::fires("latest-pointer-fails") {
            true => Err(std::io::Error::other(INJECTED_DISK_FULL)),
            false => crate::io::replace_file(&latest, step_dir_name(pending.step).as_bytes()),
        };
        if let Err(e) = pointed {
            let removed = fs::remove_file(&latest);
            sync_dir(&self.root);
            if removed.is_err() && latest.exists() {
                // A stale pointer that stays must not outlive what it names.
                return Ok(final_dir);
            }
            crate::console::say(&format!(
                "reel: warning: {}: no pointer to the newest checkpoint was written; \
                 {} is complete, and `--resume latest` finds it without the pointer",
                CheckpointError::io(&latest, e),
                final_dir.display()
            ));
        }
        self.prune(&final_dir);
        Ok(final_dir)
    }

    /// Completed checkpoints `(step, folder)`, newest first (not verified). A step whose
    /// `step-N` folder is missing but whose previous copy was moved aside by a re-save that
    /// died before the new copy was renamed into place (`.old-step-N-<pid>`) is listed under
    /// that hidden folder (one whose manifest reads, where there are several).
    pub fn list(&self) -> Vec<(u64, PathBuf)> {
        let (mut found, set_aside) = self.scan();
        for (n, dir) in set_aside {
            let better =
                |kept: &PathBuf| Manifest::read(kept).is_err() && Manifest::read(&dir).is_ok();
            match found.get(&n) {
                None => {
                    found.insert(n, dir);
                }
                Some(kept) if step_set_aside(&file_name(kept)).is_some() && better(kept) => {
                    found.insert(n, dir);
                }
                Some(_) => {}
            }
        }
        found.into_iter().rev().collect()
    }

    /// The store's `step-N` folders by step, and its moved-aside previous copies
    /// (`.old-step-N-<pid>`), every one.
    fn scan(&self) -> (BTreeMap<u64, PathBuf>, Vec<(u64, PathBuf)>) {
        let mut steps = BTreeMap::new();
        let mut set_aside = vec![];
        if let Ok(rd) = fs::read_dir(&self.root) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if let Some(n) = step_of(&name) {
                    steps.insert(n, e.path());
                } else if let Some(n) = step_set_aside(&name) {
                    set_aside.push((n, e.path()));
                }
            }
        }
        (steps, set_aside)
    }

    /// Remove leftovers of interrupted saves and prunes (a previous copy moved aside only
    /// once its step has a copy in place), then all checkpoints but `kept` (the one just
    /// written, never removed) and the newest `keep_last - 1` others that have a manifest:
    /// those without one (or with one that does not parse), which no resume can take, are
    /// moved aside without counting ([`Self::set_aside_damaged`]), so they never push out an
    /// older resumable checkpoint.
    fn prune(&self, kept: &Path) {
        if let Ok(rd) = fs::read_dir(&self.root) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                let leftover = name.starts_with(".tmp-")
                    || crate::io::tmp_sibling_target(&name).is_some()
                    || step_set_aside(&name).is_some_and(|n| self.step_dir(n).is_dir());
                if leftover {
                    let _ = crate::io::remove_any(&e.path());
                }
            }
        }
        let others = self.list().into_iter().filter(|(_, d)| d != kept);
        let (damaged, intact): (Vec<_>, Vec<_>) = others.partition(|(_, d)| lacks_manifest(d));
        for (_, dir) in damaged {
            self.set_aside_damaged(&dir);
        }
        for (_, dir) in intact.into_iter().skip(self.keep_last - 1) {
            // Renamed first, so that a crash while deleting leaves a leftover the next prune
            // removes, never a `step-N` folder without its manifest.
            let doomed = self.root.join(format!(
                ".tmp-pruned-{}-{}",
                file_name(&dir),
                std::process::id()
            ));
            if fs::rename(&dir, &doomed).is_ok() {
                let _ = fs::remove_dir_all(doomed);
            }
        }
    }

    /// `<root>/<base>`, or `<base>-2`, `-3`, ... where that exists: a folder name not in use.
    fn unused_folder(&self, base: &str) -> PathBuf {
        (1..)
            .map(|k| match k {
                1 => self.root.join(base),
                k => self.root.join(format!("{base}-{k}")),
            })
            .find(|d| !d.exists())
            .expect("an unused folder name")
    }

    /// Move a checkpoint folder without a manifest that parses (edited by hand, or another
    /// tool's) to `damaged-<name>[-k]/`, out of listing and pruning, and say so: what it holds
    /// may be someone's only copy, so it is not deleted. (Saves never leave such a folder:
    /// one is renamed into place with its manifest, and pruning renames before deleting.)
    fn set_aside_damaged(&self, dir: &Path) {
        let aside = self.unused_folder(&format!(
            "damaged-{}",
            file_name(dir).trim_start_matches('.')
        ));
        if fs::rename(dir, &aside).is_ok() {
            crate::console::say(&format!(
                "reel: warning: {} has no readable manifest, so no resume can take it: moved \
                 to {} (delete it when no longer needed)",
                dir.display(),
                aside.display()
            ));
        }
    }

    /// Move every checkpoint of a step after `step` (intact or damaged) into a new folder
    /// `abandoned-after-step-<step>[-<k>]/` of this store, where listing, `--resume latest`
    /// and pruning do not look: resuming from an older checkpoint starts a new timeline, whose
    /// saves would otherwise replace the old one's step by step and prune it. Returns the
    /// folder and the names moved, `None` when there were none.
    pub fn set_aside_newer(
        &self,
        step: u64,
    ) -> Result<Option<(PathBuf, Vec<String>)>, CheckpointError> {
        // Every copy of a later step, also a previous copy moved aside beside its step's
        // folder (a re-save whose clean-up did not finish), which would else be listed again
        // once that folder is gone.
        let (steps, set_aside) = self.scan();
        let newer: Vec<PathBuf> = (steps.into_iter().chain(set_aside))
            .filter(|(n, _)| *n > step)
            .map(|(_, d)| d)
            .collect();
        if newer.is_empty() {
            return Ok(None);
        }
        let aside = self.unused_folder(&format!("abandoned-after-{}", step_dir_name(step)));
        fs::create_dir(&aside).map_err(|e| CheckpointError::io(&aside, e))?;
        let mut names = vec![];
        for dir in &newer {
            let name = dir.file_name().expect("a step folder").to_owned();
            fs::rename(dir, aside.join(&name)).map_err(|e| CheckpointError::io(dir, e))?;
            names.push(name.to_string_lossy().into_owned());
        }
        sync_dir(&self.root);
        Ok(Some((aside, names)))
    }

    /// `--resume <path>`: a checkpoint folder (verified), a run folder or a `checkpoints/`
    /// folder (its newest intact checkpoint), or a `checkpoints/latest` file (the same).
    fn resolve_path(
        path: &Path,
        accept: Accept,
    ) -> Result<(PathBuf, Manifest, Vec<String>), CheckpointError> {
        let pointer = path.file_name().is_some_and(|n| n == "latest");
        // A `checkpoints/latest` pointer may be missing (a full disk stopped its write, or
        // someone removed it): its folder is meant.
        let store_of_pointer = pointer && path.parent().is_some_and(|p| p.is_dir());
        if !path.exists() && !store_of_pointer {
            return Err(CheckpointError::NotFound {
                path: path.to_path_buf(),
            });
        }
        let store = if pointer && !path.is_dir() {
            path.parent().map(Self::at)
        } else if path.join("checkpoints").is_dir() {
            Some(Self::at(&path.join("checkpoints")))
        } else if !path.join(MANIFEST).exists() && !Self::at(path).list().is_empty() {
            Some(Self::at(path))
        } else {
            None
        };
        if store.is_none() && !path.join(MANIFEST).exists() {
            return Err(Self::no_manifest(path));
        }
        match store {
            Some(store) => store.resolve_accepting("latest", accept),
            None => {
                let m = Self::verify_accepting(path, accept)?;
                Ok((path.to_path_buf(), m, vec![]))
            }
        }
    }

    /// What `--resume <path>` without a manifest (and no checkpoints under it) is: a step
    /// folder that lost it is damaged ([`Self::verify`] says so); a run folder or an empty
    /// `checkpoints/` holds no checkpoint yet; any other folder, or a file, is no checkpoint.
    fn no_manifest(path: &Path) -> CheckpointError {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let name = name.unwrap_or_default();
        let run = path.join("config.resolved.toml").is_file() || path.join("final").is_dir();
        if path.is_dir() && name.starts_with("step-") {
            Self::verify_accepting(path, &|_, _| true).err().unwrap_or(
                CheckpointError::NotACheckpoint {
                    path: path.to_path_buf(),
                },
            )
        } else if path.is_dir() && (run || name == "checkpoints") {
            CheckpointError::NoCheckpoint {
                dir: path.to_path_buf(),
            }
        } else {
            CheckpointError::NotACheckpoint {
                path: path.to_path_buf(),
            }
        }
    }

    /// Verify one checkpoint folder: manifest present, of the step its name says (a
    /// `step-N` folder; a copy renamed by hand is not taken for another step), checksums
    /// match, same config.
    pub fn verify(dir: &Path, config_fingerprint: &str) -> Result<Manifest, CheckpointError> {
        Self::verify_accepting(dir, &|_, m| m.config_fingerprint == config_fingerprint)
    }

    /// [`Self::verify`], where `accept` decides whether the verified checkpoint's config
    /// fits (else [`CheckpointError::ConfigMismatch`]).
    pub fn verify_accepting(dir: &Path, accept: Accept) -> Result<Manifest, CheckpointError> {
        let m = Manifest::read(dir)?;
        let name = file_name(dir);
        if let Some(n) = step_of(&name)
            .or(step_set_aside(&name))
            .filter(|&n| n != m.step)
        {
            return Err(CheckpointError::Damaged {
                dir: dir.to_path_buf(),
                reason: format!("its name says step {n}, its manifest step {}", m.step),
            });
        }
        m.verify(dir)?;
        if !accept(dir, &m) {
            return Err(CheckpointError::ConfigMismatch {
                dir: dir.to_path_buf(),
            });
        }
        Ok(m)
    }

    /// Resolve `--resume latest` (newest intact checkpoint, falling back past damaged ones;
    /// the `latest` file is a pointer for people and scripts, not consulted: a crash between
    /// a checkpoint's rename and the pointer's update leaves it one behind) or
    /// `--resume <dir>` (that folder, verified). Returns the folder, its manifest, and
    /// warnings about checkpoints that were skipped.
    pub fn resolve(
        &self,
        spec: &str,
        config_fingerprint: &str,
    ) -> Result<(PathBuf, Manifest, Vec<String>), CheckpointError> {
        self.resolve_accepting(spec, &|_, m| m.config_fingerprint == config_fingerprint)
    }

    /// [`Self::resolve`], where `accept` decides whether a verified checkpoint's config fits
    /// (`sample`, `eval` and `export` take any: a run's checkpoints hold one `[models]` and
    /// `[method]`, as a resume refuses others).
    pub fn resolve_accepting(
        &self,
        spec: &str,
        accept: Accept,
    ) -> Result<(PathBuf, Manifest, Vec<String>), CheckpointError> {
        if spec != "latest" {
            return Self::resolve_path(Path::new(spec), accept);
        }
        let mut warnings = vec![];
        for (_, dir) in self.list() {
            match Self::verify_accepting(&dir, accept) {
                Ok(m) => return Ok((dir, m, warnings)),
                // Only a checkpoint known to be damaged is passed over: one that cannot be
                // read now may be intact, and resuming before it would set it aside.
                Err(e @ CheckpointError::Damaged { .. }) => {
                    warnings.push(format!("{e}; skipped, falling back to an older checkpoint"))
                }
                Err(e) => return Err(e),
            }
        }
        Err(CheckpointError::NoCheckpoint {
            dir: self.root.clone(),
        })
    }
}

/// Whether the `latest` pointer at `path` names the folder of `step`.
fn pointer_names(path: &Path, step: u64) -> bool {
    fs::read_to_string(path).is_ok_and(|text| text.trim() == step_dir_name(step))
}

fn collect_files(
    base: &Path,
    dir: &Path,
    out: &mut BTreeMap<String, FileEntry>,
) -> Result<(), CheckpointError> {
    let rd = fs::read_dir(dir).map_err(|e| CheckpointError::io(dir, e))?;
    for e in rd {
        let e = e.map_err(|e| CheckpointError::io(dir, e))?;
        let p = e.path();
        if p.is_dir() {
            collect_files(base, &p, out)?;
        } else {
            let rel = p
                .strip_prefix(base)
                .expect("under base")
                .to_string_lossy()
                .replace('\\', "/");
            out.insert(rel, sha256_file(&p)?);
        }
    }
    Ok(())
}

/// Tensors by key plus the file's string metadata.
pub type TensorsWithMetadata = (BTreeMap<String, TensorData>, HashMap<String, String>);

/// Read a safetensors file of a checkpoint (as f32 tensors).
pub fn read_tensors(dir: &Path, name: &str) -> Result<TensorsWithMetadata, CheckpointError> {
    let p = dir.join(name);
    let (t, m) = read_safetensors(&p).map_err(|e| CheckpointError::Damaged {
        dir: dir.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok((t, m.unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn save(store: &CheckpointStore, step: u64, fp: &str) -> PathBuf {
        let p = store.begin(step).unwrap();
        p.write_bytes("state.json", format!("{{\"step\":{step}}}").as_bytes())
            .unwrap();
        p.write_tensors(
            "w.safetensors",
            &[("a".into(), TensorData::new(vec![step as f32; 4], [2, 2]))],
            None,
        )
        .unwrap();
        store.commit(p, fp).unwrap()
    }

    #[test]
    fn commit_resolve_prune_and_fallback() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(tmp.path(), 2);
        save(&store, 1, "fp");
        save(&store, 2, "fp");
        let d3 = save(&store, 3, "fp");
        assert_eq!(store.list().len(), 2, "keep_last = 2");
        let (dir, m, warn) = store.resolve("latest", "fp").unwrap();
        assert_eq!((dir.clone(), m.step, warn.len()), (d3.clone(), 3, 0));
        // Bit-flip the newest weights: latest falls back to step 2 and says why.
        let w = d3.join("w.safetensors");
        let mut bytes = fs::read(&w).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        fs::write(&w, bytes).unwrap();
        let (dir, m, warn) = store.resolve("latest", "fp").unwrap();
        assert_eq!(m.step, 2);
        assert!(dir.ends_with("step-00000002"));
        assert!(warn[0].contains("checksum"), "{warn:?}");
        // Explicit folder: the damage is an error.
        let err = store.resolve(d3.to_str().unwrap(), "fp").unwrap_err();
        assert!(err.to_string().contains("damaged"), "{err}");
        // The run folder, the checkpoints folder and its `latest` file mean the newest intact
        // one; a path that is not there says so.
        let root = store.root().to_path_buf();
        for p in [tmp.path().to_path_buf(), root.clone(), root.join("latest")] {
            let (dir, m, _) = store.resolve(p.to_str().unwrap(), "fp").unwrap();
            assert_eq!((m.step, dir.ends_with("step-00000002")), (2, true), "{p:?}");
        }
        let err = store.resolve("nope/step-1", "fp").unwrap_err().to_string();
        assert!(err.contains("nope/step-1 does not exist"), "{err}");
        // Another config.
        let err = store.resolve("latest", "other").unwrap_err();
        assert!(
            matches!(err, CheckpointError::ConfigMismatch { .. }),
            "{err}"
        );
    }

    #[test]
    fn newer_checkpoints_are_set_aside_and_the_new_one_is_never_pruned() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(tmp.path(), 3);
        save(&store, 2, "fp");
        save(&store, 4, "fp");
        save(&store, 5, "fp");
        assert!(store.set_aside_newer(5).unwrap().is_none());
        // The `latest` pointer one behind (a crash before its update): the newest wins.
        fs::write(store.root().join("latest"), "step-00000004").unwrap();
        assert_eq!(store.resolve("latest", "fp").unwrap().1.step, 5);
        let (aside, names) = store.set_aside_newer(2).unwrap().unwrap();
        assert_eq!(names, ["step-00000004", "step-00000005"]);
        assert!(aside.ends_with("abandoned-after-step-00000002"));
        for n in &names {
            let d = aside.join(n);
            Manifest::read(&d).unwrap().verify(&d).unwrap();
        }
        let steps = |s: &CheckpointStore| s.list().into_iter().map(|(n, _)| n).collect::<Vec<_>>();
        assert_eq!(steps(&store), [2]);
        // The new timeline's saves do not touch the set-aside ones; a second branch from the
        // same step gets its own folder.
        save(&store, 3, "fp");
        save(&store, 4, "fp");
        let (again, _) = store.set_aside_newer(2).unwrap().unwrap();
        assert!(again.ends_with("abandoned-after-step-00000002-2"));
        assert_eq!(fs::read_dir(&aside).unwrap().count(), 2);
        // With keep_last = 1 and a damaged newer checkpoint left in place, the checkpoint
        // just written stays and the damaged one is moved aside.
        let d5 = save(&store, 5, "fp");
        fs::remove_file(d5.join(MANIFEST)).unwrap();
        let one = CheckpointStore::new(tmp.path(), 1);
        let d3 = save(&one, 3, "fp");
        assert_eq!(steps(&one), [3]);
        // Saving step 3 again replaces it whole and leaves no `.old-` folder behind.
        assert_eq!(save(&one, 3, "fp"), d3);
        let hidden = fs::read_dir(one.root())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.')
            })
            .count();
        assert_eq!(hidden, 0);
        Manifest::read(&d3).unwrap().verify(&d3).unwrap();
    }

    /// A re-save of step 2 that died between its two renames left the old copy under its
    /// hidden name and no `step-00000002`: it is still listed and resumed, a later save does
    /// not delete it, and a new copy of step 2 replaces it (and then it goes). A leftover
    /// temporary `latest` goes at the next save too.
    #[test]
    fn a_copy_moved_aside_by_a_dead_resave_is_kept_until_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(tmp.path(), 3);
        save(&store, 1, "fp");
        let d2 = save(&store, 2, "fp");
        let aside = store.root().join(".old-step-00000002-4242");
        fs::rename(&d2, &aside).unwrap();
        fs::write(store.root().join(".latest.tmp4242"), "x").unwrap();
        let (dir, m, _) = store.resolve("latest", "fp").unwrap();
        assert_eq!((dir, m.step), (aside.clone(), 2));
        save(&store, 3, "fp");
        assert!(aside.is_dir(), "the only copy of step 2 was pruned");
        assert!(!store.root().join(".latest.tmp4242").exists());
        let steps: Vec<u64> = store.list().iter().map(|(n, _)| *n).collect();
        assert_eq!(steps, [3, 2, 1]);
        save(&store, 2, "fp");
        assert!(
            !aside.exists(),
            "a copy of step 2 is in place: the old one goes"
        );
        assert_eq!(store.list()[1], (2, store.step_dir(2)));
        // A previous copy of step 3 beside its folder (a clean-up that did not finish) goes
        // with it when a resume from step 1 sets the later steps aside: it is not listed
        // again once `step-00000003` is gone.
        fs::create_dir(store.root().join(".old-step-00000003-777")).unwrap();
        let (_, names) = store.set_aside_newer(1).unwrap().unwrap();
        assert_eq!(names.len(), 3, "{names:?}");
        assert_eq!(store.list(), [(1, store.step_dir(1))]);
    }

    /// Pruning keeps `keep_last` checkpoints with a manifest: one without (which no resume
    /// can take) is moved aside, not deleted, and does not take the place of an older
    /// resumable one; one whose manifest cannot be read now (here: a folder in its place) is
    /// kept and counted, and `--resume latest` stops at it with the read error rather than
    /// falling back past it.
    #[test]
    fn damaged_checkpoints_do_not_count_towards_keep_last() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(tmp.path(), 2);
        let d1 = save(&store, 1, "fp");
        let d2 = save(&store, 2, "fp");
        fs::remove_file(d2.join(MANIFEST)).unwrap();
        save(&store, 3, "fp");
        assert!(
            d1.is_dir(),
            "the intact fallback was pruned for a damaged one"
        );
        assert!(!d2.exists());
        let kept = store.root().join("damaged-step-00000002");
        assert!(kept.join("w.safetensors").is_file(), "its files were lost");
        assert_eq!(store.list().len(), 2);
        let d4 = save(&store, 4, "fp");
        fs::remove_file(d4.join(MANIFEST)).unwrap();
        fs::create_dir(d4.join(MANIFEST)).unwrap();
        save(&store, 5, "fp");
        assert!(
            d4.is_dir(),
            "a manifest that cannot be read now is no missing one"
        );
        assert_eq!(store.list().len(), 2);
        let d5 = store.step_dir(5);
        fs::remove_file(d5.join(MANIFEST)).unwrap();
        fs::create_dir(d5.join(MANIFEST)).unwrap();
        let err = store.resolve("latest", "fp").unwrap_err();
        assert!(matches!(err, CheckpointError::Io { .. }), "{err}");
        assert!(err.to_string().contains("step-00000005"), "{err}");
        // Nothing was pruned, set aside or left behind.
        let names = |s: &CheckpointStore| {
            let mut n: Vec<String> = (fs::read_dir(s.root()).unwrap())
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            n.sort();
            n
        };
        assert_eq!(
            names(&store),
            [
                "damaged-step-00000002",
                "latest",
                "step-00000004",
                "step-00000005"
            ]
        );
    }

    /// A checkpoint copied under another step's name is not taken for that step: `--resume
    /// latest` passes over it, saying why.
    #[test]
    fn a_checkpoint_under_another_steps_name_is_damaged() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(tmp.path(), 5);
        let d1 = save(&store, 1, "fp");
        let copy = store.step_dir(9);
        fs::create_dir(&copy).unwrap();
        for e in fs::read_dir(&d1).unwrap() {
            let e = e.unwrap();
            fs::copy(e.path(), copy.join(e.file_name())).unwrap();
        }
        let (dir, m, warn) = store.resolve("latest", "fp").unwrap();
        assert_eq!((dir, m.step), (d1, 1));
        assert!(
            warn[0].contains("its name says step 9, its manifest step 1"),
            "{warn:?}"
        );
    }

    #[test]
    fn truncated_and_missing_manifest_are_detected() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(tmp.path(), 5);
        let d1 = save(&store, 1, "fp");
        let d2 = save(&store, 2, "fp");
        fs::remove_file(d2.join(MANIFEST)).unwrap();
        let (dir, _, warn) = store.resolve("latest", "fp").unwrap();
        assert_eq!(dir, d1);
        assert!(warn[0].contains("manifest"), "{warn:?}");
        let w = d1.join("w.safetensors");
        let len = fs::metadata(&w).unwrap().len();
        fs::File::options()
            .write(true)
            .open(&w)
            .unwrap()
            .set_len(len - 3)
            .unwrap();
        let err = store.resolve("latest", "fp").unwrap_err();
        assert!(matches!(err, CheckpointError::NoCheckpoint { .. }), "{err}");
    }

    /// `--resume` given a file or a folder that is no run is told what it takes; a step
    /// folder that lost its manifest is damaged.
    #[test]
    fn a_path_that_is_no_checkpoint_is_named_as_such() {
        let tmp = tempfile::tempdir().unwrap();
        let store = CheckpointStore::new(tmp.path(), 5);
        let d1 = save(&store, 1, "fp");
        let file = tmp.path().join("run.toml");
        fs::write(&file, "x").unwrap();
        let plain = tmp.path().join("notes");
        fs::create_dir(&plain).unwrap();
        for path in [&file, &plain] {
            let spec = path.to_str().unwrap();
            let err = store.resolve(spec, "fp").unwrap_err();
            assert!(
                matches!(err, CheckpointError::NotACheckpoint { .. }),
                "{spec}: {err}"
            );
        }
        // A run folder whose checkpoints are gone, and an empty `checkpoints/`: no checkpoint.
        let run = tmp.path().join("run");
        fs::create_dir_all(run.join("checkpoints")).unwrap();
        fs::write(run.join("config.resolved.toml"), "").unwrap();
        for path in [run.join("checkpoints"), run.clone()] {
            let err = store.resolve(path.to_str().unwrap(), "fp").unwrap_err();
            assert!(matches!(err, CheckpointError::NoCheckpoint { .. }), "{err}");
        }
        fs::remove_dir(run.join("checkpoints")).unwrap();
        let err = store.resolve(run.to_str().unwrap(), "fp").unwrap_err();
        assert!(matches!(err, CheckpointError::NoCheckpoint { .. }), "{err}");
        fs::remove_file(d1.join(MANIFEST)).unwrap();
        let err = store.resolve(d1.to_str().unwrap(), "fp").unwrap_err();
        assert!(matches!(err, CheckpointError::Damaged { .. }), "{err}");
    }
}
