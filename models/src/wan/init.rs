//! Deterministic, lazy parameter initialization from a seed (no global RNG).
//!
//! Every parameter draws from its own generator, seeded from the model seed and the
//! parameter's dotted path, so values do not depend on construction order and a parameter
//! that is overwritten by pretrained weights is never generated at all (parameters are
//! created with [`Param::uninitialized`]).

use burn::module::{Param, ParamId};
use burn::tensor::{backend::Backend, Shape, Tensor, TensorData};
use rayon::prelude::*;

/// What SplitMix64 adds to its state for each output.
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64: a tiny, fast, well-mixed 64-bit generator.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in the open interval (0, 1).
    pub fn next_open01(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// This generator advanced by `k` outputs, in O(1) (each output adds the same increment
    /// to the state).
    pub fn skip(&mut self, k: u64) {
        self.state = self.state.wrapping_add(GAMMA.wrapping_mul(k));
    }

    /// Two standard normal samples from the next two outputs (Box–Muller).
    pub fn normal_pair(&mut self) -> [f64; 2] {
        let u1 = self.next_open01();
        let u2 = self.next_open01();
        let r = (-2.0 * u1.ln()).sqrt();
        let th = 2.0 * std::f64::consts::PI * u2;
        [r * th.cos(), r * th.sin()]
    }

    /// `n` standard normal samples (Box–Muller).
    pub fn normals(&mut self, n: usize) -> Vec<f64> {
        let mut out = Vec::with_capacity(n + 1);
        while out.len() < n {
            out.extend(self.normal_pair());
        }
        out.truncate(n);
        out
    }
}

/// Values per chunk of a parameter's random draw (even: a chunk starts on a Box–Muller pair).
const CHUNK: usize = 1 << 20;

/// `rng.normals(n)` times `std`, as float32, drawn in chunks of `chunk` (even) values in
/// parallel (rayon): the same values in the same order, since each chunk starts its own copy
/// of `rng` where the sequential draw would be (a pair takes two outputs). Random weights of
/// a billion-parameter model take seconds on a many-core host instead of minutes.
fn scaled_normals(rng: SplitMix64, n: usize, std: f64, chunk: usize) -> Vec<f32> {
    assert!(
        chunk > 0 && chunk.is_multiple_of(2),
        "chunks must hold whole pairs, not {chunk} values"
    );
    let mut out = vec![0.0f32; n];
    out.par_chunks_mut(chunk).enumerate().for_each(|(i, part)| {
        let mut rng = rng.clone();
        rng.skip((i * chunk) as u64);
        for pair in part.chunks_mut(2) {
            for (o, v) in pair.iter_mut().zip(rng.normal_pair()) {
                *o = (v * std) as f32;
            }
        }
    });
    out
}

/// FNV-1a hash of a string, used to give each parameter path its own stream.
fn fnv1a(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// How a parameter is initialized.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InitKind {
    /// `N(0, std^2)`.
    Normal {
        /// Standard deviation.
        std: f64,
    },
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
}

/// Creates lazily initialized parameters whose values depend only on `(seed, path)`.
#[derive(Debug, Clone)]
pub struct ParamInit<B: Backend> {
    seed: u64,
    device: B::Device,
}

impl<B: Backend> ParamInit<B> {
    /// An initializer for parameters on `device`.
    pub fn new(seed: u64, device: &B::Device) -> Self {
        Self {
            seed,
            device: device.clone(),
        }
    }

    /// The device parameters are created on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// The host values the parameter at `path` gets (used by the lazy initializer).
    pub fn values(seed: u64, path: &str, n: usize, kind: InitKind) -> Vec<f32> {
        match kind {
            InitKind::Zeros => vec![0.0; n],
            InitKind::Ones => vec![1.0; n],
            InitKind::Normal { std } => {
                let mut rng = SplitMix64::new(seed ^ fnv1a(path).rotate_left(17));
                // Discard one output so that nearby seeds decorrelate.
                rng.next_u64();
                scaled_normals(rng, n, std, CHUNK)
            }
        }
    }

