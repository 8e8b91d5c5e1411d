//! Which kernel runs each of a linear layer's three products: the value of `REEL_MATMUL`.
//!
//! A linear layer's forward `x · wᵀ`, its input's gradient `g · w` and its weight's gradient
//! `gᵀ · x` are products of different layouts (which operand is transposed) and, for the
//! weight's gradient, of a different reduction length (all tokens). One kernel need not be the
//! fastest on all three, so a pin names one kernel for all of them (`double-mma`) or one per
//! layout (`forward=double-mma,input-grad=simple-cmma,weight-grad=burn`; a layout left out
//! stays on Burn's matmul). `reel bench --matmul-only` prints both: the best single kernel and
//! the best per layout.

use std::fmt;

use burn::tensor::backend::Backend;

use super::matmul::{MatmulKernel, UnknownKernel, BURN_MATMUL, MATMUL_ENV};

/// One of a linear layer's three products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// The forward `x · wᵀ`.
    Forward,
    /// The input's gradient `g · w`.
    InputGrad,
    /// The weight's gradient `gᵀ · x`.
    WeightGrad,
}

/// The layouts with their names in a pin, in the order of training.
pub const LAYOUTS: [(Layout, &str); 3] = [
    (Layout::Forward, "forward"),
    (Layout::InputGrad, "input-grad"),
    (Layout::WeightGrad, "weight-grad"),
];

impl Layout {
    /// The layout's name in a pin.
    pub fn name(self) -> &'static str {
        LAYOUTS
            .iter()
            .find(|(l, _)| *l == self)
            .map(|(_, n)| *n)
            .unwrap_or_else(|| panic!("{self:?} is missing from LAYOUTS"))
    }
}

/// The kernels pinned for the three products (`None`: Burn's matmul).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MatmulPin {
    /// The forward's kernel.
    pub forward: Option<MatmulKernel>,
    /// The input gradient's kernel.
    pub input_grad: Option<MatmulKernel>,
    /// The weight gradient's kernel.
    pub weight_grad: Option<MatmulKernel>,
}

/// A pin that [`MatmulPin::parse`] does not take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PinError {
    /// A kernel name it does not know.
    #[error(transparent)]
    Kernel(#[from] UnknownKernel),
    /// `layout=` with a layout it does not know.
    #[error("unknown layout `{0}`: expected forward, input-grad or weight-grad")]
    Layout(String),
    /// A layout named twice.
    #[error("layout `{0}` is pinned twice")]
    Repeated(String),
}

impl MatmulPin {
    /// `kernel` for all three products.
    pub fn all(kernel: Option<MatmulKernel>) -> Self {
        Self {
            forward: kernel,
            input_grad: kernel,
            weight_grad: kernel,
        }
    }

    /// The kernel of `layout`'s products.
    pub fn get(&self, layout: Layout) -> Option<MatmulKernel> {
        match layout {
            Layout::Forward => self.forward,
            Layout::InputGrad => self.input_grad,
            Layout::WeightGrad => self.weight_grad,
        }
    }

    /// Whether any product leaves Burn's matmul.
    pub fn any(&self) -> bool {
        LAYOUTS.iter().any(|(l, _)| self.get(*l).is_some())
    }

    /// `NAME` (one kernel for all) or `layout=NAME,...` (the layouts not named: Burn's).
    pub fn parse(text: &str) -> Result<Self, PinError> {
        let text = text.trim();
        if !text.contains('=') {
            return Ok(Self::all(MatmulKernel::parse(text)?));
        }
        let mut pin = Self::default();
        let mut seen = vec![];
        for part in text.split(',') {
            let (layout, name) = part.split_once('=').unwrap_or((part, ""));
            let layout = layout.trim();
            let Some((l, _)) = LAYOUTS.iter().find(|(_, n)| *n == layout) else {
                return Err(PinError::Layout(layout.to_string()));
            };
            if seen.contains(l) {
                return Err(PinError::Repeated(layout.to_string()));
            }
            seen.push(*l);
            let kernel = MatmulKernel::parse(name)?;
            match l {
                Layout::Forward => pin.forward = kernel,
                Layout::InputGrad => pin.input_grad = kernel,
                Layout::WeightGrad => pin.weight_grad = kernel,
            }
        }
        Ok(pin)
    }
}

impl fmt::Display for MatmulPin {
    /// The form [`MatmulPin::parse`] reads: one name when the three agree.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |k: Option<MatmulKernel>| k.map_or(BURN_MATMUL, MatmulKernel::name);
        if self.forward == self.input_grad && self.input_grad == self.weight_grad {
            return f.write_str(name(self.forward));
        }
        let parts: Vec<String> = LAYOUTS
            .iter()
            .map(|(l, n)| format!("{n}={}", name(self.get(*l))))
            .collect();
        f.write_str(&parts.join(","))
    }
}

