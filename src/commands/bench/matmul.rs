//! `reel bench --matmul-only`: the matrix products of a preset's blocks alone, on Burn's
//! matmul and on every cubek kernel that `REEL_MATMUL` can pin
//! (`reel_models::wan::matmul`), side by side, in `--dtype`.
//!
//! The products, with `rows = batch · tokens`, width `d` and FFN width `f`:
//! - `attn`: the attention's projections, `[rows, d] · [d, d]ᵀ`, six per block (self
//!   `q, k, v, o`; cross `q, o`; the cross `k, v` on the text tokens are left out);
//! - `ffn up`: `[rows, d] · [f, d]ᵀ`, and `ffn down`: `[rows, f] · [d, f]ᵀ`, one each;
//!
//! each in the three layouts of training: the forward `x · wᵀ` (transposed right operand),
//! the input's gradient `g · w`, the weight's gradient `gᵀ · x` (transposed left operand,
//! summing over the rows). Every timing runs the product [`REPEATS`] times between device
//! syncs. Each result is checked once against the float32 product of the same values
//! (`max_error`, relative to the largest magnitude; at most [`TOLERANCE`]) and against Burn's
//! product in the bench's dtype (at most `CHECK_TOLERANCE`, the bar a pinned kernel must pass
//! in training); a row beyond either, or whose kernel failed on the device, says so in its
//! `error`.
//!
//! The summary adds up, per kernel, a block's products (each timing times its count): the
//! kernel that runs them all, correct, in the least time is `best`, a name to pin with
//! `REEL_MATMUL`. The same sums per layout give `best_pin`, the fastest correct kernel for each
//! of the three layouts (a `REEL_MATMUL` value: one name when one kernel wins all three);
//! `bench/gpu.sh` pins it.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, ElementConversion, Tensor};
use reel_core::backend::ReelBackend;
use reel_core::config::Precision;
use reel_core::rng::StreamRng;
use reel_core::with_backend;
use reel_models::wan::matmul::{
    matmul_on, Layout, MatmulKernel, BURN_MATMUL, CHECK_TOLERANCE, MATMUL_KERNELS,
};
use reel_models::wan::mem_attention::to_dtype;
use serde::Serialize;

use super::matmul_summary::{best_per_layout, print_tables, summarize};
use super::{preset_tokens, stats, BenchArgs, Stats};

/// Launches of a product per timed step.
pub const REPEATS: usize = 10;

/// Largest difference from the float32 product, relative to its largest magnitude, that a
/// kernel may show: the attention rows' bar for bf16 inputs.
pub const TOLERANCE: f64 = 3e-2;

/// One product of a block.
#[derive(Debug, Clone, Serialize)]
pub struct Product {
    /// `attn`, `ffn up` or `ffn down`, and the layout: `x·wᵀ`, `g·w` or `gᵀ·x`.
    pub name: String,
    /// The layout's name in a pin: `forward`, `input-grad` or `weight-grad`.
    pub layout: &'static str,
    /// `[m, k, n]` of `[m, k] · [k, n]`.
    pub shape: [usize; 3],
    /// Whether the left operand is transposed (`gᵀ·x`) and the right one (`x·wᵀ`).
    pub transposed: [bool; 2],
    /// How many times a block runs it.
    pub per_block: usize,
}

/// One kernel on one product.
#[derive(Debug, Clone, Serialize)]
pub struct MatmulRow {
    /// `burn` or a kernel's name.
    pub kernel: String,
    /// The product.
    pub product: Product,
    /// Milliseconds per product.
    pub ms: Option<Stats>,
    /// TFLOP/s at the median.
    pub tflops: Option<f64>,
    /// Largest difference from the float32 product, relative to its largest magnitude.
    pub max_error: Option<f64>,
    /// Why the kernel did not run the product, or that its result is beyond [`TOLERANCE`].
    pub error: Option<String>,
}

/// One kernel over a whole block.
#[derive(Debug, Clone, Serialize)]
pub struct KernelSummary {
    /// `burn` or a kernel's name.
    pub kernel: String,
    /// Milliseconds of a block's products (medians times counts); `None` unless every
    /// product ran within the tolerance.
    pub block_ms: Option<f64>,
    /// `block_ms` over Burn's.
    pub vs_burn: Option<f64>,
}

