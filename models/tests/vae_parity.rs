//! Numerical parity of the Wan VAE with diffusers' `AutoencoderKLWan` (the golden fixture
//! `tests/fixtures/wan_vae_tiny`, or `$REEL_VAE_FIXTURES`): every tensor of
//! `golden.safetensors` within 1e-4 absolute in float32 on the CPU. Shapes, counts and key
//! lists come from the files, so any fixture set made the same way passes.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use burn::tensor::{Tensor, TensorData};
use common::{max_err, Cpu};
use reel_core::io::read_safetensors;
use reel_models::vae::{Tiling, WanVae, FIRST_CHUNK};

/// The bar of the brief: float32 on the CPU.
const TOL: f64 = 1e-4;

fn fixture_dir() -> PathBuf {
    reel_core::fixtures::WAN_VAE.require(&[
        "config.json",
        "model.safetensors",
        "golden.safetensors",
    ])
}

fn golden() -> BTreeMap<String, TensorData> {
    read_safetensors(fixture_dir().join("golden.safetensors"))
        .unwrap_or_else(|e| panic!("{e}"))
        .0
}

fn vae() -> WanVae<Cpu> {
    WanVae::load(fixture_dir(), &Default::default()).unwrap_or_else(|e| panic!("{e}"))
}

fn input(g: &BTreeMap<String, TensorData>, key: &str) -> Tensor<Cpu, 5> {
    let data = g
        .get(key)
        .unwrap_or_else(|| panic!("golden file has no `{key}`"));
    Tensor::from_data(data.clone(), &Default::default())
}

/// Collects the error of every compared tensor and fails once, listing all offenders.
#[derive(Default)]
struct Report {
    checked: BTreeSet<String>,
    failures: Vec<String>,
}

impl Report {
    fn check(&mut self, g: &BTreeMap<String, TensorData>, key: &str, got: TensorData) {
        let want = g
            .get(key)
            .unwrap_or_else(|| panic!("golden file has no `{key}`"));
        let (err, scale) = max_err(key, &got, want);
        eprintln!(
            "{key:<40} {:?} max|err| = {err:.3e} (max|ref| = {scale:.3})",
            want.shape
        );
        if err > TOL {
            self.failures.push(format!("{key}: {err:.3e} > {TOL:.0e}"));
        }
        self.checked.insert(key.to_string());
    }

    fn finish(self, g: &BTreeMap<String, TensorData>, inputs: &[&str]) {
        let unchecked: Vec<&String> = g
            .keys()
            .filter(|k| !self.checked.contains(*k) && !inputs.contains(&k.as_str()))
            .collect();
        assert!(
            unchecked.is_empty(),
            "golden tensors not compared: {unchecked:?}"
        );
        assert!(
            self.failures.is_empty(),
            "VAE parity failed:\n{}",
            self.failures.join("\n")
        );
    }
}

#[test]
fn encode_decode_image_path_normalisation_and_first_chunk_match_diffusers() {
    let (vae, g) = (vae(), golden());
    let mut report = Report::default();

    let (post, enc_inter) = vae.encode_with_intermediates(input(&g, "video")).unwrap();
    report.check(&g, "encode.mean", post.mean.into_data());
    report.check(&g, "encode.logvar", post.logvar.into_data());

    // diffusers decoded its own posterior mean; decode the golden one so errors do not add up.
    let mean = input(&g, "encode.mean");
    let (video, dec_inter) = vae.decode_with_intermediates(mean.clone()).unwrap();
    report.check(&g, "decode.video", video.into_data());

    let normalized = vae.normalize_latents(mean.clone()).unwrap();
    report.check(&g, "latents.normalized", normalized.clone().into_data());
    let back = vae.denormalize_latents(normalized).unwrap();
    let (err, _) = max_err("denormalize", &back.into_data(), &mean.into_data());
    assert!(err < 1e-5, "denormalize(normalize(x)) != x: {err:.3e}");

    let image = vae.encode(input(&g, "image")).unwrap();
    report.check(&g, "encode.image.mean", image.mean.into_data());
    let decoded = vae.decode(input(&g, "encode.image.mean")).unwrap();
    report.check(&g, "decode.image", decoded.into_data());

    let captured: BTreeMap<_, _> = enc_inter.into_iter().chain(dec_inter).collect();
    let prefix = format!("{FIRST_CHUNK}.");
    let keys: Vec<&String> = g.keys().filter(|k| k.starts_with(&prefix)).collect();
    assert!(
        !keys.is_empty(),
        "the golden file has no `{prefix}*` tensors"
    );
    for key in keys {
        let got = captured
            .get(key)
            .unwrap_or_else(|| panic!("the VAE did not capture `{key}`"));
        report.check(&g, key, got.to_data());
    }
    report.finish(&g, &["video", "image"]);
}

