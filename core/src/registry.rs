//! The plugin registry: every method, callback, adapter, model and data source registers a
//! descriptor (kind, name, one-line summary) with `#[reel_core::plugin(name, summary)]` on
//! its config impl, the same attribute that names it for TOML.
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

/// The plugin kind of a plugin config trait object (`dyn MethodConfig` is a
/// [`PluginKind::Method`]...), which `#[plugin]` uses to file a registration.
pub trait PluginTrait {
    /// The extension point.
    const KIND: PluginKind;
}

macro_rules! plugin_traits {
    ($($t:path => $kind:ident),*) => {
        $(impl PluginTrait for dyn $t {
            const KIND: PluginKind = PluginKind::$kind;
        })*
    };
}

plugin_traits!(
    crate::method::MethodConfig => Method,
    crate::callback::CallbackConfig => Callback,
    crate::role::AdapterConfig => Adapter,
    crate::model::ModelConfig => Model,
    crate::data::DataConfig => Data
);

/// Every registered plugin, sorted by kind then name.
pub fn plugins() -> Vec<PluginDescriptor> {
    let mut all: Vec<PluginDescriptor> = inventory::iter::<PluginDescriptor>
        .into_iter()
        .copied()
        .collect();
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