/// Everything `--matmul-only` measured.
#[derive(Debug, Clone, Serialize)]
pub struct MatmulReport {
    /// Precision of the operands.
    pub dtype: Precision,
    /// Every kernel on every product.
    pub rows: Vec<MatmulRow>,
    /// Every kernel over a block, fastest first (those that did not run everything last).
    pub summary: Vec<KernelSummary>,
    /// The fastest kernel that ran every product correctly (`burn` when none beat it).
    pub best: String,
    /// The fastest correct kernel per layout, as a `REEL_MATMUL` value (`burn` for Burn's).
    pub best_pin: String,
    /// Milliseconds of a block's products with `best_pin`.
    pub best_pin_block_ms: Option<f64>,
}

/// The products of a block of `d` wide, `f` wide FFN, over `rows` tokens.
pub fn products(rows: usize, d: usize, f: usize) -> Vec<Product> {
    let mut out = vec![];
    for (layer, d_in, d_out, per_block) in [
        ("attn", d, d, 6),
        ("ffn up", d, f, 1),
        ("ffn down", f, d, 1),
    ] {
        let layouts = [
            ("x·wᵀ", Layout::Forward, [rows, d_in, d_out], [false, true]),
            (
                "g·w",
                Layout::InputGrad,
                [rows, d_out, d_in],
                [false, false],
            ),
            (
                "gᵀ·x",
                Layout::WeightGrad,
                [d_out, rows, d_in],
                [true, false],
            ),
        ];
        for (product, layout, shape, transposed) in layouts {
            out.push(Product {
                name: format!("{layer} {product}"),
                layout: layout.name(),
                shape,
                transposed,
                per_block,
            });
        }
    }
    out
}

/// Time the products and print their tables (or JSON).
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let kernels = kernels(&args.matmul_kernels)?;
    let report = with_backend!(args.backend, |B| report::<B>(args, &kernels))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    print_tables(&report);
    Ok(())
}

/// `--matmul-kernel`'s names (every kernel when none), `None` standing for Burn's matmul,
/// which is always timed first.
fn kernels(names: &[String]) -> anyhow::Result<Vec<Option<MatmulKernel>>> {
    let mut out = vec![None];
    if names.is_empty() {
        out.extend(MATMUL_KERNELS.iter().map(|(k, _)| Some(*k)));
        return Ok(out);
    }
    for name in names {
        let kernel =
            MatmulKernel::parse(name).map_err(|e| anyhow::anyhow!("--matmul-kernel: {e}"))?;
        if kernel.is_some() && !out.contains(&kernel) {
            out.push(kernel);
        }
    }
    Ok(out)
}

fn report<B: ReelBackend>(
    args: &BenchArgs,
    kernels: &[Option<MatmulKernel>],
) -> anyhow::Result<MatmulReport> {
    let preset = args.presets.first().map(String::as_str).unwrap_or("");
    let (cfg, tokens) = preset_tokens(args, preset)?;
    let products = products(args.batch * tokens, cfg.inner_dim(), cfg.ffn_dim);
    let device = crate::commands::device::<B>(0, "--backend")?;
    let mut rows = vec![];
    for (i, product) in products.iter().enumerate() {
        let [lhs, rhs] =
            operands::<B::InnerBackend>(product, args.dtype.dtype(), i as u64, &device);
        let f32 = |t: &Tensor<B::InnerBackend, 2>| to_dtype(t.clone(), DType::F32);
        let references = [
            f32(&lhs).matmul(f32(&rhs)),
            f32(&lhs.clone().matmul(rhs.clone())),
        ];
        for &kernel in kernels {
            let row =
                row::<B::InnerBackend>(args, kernel, product.clone(), [&lhs, &rhs], &references)?;
            eprintln!("{}", progress_line(&row));
            rows.push(row);
        }
    }
    let summary = summarize(kernels, &rows);
    let best = summary
        .first()
        .filter(|s| s.block_ms.is_some())
        .map_or(BURN_MATMUL.to_string(), |s| s.kernel.clone());
    let (pin, best_pin_block_ms) = best_per_layout(kernels, &rows);
    Ok(MatmulReport {
        dtype: args.dtype,
        rows,
        summary,
        best,
        best_pin: pin.to_string(),
        best_pin_block_ms,
    })
}

/// The two operands of `product`, normal values in `dtype`, laid out as training has them.
fn operands<B: Backend>(
    product: &Product,
    dtype: DType,
    seed: u64,
    device: &B::Device,
) -> [Tensor<B, 2>; 2] {
    let [m, k, n] = product.shape;
    let mut rng = StreamRng::from_seed(seed);
    let mut make = |[r, c]: [usize; 2], transposed: bool| {
        let dims = if transposed { [c, r] } else { [r, c] };
        let t: Tensor<B, 2> = to_dtype(rng.normal_tensor(dims, device), dtype);
        if transposed {
            t.transpose()
        } else {
            t
        }
    };
    [
        make([m, k], product.transposed[0]),
        make([k, n], product.transposed[1]),
    ]
}

