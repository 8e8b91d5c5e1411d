//! The README's plugin example is the real `examples/custom-method/src/minimal.rs`, and a
//! method registered by that third crate is selected from TOML by its name and trains.

mod common;

use common::*;

use reel_methods as _;
use reel_plugins as _;

#[test]
fn readme_example_is_the_compiled_file() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let file =
        std::fs::read_to_string(format!("{root}/examples/custom-method/src/minimal.rs")).unwrap();
    let section = readme
        .split("## Write your own method plugin")
        .nth(1)
        .expect("README has the plugin section");
    let block = section
        .split("```rust\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a rust block");
    assert_eq!(
        block, file,
        "README example and examples/custom-method/src/minimal.rs differ"
    );
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
