//! The README is a short front door whose commands come first and whose `docs/` links
//! resolve; the plugin example of `docs/extending.md` is the real
//! `examples/custom-method/src/minimal.rs`; and a method registered by that third crate is
//! selected from TOML by its name and trains.

use crate::common;

use common::*;

use reel_methods as _;
use reel_plugins as _;

/// The first ```rust block under `## Write your own method plugin` in `docs/extending.md` is
/// byte for byte `examples/custom-method/src/minimal.rs`, which the workspace compiles.
#[test]
fn readme_example_is_the_compiled_file() {
    let root = env!("CARGO_MANIFEST_DIR");
    let doc = std::fs::read_to_string(format!("{root}/docs/extending.md")).unwrap();
    let file =
        std::fs::read_to_string(format!("{root}/examples/custom-method/src/minimal.rs")).unwrap();
    let section = doc
        .split("## Write your own method plugin")
        .nth(1)
        .expect("docs/extending.md has the section `## Write your own method plugin`");
    let block = section
        .split("```rust\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("docs/extending.md: a ```rust block under the plugin section");
    assert_eq!(
        block, file,
        "the example in docs/extending.md and examples/custom-method/src/minimal.rs differ"
    );
}

/// The README stays a front door (at most 200 lines; the manual lives in `docs/`), and every
/// relative link `](docs/...)` in it names a file that exists.
#[test]
fn readme_is_a_short_front_door() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines, more than 200: move the details into docs/"
    );
    let mut links = 0;
    for (i, _) in readme.match_indices("](docs/") {
        let target = &readme[i + 2..];
        let end = target
            .find([')', '#'])
            .unwrap_or_else(|| panic!("README.md: unclosed link `{target}`"));
        let path = &target[..end];
        assert!(
            root.join(path).is_file(),
            "README.md links to `{path}`, which is not a file"
        );
        links += 1;
    }
    assert!(links > 0, "README.md links to no page under docs/");
}

#[test]
fn readme_commands_are_on_the_first_screen() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let first: String = readme.lines().take(25).collect::<Vec<_>>().join("\n");
    assert!(first.contains("cargo run --release -- train configs/quickstart.toml"));
    let test_command = first
        .lines()
        .find(|l| l.starts_with("cargo test "))
        .expect("README.md: a `cargo test` command on the first screen");
    assert!(
        test_command.starts_with("cargo test --release --workspace"),
        "README.md's test command tests the whole workspace in release: `{test_command}`"
    );
    let ci = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/run")).unwrap();
    assert!(
        ci.contains(test_command),
        ".ci/run must run the README's test command `{test_command}`"
    );
}

/// Every workspace member but the proc-macro crate has its entry in `tests/profile.toml`
/// (the test command's opt-level 1), and the file sets nothing else: a member without one
/// would compile its generic code again in every crate that uses it.
#[test]
fn test_profile_covers_every_workspace_member() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &std::path::Path| -> toml::Table {
        let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        text.parse()
            .unwrap_or_else(|e| panic!("{}: not TOML: {e}", p.display()))
    };
    let manifest = read(&root.join("Cargo.toml"));
    let members = manifest["workspace"]["members"].as_array().unwrap();
    let mut want = vec![manifest["package"]["name"].as_str().unwrap().to_string()];
    for member in members {
        let m = read(&root.join(member.as_str().unwrap()).join("Cargo.toml"));
        let proc_macro = m
            .get("lib")
            .and_then(|l| l.get("proc-macro"))
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        if !proc_macro {
            want.push(m["package"]["name"].as_str().unwrap().to_string());
        }
    }
    let profile = read(&root.join("tests/profile.toml"));
    assert_eq!(profile.keys().collect::<Vec<_>>(), ["profile"]);
    let packages = profile["profile"]["release"]["package"].as_table().unwrap();
    for name in &want {
        let entry = packages
            .get(name)
            .unwrap_or_else(|| panic!("tests/profile.toml: no entry for member `{name}`"));
        assert_eq!(
            entry.as_table().unwrap().to_string().trim(),
            "opt-level = 1",
            "tests/profile.toml: `{name}`"
        );
    }
    let mut got: Vec<_> = packages.keys().cloned().collect();
    got.sort();
    want.sort();
    assert_eq!(got, want, "tests/profile.toml names exactly the members");
}

#[test]
fn a_third_party_method_is_selected_by_name_and_trains() {
    let text = r#"
[runtime]
seed = 3
[models.student]
arch = "wan"
preset = "wan-tiny"
trainable = true
[method]
kind = "fixed_sigma"
sigma = 0.5
[data]
kind = "synthetic"
batch_size = 2
num_samples = 8
frames = 2
height = 12
width = 12
[optimizer]
lr = 1e-3
[training]
max_steps = 3
"#;
    let tmp = tempfile::tempdir().unwrap();
    let s = run(&load(text, &[]), tmp.path(), None);
    assert_eq!(s.steps, 3);
    let loss = s
        .last_losses
        .iter()
        .find(|(k, _)| k == "loss")
        .expect("loss reported")
        .1;
    assert!(loss.is_finite() && loss > 0.0, "{loss}");
    let w = tensors(&ckpt(tmp.path(), 3).join("student.safetensors"));
    assert!(
        w.contains_key("blocks.0.attn1.to_q.weight"),
        "checkpoint keys are diffusers keys"
    );
}
