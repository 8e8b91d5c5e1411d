//! Tests of the synthetic source and its evaluator.

use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use reel_core::data::{ClipEvaluator, DataConfig, DataSource, DataSpec};

use super::*;

fn noise(n: usize, sigma: f32, rng: &mut ChaCha8Rng) -> Vec<f32> {
    // Sum of 4 uniforms, rescaled: close enough to a normal for these tests.
    (0..n)
        .map(|_| {
            let s: f32 = (0..4).map(|_| rng.random::<f32>()).sum::<f32>() - 2.0;
            s * 3f32.sqrt() * sigma
        })
        .collect()
}

/// Every placement the generator can draw, for every caption.
fn all_scenes(spec: &DataSpec) -> Vec<Scene> {
    all_scenes_in(&Geometry::new(spec))
}

/// Every placement the generator can draw in geometry `g`, for every caption.
fn all_scenes_in(g: &Geometry) -> Vec<Scene> {
    let mut out = Vec::new();
    for caption in Caption::all() {
        let d = caption.direction;
        for size in g.sizes(caption.shape) {
            let across_extent = if d.horizontal() { g.height } else { g.width };
            for along in 0..=g.extent(d) - size - g.travel(d) {
                for across in 0..=across_extent - size {
                    out.push(Scene {
                        caption,
                        size,
                        along,
                        across,
                    });
                }
            }
        }
    }
    out
}

fn spec_of(frames: usize, height: usize, width: usize) -> DataSpec {
    SyntheticConfig {
        frames,
        height,
        width,
        ..Default::default()
    }
    .spec()
}

#[test]
fn every_ground_truth_clip_scores_one() {
    let eval = SyntheticEvaluator::default();
    for spec in [spec_of(8, 16, 16), spec_of(16, 12, 20), spec_of(4, 24, 16)] {
        let g = Geometry::new(&spec);
        let scenes = all_scenes(&spec);
        assert!(scenes.len() > 32 * 10);
        for scene in scenes {
            let clip = scene.render(&g);
            let score = eval.score(&clip, &spec, &scene.caption.to_string());
            assert_eq!(score.overall, 1.0, "{spec:?} {scene:?} {score:?}");
            let det = eval.detect(&clip, &spec).unwrap();
            assert_eq!(det.caption(), Some(scene.caption));
            assert!((det.shape_iou - 1.0).abs() < 1e-6);
        }
    }
}

#[test]
fn speed_and_object_size_are_shared_by_renderer_and_evaluator() {
    let spec = spec_of(4, 12, 12);
    let (slow, fast) = (
        Geometry::new(&spec),
        Geometry::with_motion(&spec, Some(4), 2),
    );
    assert_eq!((slow.base, slow.travel(Direction::Left)), (5, 3));
    assert_eq!((fast.base, fast.travel(Direction::Left)), (4, 6));
    // A path clamped by the frame: 3 px/frame over 3 frames would need 9 px, only 6 fit.
    assert_eq!(
        Geometry::with_motion(&spec, Some(4), 3).travel(Direction::Up),
        6
    );
    let eval = SyntheticEvaluator {
        object_size: Some(4),
        speed: 2,
    };
    let scenes = all_scenes_in(&fast);
    assert!(scenes.len() >= 32);
    for scene in &scenes {
        let clip = scene.render(&fast);
        let score = eval.score(&clip, &spec, &scene.caption.to_string());
        assert_eq!(score.overall, 1.0, "{scene:?} {score:?}");
    }
    // The evaluator asks for half the configured travel: half the speed still passes, a
    // still object does not.
    let scene = scenes[0];
    let half = Geometry { speed: 1, ..fast };
    let clip = scene.render(&half);
    let det = eval.detect(&clip, &spec).expect("object found");
    assert_eq!(det.caption(), Some(scene.caption), "{det:?}");
    let slow_clip = Scene { size: 4, ..scene }.render(&Geometry { speed: 0, ..fast });
    let det = eval.detect(&slow_clip, &spec).expect("object found");
    assert_eq!(
        det.direction, None,
        "a still object has no direction: {det:?}"
    );

    // The source hands out the matching evaluator.
    let source = SyntheticSource::new(&SyntheticConfig {
        frames: 4,
        height: 12,
        width: 12,
        speed: 2,
        object_size: Some(4),
        ..Default::default()
    });
    assert_eq!(source.geometry(), fast);
    for i in 0..64 {
        let sample = source.get(i).unwrap();
        let score = source
            .evaluator()
            .unwrap()
            .score(&sample.latents, &spec, &sample.caption);
        assert_eq!(score.overall, 1.0, "sample {i}: {score:?}");
    }
}

