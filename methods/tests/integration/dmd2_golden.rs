//! Golden test: the DMD2 generator loss, the student's gradients and the critic's
//! flow-matching loss and gradients reproduce `dmd2.safetensors` (FastVideo's formulas run on
//! the real diffusers model), for both CFG forms, through the functions the `dmd2` method
//! itself calls (`data_latent_input`, `student_x0`, `dmd_scores`, `generator_loss`,
//! `critic_loss`), with the fixture's noises and σ passed explicitly.
//!
//! Fixtures: `$REEL_WAN_FIXTURES`, else the repository's `tests/fixtures/wan_tiny`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use burn::tensor::{Tensor, TensorData};
use reel_core::io::read_safetensors;
use reel_methods::dmd2::{
    critic_loss, data_latent_input, dmd_scores, generator_loss, student_x0, CfgForm,
    DenoisingSchedule, DmdScores, RolloutDraws,
};
use reel_models::golden::{max_err, present_grads};
use reel_models::{WanConfig, WanModel};

type B = burn::backend::Autodiff<burn::backend::NdArray>;
type I = burn::backend::NdArray;

fn fixtures_dir() -> PathBuf {
    reel_core::fixtures::WAN.require(&[
        "config.json",
        "model.safetensors",
        "critic.safetensors",
        "student.safetensors",
        "dmd2.safetensors",
    ])
}

fn fixture(name: &str) -> BTreeMap<String, TensorData> {
    read_safetensors(fixtures_dir().join(name))
        .unwrap_or_else(|e| panic!("{e}"))
        .0
}

