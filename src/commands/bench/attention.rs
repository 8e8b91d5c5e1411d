//! `reel bench --attention-only`: the self-attention operation of a preset's blocks alone, at the
//! tokens of `--shape`: `q`, `k`, `v` of `[B, heads, N, head_dim]` in `--dtype`, laid out `[B, N,
//! heads, head_dim]` as the Wan blocks pass them. One row per attention mode (`memory_efficient`,
//! `fused`, `flash`; `--attention <mode>` times that one alone) with the forward without gradients
//! and the forward plus backward, and with `flash` one row of cubek's tensor-core flash forward by
//! itself (the plain CubeCL backends only) and, in a `cuda` build, one of `flash` on cuDNN (`flash
//! cudnn`, the `cuda` default; the `flash` row is Reel's tiled kernels whatever `REEL_FLASH`
//! says); `--tiles SPEC` adds a `flash` row per launch shape of the tiled kernels.
//! A GPU session learns in seconds which kernel (and which shape) is slow, without the minutes of a
//! full model step; `bench/pytorch/bench_wan.py --attention-only` times PyTorch's
//! `scaled_dot_product_attention` on the same shapes.
//!
//! FLOP count: the forward's two products, `4·B·heads·N²·head_dim`; the backward's five count
//! 2.5× that (FlashAttention's convention), so forward plus backward counts 3.5×.
//!
//! Every row is also checked, once after its timing: its output and the gradients of
//! `Σ w∘o` (random `w`) for `q`, `k`, `v` against `memory_efficient` attention in float32 on
//! the same inputs (`max_error`, the largest difference relative to each tensor's largest
//! magnitude; the `cubek` row: its output alone). A row beyond [`TOLERANCE`] says so in its
//! `error`, so that a fast but wrong launch shape is never picked (`bench/gpu.sh`).

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, ElementConversion, Tensor};
use reel_core::backend::ReelBackend;
use reel_core::config::Precision;
use reel_core::rng::StreamRng;
use reel_core::with_backend;
#[cfg(any(feature = "cuda", feature = "wgpu"))]
use reel_models::wan::fused_attention::tiles::TileChoice;
use reel_models::wan::mem_attention::{attention, to_dtype};
use reel_models::AttentionMode;
use serde::Serialize;

use super::progress::time;
use super::{preset_tokens, BenchArgs, Stats};

/// Largest difference from the float32 reference, relative to the reference's largest
/// magnitude (at least 1), that a row may show: the tensor-core kernels' tests' bar for bf16
/// inputs.
pub const TOLERANCE: f64 = 3e-2;

/// The attention modes timed, in order.
const MODES: [AttentionMode; 3] = [
    AttentionMode::MemoryEfficient,
    AttentionMode::Fused,
    AttentionMode::Flash,
];

/// One attention implementation's times.
#[derive(Debug, Clone, Serialize)]
pub struct AttentionRow {
    /// `memory_efficient`, `fused`, `flash`, or `cubek` (its tensor-core flash forward alone).
    pub kernel: String,
    /// Batch, heads, tokens, head dim.
    pub shape: [usize; 4],
    /// Precision of q, k and v.
    pub dtype: Precision,
    /// Forward without gradients, milliseconds.
    pub forward_ms: Option<Stats>,
    /// Forward TFLOP/s (median).
    pub forward_tflops: Option<f64>,
    /// Forward with a graph plus backward, milliseconds (`None` for the `cubek` row).
    pub train_ms: Option<Stats>,
    /// Forward plus backward TFLOP/s (median).
    pub train_tflops: Option<f64>,
    /// Largest difference of the output and the three gradients from the float32 reference,
    /// relative to each one's largest magnitude (at least 1); the output's alone for `cubek`.
    pub max_error: Option<f64>,
    /// Why a part did not run (the `cubek` row on a backend or shape it does not take), or
    /// that the results are beyond [`TOLERANCE`].
    pub error: Option<String>,
}

