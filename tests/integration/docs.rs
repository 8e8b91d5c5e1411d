//! `docs/config.md` documents every key serde accepts, for the fixed tables and for every
//! registered built-in plugin: a key added to a config struct without a row in the reference
//! fails this test, and so does a plugin without a section.
//!
//! The keys come from serde itself: deserializing a table with one unknown key makes a
//! `deny_unknown_fields` struct list every field it accepts ("unknown field `__probe__`,
//! expected one of `a`, `b`").

use std::path::Path;

use reel_core::callback::CallbackConfig;
use reel_core::config::{RuntimeConfig, TrainingConfig};
use reel_core::data::DataConfig;
use reel_core::method::MethodConfig;
use reel_core::model::ModelConfig;
use reel_core::optim::OptimizerConfig;
use reel_core::registry::{plugins, PluginKind};
use reel_core::role::{AdapterConfig, RoleKeys};
use serde::de::DeserializeOwned;

use reel_methods as _;
use reel_models as _;
use reel_plugins as _;

const PROBE: &str = "__probe__";

/// Every key a struct accepts, from the error of a table with `head` and one unknown key.
fn accepted_keys<T: DeserializeOwned>(head: &str) -> Vec<String> {
    let text = format!("{head}\n{PROBE} = 0\n");
    let err = match toml::from_str::<T>(&text) {
        Ok(_) => panic!("`{head}` accepted the unknown key `{PROBE}`"),
        Err(e) => e.to_string(),
    };
    let tail = err
        .split(&format!("unknown field `{PROBE}`"))
        .nth(1)
        .unwrap_or_else(|| panic!("`{head}`: not an unknown-field error: {err}"));
    if tail.contains("there are no fields") {
        return Vec::new();
    }
    tail.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The text of `docs/config.md` from the heading line `heading` to the next heading of the
/// same or a higher level.
fn section<'a>(doc: &'a str, heading: &str) -> &'a str {
    let start = doc
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("docs/config.md has no heading `{heading}`"))
        + 1;
    let level = heading.chars().take_while(|c| *c == '#').count();
    let body = &doc[start + heading.len()..];
    let end = body
        .match_indices("\n#")
        .find(|(i, _)| {
            let hashes = body[i + 1..].chars().take_while(|c| *c == '#').count();
            hashes <= level && body[i + 1 + hashes..].starts_with(' ')
        })
        .map_or(body.len(), |(i, _)| i);
    &doc[start..start + heading.len() + end]
}

/// Keys of `keys` without a table row (`| `key` |`) in `text`.
fn undocumented(text: &str, keys: &[String]) -> Vec<String> {
    keys.iter()
        .filter(|k| !text.contains(&format!("| `{k}` |")))
        .cloned()
        .collect()
}

/// `reel list`: every plugin the `reel` binary registers, one line each (name, summary).
fn reel_list() -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_reel"))
        .arg("list")
        .output()
        .expect("runs reel list");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn config_doc() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/config.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_config_reference_names_every_key() {
    let doc = config_doc();
    let mut missing = Vec::new();
    let mut check = |heading: String, keys: Vec<String>| {
        assert!(!keys.is_empty(), "{heading}: no keys found");
        for k in undocumented(section(&doc, &heading), &keys) {
            missing.push(format!("{heading}: `{k}`"));
        }
    };
    check("## [runtime]".into(), accepted_keys::<RuntimeConfig>(""));
    check("## [training]".into(), accepted_keys::<TrainingConfig>(""));
    check(
        "## [optimizer]".into(),
        accepted_keys::<OptimizerConfig>(""),
    );
    check("## [models.<role>]".into(), accepted_keys::<RoleKeys>(""));

    // The built-in plugins are those the `reel` binary carries: this test binary also links
    // the example crate's (`toy`, `fixed_sigma`...), which document themselves.
    let listed = reel_list();
    let builtin = plugins().into_iter().filter(|p| {
        listed
            .lines()
            .any(|l| l.trim_start().starts_with(p.name) && l.ends_with(p.summary))
    });
    let mut seen = 0;
    for p in builtin {
        let (tag, table, keys) = match p.kind {
            PluginKind::Method => ("kind", "## [method]", {
                accepted_keys::<Box<dyn MethodConfig>>(&format!("kind = {:?}", p.name))
            }),
            PluginKind::Data => ("kind", "## [data]", {
                accepted_keys::<Box<dyn DataConfig>>(&format!("kind = {:?}", p.name))
            }),
            PluginKind::Callback => ("kind", "## [[callbacks]]", {
                accepted_keys::<Box<dyn CallbackConfig>>(&format!("kind = {:?}", p.name))
            }),
            PluginKind::Adapter => ("kind", "## [models.<role>.adapter]", {
                accepted_keys::<Box<dyn AdapterConfig>>(&format!("kind = {:?}", p.name))
            }),
            PluginKind::Model => ("arch", "## [models.<role>]", {
                accepted_keys::<Box<dyn ModelConfig>>(&format!("arch = {:?}", p.name))
            }),
        };
        let heading = format!("### `{tag} = {:?}`", p.name);
        let within = section(&doc, table);
        assert!(
            within.contains(&format!("\n{heading}\n")),
            "docs/config.md: `{heading}` is not under `{table}`"
        );
        check(heading, keys);
        seen += 1;
    }
    let lines = listed.lines().filter(|l| l.starts_with("  ")).count();
    assert!(
        seen >= 5 && seen == lines,
        "{seen} plugins matched of the {lines} that `reel list` shows:\n{listed}"
    );
    assert!(
        missing.is_empty(),
        "docs/config.md does not document: {missing:#?}"
    );
}

#[test]
fn the_probe_finds_keys_and_sections() {
    let keys = accepted_keys::<TrainingConfig>("");
    assert!(keys.contains(&"max_steps".to_string()), "{keys:?}");
    assert!(!keys.contains(&PROBE.to_string()));
    let doc = "intro\n## [a]\n| `x` |\n### `kind = \"p\"`\n| `y` |\n## [b]\n| `z` |\n";
    let a = section(doc, "## [a]");
    assert!(
        a.contains("`x`") && a.contains("`y`") && !a.contains("`z`"),
        "{a}"
    );
    let p = section(doc, "### `kind = \"p\"`");
    assert!(p.contains("`y`") && !p.contains("`x`"), "{p}");
    assert_eq!(
        undocumented(a, &["x".into(), "y".into(), "w".into()]),
        ["w"]
    );
}