#[test]
fn bad_speed_and_object_size_name_the_key() {
    for (edit, key) in [
        (
            SyntheticConfig {
                speed: 0,
                ..Default::default()
            },
            "speed",
        ),
        (
            SyntheticConfig {
                object_size: Some(2),
                ..Default::default()
            },
            "object_size",
        ),
        (
            SyntheticConfig {
                object_size: Some(14),
                ..Default::default()
            },
            "object_size",
        ),
    ] {
        let err = edit.validate().unwrap_err();
        assert!(err.to_string().contains(key), "{err}");
    }
}

#[test]
fn noisy_ground_truth_still_scores_high() {
    let (spec, eval) = (spec_of(8, 16, 16), SyntheticEvaluator::default());
    let source = SyntheticSource::new(&SyntheticConfig::default());
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut correct = 0;
    for i in 0..128 {
        let s = source.get(i).unwrap();
        let n = noise(s.latents.len(), 0.5, &mut rng);
        let clip: Vec<f32> = s.latents.iter().zip(&n).map(|(a, b)| a + b).collect();
        correct += eval.score(&clip, &spec, &s.caption).overall as usize;
    }
    assert!(correct >= 124, "{correct}/128");
}

#[test]
fn pure_noise_and_empty_clips_score_zero() {
    let (spec, eval) = (spec_of(8, 16, 16), SyntheticEvaluator::default());
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut any = 0.0;
    for i in 0..64 {
        let clip = noise(spec.latent_numel(), 1.0, &mut rng);
        any += eval
            .score(&clip, &spec, &Caption::from_index(i).to_string())
            .overall;
    }
    assert_eq!(any, 0.0);
    let empty = vec![0.0; spec.latent_numel()];
    assert!(eval.detect(&empty, &spec).is_none());
    let score = eval.score(&empty, &spec, "a red square moving left");
    assert!(score.criteria.iter().all(|(_, v)| *v == 0.0) && score.overall == 0.0);
    // Wrong length or channel count: zero, no panic.
    assert_eq!(
        eval.score(&empty[1..], &spec, "a red square moving left")
            .overall,
        0.0
    );
    let spec3 = DataSpec {
        channels: 3,
        ..spec
    };
    assert_eq!(
        eval.score(&empty, &spec3, "a red square moving left")
            .overall,
        0.0
    );
}

#[test]
fn wrong_captions_fail_exactly_the_wrong_attributes() {
    let (spec, eval) = (spec_of(8, 16, 16), SyntheticEvaluator::default());
    let source = SyntheticSource::new(&SyntheticConfig::default());
    for i in 0..32 {
        let s = source.get(i).unwrap();
        let truth = Caption::parse(&s.caption).unwrap();
        for other in Caption::all().into_iter().filter(|c| *c != truth) {
            let score = eval.score(&s.latents, &spec, &other.to_string());
            assert_eq!(score.overall, 0.0);
            let want = [
                other.colour == truth.colour,
                other.shape == truth.shape,
                other.direction == truth.direction,
            ];
            for ((_, got), want) in score.criteria.iter().zip(want) {
                assert_eq!(*got == 1.0, want, "{truth} vs {other}");
            }
        }
        assert_eq!(eval.score(&s.latents, &spec, "not a caption").overall, 0.0);
    }
}

