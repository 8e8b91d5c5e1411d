//! Applying a [`LoraSpec`] to a [`WanModel`]: find the targeted linear layers by module path
//! (PEFT's list semantics), freeze every base parameter, attach seeded `A` / zero `B`.

use burn::module::{Module, Param, ParamId};
use burn::tensor::{backend::Backend, Shape, Tensor, TensorData};
use reel_core::config::ConfigError;

use super::spec::{target_matches, LoraSpec};

use super::LoraError;
use crate::wan::init::SplitMix64;
use crate::wan::{Linear, WanModel};

/// Module paths of every linear layer of a Wan model, with `{}` for the block index. These
/// are the names a LoRA `target_modules` entry may end with (see [`is_known_target`]).
pub const WAN_LINEAR_MODULES: &[&str] = &[
    "condition_embedder.time_embedder.linear_1",
    "condition_embedder.time_embedder.linear_2",
    "condition_embedder.time_proj",
    "condition_embedder.text_embedder.linear_1",
    "condition_embedder.text_embedder.linear_2",
    "blocks.{}.attn1.to_q",
    "blocks.{}.attn1.to_k",
    "blocks.{}.attn1.to_v",
    "blocks.{}.attn1.to_out.0",
    "blocks.{}.attn2.to_q",
    "blocks.{}.attn2.to_k",
    "blocks.{}.attn2.to_v",
    "blocks.{}.attn2.to_out.0",
    "blocks.{}.ffn.net.0.proj",
    "blocks.{}.ffn.net.2",
    "proj_out",
];

/// Whether `target` names some Wan linear layer under PEFT's suffix rule: its dotted parts
/// are the trailing parts of one of [`WAN_LINEAR_MODULES`] (`{}` matching any block index).
/// `"to_q"`, `"attn2.to_v"`, `"blocks.3.ffn.net.2"` and `"proj_out"` are known; `"to_x"`
/// and `"norm_q"` (not a linear layer) are not.
pub fn is_known_target(target: &str) -> bool {
    let parts: Vec<&str> = target.split('.').collect();
    if target.is_empty() || parts.iter().any(|p| p.is_empty()) {
        return false;
    }
    WAN_LINEAR_MODULES.iter().any(|pattern| {
        let pat: Vec<&str> = pattern.split('.').collect();
        parts.len() <= pat.len()
            && pat[pat.len() - parts.len()..]
                .iter()
                .zip(&parts)
                .all(|(p, t)| part_fits(p, t))
    })
}

/// Whether the target part `t` fits the pattern part `p`: the same name, or digits where the
/// pattern has `{}` (a literal `{}`, copied from an error listing the patterns, is no index).
fn part_fits(p: &str, t: &str) -> bool {
    match p {
        "{}" => !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()),
        _ => p == t,
    }
}

/// The block index `target` names, where its parts align with a `blocks.{}` of
/// [`WAN_LINEAR_MODULES`] (`"blocks.4.attn1.to_q"` and `"4.attn1.to_q"` give 4; `"to_q"`
/// and `"to_out.0"` none).
pub fn block_index(target: &str) -> Option<usize> {
    let parts: Vec<&str> = target.split('.').collect();
    WAN_LINEAR_MODULES.iter().find_map(|pattern| {
        let pat: Vec<&str> = pattern.split('.').collect();
        let tail = pat.get(pat.len().checked_sub(parts.len())?..)?;
        let aligned = tail.iter().zip(&parts);
        let fits = aligned.clone().all(|(p, t)| part_fits(p, t));
        fits.then(|| {
            aligned
                .filter(|(p, _)| **p == "{}")
                .find_map(|(_, t)| t.parse().ok())
        })?
    })
}

/// `spec`'s targets against a model of `num_layers` blocks: the first one naming a block the
/// model lacks is an error keyed `target_modules[i]` (relative to the adapter table), so
/// that it is refused from the config before any weights are read.
pub fn check_block_targets(spec: &LoraSpec, num_layers: usize) -> Result<(), ConfigError> {
    for (i, t) in spec.target_modules.iter().enumerate() {
        if let Some(n) = block_index(t).filter(|&n| n >= num_layers) {
            return Err(ConfigError::new(
                format!("target_modules[{i}]"),
                format!(
                    "`{t}` names block {n}, but the model has {num_layers} blocks (0..{})",
                    num_layers.saturating_sub(1)
                ),
            ));
        }
    }
    Ok(())
}

