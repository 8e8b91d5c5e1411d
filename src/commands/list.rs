//! `reel list`: every registered plugin.

use reel_core::registry::{plugins, PluginKind};

/// Print plugins grouped by kind.
pub fn run() -> anyhow::Result<()> {
    let all = plugins();
    for kind in PluginKind::ALL {
        let of_kind: Vec<_> = all.iter().filter(|p| p.kind == kind).collect();
        if of_kind.is_empty() {
            continue;
        }
        let title = match kind {
            PluginKind::Data => "data sources",
            PluginKind::Method => "methods",
            PluginKind::Model => "models",
            PluginKind::Adapter => "adapters",
            PluginKind::Callback => "callbacks",
        };
        println!("{title}:");
        for p in of_kind {
            println!("  {:<20} {}", p.name, p.summary);
        }
    }
    Ok(())
}