impl AttentionRow {
    /// A row of `kernel` with no times yet.
    fn untimed(kernel: String, shape: [usize; 4], dtype: Precision) -> Self {
        Self {
            kernel,
            shape,
            dtype,
            forward_ms: None,
            forward_tflops: None,
            train_ms: None,
            train_tflops: None,
            max_error: None,
            error: None,
        }
    }
}

/// Forward FLOPs of the attention over `[b, h, n, d]`.
pub fn forward_flops([b, h, n, d]: [usize; 4]) -> f64 {
    4.0 * (b * h) as f64 * (n as f64) * (n as f64) * d as f64
}

/// Time the attention rows and print their table (or JSON).
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let rows = with_backend!(args.backend, |B| rows::<B>(args))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    // `flash <tiles>` rows can be long.
    let w = super::kernel_width(rows.iter().map(|r| r.kernel.as_str()));
    println!(
        "{:<w$} {:<22} {:<5} | {:>12} {:>9} | {:>14} {:>9} | {:>9}",
        "kernel",
        "[B, heads, N, d]",
        "dtype",
        "forward ms",
        "TFLOP/s",
        "fwd+bwd ms",
        "TFLOP/s",
        "max error"
    );
    let opt = |v: Option<f64>, p: usize| v.map_or("—".to_string(), |v| format!("{v:.p$}"));
    for r in rows {
        println!(
            "{:<w$} {:<22} {:<5} | {:>12} {:>9} | {:>14} {:>9} | {:>9}{}",
            r.kernel,
            format!("{:?}", r.shape),
            if r.dtype == Precision::Bf16 {
                "bf16"
            } else {
                "f32"
            },
            opt(r.forward_ms.as_ref().map(|s| s.median), 2),
            opt(r.forward_tflops, 1),
            opt(r.train_ms.as_ref().map(|s| s.median), 2),
            opt(r.train_tflops, 1),
            r.max_error.map_or("—".to_string(), |e| format!("{e:.1e}")),
            r.error.map(|e| format!("  ({e})")).unwrap_or_default()
        );
    }
    Ok(())
}

/// `[B, heads, N, head_dim]` of the preset's self-attention at `--shape` and `--batch`.
fn problem(args: &BenchArgs) -> anyhow::Result<[usize; 4]> {
    let preset = args.presets.first().map(String::as_str).unwrap_or("");
    let (cfg, tokens) = preset_tokens(args, preset)?;
    Ok([
        args.batch,
        cfg.num_attention_heads,
        tokens,
        cfg.attention_head_dim,
    ])
}

fn rows<B: ReelBackend>(args: &BenchArgs) -> anyhow::Result<Vec<AttentionRow>> {
    let shape = problem(args)?;
    // A bad `--tiles` spec fails before any timing.
    let choices = args
        .tiles
        .iter()
        .map(|spec| parse_tiles(spec))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let device = crate::commands::device::<B>(0, "--backend")?;
    let [b, h, n, d] = shape;
    // Stored `[B, N, heads, d]`, seen as `[B, heads, N, d]`, in the bench's dtype.
    let mut rng = StreamRng::from_seed(0);
    let mut input = || {
        let t: Tensor<B::InnerBackend, 4> = rng.normal_tensor([b, n, h, d], &device);
        to_dtype(t, args.dtype.dtype()).swap_dims(1, 2)
    };
    let (q, k, v) = (input(), input(), input());
    let w: Tensor<B::InnerBackend, 4> = rng.normal_tensor([b, h, n, d], &device);
    let f32_of = |t: &Tensor<B::InnerBackend, 4>| to_dtype(t.clone(), DType::F32);
    let check = Check {
        reference: results::<B>(
            AttentionMode::MemoryEfficient,
            [&f32_of(&q), &f32_of(&k), &f32_of(&v)],
            &w,
        )?,
        w,
    };
    // `--attention auto` (the default): every mode; another: that one alone.
    let modes = match args.attention {
        AttentionMode::Auto => MODES.to_vec(),
        mode => vec![mode],
    };
    let mut rows = vec![];
    // The `flash` rows time Reel's kernels; cuDNN's (the `cuda` default) get a row of their own.
    #[cfg(feature = "cuda")]
    reel_models::wan::fused_attention::cudnn::choose(Some(
        reel_models::wan::fused_attention::cudnn::Flash::Reel,
    ));
    for &mode in &modes {
        let row = mode_row::<B>(args, mode, label(mode), [&q, &k, &v], shape, &check)?;
        rows.push(row);
    }
    for choice in choices {
        rows.push(tiles_row::<B>(args, choice, [&q, &k, &v], shape, &check)?);
    }
    if modes.contains(&AttentionMode::Flash) {
        let row = cubek_row::<B::InnerBackend>(args, [&q, &k, &v], shape, &device, &check)?;
        rows.push(row);
        #[cfg(feature = "cuda")]
        rows.push(cudnn_row::<B>(args, [&q, &k, &v], shape, &check)?);
    }
    #[cfg(feature = "cuda")]
    reel_models::wan::fused_attention::cudnn::choose(None);
    Ok(rows)
}