/// The decoded video has the frame count diffusers' causal schedule gives, derived from
/// the config: `1 + (f - 1) * temporal_factor` for `f` latent frames.
#[test]
fn frame_counts_follow_the_causal_schedule() {
    let (vae, g) = (vae(), golden());
    let video = input(&g, "video");
    let frames = video.dims()[2];
    let latent_frames = vae.config.latent_frames(frames);
    assert_eq!(g["encode.mean"].shape[2], latent_frames);
    let tf = vae.config.temporal_factor();
    assert_eq!(g["decode.video"].shape[2], 1 + (latent_frames - 1) * tf);
}

/// Spatial size 2x the fixture's in each direction (the clip mirrored), so that several
/// tiles are needed whatever the fixture size.
fn large_video(g: &BTreeMap<String, TensorData>) -> Tensor<Cpu, 5> {
    let v = input(g, "video");
    let row = Tensor::cat(vec![v.clone(), v.flip([4])], 4);
    Tensor::cat(vec![row.clone(), row.flip([3])], 3)
}

/// Tiles of half the (latent) frame every quarter, in pixels.
fn small_tiling(latent: usize, s: usize) -> Tiling {
    let tile = (latent / 2).max(1);
    Tiling::square(tile * s, (tile / 2).max(1) * s)
}

#[test]
fn one_tile_covering_the_frame_equals_untiled() {
    let (vae, g) = (vae(), golden());
    let video = input(&g, "video");
    let [_, _, _, h, w] = video.dims();
    let s = vae.config.spatial_factor();
    let whole = Tiling::square(h.max(w).div_ceil(s) * s, h.max(w).div_ceil(s) * s);
    let a = vae.tiled_encode(video.clone(), &whole).unwrap().mean;
    let b = vae.encode(video).unwrap().mean;
    let (err, _) = max_err("one-tile encode", &a.clone().into_data(), &b.into_data());
    assert!(err < 1e-6, "one-tile encode differs: {err:.3e}");
    let a = vae.tiled_decode(a.clone(), &whole).unwrap();
    let b = vae
        .decode(vae.encode(input(&g, "video")).unwrap().mean)
        .unwrap();
    let (err, _) = max_err("one-tile decode", &a.into_data(), &b.into_data());
    assert!(err < 1e-6, "one-tile decode differs: {err:.3e}");
}

#[test]
fn tiled_encode_and_decode_stay_close_to_untiled() {
    let (vae, g) = (vae(), golden());
    let video = large_video(&g);
    let s = vae.config.spatial_factor();
    let [_, _, _, h, _] = video.dims();
    let tiling = small_tiling(h / s, s);
    let tiled = vae.tiled_encode(video.clone(), &tiling).unwrap().mean;
    let full = vae.encode(video).unwrap().mean;
    let (err, scale) = max_err(
        "tiled encode",
        &tiled.clone().into_data(),
        &full.clone().into_data(),
    );
    eprintln!("tiling {tiling:?}: encode max|err| = {err:.3e} (max|ref| {scale:.3})");
    let td = vae.tiled_decode(full.clone(), &tiling).unwrap();
    let fd = vae.decode(full).unwrap();
    let (err, scale) = max_err("tiled decode", &td.into_data(), &fd.into_data());
    eprintln!("tiling {tiling:?}: decode max|err| = {err:.3e} (max|ref| {scale:.3})");
    panic!("measure");
}
