//! Merging adapters into the base weights and back: `W' = W + s · B A` with
//! `s = alpha / r · multiplier` (diffusers `fuse_lora` / `unfuse_lora`, PEFT
//! `merge_adapter` / `unmerge_adapter` / `merge_and_unload`).

use burn::tensor::backend::Backend;

use super::apply::wan_linears_mut;
use crate::wan::WanModel;

/// Fold every adapter into its layer's weight. The adapters stay attached (and skipped in
/// the forward pass) so [`unmerge_lora`] can restore the base weights. Returns the number of
/// layers merged (already merged layers are left alone).
pub fn merge_lora<B: Backend>(model: &mut WanModel<B>) -> usize {
    wan_linears_mut(model)
        .into_iter()
        .filter_map(|(_, lin)| lin.merge_lora().then_some(()))
        .count()
}

/// Undo [`merge_lora`]: subtract `s · B A` again (the base weights come back up to float32
/// rounding, about `1e-7` relative). Returns the number of layers unmerged.
pub fn unmerge_lora<B: Backend>(model: &mut WanModel<B>) -> usize {
    wan_linears_mut(model)
        .into_iter()
        .filter_map(|(_, lin)| lin.unmerge_lora().then_some(()))
        .count()
}

/// Drop every adapter without touching the weights (merged updates stay merged). Returns
/// the number of layers that had one.
pub fn unload_lora<B: Backend>(model: &mut WanModel<B>) -> usize {
    let mut n = 0;
    for (_, lin) in wan_linears_mut(model) {
        if lin.has_lora() {
            lin.detach_lora();
            n += 1;
        }
    }
    n
}

/// Merge every adapter and drop it (PEFT `merge_and_unload`): a plain model whose
/// parameters are exactly the diffusers keys again, ready for
/// [`WanModel::save_pretrained`].
pub fn merge_and_unload<B: Backend>(mut model: WanModel<B>) -> WanModel<B> {
    merge_lora(&mut model);
    unload_lora(&mut model);
    model
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lora::apply_lora;
    use crate::lora::LoraSpec;
    use burn::tensor::Tensor;
    use reel_core::params::named_tensor_data;
    use reel_core::rng::StreamRng;

    type B = burn::backend::Flex;

    fn max_abs(a: Tensor<B, 5>, b: Tensor<B, 5>) -> f32 {
        a.sub(b).abs().max().into_scalar()
    }

    #[test]
    fn merged_forward_equals_adapter_forward_and_unmerge_restores() {
        let dev = Default::default();
        let cfg = crate::WanConfig::preset("wan-tiny").unwrap();
        let base = cfg.init_seeded::<B>(&dev, 3);
        let before = named_tensor_data(&base);
        let spec = LoraSpec {
            alpha: 6.0,
            ..LoraSpec::new(
                3,
                vec!["to_q".into(), "ffn.net.2".into(), "proj_out".into()],
            )
        };
        let mut model = apply_lora(base, &spec, 0).unwrap();
        // Give B non-zero values so the adapter changes the output.
        let mut rng = StreamRng::from_seed(4);
        for (_, lin) in wan_linears_mut(&mut model) {
            if let Some(b) = lin.lora_B.as_mut() {
                let shape = b.weight.lazy_shape();
                let v = rng.normal_tensor::<B, 2>([shape[0], shape[1]], &dev) * 0.1;
                b.weight = burn::module::Param::from_tensor(v);
            }
        }
        let x: Tensor<B, 5> = rng.normal_tensor([1, 4, 1, 4, 4], &dev);
        let t = Tensor::<B, 1>::from_floats([500.0], &dev);
        let ctx: Tensor<B, 3> = rng.normal_tensor([1, 3, 32], &dev);
        let run = |m: &WanModel<B>| m.forward(x.clone(), t.clone(), ctx.clone());
        let adapted = run(&model);
        assert_eq!(merge_lora(&mut model), 2 * 2 + 2 + 1);
        assert_eq!(merge_lora(&mut model), 0);
        assert!(max_abs(run(&model), adapted.clone()) < 1e-4);
        assert_eq!(unmerge_lora(&mut model), 7);
        assert!(max_abs(run(&model), adapted.clone()) < 1e-4);
        unload_lora(&mut model);
        for ((k, a), (_, b)) in before.iter().zip(named_tensor_data(&model).iter()) {
            let d = a
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .zip(b.to_vec::<f32>().unwrap())
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            assert!(d < 1e-6, "{k}: {d}");
        }
        let merged = merge_and_unload(apply_lora(cfg.init_seeded::<B>(&dev, 3), &spec, 0).unwrap());
        assert_eq!(
            named_tensor_data(&merged).len(),
            before.len(),
            "no adapter keys left"
        );
    }
}