/// `kernel` on one product: timed, then checked.
fn row<B: Backend>(
    args: &BenchArgs,
    kernel: Option<MatmulKernel>,
    product: Product,
    [lhs, rhs]: [&Tensor<B, 2>; 2],
    [reference, burns]: &[Tensor<B, 2>; 2],
) -> anyhow::Result<MatmulRow> {
    let name = kernel.map_or(BURN_MATMUL, MatmulKernel::name).to_string();
    let mut row = MatmulRow {
        kernel: name,
        product,
        ms: None,
        tflops: None,
        max_error: None,
        error: None,
    };
    let run = || match kernel {
        None => Ok(lhs.clone().matmul(rhs.clone())),
        Some(k) => matmul_on(lhs.clone(), rhs.clone(), k),
    };
    let device = lhs.device();
    // A launch or compilation that fails after cubek returns surfaces at the next sync: such
    // a row says so rather than timing nothing and reading a buffer never written.
    let synced = |row: &mut MatmulRow| match B::sync(&device) {
        Ok(()) => true,
        Err(e) => {
            row.error = Some(format!("failed on the device: {e:?}"));
            false
        }
    };
    // The first run compiles the kernel, or finds that it cannot run.
    let out = match run() {
        Ok(out) => out,
        Err(e) => {
            row.error = Some(e.to_string());
            return Ok(row);
        }
    };
    if !synced(&mut row) {
        return Ok(row);
    }
    let mut ms = vec![];
    for i in 0..args.warmup + args.steps {
        let t0 = std::time::Instant::now();
        for _ in 0..REPEATS {
            let _ = run();
        }
        if !synced(&mut row) {
            return Ok(row);
        }
        if i >= args.warmup {
            ms.push(t0.elapsed().as_secs_f64() * 1e3 / REPEATS as f64);
        }
    }
    let ms = stats(ms);
    let [m, k, n] = row.product.shape;
    row.tflops = Some(2.0 * (m * k * n) as f64 / (ms.median * 1e9));
    row.ms = Some(ms);
    let out = to_dtype(out, DType::F32);
    let e = max_error(out.clone(), reference.clone());
    row.max_error = Some(e);
    // The bar of the check that a pinned kernel passes in training, too.
    let from_burns = max_error(out, burns.clone());
    if e > TOLERANCE {
        row.error = Some(format!(
            "differs from the float32 product by {e:.2e} (tolerance {TOLERANCE:e})"
        ));
    } else if from_burns > f64::from(CHECK_TOLERANCE) {
        row.error = Some(format!(
            "differs from Burn's product by {from_burns:.2e} (tolerance {CHECK_TOLERANCE:e})"
        ));
    }
    Ok(row)
}

/// `max |got − want|` over `max(1, max |want|)`; infinite for a NaN.
fn max_error<B: Backend>(got: Tensor<B, 2>, want: Tensor<B, 2>) -> f64 {
    let scalar = |t: Tensor<B, 1>| t.into_scalar().elem::<f64>();
    let scale = scalar(want.clone().abs().max()).max(1.0);
    let e = scalar((got - want).abs().max()) / scale;
    if e.is_nan() {
        f64::INFINITY
    } else {
        e
    }
}

/// The line on stderr for a row just measured.
fn progress_line(r: &MatmulRow) -> String {
    let what = format!(
        "bench: matmul {} {} {:?}",
        r.kernel, r.product.name, r.product.shape
    );
    match (&r.ms, &r.error) {
        (_, Some(e)) => format!("{what}: {e}"),
        (Some(ms), None) => format!("{what}: {:.3} ms", ms.median),
        (None, None) => what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocks_products_have_the_layers_shapes() {
        let p = products(10, 4, 16);
        assert_eq!(p.len(), 9);
        let shapes: Vec<_> = p
            .iter()
            .map(|p| (p.name.as_str(), p.shape, p.per_block))
            .collect();
        assert_eq!(shapes[0], ("attn x·wᵀ", [10, 4, 4], 6));
        assert_eq!(shapes[4], ("ffn up g·w", [10, 16, 4], 1));
        assert_eq!(shapes[8], ("ffn down gᵀ·x", [4, 10, 16], 1));
    }
}
