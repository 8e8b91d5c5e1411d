//! The summary of `reel bench --matmul-only`: a block's milliseconds per kernel, the fastest
//! kernel per layout (the `REEL_MATMUL` value `bench/gpu.sh` pins), and the tables on stdout.

use reel_models::wan::matmul::{Layout, MatmulKernel, MatmulPin, BURN_MATMUL};

use super::matmul::{KernelSummary, MatmulReport, MatmulRow};

/// The milliseconds of a block's products among the `rows` that `keep` takes (medians times
/// counts); `None` unless every one of them ran within the tolerance.
fn total_ms(rows: &[MatmulRow], keep: impl Fn(&MatmulRow) -> bool) -> Option<f64> {
    rows.iter()
        .filter(|r| keep(r))
        .map(|r| match (&r.ms, &r.error) {
            (Some(ms), None) => Some(ms.median * r.product.per_block as f64),
            _ => None,
        })
        .sum()
}

/// Per kernel: a block's milliseconds (when it ran every product within the tolerance),
/// fastest first.
pub fn summarize(kernels: &[Option<MatmulKernel>], rows: &[MatmulRow]) -> Vec<KernelSummary> {
    let name = |k: &Option<MatmulKernel>| k.map_or(BURN_MATMUL, MatmulKernel::name);
    let block_ms = |kernel: &str| total_ms(rows, |r| r.kernel == kernel);
    let burn = block_ms(BURN_MATMUL);
    let mut out: Vec<KernelSummary> = kernels
        .iter()
        .map(|k| {
            let block_ms = block_ms(name(k));
            KernelSummary {
                kernel: name(k).to_string(),
                block_ms,
                vs_burn: block_ms.zip(burn).map(|(a, b)| a / b),
            }
        })
        .collect();
    out.sort_by(|a, b| {
        let key = |s: &KernelSummary| s.block_ms.unwrap_or(f64::INFINITY);
        key(a).total_cmp(&key(b))
    });
    out
}

/// Per layout, the kernel whose products of that layout (medians times counts) take the
/// least time, among those that ran all of them within the tolerance; with the block's total.
/// A layout no kernel ran completely stays on Burn's matmul, and the total is `None`.
pub fn best_per_layout(
    kernels: &[Option<MatmulKernel>],
    rows: &[MatmulRow],
) -> (MatmulPin, Option<f64>) {
    let name = |k: &Option<MatmulKernel>| k.map_or(BURN_MATMUL, MatmulKernel::name);
    let layout_ms = |kernel: &str, layout: &str| {
        total_ms(rows, |r| r.kernel == kernel && r.product.layout == layout)
    };
    let mut pin = MatmulPin::default();
    let mut total = Some(0.0);
    for (layout, layout_name) in reel_models::wan::matmul::LAYOUTS {
        let fastest = kernels
            .iter()
            .filter_map(|k| layout_ms(name(k), layout_name).map(|ms| (ms, *k)))
            .min_by(|a, b| a.0.total_cmp(&b.0));
        let kernel = fastest.and_then(|(_, k)| k);
        match layout {
            Layout::Forward => pin.forward = kernel,
            Layout::InputGrad => pin.input_grad = kernel,
            Layout::WeightGrad => pin.weight_grad = kernel,
        }
        total = total.zip(fastest).map(|(t, (ms, _))| t + ms);
    }
    (pin, total)
}

/// The rows, the per-kernel summary and the fastest kernels, as tables on stdout.
pub fn print_tables(report: &MatmulReport) {
    let w = super::kernel_width(report.rows.iter().map(|r| r.kernel.as_str()));
    println!(
        "{:<w$} {:<14} {:<22} | {:>9} {:>8} | {:>9}",
        "kernel", "product", "[m, k, n]", "ms", "TFLOP/s", "max error"
    );
    let opt = |v: Option<f64>, p: usize| v.map_or("—".to_string(), |v| format!("{v:.p$}"));
    for r in &report.rows {
        println!(
            "{:<w$} {:<14} {:<22} | {:>9} {:>8} | {:>9}{}",
            r.kernel,
            r.product.name,
            format!("{:?}", r.product.shape),
            opt(r.ms.as_ref().map(|s| s.median), 3),
            opt(r.tflops, 1),
            r.max_error.map_or("—".to_string(), |e| format!("{e:.1e}")),
            r.error
                .as_ref()
                .map(|e| format!("  ({e})"))
                .unwrap_or_default()
        );
    }
    println!();
    println!("{:<w$} | {:>12} {:>8}", "kernel", "block ms", "/ burn");
    for s in &report.summary {
        println!(
            "{:<w$} | {:>12} {:>8}",
            s.kernel,
            opt(s.block_ms, 3),
            opt(s.vs_burn, 2)
        );
    }
    println!("best: {}", report.best);
    println!(
        "best per layout: {} ({} ms per block)",
        report.best_pin,
        opt(report.best_pin_block_ms, 3)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::bench::matmul::{products, Product};
    use crate::commands::bench::Stats;

    fn row(kernel: &str, product: Product, ms: Option<f64>, error: Option<&str>) -> MatmulRow {
        let s = |m| Stats {
            mean: m,
            median: m,
            min: m,
            max: m,
        };
        MatmulRow {
            kernel: kernel.into(),
            product,
            ms: ms.map(s),
            tflops: None,
            max_error: None,
            error: error.map(String::from),
        }
    }

    #[test]
    fn the_summary_counts_every_product_and_skips_incomplete_kernels() {
        let p = products(10, 4, 16);
        let kernels = [
            None,
            Some(MatmulKernel::DoubleMma),
            Some(MatmulKernel::TmaMma),
        ];
        let mut rows = vec![];
        for q in &p {
            rows.push(row("burn", q.clone(), Some(1.0), None));
            rows.push(row("double-mma", q.clone(), Some(0.5), None));
            let refused = q.name == "ffn up g·w";
            rows.push(row(
                "tma-mma",
                q.clone(),
                Some(0.1),
                refused.then_some("refused"),
            ));
        }
        let s = summarize(&kernels, &rows);
        let names: Vec<_> = s.iter().map(|s| s.kernel.as_str()).collect();
        assert_eq!(names, ["double-mma", "burn", "tma-mma"]);
        // 3 attention layouts × 6 + 6 FFN products × 1.
        assert_eq!(s[1].block_ms, Some(24.0));
        assert_eq!(s[0].block_ms, Some(12.0));
        assert_eq!(s[0].vs_burn, Some(0.5));
        assert_eq!(
            s[2].block_ms, None,
            "a kernel that skipped a product has no total"
        );
        // Per layout, `tma-mma` wins the two layouts it ran completely; the input gradient
        // (whose FFN product it refused) goes to `double-mma`.
        let (pin, ms) = best_per_layout(&kernels, &rows);
        assert_eq!(
            pin.to_string(),
            "forward=tma-mma,input-grad=double-mma,weight-grad=tma-mma"
        );
        // Each layout: 6 attention products and 2 FFN products.
        let ms = ms.expect("every layout ran on some kernel");
        assert!(
            (ms - (8.0 * 0.1 + 8.0 * 0.5 + 8.0 * 0.1)).abs() < 1e-9,
            "{ms}"
        );
    }
}