/// What every row is checked against: the weights `w` of the loss `Σ w∘o` and the float32
/// reference's output and gradients ([`results`]).
struct Check<B: Backend> {
    w: Tensor<B, 4>,
    reference: [Tensor<B, 4>; 4],
}

impl<B: Backend> Check<B> {
    /// The largest difference of `got` from the reference's first `got.len()` tensors,
    /// relative to each reference tensor's largest magnitude (at least 1); infinite where
    /// `got` holds a NaN.
    fn max_error(&self, got: &[Tensor<B, 4>]) -> f64 {
        let scalar = |t: Tensor<B, 1>| t.into_scalar().elem::<f64>();
        let mut worst = 0.0f64;
        for (want, got) in self.reference.iter().zip(got) {
            if got.clone().is_nan().any().into_scalar().elem::<bool>() {
                return f64::INFINITY;
            }
            let scale = scalar(want.clone().abs().max()).max(1.0);
            let diff = scalar((want.clone() - got.clone()).abs().max()) / scale;
            worst = worst.max(if diff.is_nan() { f64::INFINITY } else { diff });
        }
        worst
    }

    /// `row` with its `max_error` for `got`, and an `error` when beyond [`TOLERANCE`].
    fn mark(&self, mut row: AttentionRow, got: &[Tensor<B, 4>]) -> AttentionRow {
        let e = self.max_error(got);
        row.max_error = Some(e);
        if e > TOLERANCE {
            row.error = Some(format!(
                "results differ from the float32 reference by {e:.2e} of their largest \
                 magnitude (tolerance {TOLERANCE:e})"
            ));
        }
        row
    }
}

/// `[o, dq, dk, dv]` in float32 of `mode` on the autodiff backend `B`, the gradients those of
/// `Σ w∘o`.
fn results<B: AutodiffBackend>(
    mode: AttentionMode,
    [q, k, v]: [&Tensor<B::InnerBackend, 4>; 3],
    w: &Tensor<B::InnerBackend, 4>,
) -> anyhow::Result<[Tensor<B::InnerBackend, 4>; 4]> {
    let leaf =
        |t: &Tensor<B::InnerBackend, 4>| Tensor::<B, 4>::from_inner(t.clone()).require_grad();
    let (q, k, v) = (leaf(q), leaf(k), leaf(v));
    let o = attention(q.clone(), k.clone(), v.clone(), mode);
    let w = Tensor::<B, 4>::from_inner(to_dtype(w.clone(), o.dtype()));
    let grads = (o.clone() * w).sum().backward();
    let grad = |t: &Tensor<B, 4>| {
        t.grad(&grads)
            .map(|g| to_dtype(g, DType::F32))
            .ok_or_else(|| anyhow::anyhow!("{mode:?} attention gave no gradient"))
    };
    Ok([
        to_dtype(o.inner(), DType::F32),
        grad(&q)?,
        grad(&k)?,
        grad(&v)?,
    ])
}