/// Every linear layer of `model` with its dotted module path, in module order.
pub fn wan_linears_mut<B: Backend>(model: &mut WanModel<B>) -> Vec<(String, &mut Linear<B>)> {
    let ce = &mut model.condition_embedder;
    let mut out: Vec<(String, &mut Linear<B>)> = vec![
        (
            "condition_embedder.time_embedder.linear_1".into(),
            &mut ce.time_embedder.linear_1,
        ),
        (
            "condition_embedder.time_embedder.linear_2".into(),
            &mut ce.time_embedder.linear_2,
        ),
        ("condition_embedder.time_proj".into(), &mut ce.time_proj),
        (
            "condition_embedder.text_embedder.linear_1".into(),
            &mut ce.text_embedder.linear_1,
        ),
        (
            "condition_embedder.text_embedder.linear_2".into(),
            &mut ce.text_embedder.linear_2,
        ),
    ];
    for (i, block) in model.blocks.iter_mut().enumerate() {
        for (name, attn) in [("attn1", &mut block.attn1), ("attn2", &mut block.attn2)] {
            out.push((format!("blocks.{i}.{name}.to_q"), &mut attn.to_q));
            out.push((format!("blocks.{i}.{name}.to_k"), &mut attn.to_k));
            out.push((format!("blocks.{i}.{name}.to_v"), &mut attn.to_v));
            for (j, o) in attn.to_out.iter_mut().enumerate() {
                out.push((format!("blocks.{i}.{name}.to_out.{j}"), o));
            }
        }
        out.push((
            format!("blocks.{i}.ffn.net.0.proj"),
            &mut block.ffn.net.0.proj,
        ));
        out.push((format!("blocks.{i}.ffn.net.2"), &mut block.ffn.net.2));
    }
    out.push(("proj_out".into(), &mut model.proj_out));
    out
}

/// Salt mixed into the run seed when the spec gives no `init_seed`.
const RUN_SEED_SALT: u64 = 0x4C6F_5241_0000_0001;

fn path_hash(s: &str) -> u64 {
    // FNV-1a: each module path gets its own stream.
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The initial `lora_A` values of the module at `path`: PEFT's default
/// (`kaiming_uniform_(a=sqrt(5))`), i.e. uniform in `[-1/sqrt(in), 1/sqrt(in)]`, drawn from
/// a generator seeded by `(seed, path)`.
pub fn lora_a_init_values(seed: u64, path: &str, rank: usize, d_in: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed ^ path_hash(path).rotate_left(23));
    rng.next_u64();
    let bound = 1.0 / (d_in as f64).sqrt();
    (0..rank * d_in)
        .map(|_| ((2.0 * rng.next_open01() - 1.0) * bound) as f32)
        .collect()
}

/// A trainable parameter of `shape` created on first use from `values`.
fn lazy_param<B: Backend>(
    device: B::Device,
    shape: [usize; 2],
    values: impl Fn() -> Vec<f32> + Send + Sync + 'static,
) -> Param<Tensor<B, 2>> {
    Param::uninitialized(
        ParamId::new(),
        move |device, require_grad| {
            Tensor::<B, 2>::from_data(TensorData::new(values(), shape), device)
                .set_require_grad(require_grad)
        },
        device,
        true,
        Shape::new(shape),
    )
}

