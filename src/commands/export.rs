//! `reel export`: turn a checkpoint's role weights into files other tools load.
//!
//! ```text
//! reel export runs/lora_quickstart --out exported/transformer                  # merged model
//! reel export runs/lora_quickstart --out exported/lora --format lora           # adapter only
//! reel export runs/x/checkpoints/step-00000300 --config run.toml --role student --ema --out o
//! ```
//!
//! The role is rebuilt from the run config (architecture, base weights, adapter), the
//! checkpoint's `<role>.safetensors` (or `<role>.ema.safetensors` with `--ema`) is loaded into
//! its trainable parameters (exact key check), then:
//! - `--format diffusers` (default): adapters are merged (`W + alpha/r · B A`) and dropped,
//!   and the model is written as a diffusers `transformer/` folder (`config.json` +
//!   `diffusion_pytorch_model.safetensors`) into `--out`;
//! - `--format lora`: the adapter is written as `<out>/pytorch_lora_weights.safetensors` in
//!   the diffusers/PEFT layout with `lora_adapter_metadata`;
//! - `--format comfyui`: the adapter is written as `<out>/lora_comfyui.safetensors` with the
//!   original Wan module names ComfyUI's loader expects.
//!
//! Export runs on the CPU backend (it only reads, merges and writes weights). It does not
//! replace files another export (or a model) left in `--out` unless `--force` is given, and
//! never writes a single-file model beside a sharded one (its index would win when loaded) or
//! over the weights a role of the run is built from.

use std::path::{Path, PathBuf};

use anyhow::bail;
use reel_core::backend::CpuBackend;
use reel_core::checkpoint::{step_of, CheckpointError, Manifest};
use reel_core::config::{load_run_config, LoadedConfig};
use reel_core::role::{RoleHandle, TrainableRole};
use reel_core::trainer::{ema_file, weights_file};
use reel_models::lora::io::{adapter_target, COMFY_LORA_FILE, LORA_WEIGHTS_FILE};
use reel_models::lora::{merge_and_unload, save_lora, save_lora_comfy, LoraSpec};
use reel_models::wan::weights::{CONFIG_FILE, INDEX_FILE, WEIGHTS_FILE};
use reel_models::{build_wan_role, WanArch, WanModel, ARCH_NAME};

use super::inference::{config_for, weights_folder};

/// Output layout of `reel export`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// The whole model (adapters merged) as a diffusers `transformer/` folder.
    Diffusers,
    /// Only the LoRA adapter, as diffusers' `pytorch_lora_weights.safetensors`.
    Lora,
    /// Only the LoRA adapter, in the ComfyUI / original-Wan key style
    /// (`lora_comfyui.safetensors`: `diffusion_model.….lora_down/lora_up/alpha`).
    Comfyui,
}

/// `reel export` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ExportArgs {
    /// A checkpoint folder (`.../checkpoints/step-N`, or a run's `final/`) or a run folder
    /// (its newest intact checkpoint is used).
    pub checkpoint: PathBuf,
    /// The run config; defaults to the checkpoint's `config.toml`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The role to export.
    #[arg(long, default_value = "student")]
    pub role: String,
    /// Export the EMA weights (`<role>.ema.safetensors`) instead of the live ones.
    #[arg(long)]
    pub ema: bool,
    /// Output folder; for `lora` and `comfyui`, a `.safetensors` file name also works.
    #[arg(long)]
    pub out: PathBuf,
    /// What to write.
    #[arg(long, value_enum, default_value_t = ExportFormat::Diffusers)]
    pub format: ExportFormat,
    /// Override a config value (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Replace the files an earlier export left in `--out`.
    #[arg(long)]
    pub force: bool,
}

impl ExportFormat {
    /// The files this format writes for `--out`: into the folder, or (an adapter) the
    /// `.safetensors` file `out` names.
    fn targets(self, out: &Path) -> Vec<PathBuf> {
        match self {
            ExportFormat::Diffusers => vec![out.join(CONFIG_FILE), out.join(WEIGHTS_FILE)],
            ExportFormat::Lora => vec![adapter_target(out, LORA_WEIGHTS_FILE)],
            ExportFormat::Comfyui => vec![adapter_target(out, COMFY_LORA_FILE)],
        }
    }
}