/// `mode`'s forward and forward + backward, in a row named `kernel`, checked.
fn mode_row<B: ReelBackend>(
    args: &BenchArgs,
    mode: AttentionMode,
    kernel: String,
    [q, k, v]: [&Tensor<B::InnerBackend, 4>; 3],
    shape: [usize; 4],
    check: &Check<B::InnerBackend>,
) -> anyhow::Result<AttentionRow> {
    let device = q.device();
    let flops = forward_flops(shape);
    let tflops = |s: &Stats, times: f64| times * flops / (s.median * 1e9);
    let what = format!("{kernel} attention {shape:?}");
    let (fwd, _) = time::<B::InnerBackend, _>(args, &format!("{what}, forward"), &device, || {
        Ok(attention(q.clone(), k.clone(), v.clone(), mode))
    })?;
    let train = train_time::<B>(args, &what, mode, [q, k, v])?;
    let row = AttentionRow {
        kernel,
        shape,
        dtype: args.dtype,
        forward_tflops: Some(tflops(&fwd, 1.0)),
        forward_ms: Some(fwd),
        train_tflops: Some(tflops(&train, 3.5)),
        train_ms: Some(train),
        max_error: None,
        error: None,
    };
    Ok(check.mark(row, &results::<B>(mode, [q, k, v], &check.w)?))
}

/// Without the CubeCL backends there are no tiled kernels, and no launch shape to choose.
#[cfg(not(any(feature = "cuda", feature = "wgpu")))]
type TileChoice = std::convert::Infallible;

/// `--tiles`' spec, parsed.
fn parse_tiles(spec: &str) -> anyhow::Result<TileChoice> {
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    return spec.parse().map_err(|e| anyhow::anyhow!("--tiles: {e}"));
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    anyhow::bail!("--tiles {spec}: the tiled kernels need a build with the cuda or wgpu feature")
}

/// The `flash` row with the tiled kernels launched as `choice` says (`--tiles`); the choice
/// in force before is restored afterwards. A shape whose kernels fail or panic (one the
/// device rejects, or a kernel never run before) gets a row with its `error`, so it costs its
/// own row and not the table.
fn tiles_row<B: ReelBackend>(
    args: &BenchArgs,
    choice: TileChoice,
    qkv: [&Tensor<B::InnerBackend, 4>; 3],
    shape: [usize; 4],
    check: &Check<B::InnerBackend>,
) -> anyhow::Result<AttentionRow> {
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    {
        use reel_models::wan::fused_attention::tiles::{set_tiles, tiles_choice};
        let before = tiles_choice();
        set_tiles(choice);
        let kernel = format!("flash {choice}");
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            mode_row::<B>(
                args,
                AttentionMode::Flash,
                kernel.clone(),
                qkv,
                shape,
                check,
            )
        }));
        set_tiles(before);
        let error = match run {
            Ok(Ok(row)) => return Ok(row),
            Ok(Err(e)) => format!("{e:#}"),
            Err(payload) => format!(
                "panicked: {}",
                reel_core::trainer::panic_message(payload.as_ref()).unwrap_or("(no message)")
            ),
        };
        Ok(AttentionRow {
            error: Some(error),
            ..AttentionRow::untimed(kernel, shape, args.dtype)
        })
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    {
        let _ = (args, qkv, shape, check);
        match choice {}
    }
}

/// The config name of `mode`.
fn label(mode: AttentionMode) -> String {
    serde_json::to_value(mode)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{mode:?}"))
}