/// Attach a fresh adapter (seeded `A`, zero `B`) to every linear layer `spec` targets and
/// freeze every other parameter (`require_grad = false`: no gradients, no optimizer state,
/// not in checkpoints). The adapter weights are created lazily, so loading a trained adapter
/// afterwards never draws the random values.
///
/// `run_seed` is used (salted) when `spec.init_seed` is `None`. Errors: an invalid spec, a
/// target that matches no layer of this model, or a layer that already has an adapter.
pub fn apply_lora<B: Backend>(
    model: WanModel<B>,
    spec: &LoraSpec,
    run_seed: u64,
) -> Result<WanModel<B>, LoraError> {
    spec.validate()
        .map_err(|e| LoraError::Spec(e.to_string()))?;
    let seed = spec.init_seed.unwrap_or(run_seed ^ RUN_SEED_SALT);
    let mut model = model.no_grad();
    for (path, lin) in targeted_linears(&mut model, spec)? {
        if lin.has_lora() {
            return Err(LoraError::Spec(format!(
                "`{path}` already has a LoRA adapter"
            )));
        }
        let (d_in, d_out, r) = (lin.in_features(), lin.out_features(), spec.rank);
        let device = lin.weight.lazy_device();
        let p = path.clone();
        let a = lazy_param::<B>(device.clone(), [r, d_in], move || {
            lora_a_init_values(seed, &p, r, d_in)
        });
        let b = lazy_param::<B>(device, [d_out, r], move || vec![0.0; d_out * r]);
        lin.attach_lora(a, b, spec.scaling());
    }
    Ok(model)
}

/// Parameters the adapter of `spec` would add to `model` (`A` and `B` of every targeted
/// layer: `rank · (in + out)` each), from the layers' shapes alone: unlike [`apply_lora`],
/// which needs the model's weights to freeze them, nothing is initialised or allocated.
/// Errors as [`apply_lora`]'s for a target that matches no layer.
pub fn lora_param_count<B: Backend>(
    model: &mut WanModel<B>,
    spec: &LoraSpec,
) -> Result<u64, LoraError> {
    spec.validate()
        .map_err(|e| LoraError::Spec(e.to_string()))?;
    let layers = targeted_linears(model, spec)?;
    // Saturating: an absurd rank counts as "more than any memory", not as a wrapped number.
    let count = |lin: &Linear<B>| {
        let widths = (lin.in_features() + lin.out_features()) as u64;
        (spec.rank as u64).saturating_mul(widths)
    };
    Ok((layers.iter()).fold(0u64, |n, (_, lin)| n.saturating_add(count(lin))))
}

/// The linear layers of `model` that some entry of `spec.target_modules` names, with their
/// paths; a target that matches no layer is an error naming the layers there are.
fn targeted_linears<'m, B: Backend>(
    model: &'m mut WanModel<B>,
    spec: &LoraSpec,
) -> Result<Vec<(String, &'m mut Linear<B>)>, LoraError> {
    let mut matched = vec![false; spec.target_modules.len()];
    let mut layers = Vec::new();
    for (path, lin) in wan_linears_mut(model) {
        let mut hit = false;
        for (i, target) in spec.target_modules.iter().enumerate() {
            if target_matches(&path, target) {
                matched[i] = true;
                hit = true;
            }
        }
        if hit {
            layers.push((path, lin));
        }
    }
    let unmatched: Vec<&str> = (spec.target_modules.iter().zip(&matched))
        .filter(|(_, m)| !**m)
        .map(|(t, _)| t.as_str())
        .collect();
    if !unmatched.is_empty() {
        return Err(LoraError::Spec(format!(
            "target_modules {unmatched:?} match no linear layer of this model (linear layers: {})",
            WAN_LINEAR_MODULES.join(", ")
        )));
    }
    Ok(layers)
}

/// Module paths of the layers that carry an adapter.
pub fn lora_module_paths<B: Backend>(model: &mut WanModel<B>) -> Vec<String> {
    wan_linears_mut(model)
        .into_iter()
        .filter(|(_, l)| l.has_lora())
        .map(|(p, _)| p)
        .collect()
}

