//! Building Wan role models from `[models.<role>]` tables, and the `arch = "wan"`
//! registration with its config check.

use std::path::{Path, PathBuf};

use burn::tensor::backend::Backend;

use reel_core::config::ConfigError;
use reel_core::role::RoleConfig;

use crate::lora::apply_lora;
use crate::wan::{WanConfig, WanModel};

/// The architecture config a role table selects (preset or `config.json`), with paths
/// resolved by `resolve`.
pub fn wan_config_for(
    role: &RoleConfig,
    resolve: impl Fn(&Path) -> PathBuf,
) -> Result<WanConfig, ConfigError> {
    let cfg = match (&role.preset, &role.config) {
        (Some(name), _) => WanConfig::preset(name).ok_or_else(|| {
            ConfigError::new(
                "preset",
                format!(
                    "unknown Wan preset `{name}`, expected one of {:?}",
                    WanConfig::preset_names()
                ),
            )
        })?,
        (None, Some(path)) => {
            let p = resolve(path);
            WanConfig::from_json_file(&p)
                .map_err(|e| ConfigError::new("config", format!("{}: {e}", p.display())))?
        }
        (None, None) => {
            return Err(ConfigError::new(
                "preset",
                "missing: give `preset` or `config`",
            ))
        }
    };
    cfg.validate()
        .map_err(|e| ConfigError::new("preset", e.to_string()))?;
    Ok(cfg)
}

fn check_wan_role(role: &RoleConfig) -> Result<(), ConfigError> {
    // Presets are checked here; a `config.json` path is read at build time (it may be
    // relative to the working directory of `reel train`).
    if role.preset.is_some() {
        wan_config_for(role, Path::to_path_buf)?;
    }
    Ok(())
}

reel_core::register_model!(
    crate::ARCH_NAME,
    "Wan2.1 video DiT (diffusers WanTransformer3DModel layout, safetensors in/out)",
    check_wan_role
);

/// Build the Wan model of one role: architecture from the preset / `config.json`, weights
/// from `weights` (diffusers folder or file) or a seeded init. Frozen roles get
/// `require_grad = false` parameters. A role with a LoRA adapter gets fresh adapters on the
/// targeted layers and frozen base weights (see [`crate::lora::apply_lora`]; without an
/// adapter `init_seed` the adapter seed derives from `default_seed`), so only the adapter is
/// trained and checkpointed. Every attention uses the role's `attention` mode. Errors are
/// messages naming the file or key.
pub fn build_wan_role<B: Backend>(
    role: &RoleConfig,
    resolve: impl Fn(&Path) -> PathBuf,
    default_seed: u64,
    device: &B::Device,
) -> Result<WanModel<B>, String> {
    let cfg = wan_config_for(role, &resolve).map_err(|e| e.to_string())?;
    let model = cfg
        .try_init::<B>(device, role.init_seed.unwrap_or(default_seed))
        .map_err(|e| e.to_string())?;
    let model = model.with_attention(role.attention);
    let model = match &role.weights {
        Some(w) => model.load_weights(resolve(w)).map_err(|e| e.to_string())?,
        None => model,
    };
    let model = match &role.adapter {
        None => model,
        Some(adapter) => {
            let spec = adapter
                .lora()
                .ok_or_else(|| format!("adapter {adapter:?} is not supported by the Wan model (only `kind = \"lora\"`)"))?;
            apply_lora(model, &spec, default_seed).map_err(|e| format!("adapter: {e}"))?
        }
    };
    Ok(if role.trainable {
        model
    } else {
        burn::module::Module::no_grad(model)
    })
}