/// Refuse an output folder whose files the export would replace (unless `force`), or that
/// holds a sharded diffusers model: its index would still be loaded in place of the export.
fn check_out(out: &Path, format: ExportFormat, force: bool) -> anyhow::Result<()> {
    // A checkpoint is a folder whose `manifest.json` reads as one (not any project's).
    let resolved = reel_core::paths::resolved(out);
    let is_checkpoint = |dir: &Path| Manifest::read(dir).is_ok();
    if let Some(checkpoint) = resolved.ancestors().find(|a| is_checkpoint(a)) {
        bail!(
            "--out {} lies in the checkpoint folder {}: a run's checkpoint rotation \
             (`training.keep_last`) deletes whole checkpoint folders, the export with them; \
             export into another folder",
            out.display(),
            checkpoint.display()
        );
    }
    // A step folder of a run's checkpoints not saved yet: that step's save replaces it.
    // Only a step's name (`step-N`, N a number) is one: `checkpoints/step-final` is not.
    let step_slot = |dir: &Path| {
        let step = dir
            .file_name()
            .is_some_and(|n| step_of(&n.to_string_lossy()).is_some());
        let store = |p: &Path| p.join("latest").is_file() || p.ends_with("checkpoints");
        step && dir.parent().is_some_and(store)
    };
    if let Some(slot) = resolved.ancestors().find(|a| step_slot(a)) {
        bail!(
            "--out {} lies in {}, where the run saves a checkpoint: that save replaces the \
             folder, the export with it; export into another folder",
            out.display(),
            slot.display()
        );
    }
    if format == ExportFormat::Diffusers && out.join(INDEX_FILE).exists() {
        bail!(
            "--out {} holds a sharded model ({INDEX_FILE}): a loader would read its shards, \
             not the export; export into another folder",
            out.display()
        );
    }
    let present: Vec<String> = (format.targets(out).into_iter())
        .filter(|f| f.exists())
        .map(|f| f.display().to_string())
        .collect();
    if !present.is_empty() && !force {
        bail!(
            "--out {} already holds {} (an earlier export, or a model's own files): pass \
             --force to replace them, or export into another folder",
            out.display(),
            present.join(" and ")
        );
    }
    Ok(())
}

/// Refuse a role `reel export` cannot export: one the config lacks, one of another
/// architecture than Wan, a frozen one (its checkpoint holds no weights).
fn check_role(loaded: &LoadedConfig, name: &str) -> anyhow::Result<()> {
    let cfg = &loaded.config;
    let Some(role) = cfg.models.get(name) else {
        bail!(
            "the config has no role `{name}` (roles: {:?})",
            cfg.models.keys().collect::<Vec<_>>()
        );
    };
    if role.model.as_any().downcast_ref::<WanArch>().is_none() {
        bail!(
            "role `{name}` has arch `{}`: only `{ARCH_NAME}` models can be exported",
            role.arch()
        );
    }
    if !role.trainable {
        bail!("role `{name}` is frozen: its checkpoint holds no weights (export its `weights` directly)");
    }
    Ok(())
}

/// Rebuild role `name` from the config and load the checkpoint file into its trainable
/// parameters; returns the model (inference backend) and the file used.
pub fn load_role_weights(
    loaded: &LoadedConfig,
    name: &str,
    dir: &Path,
    ema: bool,
) -> anyhow::Result<(
    WanModel<<CpuBackend as burn::tensor::backend::AutodiffBackend>::InnerBackend>,
    PathBuf,
)> {
    check_role(loaded, name)?;
    let cfg = &loaded.config;
    let role = &cfg.models[name];
    let file = dir.join(if ema {
        ema_file(name)
    } else {
        weights_file(name)
    });
    if !file.is_file() {
        bail!(
            "{} not found{}",
            file.display(),
            if ema {
                " (the run had no EMA callback?)"
            } else {
                ""
            }
        );
    }
    let resolve = |p: &Path| loaded.resolve(p);
    let device = Default::default();
    let model = build_wan_role::<CpuBackend>(role, resolve, cfg.runtime.seed, &device)
        .map_err(|e| anyhow::anyhow!("role `{name}`: {e}"))?;
    let mut handle = TrainableRole::new(name, model, cfg.optimizer.clone(), None, 1);
    let (tensors, _) =
        reel_core::checkpoint::read_tensors(dir, &file.file_name().unwrap().to_string_lossy())?;
    (handle.load_trainable_tensors(&tensors))
        .map_err(|e| CheckpointError::does_not_fit(&file, &e))?;
    Ok((handle.model_valid(), file))
}

