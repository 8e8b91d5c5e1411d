//! The memory floor of run configs (`LoadedConfig::memory_floor`, shown by `reel check` and
//! `reel train`): what each kind of role holds per device, from Wan's parameter count, the
//! data's shapes, the workers, the precision and the callbacks.

use crate::common::*;

use reel_core::memory::MemoryFloor;
use reel_models::WanConfig;

/// `wan-tiny`'s parameters and `(tokens, hidden, blocks)` of one [`TINY_WAN_RUN`] sample.
fn tiny() -> (u128, u128) {
    let cfg = WanConfig::preset("wan-tiny").unwrap();
    let model = cfg.init::<burn::backend::NdArray>(&Default::default());
    let params = burn::module::Module::num_params(&model) as u128;
    let loaded = load(TINY_WAN_RUN, &[]);
    let spec = loaded.config.data.build(&loaded.base_dir).unwrap().spec();
    let info = cfg.model_info();
    let tokens = info.tokens(spec.frames, spec.height, spec.width).unwrap() as u128;
    // Float32 inputs of every block for one sample.
    (
        params,
        tokens * cfg.inner_dim() as u128 * cfg.num_layers as u128 * 4,
    )
}

fn floor_of(text: &str, sets: &[&str]) -> MemoryFloor {
    let loaded = load(text, sets);
    let spec = loaded.config.data.build(&loaded.base_dir).unwrap().spec();
    loaded.memory_floor(&spec)
}

#[test]
fn a_fully_trained_role_holds_weights_moments_ema_and_one_backward() {
    let (p, per_sample) = tiny();
    let batch = 2;
    let f = floor_of(TINY_WAN_RUN, &[]);
    assert_eq!((f.weights, f.moments, f.copies), (4 * p, 8 * p, 4 * p));
    assert_eq!(f.backward, (4 * p).max(batch * per_sample));
    assert_eq!(f.backward_role.as_deref(), Some("student"));
    assert!(f.uncounted.is_empty());
    // Under gradient accumulation the gradients wait through the next micro-batch.
    let acc = floor_of(TINY_WAN_RUN, &["training.grad_accumulation=2"]);
    assert_eq!(acc.backward, 4 * p + batch * per_sample);
    // Two workers: each holds every role, and its half of the batch's block inputs.
    let two = floor_of(
        TINY_WAN_RUN,
        &["runtime.num_devices=2", "training.grad_accumulation=2"],
    );
    assert_eq!(two.backward, 4 * p + per_sample);
    assert_eq!(two.weights, f.weights);
}

/// Parameters of `wan-tiny` with a rank-4 LoRA on the default targets, the adapter's alone.
fn tiny_lora_params() -> u128 {
    let cfg = WanConfig::preset("wan-tiny").unwrap();
    let model = cfg.init::<burn::backend::NdArray>(&Default::default());
    let spec = reel_models::LoraSpec::new(4, reel_models::LoraSpec::default_targets());
    let adapted = reel_models::lora::apply_lora(model, &spec, 0).unwrap();
    let shapes = reel_core::params::named_param_shapes(&adapted);
    let lora = shapes.iter().filter(|s| s.path.contains("lora_"));
    lora.map(|s| s.shape.iter().product::<usize>() as u128)
        .sum()
}

#[test]
fn a_lora_role_holds_its_float32_base_and_block_inputs_only_when_checkpointed() {
    let (p, per_sample) = tiny();
    let a = tiny_lora_params();
    assert!(a > 0);
    let lora = "models.student.adapter={kind=\"lora\",rank=4}";
    let f = floor_of(TINY_WAN_RUN, &[lora]);
    // The base's float32 weights; the adapter's weights, moments, EMA copy and gradients.
    assert_eq!(
        (f.weights, f.moments, f.copies, f.backward),
        (4 * p + 4 * a, 8 * a, 4 * a, 4 * a)
    );
    // A rank far beyond the layers' widths is counted, not allocated: the floor grows with it.
    // (An adapter's parameters grow linearly with the rank: 10^6 times rank 4's.)
    let huge = "models.student.adapter={kind=\"lora\",rank=4000000}";
    assert!(floor_of(TINY_WAN_RUN, &[huge]).total() >= 20 * a * 1_000_000);
    let checkpointed = floor_of(
        TINY_WAN_RUN,
        &[lora, "models.student.gradient_checkpointing=true"],
    );
    assert_eq!(checkpointed.backward, (2 * per_sample).max(4 * a));
}

#[test]
fn a_frozen_teacher_holds_bfloat16_weights_in_a_bf16_run() {
    let (p, per_sample) = tiny();
    let text = distill_config("kind = \"dmd2\"", true, 1);
    let f32 = floor_of(&text, &[]);
    // Student and critic trained in full, the teacher frozen.
    assert_eq!((f32.weights, f32.moments), (12 * p, 16 * p));
    let bf16 = floor_of(
        &text,
        &["runtime.backend=\"flex\"", "runtime.dtype=\"bf16\""],
    );
    assert_eq!(bf16.weights, 10 * p, "the teacher at 2 bytes a parameter");
    let batch = load(&text, &[]).config.data.batch_size() as u128;
    // Block inputs in bfloat16: half the float32 bytes.
    assert_eq!(bf16.backward, (4 * p).max(batch * per_sample / 2));
}