fn model<Bk: burn::tensor::backend::Backend>(weights: &str) -> WanModel<Bk> {
    let cfg = WanConfig::from_json_file(fixtures_dir().join("config.json")).unwrap();
    cfg.init::<Bk>(&Default::default())
        .load_weights(fixtures_dir().join(weights))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn tensor<Bk: burn::tensor::backend::Backend, const D: usize>(d: &TensorData) -> Tensor<Bk, D> {
    Tensor::from_data(d.clone(), &Default::default())
}

/// Collects measured errors and fails on the first one over its tolerance.
#[derive(Default)]
struct Report(Vec<(String, f64, f64)>);

impl Report {
    /// `max|got − want| <= rel · max(1, max|want|)`.
    fn check(&mut self, name: &str, got: TensorData, want: &TensorData, rel: f64) {
        let (err, scale) = max_err(name, &got, want);
        let scale = scale.max(1.0);
        assert!(
            err <= rel * scale,
            "{name}: max abs error {err:e} > {rel:e} x {scale}"
        );
        self.0.push((name.to_string(), err, scale));
    }

    /// Gradients: `max|got − want| <= rel · max|want|` (relative to the tensor's magnitude).
    fn check_grad(&mut self, name: &str, got: TensorData, want: &TensorData, rel: f64) {
        let (err, scale) = max_err(name, &got, want);
        assert!(scale > 0.0, "{name}: zero golden gradient");
        assert!(
            err <= rel * scale,
            "{name}: max abs error {err:e} > {rel:e} x {scale:e}"
        );
        self.0.push((name.to_string(), err, scale));
    }

    fn print(&self) {
        for (k, e, s) in &self.0 {
            eprintln!(
                "{k:58} max abs error {e:.2e}  (max |golden| {s:.3}, relative {:.1e})",
                e / s
            );
        }
    }
}

fn data<Bk: burn::tensor::backend::Backend, const D: usize>(t: &Tensor<Bk, D>) -> TensorData {
    t.clone().into_data()
}

fn scalar<Bk: burn::tensor::backend::Backend>(t: &Tensor<Bk, 1>) -> TensorData {
    // Goldens store scalars with shape [].
    TensorData::new(
        t.clone().into_data().to_vec::<f32>().unwrap(),
        Vec::<usize>::new(),
    )
}

/// The student rollout of the fixture (`data_latent` with the fixture's σ as a two-entry
/// schedule, sample b at index b) and its x0 prediction, with gradients.
fn student_step(
    g: &BTreeMap<String, TensorData>,
    student: &WanModel<B>,
) -> (Tensor<I, 5>, Tensor<B, 5>, Tensor<B, 5>) {
    let sigmas = g["gen_sigmas"].to_vec::<f32>().unwrap();
    let schedule = DenoisingSchedule {
        sigmas: sigmas.iter().map(|&s| s as f64).collect(),
    };
    let draws = RolloutDraws::<I> {
        index: (0..sigmas.len()).collect(),
        noises: vec![tensor(&g["gen_noise"])],
    };
    let (x_t, sigma) = data_latent_input(tensor::<I, 5>(&g["gen_x_real"]), &schedule, &draws);
    assert_eq!(sigma, sigmas);
    let text: Tensor<B, 3> = tensor(&g["encoder_hidden_states"]);
    let (x0, v) = student_x0(
        student,
        Tensor::from_inner(x_t.clone()),
        tensor(&g["gen_sigmas"]),
        text,
    );
    (x_t, x0, v)
}

fn scores(
    g: &BTreeMap<String, TensorData>,
    x0: Tensor<I, 5>,
    critic: &WanModel<I>,
    teacher: &WanModel<I>,
    form: CfgForm,
) -> DmdScores<I> {
    let guidance = g["guidance_scale"].to_vec::<f32>().unwrap()[0] as f64;
    dmd_scores(
        x0,
        tensor(&g["dmd_noise"]),
        tensor(&g["dmd_sigmas"]),
        critic,
        teacher,
        tensor(&g["encoder_hidden_states"]),
        tensor(&g["negative_encoder_hidden_states"]),
        guidance,
        form,
    )
    .unwrap_or_else(|e| panic!("one device has no collective to fail: {e}"))
}

#[test]
fn dmd2_generator_and_critic_match_fastvideo() {
    let _turn = reel_core::parallel::autodiff_turn();
    let g = fixture("dmd2.safetensors");
    let teacher: WanModel<I> = model("model.safetensors");
    let critic_i: WanModel<I> = model("critic.safetensors");
    let critic: WanModel<B> = model("critic.safetensors");
    let student: WanModel<B> = model("student.safetensors");
    let mut r = Report::default();
    const OUT: f64 = 1e-5;
    const GRAD: f64 = 1e-4;

    // --- Generator, cfg_form = "uncond" (FastVideo's new trainer): the plain keys. ---
    let (x_t, x0, v) = student_step(&g, &student);
    r.check("gen_noisy_input", data(&x_t), &g["gen_noisy_input"], OUT);
    r.check("v_student", data(&v), &g["v_student"], OUT);
    r.check("x0_gen", data(&x0), &g["x0_gen"], OUT);
    let x0_i = x0.clone().inner();
    let s = scores(&g, x0_i.clone(), &critic_i, &teacher, CfgForm::Uncond);
    r.check("dmd_noisy", data(&s.noisy), &g["dmd_noisy"], OUT);
    r.check("v_critic", data(&s.v_critic), &g["v_critic"], OUT);
    r.check("faker_x0", data(&s.fake_x0), &g["faker_x0"], OUT);
    r.check(
        "v_teacher_cond",
        data(&s.v_teacher_cond),
        &g["v_teacher_cond"],
        OUT,
    );
    r.check(
        "real_cond_x0",
        data(&s.real_cond_x0),
        &g["real_cond_x0"],
        OUT,
    );
    r.check(
        "v_teacher_uncond",
        data(s.v_teacher_uncond.as_ref().unwrap()),
        &g["v_teacher_uncond"],
        OUT,
    );
    r.check(
        "real_uncond_x0",
        data(s.real_uncond_x0.as_ref().unwrap()),
        &g["real_uncond_x0"],
        OUT,
    );
    r.check("real_cfg_x0", data(&s.real_x0), &g["real_cfg_x0"], OUT);
    r.check("normalizer", scalar(&s.normalizer), &g["normalizer"], OUT);
    r.check("dmd_grad", data(&s.grad), &g["dmd_grad"], OUT);
    let loss = generator_loss(x0, s.grad);
    r.check("loss", scalar(&loss), &g["loss"], OUT);
    let grads = loss.backward();
    let student_grads = present_grads(&student, &grads);
    let mut n = 0;
    for (k, want) in g.iter().filter(|(k, _)| k.starts_with("grad.student.")) {
        let name = &k["grad.student.".len()..];
        r.check_grad(k, student_grads[name].clone(), want, GRAD);
        n += 1;
    }
    assert!(n > 0, "the fixture holds no student gradients");

    // --- Critic flow matching on the detached student sample. ---
    let c = critic_loss(
        &critic,
        Tensor::from_inner(x0_i),
        tensor(&g["critic_noise"]),
        tensor(&g["critic_sigmas"]),
        tensor(&g["encoder_hidden_states"]),
    );
    r.check(
        "critic.noisy_input",
        data(&c.noisy),
        &g["critic.noisy_input"],
        OUT,
    );
    r.check("critic.pred", data(&c.pred), &g["critic.pred"], OUT);
    r.check("critic.target", data(&c.target), &g["critic.target"], OUT);
    r.check("critic.loss", scalar(&c.loss), &g["critic.loss"], OUT);
    let grads = c.loss.backward();
    let critic_grads = present_grads(&critic, &grads);
    let mut n = 0;
    for (k, want) in g.iter().filter(|(k, _)| k.starts_with("grad.critic.")) {
        let name = &k["grad.critic.".len()..];
        r.check_grad(k, critic_grads[name].clone(), want, GRAD);
        n += 1;
    }
    assert!(n > 0, "the fixture holds no critic gradients");

    // --- Generator, cfg_form = "legacy" (FastVideo's DistillationPipeline): `fastvideo.*`. ---
    let (_, x0, _) = student_step(&g, &student);
    let s = scores(&g, x0.clone().inner(), &critic_i, &teacher, CfgForm::Legacy);
    r.check(
        "fastvideo.real_cfg_x0",
        data(&s.real_x0),
        &g["fastvideo.real_cfg_x0"],
        OUT,
    );
    r.check(
        "fastvideo.normalizer",
        scalar(&s.normalizer),
        &g["fastvideo.normalizer"],
        OUT,
    );
    r.check(
        "fastvideo.dmd_grad",
        data(&s.grad),
        &g["fastvideo.dmd_grad"],
        OUT,
    );
    let loss = generator_loss(x0, s.grad);
    r.check("fastvideo.loss", scalar(&loss), &g["fastvideo.loss"], OUT);
    let grads = loss.backward();
    let student_grads = present_grads(&student, &grads);
    let mut n = 0;
    for (k, want) in g
        .iter()
        .filter(|(k, _)| k.starts_with("fastvideo.grad.student."))
    {
        let name = &k["fastvideo.grad.student.".len()..];
        r.check_grad(k, student_grads[name].clone(), want, GRAD);
        n += 1;
    }
    assert!(n > 0, "the fixture holds no legacy student gradients");
    r.print();
}