#[test]
fn other_motions_fail_direction() {
    let (spec, eval) = (spec_of(8, 16, 16), SyntheticEvaluator::default());
    let g = Geometry::new(&spec);
    let caption = Caption::parse("a blue circle moving right").unwrap();
    for d in [Direction::Left, Direction::Up, Direction::Down] {
        let scene = Scene {
            caption: Caption {
                direction: d,
                ..caption
            },
            size: 7,
            along: 1,
            across: 4,
        };
        let score = eval.score(&scene.render(&g), &spec, &caption.to_string());
        assert_eq!(score.criteria[0].1, 1.0);
        assert_eq!(score.criteria[1].1, 1.0);
        assert_eq!(score.criteria[2].1, 0.0, "{d}");
    }
    // Time-reversed "right" is "left"; a frozen first frame is no motion at all.
    let scene = Scene {
        caption,
        size: 8,
        along: 0,
        across: 3,
    };
    let clip = scene.render(&g);
    let frame = 16 * 16;
    let mut reversed = clip.clone();
    let mut frozen = clip.clone();
    for c in 0..4 {
        for t in 0..8 {
            let dst = (c * 8 + t) * frame;
            reversed[dst..dst + frame].copy_from_slice(&clip[(c * 8 + 7 - t) * frame..][..frame]);
            frozen[dst..dst + frame].copy_from_slice(&clip[(c * 8) * frame..][..frame]);
        }
    }
    let det = eval.detect(&reversed, &spec).unwrap();
    assert_eq!(det.direction, Some(Direction::Left));
    let det = eval.detect(&frozen, &spec).unwrap();
    assert_eq!((det.direction, det.shape), (None, Some(Shape::Circle)));
}

#[test]
fn source_is_deterministic_balanced_and_varied() {
    let config = SyntheticConfig {
        num_samples: 96,
        ..Default::default()
    };
    let (a, b) = (SyntheticSource::new(&config), SyntheticSource::new(&config));
    assert_eq!(a.len(), 96);
    let mut counts = [0usize; 32];
    let mut scenes = std::collections::HashSet::new();
    for i in 0..96 {
        let s = a.get(i).unwrap();
        assert_eq!(s, b.get(i).unwrap());
        assert_eq!(s.latents.len(), 4 * 8 * 16 * 16);
        assert_eq!(s.text.embedding.len(), 8 * 32);
        assert_eq!(s.caption, a.caption(i).to_string());
        counts[a.caption(i).index()] += 1;
        scenes.insert(format!("{:?}", a.scene(i)));
    }
    assert!(counts.iter().all(|&c| c == 3));
    assert!(scenes.len() > 90, "{}", scenes.len());
    assert!(a.get(96).is_err());
    // The seed changes order and placements but not the text table.
    let other = SyntheticSource::new(&SyntheticConfig {
        seed: 1,
        ..config.clone()
    });
    assert!((0..32).any(|i| other.caption(i) != a.caption(i)));
    let p = a.prompt_for("a red circle moving left").unwrap();
    assert_eq!(p, other.prompt_for("A red circle moving LEFT").unwrap());
    assert_eq!(p.caption, "a red circle moving left");
    assert!(a.prompt_for("a red hexagon moving left").is_none());
}

#[test]
fn latents_are_roughly_unit_scale() {
    let source = SyntheticSource::new(&SyntheticConfig::default());
    let (mut sum, mut sq, mut n) = (0.0f64, 0.0f64, 0usize);
    for i in 0..256 {
        for v in source.get(i).unwrap().latents {
            sum += f64::from(v);
            sq += f64::from(v) * f64::from(v);
            n += 1;
        }
    }
    let mean = sum / n as f64;
    let std = (sq / n as f64 - mean * mean).sqrt();
    assert!(
        mean.abs() < 0.1 && (0.8..1.2).contains(&std),
        "mean {mean} std {std}"
    );
}