/// Refuse an export that would replace weights a role of the run is built from, even with
/// `--force`: a diffusers export into a role's `weights` folder, or any export writing the
/// file a role's `weights` names. The run would then rebuild from the export, with its
/// adapters applied on top of merged weights. `weights` are the roles' `(name, path)` pairs,
/// paths as the config resolves them.
fn check_not_weights(
    out: &Path,
    format: ExportFormat,
    weights: &[(String, PathBuf)],
) -> anyhow::Result<()> {
    // What is not there yet replaces nothing.
    let out_real = out.canonicalize().ok();
    let written: Vec<PathBuf> = (format.targets(out).iter())
        .filter_map(|f| f.canonicalize().ok())
        .collect();
    for (role, path) in weights {
        let Ok(real) = path.canonicalize() else {
            continue;
        };
        let replaced = if real.is_dir() {
            format == ExportFormat::Diffusers && Some(&real) == out_real.as_ref()
        } else {
            written.contains(&real)
        };
        if replaced {
            bail!(
                "--out {} holds the weights of role `{role}` (models.{role}.weights = {}): the \
                 export would replace the weights the run is built from; export into another \
                 folder",
                out.display(),
                path.display()
            );
        }
    }
    Ok(())
}

/// Run `reel export`.
pub fn run(args: &ExportArgs) -> anyhow::Result<()> {
    let config = config_for(Some(&args.checkpoint), args.config.as_deref())?;
    let loaded = load_run_config(&config, &args.set)?;
    check_out(&args.out, args.format, args.force)?;
    let weights: Vec<(String, PathBuf)> = (loaded.config.models.iter())
        .filter_map(|(name, role)| Some((name.clone(), loaded.resolve(role.weights.as_ref()?))))
        .collect();
    check_not_weights(&args.out, args.format, &weights)?;
    // Before any weights load: an exportable role, and for an adapter export, its adapter.
    check_role(&loaded, &args.role)?;
    let adapter = (loaded.config.models.get(&args.role))
        .and_then(|role| role.adapter.as_ref())
        .and_then(|a| a.as_any().downcast_ref::<LoraSpec>());
    if args.format != ExportFormat::Diffusers && adapter.is_none() {
        bail!(
            "role `{}` has no LoRA adapter: use `--format diffusers`",
            args.role
        );
    }
    let dir = weights_folder(&args.checkpoint, &loaded)?;
    let (model, file) = load_role_weights(&loaded, &args.role, &dir, args.ema)?;
    let written = match args.format {
        ExportFormat::Diffusers => {
            let model = merge_and_unload(model);
            model.save_pretrained(&args.out)?;
            args.out.clone()
        }
        ExportFormat::Lora | ExportFormat::Comfyui => {
            let spec = adapter.unwrap_or_else(|| unreachable!("checked before loading"));
            if args.format == ExportFormat::Lora {
                save_lora(&model, spec, &args.out)?
            } else {
                save_lora_comfy(&model, spec, &args.out)?
            }
        }
    };
    eprintln!(
        "reel: exported role `{}` from {} to {}",
        args.role,
        file.display(),
        written.display()
    );
    println!("{}", written.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use reel_core::checkpoint::{CheckpointStore, MANIFEST};

    /// An export inside a checkpoint folder would be deleted with it by the rotation: refused,
    /// even with `--force`; a folder beside it is not.
    #[test]
    fn an_output_folder_in_a_checkpoint_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::at(&dir.path().join("run/checkpoints"));
        let pending = store.begin(4).unwrap();
        pending.write_bytes("state.json", b"{}").unwrap();
        let step = store.commit(pending, "fingerprint").unwrap();
        // A project's own `manifest.json` above `--out` is no checkpoint.
        std::fs::write(dir.path().join(MANIFEST), b"{\"name\": \"app\"}").unwrap();
        check_out(&dir.path().join("exported"), ExportFormat::Lora, false).unwrap();
        for out in [step.clone(), step.join("exported/lora")] {
            let err = check_out(&out, ExportFormat::Lora, true)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("lies in the checkpoint folder") && err.contains("rotation (`"),
                "{err}"
            );
        }
        check_out(&step.join("../exported"), ExportFormat::Lora, false).unwrap();
        // The folder of a step not saved yet: that step's save would replace it.
        let later = store.step_dir(6).join("lora");
        let err = check_out(&later, ExportFormat::Lora, true).unwrap_err();
        assert!(
            err.to_string().contains("where the run saves a checkpoint"),
            "{err}"
        );
        // A folder that only starts like one is no step's.
        let named = later
            .parent()
            .unwrap()
            .with_file_name("step-final")
            .join("lora");
        check_out(&named, ExportFormat::Lora, true).unwrap();
    }

    #[test]
    fn an_output_folder_with_the_files_is_refused_without_force() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        for format in [
            ExportFormat::Diffusers,
            ExportFormat::Lora,
            ExportFormat::Comfyui,
        ] {
            check_out(&out.join("new"), format, false).unwrap();
            check_out(out, format, false).unwrap();
        }
        std::fs::write(out.join(WEIGHTS_FILE), b"weights").unwrap();
        let err = check_out(out, ExportFormat::Diffusers, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(WEIGHTS_FILE) && err.contains("--force"),
            "{err}"
        );
        assert!(!err.contains(CONFIG_FILE), "{err}");
        check_out(out, ExportFormat::Diffusers, true).unwrap();
        check_out(out, ExportFormat::Lora, false).unwrap();

        std::fs::write(out.join(INDEX_FILE), b"{}").unwrap();
        let err = check_out(out, ExportFormat::Diffusers, true)
            .unwrap_err()
            .to_string();
        assert!(err.contains(INDEX_FILE) && err.contains("sharded"), "{err}");
        check_out(out, ExportFormat::Lora, false).unwrap();

        // An adapter `--out` naming a file: that file is what it would replace.
        let file = out.join("my_lora.safetensors");
        check_out(&file, ExportFormat::Lora, false).unwrap();
        std::fs::write(&file, b"adapter").unwrap();
        for format in [ExportFormat::Lora, ExportFormat::Comfyui] {
            let err = check_out(&file, format, false).unwrap_err().to_string();
            assert!(
                err.contains("my_lora.safetensors") && err.contains("--force"),
                "{err}"
            );
            check_out(&file, format, true).unwrap();
        }
    }

    #[test]
    fn the_weights_of_a_role_are_never_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("ckpt/transformer");
        std::fs::create_dir_all(&model).unwrap();
        let single = dir.path().join(WEIGHTS_FILE);
        std::fs::write(&single, b"weights").unwrap();
        let roles = [
            ("teacher".to_string(), dir.path().join("ckpt/./transformer")),
            ("student".to_string(), single),
        ];
        let refused = |out: &Path, format| {
            check_not_weights(out, format, &roles)
                .err()
                .map(|e| e.to_string())
        };
        let err = refused(&model, ExportFormat::Diffusers).unwrap();
        assert!(err.contains("role `teacher`"), "{err}");
        let err = refused(dir.path(), ExportFormat::Diffusers).unwrap();
        assert!(err.contains("role `student`"), "{err}");
        // An adapter `--out` naming a role's weights file would replace it, even with
        // `--force`.
        let file = dir.path().join(WEIGHTS_FILE);
        for format in [ExportFormat::Lora, ExportFormat::Comfyui] {
            let err = refused(&file, format).unwrap();
            assert!(err.contains("role `student`"), "{err}");
        }
        // An adapter file beside a role's weights replaces nothing.
        assert_eq!(refused(&model, ExportFormat::Lora), None);
        assert_eq!(refused(dir.path(), ExportFormat::Comfyui), None);
        assert_eq!(
            refused(&dir.path().join("ckpt"), ExportFormat::Diffusers),
            None
        );
        assert_eq!(
            refused(&dir.path().join("new"), ExportFormat::Diffusers),
            None
        );
    }
}