/// Forward with a graph and backward of `Σ o` on the autodiff backend `B`.
fn train_time<B: AutodiffBackend>(
    args: &BenchArgs,
    what: &str,
    mode: AttentionMode,
    [q, k, v]: [&Tensor<B::InnerBackend, 4>; 3],
) -> anyhow::Result<Stats> {
    let device = q.device();
    let (ms, _) = time::<B, _>(
        args,
        &format!("{what}, forward + backward"),
        &device,
        || {
            let leaf = |t: &Tensor<B::InnerBackend, 4>| {
                Tensor::<B, 4>::from_inner(t.clone()).require_grad()
            };
            let (q, k, v) = (leaf(q), leaf(k), leaf(v));
            let o = attention(q.clone(), k, v, mode);
            let grads = o.sum().backward();
            Ok(q.grad(&grads).map(|g| g.dims()))
        },
    )?;
    Ok(ms)
}

/// The `flash` row on cuDNN (the `cuda` default), or, where one untimed forward finds that
/// cuDNN does not run (another backend, no `libcudnn`, a shape it refuses: the reason is on
/// stderr), a row saying so; a row whose backward fell back to Reel's kernels says that too.
#[cfg(feature = "cuda")]
fn cudnn_row<B: ReelBackend>(
    args: &BenchArgs,
    [q, k, v]: [&Tensor<B::InnerBackend, 4>; 3],
    shape: [usize; 4],
    check: &Check<B::InnerBackend>,
) -> anyhow::Result<AttentionRow> {
    use reel_models::wan::fused_attention::cudnn::{self, Flash};
    // cuDNN as REEL_FLASH calls it (`cudnn-queued` or `cudnn`), whatever this thread chose.
    cudnn::choose(None);
    let flash = match cudnn::flash() {
        Flash::Reel => Flash::Cudnn,
        other => other,
    };
    cudnn::choose(Some(flash));
    let kernel = format!("flash {}", flash.name());
    let before = cudnn::runs();
    let _ = attention(q.clone(), k.clone(), v.clone(), AttentionMode::Flash);
    let row = if cudnn::runs().0 > before.0 {
        mode_row::<B>(args, AttentionMode::Flash, kernel, [q, k, v], shape, check).map(|row| {
            let backward = cudnn::runs().1 > before.1;
            let error = (!backward).then(|| {
                "cuDNN's backward did not run (stderr says why): the train time has Reel's".into()
            });
            AttentionRow {
                error: row.error.or(error),
                ..row
            }
        })
    } else {
        Ok(AttentionRow {
            error: Some("cuDNN did not run (stderr says why)".into()),
            ..AttentionRow::untimed(kernel, shape, args.dtype)
        })
    };
    cudnn::choose(None);
    row
}

/// cubek's tensor-core flash forward alone, or why it does not run here.
fn cubek_row<B: Backend>(
    args: &BenchArgs,
    [q, k, v]: [&Tensor<B, 4>; 3],
    shape: [usize; 4],
    device: &B::Device,
    check: &Check<B>,
) -> anyhow::Result<AttentionRow> {
    let mut row = AttentionRow::untimed("cubek".into(), shape, args.dtype);
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    {
        use reel_models::wan::fused_attention::flash::cubek_forward;
        // One try first: a shape or backend it does not take fails before any timing.
        if let Err(e) = cubek_forward(q.clone(), k.clone(), v.clone()) {
            row.error = Some(e);
            return Ok(row);
        }
        let what = format!("cubek flash forward {shape:?}");
        let (fwd, o) = time::<B, _>(args, &what, device, || {
            cubek_forward(q.clone(), k.clone(), v.clone()).map_err(anyhow::Error::msg)
        })?;
        row.forward_tflops = Some(forward_flops(shape) / (fwd.median * 1e9));
        row.forward_ms = Some(fwd);
        row = check.mark(row, &[to_dtype(o, DType::F32)]);
    }
    #[cfg(not(any(feature = "cuda", feature = "wgpu")))]
    {
        let _ = (q, k, v, device, check);
        row.error = Some("built without the cuda and wgpu features".into());
    }
    Ok(row)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flops_count_both_products_of_every_head() {
        // 2 products of N·N·d multiply-adds, 2 FLOP each, per batch and head.
        assert_eq!(forward_flops([2, 3, 10, 4]), 2.0 * 3.0 * 4.0 * 100.0 * 4.0);
    }
}
