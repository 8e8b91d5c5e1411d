//! Model architectures as plugins: [`ModelConfig`] (the architecture's keys of a
//! `[models.<role>]` table, tagged `arch`) builds a [`DynModel`] with [`BuildModel`].

use std::fmt::Debug;
use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;

use super::{DynModel, ModelInfo};
use crate::backend::BuildModelAll;
use crate::config::ConfigError;
use crate::method::BuildContext;
use crate::role::RoleConfig;

/// Why a role's model could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A key of the role table is wrong (key relative to the role table).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Anything else: weights missing or mismatched, an unsupported adapter... The message
    /// names the file or key.
    #[error("{0}")]
    Build(String),
}

/// The architecture-specific keys of a role table: `arch = "<name>"` selects the
/// implementation (`reel list` shows the registered ones), the other keys not shared by
/// every role (`weights`, `trainable`, `adapter`, ...) belong to it. Register one with
/// `#[reel_core::plugin(name = "<arch>", summary = "...")]` on its impl.
#[typetag::serde(tag = "arch")]
pub trait ModelConfig: BuildModelAll + Debug + Send + Sync {
    /// Check values; keys relative to the role table (`preset`, `attention`, ...).
    fn validate(&self) -> Result<(), ConfigError>;
    /// Downcast support, for tools tied to one architecture (e.g. `reel export`).
    fn as_any(&self) -> &dyn std::any::Any;
    /// Check the files `role` names (architecture config, `weights`) as building it would,
    /// but from headers only, without reading tensor data (`reel check`). `resolve` maps a
    /// config path to a file. Errors name the key relative to the role table
    /// (`weights`, `config`). The default has nothing to check.
    fn check_files(
        &self,
        role: &RoleConfig,
        resolve: &dyn Fn(&Path) -> PathBuf,
    ) -> Result<(), ConfigError> {
        let _ = (role, resolve);
        Ok(())
    }
    /// The shape facts of `role`'s model (channels, text width, patch) when its config tells
    /// them without building it, so that `reel check` can compare them with the data. `None`
    /// (the default) when they are only known once built; the check then waits for
    /// `reel train`. Errors name the key relative to the role table.
    fn model_info(
        &self,
        role: &RoleConfig,
        resolve: &dyn Fn(&Path) -> PathBuf,
    ) -> Result<Option<ModelInfo>, ConfigError> {
        let _ = (role, resolve);
        Ok(None)
    }
    /// Keys of the role table (relative to it) that change how the model computes but not
    /// what a checkpoint of it holds, such as an attention implementation: a resume may
    /// change them (the checkpoint's fingerprint leaves them out). The default: none.
    fn resumable_keys(&self) -> &'static [&'static str] {
        &[]
    }
    /// How many parameters `role`'s model has, an adapter's not counted, when its config
    /// tells it without allocating them: [`crate::memory::MemoryFloor`] counts each role's
    /// weights, gradients and optimizer state from it, so that `reel check` and `reel train`
    /// refuse a model its device cannot hold before any weight is read. `None` (the
    /// default): unknown, the role is left out of the floor. Errors name the key relative to
    /// the role table.
    fn num_params(
        &self,
        role: &RoleConfig,
        resolve: &dyn Fn(&Path) -> PathBuf,
    ) -> Result<Option<u64>, ConfigError> {
        let _ = (role, resolve);
        Ok(None)
    }
    /// How many parameters `role`'s adapter adds (a LoRA's `A` and `B` on every targeted
    /// layer), counted without allocating them, for the memory floor. `None` (the default,
    /// and for a role without an adapter): not counted.
    fn num_adapter_params(
        &self,
        role: &RoleConfig,
        resolve: &dyn Fn(&Path) -> PathBuf,
    ) -> Result<Option<u64>, ConfigError> {
        let _ = (role, resolve);
        Ok(None)
    }
}

/// Build a role's model for backend `B`. Implement it generically
/// (`impl<B: AutodiffBackend> BuildModel<B> for MyModelConfig`) and every compiled backend
/// is covered.
pub trait BuildModel<B: AutodiffBackend> {
    /// Build the model of `role` (this config is `role.model`): initialise it from
    /// `role.init_seed` (else `ctx.seed`), load `role.weights`, apply `role.adapter`, freeze
    /// it unless `role.trainable`, and compute in `ctx.precision`. Paths resolve with
    /// [`BuildContext::resolve`].
    fn build_model(
        &self,
        role: &RoleConfig,
        ctx: &BuildContext<B>,
    ) -> Result<DynModel<B>, ModelError>;
}
