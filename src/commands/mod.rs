//! CLI subcommands.
pub mod bench;
pub mod check;
pub mod data;
pub mod eval;
pub mod export;
pub mod inference;
pub mod list;
pub mod sample;
pub mod train;

use reel_core::config::LoadedConfig;

/// Run `$body` with the type alias `B` bound to the backend the config names.
#[macro_export]
macro_rules! with_backend {
    ($loaded:expr, |$b:ident| $body:expr) => {{
        match $loaded.config.runtime.backend {
            reel_core::backend::BackendName::Cpu => {
                type $b = reel_core::backend::CpuBackend;
                $body
            }
            reel_core::backend::BackendName::Flex => {
                type $b = reel_core::backend::FlexBackend;
                $body
            }
            #[cfg(feature = "cuda")]
            reel_core::backend::BackendName::Cuda => {
                type $b = reel_core::backend::CudaBackend;
                $body
            }
            #[allow(unreachable_patterns)]
            other => Err(anyhow::anyhow!(
                "backend `{}` is not compiled in: rebuild with `--features cuda`",
                other.as_str()
            )),
        }
    }};
}

/// One-line description of a loaded config.
pub fn describe(loaded: &LoadedConfig) -> String {
    let c = &loaded.config;
    let roles: Vec<String> = c
        .models
        .iter()
        .map(|(n, r)| format!("{n}={}{}", r.arch, if r.trainable { "*" } else { "" }))
        .collect();
    let backend = c.runtime.backend.as_str();
    format!(
        "method `{}`, roles [{}] (* = trainable), backend {backend}, {} steps",
        method_kind(loaded),
        roles.join(", "),
        c.training.max_steps
    )
}

/// The `kind` of the `[method]` table.
pub fn method_kind(loaded: &LoadedConfig) -> String {
    toml::from_str::<toml::Table>(&loaded.resolved_toml)
        .ok()
        .and_then(|t| t.get("method")?.get("kind")?.as_str().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}