/// Set the runtime multiplier of every adapter (diffusers `attention_kwargs={"scale": s}`):
/// the adapter branch becomes `s · alpha / r · B A x`. Returns the number of adapted layers.
/// Has no effect on layers whose adapter is merged until they are unmerged (the unmerge
/// takes back the update merged with the multiplier of then).
pub fn set_lora_scale<B: Backend>(model: &mut WanModel<B>, scale: f64) -> usize {
    let mut n = 0;
    for (_, lin) in wan_linears_mut(model) {
        if lin.has_lora() {
            lin.lora_multiplier = scale;
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {

    #[test]
    fn block_indices_are_read_where_a_block_is_named() {
        assert_eq!(block_index("blocks.4.attn1.to_q"), Some(4));
        assert_eq!(block_index("12.ffn.net.2"), Some(12));
        for none in ["to_q", "to_out.0", "ffn.net.2", "proj_out", "x.4.to_q"] {
            assert_eq!(block_index(none), None, "{none}");
        }
        let spec = LoraSpec::new(4, vec!["to_q".into(), "blocks.2.attn2.to_k".into()]);
        assert!(check_block_targets(&spec, 3).is_ok());
        let e = check_block_targets(&spec, 2).unwrap_err();
        assert_eq!(e.key, "target_modules[1]");
        assert!(
            e.to_string().contains("the model has 2 blocks (0..1)"),
            "{e}"
        );
    }
    use super::*;

    #[test]
    fn known_targets_follow_the_suffix_rule() {
        for t in [
            "to_q",
            "to_out.0",
            "attn2.to_v",
            "blocks.3.ffn.net.2",
            "net.0.proj",
            "proj_out",
            "time_proj",
            "0.attn1.to_k",
        ] {
            assert!(is_known_target(t), "{t}");
        }
        for t in [
            "",
            "to_x",
            "norm_q",
            "to_out",
            "blocks.x.attn1.to_q",
            "blocks.{}.attn1.to_q",
            "{}.ffn.net.2",
            "attn3.to_q",
            "a..b",
            "patch_embedding",
        ] {
            assert!(!is_known_target(t), "{t}");
        }
    }

    #[test]
    fn template_list_equals_the_model_layers() {
        let mut cfg = crate::WanConfig::preset("wan-tiny").unwrap();
        cfg.num_layers = 1;
        let mut model = cfg.init::<burn::backend::Flex>(&Default::default());
        let paths: Vec<String> = wan_linears_mut(&mut model)
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        let want: Vec<String> = WAN_LINEAR_MODULES
            .iter()
            .map(|p| p.replace("{}", "0"))
            .collect();
        assert_eq!(paths, want);
    }

    #[test]
    fn a_init_is_seeded_and_kaiming_bounded() {
        let a = lora_a_init_values(5, "blocks.0.attn1.to_q", 4, 64);
        assert_eq!(a, lora_a_init_values(5, "blocks.0.attn1.to_q", 4, 64));
        assert_ne!(a, lora_a_init_values(5, "blocks.0.attn1.to_k", 4, 64));
        assert_ne!(a, lora_a_init_values(6, "blocks.0.attn1.to_q", 4, 64));
        assert!(a.iter().all(|v| v.abs() <= 0.125));
        assert!(a.iter().any(|v| v.abs() > 0.1));
    }

    /// The count from shapes alone equals the adapter `apply_lora` attaches, for one target
    /// and for several overlapping ones; an unmatched target is refused alike.
    #[test]
    fn the_adapter_is_counted_without_attaching_it() {
        let cfg = crate::WanConfig::preset("wan-tiny").unwrap();
        let model = cfg.init::<burn::backend::Flex>(&Default::default());
        for (rank, targets) in [
            (3, vec!["to_q"]),
            (2, vec!["attn1.to_q", "to_q", "ffn.net.2"]),
        ] {
            let spec = LoraSpec {
                rank,
                alpha: rank as f64,
                target_modules: targets.iter().map(|t| t.to_string()).collect(),
                dropout: 0.0,
                init_seed: Some(0),
            };
            let counted = lora_param_count(&mut model.clone(), &spec).unwrap();
            let adapted = apply_lora(model.clone(), &spec, 0).unwrap();
            let shapes = reel_core::params::named_param_shapes(&adapted);
            let lora = shapes.iter().filter(|s| s.path.contains(".lora_"));
            let attached: usize = lora.map(|s| s.shape.iter().product::<usize>()).sum();
            assert!(attached > 0);
            assert_eq!(counted, attached as u64, "{targets:?}");
        }
        let spec = LoraSpec {
            rank: 2,
            alpha: 2.0,
            target_modules: vec!["to_x".into()],
            dropout: 0.0,
            init_seed: None,
        };
        assert!(lora_param_count(&mut model.clone(), &spec).is_err());
    }
}