#[test]
fn prompts_negative_and_evaluator_are_provided() {
    let source = SyntheticSource::new(&SyntheticConfig::default());
    let prompts = source.prompts();
    assert_eq!(prompts.len(), 8);
    for p in &prompts {
        assert_eq!(source.prompt_for(&p.caption).as_ref(), Some(p));
        assert_eq!(p.text.mask.iter().filter(|m| **m).count(), 5);
    }
    let neg = source.negative_text().unwrap();
    assert_eq!(neg.embedding.len(), 8 * 32);
    assert!(neg.mask.iter().all(|m| !m));
    let eval = source.evaluator().unwrap();
    let s = source.get(3).unwrap();
    assert_eq!(
        eval.score(&s.latents, &source.spec(), &s.caption).overall,
        1.0
    );
}

#[test]
fn config_parses_validates_and_builds() {
    let cfg: Box<dyn DataConfig> =
        toml::from_str("kind = \"synthetic\"\nbatch_size = 2\nnum_samples = 64\nheight = 20\n")
            .unwrap();
    cfg.validate().unwrap();
    assert_eq!(cfg.batch_size(), 2);
    let source = cfg.build(Path::new(".")).unwrap();
    assert_eq!(source.len(), 64);
    assert_eq!(
        (
            source.spec().height,
            source.spec().width,
            source.spec().channels
        ),
        (20, 16, 4)
    );
    let defaults: Box<dyn DataConfig> = toml::from_str("kind = \"synthetic\"").unwrap();
    assert_eq!(defaults.build(Path::new(".")).unwrap().len(), 512);
    let err = toml::from_str::<Box<dyn DataConfig>>("kind = \"synthetic\"\nheigth = 16\n");
    assert!(err.unwrap_err().to_string().contains("heigth"));
    for (field, bad) in [
        (
            "height",
            SyntheticConfig {
                height: 8,
                ..Default::default()
            },
        ),
        (
            "width",
            SyntheticConfig {
                width: 1000,
                ..Default::default()
            },
        ),
        (
            "frames",
            SyntheticConfig {
                frames: 1,
                ..Default::default()
            },
        ),
        (
            "text_len",
            SyntheticConfig {
                text_len: 4,
                ..Default::default()
            },
        ),
        (
            "text_dim",
            SyntheticConfig {
                text_dim: 0,
                ..Default::default()
            },
        ),
        (
            "batch_size",
            SyntheticConfig {
                batch_size: 0,
                ..Default::default()
            },
        ),
        (
            "batch_size",
            SyntheticConfig {
                num_samples: 2,
                ..Default::default()
            },
        ),
        (
            "num_samples",
            SyntheticConfig {
                num_samples: 0,
                batch_size: 1,
                ..Default::default()
            },
        ),
    ] {
        let err = bad.validate().unwrap_err();
        assert_eq!(err.key, field, "{err}");
    }
    assert!(reel_core::registry::is_registered(
        reel_core::registry::PluginKind::Data,
        "synthetic"
    ));
}

#[test]
fn rgb_decoding_shows_the_colour_on_grey() {
    let spec = spec_of(8, 16, 16);
    let scene = Scene {
        caption: Caption::parse("a red square moving down").unwrap(),
        size: 6,
        along: 0,
        across: 0,
    };
    let rgb = clip_to_rgb(&scene.render(&Geometry::new(&spec)), &spec);
    assert_eq!(rgb.len(), 8);
    assert_eq!(rgb[0].len(), 256);
    assert_eq!(rgb[0][0], [255, 1, 1]);
    assert_eq!(rgb[0][15], [128, 128, 128]);
    assert_eq!(rgb[7][7 * 16], [255, 1, 1]);
    assert!(clip_to_rgb(&[], &spec)[0]
        .iter()
        .all(|p| *p == [128, 128, 128]));
}
