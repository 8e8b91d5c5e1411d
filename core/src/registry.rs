//! The plugin registry: every method, callback, adapter, model and data source registers a
//! descriptor (kind, name, one-line summary) with [`register_plugin!`](crate::register_plugin).
//!
//! The registry is what `reel list` prints and what "unknown kind" errors list as the valid
//! names. Registration happens at link time through `inventory`; the binary must reference
//! every plugin crate so the linker keeps them.

use std::fmt;

/// The extension point a plugin belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PluginKind {
    /// A training method (`[method] kind = ...`).
    Method,
    /// A callback (`[[callbacks]] kind = ...`).
    Callback,
    /// A model adapter (`[models.<role>.adapter] kind = ...`).
    Adapter,
    /// A model architecture (`[models.<role>] arch = ...`).
    Model,
    /// A data source (`[data] kind = ...`).
    Data,
}

impl PluginKind {
    /// All kinds, in listing order.
    pub const ALL: [PluginKind; 5] = [
        PluginKind::Method,
        PluginKind::Model,
        PluginKind::Adapter,
        PluginKind::Data,
        PluginKind::Callback,
    ];

    /// Lower-case name used in listings.
    pub fn as_str(self) -> &'static str {
        match self {
            PluginKind::Method => "method",
            PluginKind::Callback => "callback",
            PluginKind::Adapter => "adapter",
            PluginKind::Model => "model",
            PluginKind::Data => "data",
        }
    }
}

impl fmt::Display for PluginKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One registered plugin.
#[derive(Debug, Clone, Copy)]
pub struct PluginDescriptor {
    /// Extension point.
    pub kind: PluginKind,
    /// Name used in TOML (`kind = "<name>"` or `arch = "<name>"`).
    pub name: &'static str,
    /// One-line summary for `reel list`.
    pub summary: &'static str,
}

inventory::collect!(PluginDescriptor);

/// A model architecture's check of a role table.
pub type RoleCheck = fn(&crate::role::RoleConfig) -> Result<(), crate::config::ConfigError>;

/// A registered model architecture (`arch = "<name>"`), with a check of the role table
/// (preset known, config file readable...) run by `reel check` before anything loads.
#[derive(Debug)]
pub struct ModelArch {
    /// Architecture name.
    pub name: &'static str,
    /// One-line summary for `reel list`.
    pub summary: &'static str,
    /// Validates a role table for this architecture; keys relative to the role table.
    pub check: RoleCheck,
}

inventory::collect!(ModelArch);

/// Register a model architecture with its role-table check:
///
/// ```ignore
/// reel_core::register_model!("wan", "Wan2.1 video DiT (diffusers layout)", check_wan_role);
/// ```
#[macro_export]
macro_rules! register_model {
    ($name:expr, $summary:expr, $check:expr) => {
        $crate::inventory::submit! {
            $crate::registry::ModelArch { name: $name, summary: $summary, check: $check }
        }
    };
}

/// The role-table check of architecture `name`, if registered.
pub fn model_check(name: &str) -> Option<RoleCheck> {
    inventory::iter::<ModelArch>
        .into_iter()
        .find(|m| m.name == name)
        .map(|m| m.check)
}

/// Register a plugin descriptor. One line per plugin:
///
/// ```ignore
/// reel_core::register_plugin!(Method, "finetune", "Flow-matching fine-tuning");
/// ```
#[macro_export]
macro_rules! register_plugin {
    ($kind:ident, $name:expr, $summary:expr) => {
        $crate::inventory::submit! {
            $crate::registry::PluginDescriptor {
                kind: $crate::registry::PluginKind::$kind,
                name: $name,
                summary: $summary,
            }
        }
    };
}

/// Every registered plugin (model architectures included), sorted by kind then name.
pub fn plugins() -> Vec<PluginDescriptor> {
    let mut all: Vec<PluginDescriptor> = inventory::iter::<PluginDescriptor>
        .into_iter()
        .copied()
        .collect();
    all.extend(
        inventory::iter::<ModelArch>
            .into_iter()
            .map(|m| PluginDescriptor {
                kind: PluginKind::Model,
                name: m.name,
                summary: m.summary,
            }),
    );
    all.sort_by(|a, b| (a.kind, a.name).cmp(&(b.kind, b.name)));
    all
}

/// Registered names of one kind, sorted.
pub fn names(kind: PluginKind) -> Vec<&'static str> {
    plugins()
        .into_iter()
        .filter(|p| p.kind == kind)
        .map(|p| p.name)
        .collect()
}

/// Whether `name` is registered as `kind`.
pub fn is_registered(kind: PluginKind, name: &str) -> bool {
    plugins().iter().any(|p| p.kind == kind && p.name == name)
}