    /// A parameter of `shape` at dotted `path`, initialized on first use.
    pub fn param<const D: usize>(
        &self,
        path: &str,
        shape: [usize; D],
        kind: InitKind,
    ) -> Param<Tensor<B, D>> {
        let seed = self.seed;
        let path = path.to_string();
        Param::uninitialized(
            ParamId::new(),
            move |device, require_grad| {
                let n = shape.iter().product();
                let data = TensorData::new(Self::values(seed, &path, n, kind), shape);
                Tensor::<B, D>::from_data(data, device).set_require_grad(require_grad)
            },
            self.device.clone(),
            true,
            Shape::new(shape),
        )
    }

    /// A weight with `N(0, 1) / sqrt(fan_in)` entries, `fan_in` = product of all but the
    /// first dimension (PyTorch's convention for Linear and Conv weights).
    pub fn weight<const D: usize>(&self, path: &str, shape: [usize; D]) -> Param<Tensor<B, D>> {
        let fan_in: usize = shape[1..].iter().product::<usize>().max(1);
        self.param(
            path,
            shape,
            InitKind::Normal {
                std: 1.0 / (fan_in as f64).sqrt(),
            },
        )
    }

    /// A zero-initialized parameter (biases).
    pub fn zeros<const D: usize>(&self, path: &str, shape: [usize; D]) -> Param<Tensor<B, D>> {
        self.param(path, shape, InitKind::Zeros)
    }

    /// A one-initialized parameter (norm scales).
    pub fn ones<const D: usize>(&self, path: &str, shape: [usize; D]) -> Param<Tensor<B, D>> {
        self.param(path, shape, InitKind::Ones)
    }
}

/// Join a parent path and a child name with a dot.
pub fn join(parent: &str, child: &str) -> String {
    if parent.is_empty() {
        child.to_string()
    } else {
        format!("{parent}.{child}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normals_have_unit_moments_and_depend_on_seed_and_path() {
        let v =
            ParamInit::<burn::backend::Flex>::values(7, "a", 20000, InitKind::Normal { std: 1.0 });
        let mean = v.iter().map(|x| *x as f64).sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (*x as f64 - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.03, "{mean}");
        assert!((var - 1.0).abs() < 0.05, "{var}");
        let again =
            ParamInit::<burn::backend::Flex>::values(7, "a", 5, InitKind::Normal { std: 1.0 });
        assert_eq!(&v[..5], &again[..]);
        let other =
            ParamInit::<burn::backend::Flex>::values(7, "b", 5, InitKind::Normal { std: 1.0 });
        assert_ne!(&v[..5], &other[..]);
        let seed8 =
            ParamInit::<burn::backend::Flex>::values(8, "a", 5, InitKind::Normal { std: 1.0 });
        assert_ne!(&v[..5], &seed8[..]);
    }

    #[test]
    fn normals_in_chunks_are_the_sequential_draw() {
        let mut base = SplitMix64::new(42);
        base.next_u64();
        // Lengths around the chunking: one value, odd and even lengths, one chunk, many.
        for (n, chunk) in [
            (1, 4),
            (7, 4),
            (1000, 2000),
            (1000, 6),
            (1001, 8),
            (4099, 256),
        ] {
            let want: Vec<f32> = base
                .clone()
                .normals(n)
                .into_iter()
                .map(|v| (v * 0.5) as f32)
                .collect();
            let got = scaled_normals(base.clone(), n, 0.5, chunk);
            assert_eq!(got, want, "{n} in chunks of {chunk}");
        }
        let mut skipped = base.clone();
        skipped.skip(3);
        let mut stepped = base;
        (0..3).for_each(|_| {
            stepped.next_u64();
        });
        assert_eq!(skipped.next_u64(), stepped.next_u64());
    }
}