/// The pin of the linear layers' products on backend `B`: the one [`MATMUL_ENV`] sets (read
/// once; Burn's matmul everywhere when it is `burn` or not understood, with one line on
/// stderr), else [`default_pin`].
pub fn pin<B: Backend>() -> MatmulPin {
    use std::sync::OnceLock;
    static PIN: OnceLock<Option<MatmulPin>> = OnceLock::new();
    let set = PIN.get_or_init(|| {
        let v = std::env::var(MATMUL_ENV).ok()?;
        Some(MatmulPin::parse(&v).unwrap_or_else(|e| {
            eprintln!("reel: {MATMUL_ENV}: {e}; using Burn's matmul");
            MatmulPin::default()
        }))
    });
    set.unwrap_or_else(default_pin::<B>)
}

/// The pin when [`MATMUL_ENV`] is unset: cuBLAS on CubeCL's own stream (`cublas-stream`: no
/// host syncs; host syncs where CUPTI does not find the stream) for every product on the plain
/// `cuda` backend (with or without autodiff) where `libcublas` loads, Burn's matmul elsewhere.
///
/// Chosen by measurement. H100, 2026-11-27
/// (`bench/results/2026-11-27-NVIDIA-H100-80GB-HBM3-session2.md`): the products of one
/// Wan2.1-1.3B block at 8190 tokens took 4.8 ms on cuBLAS against 34.6 ms on Burn's matmul and
/// 10.7 ms on the fastest cubek kernel (`reel bench --matmul-only`), and a checkpointed bf16
/// training step 1626 ms against 2072 ms. H200, 2026-11-30
/// (`bench/results/2026-11-30-NVIDIA-H200.md`): the same step took 678 ms with `cublas-stream`,
/// 1045 ms with `cublas-async` and 1273 ms with `cublas` (host syncs), PyTorch 519 ms; a
/// block's products 2.9, 3.8 and 5.1 ms; `cuda_cublas_runs_every_problem` passed there for
/// all three orderings.
#[cfg_attr(not(feature = "cuda"), allow(clippy::extra_unused_type_parameters))]
pub fn default_pin<B: Backend>() -> MatmulPin {
    #[cfg(feature = "cuda")]
    if super::cublas::default_on::<B>() {
        return MatmulPin::all(Some(MatmulKernel::CublasStream));
    }
    MatmulPin::default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_name_pins_every_layout_and_prints_back() {
        let pin = MatmulPin::parse(" double-mma ").unwrap();
        assert_eq!(pin, MatmulPin::all(Some(MatmulKernel::DoubleMma)));
        assert_eq!(pin.to_string(), "double-mma");
        assert!(pin.any());
        let burn = MatmulPin::parse("burn").unwrap();
        assert_eq!((burn, burn.any()), (MatmulPin::default(), false));
        assert_eq!(burn.to_string(), "burn");
    }

    #[test]
    fn layouts_pin_their_own_kernels_and_the_rest_stay_on_burn() {
        let pin = MatmulPin::parse("weight-grad=simple-cmma, forward=tma-mma").unwrap();
        assert_eq!(pin.get(Layout::Forward), Some(MatmulKernel::TmaMma));
        assert_eq!(pin.get(Layout::InputGrad), None);
        assert_eq!(pin.get(Layout::WeightGrad), Some(MatmulKernel::SimpleCmma));
        let text = pin.to_string();
        assert_eq!(
            text,
            "forward=tma-mma,input-grad=burn,weight-grad=simple-cmma"
        );
        assert_eq!(MatmulPin::parse(&text), Ok(pin));
        for (l, name) in LAYOUTS {
            assert_eq!(l.name(), name);
        }
    }

    #[test]
    fn off_cuda_the_default_is_burns_matmul() {
        type Cpu = burn::backend::NdArray;
        assert_eq!(default_pin::<Cpu>(), MatmulPin::default());
        assert_eq!(
            default_pin::<burn::backend::Autodiff<Cpu>>(),
            MatmulPin::default()
        );
        #[cfg(feature = "wgpu")]
        assert_eq!(default_pin::<burn::backend::Wgpu>(), MatmulPin::default());
    }

    #[test]
    fn bad_pins_say_what_is_wrong() {
        let err = |t: &str| MatmulPin::parse(t).unwrap_err().to_string();
        assert!(err("forward=fastest").contains("`fastest`"));
        assert!(err("backward=double-mma").contains("unknown layout `backward`"));
        assert!(err("forward=double-mma,forward=burn").contains("pinned twice"));
        assert!(err("forward").contains("unknown matmul kernel `forward`"));
        assert!(err("input-grad=").contains("unknown matmul kernel ``"));
    }
}
