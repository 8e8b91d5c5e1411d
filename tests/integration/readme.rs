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
    assert!(first.contains("cargo test --release --workspace"));
    let ci = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/run")).unwrap();
    assert!(
        ci.contains("cargo test --release --workspace"),
        ".ci/run must run the README's test command"
    );
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
