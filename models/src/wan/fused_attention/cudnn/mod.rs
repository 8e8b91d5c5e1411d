//! Attention on NVIDIA's cuDNN (the `cuda` default; `REEL_FLASH=reel` opts out): the fused
//! flash-attention engines PyTorch's `scaled_dot_product_attention` runs on Hopper, through
//! cuDNN's graph API.
//!
//! With `attention = "flash"`, the bf16/f16 forwards (tracked or not) and backwards run here
//! unless `REEL_FLASH=reel`. The default since the H200 run of 2026-11-30
//! (`bench/results/2026-11-30-NVIDIA-H200-late.md`): the attention alone at Wan's 8190 tokens
//! took 0.96 ms forward and 2.94 ms forward + backward on cuDNN against 2.26 and 8.84 ms on
//! Reel's tiled kernels, and the 29120-token training step 0.93× PyTorch's. cuDNN's backward
//! sums `dQ` with float32 atomics, so two GPU runs may differ in the last bits (PyTorch's
//! default too); Reel's kernels make `dQ` in a pass of their own, and `REEL_FLASH=reel` gives
//! runs that repeat bit for bit. cuDNN's saved statistics are Reel's log-sum-exp (both
//! `max + ln Σ exp` of the scaled scores, float32, `[B, H, Sq]`), so a forward on one and a
//! backward on the other agree. Where cuDNN cannot run a call (no `libcudnn`, another dtype,
//! a head dim cuDNN does not take, no engine), one line on stderr says why and Reel's tiled
//! kernels ([`super::tiled`]) run it.
//!
//! The VAE's convolutions may run here too (`REEL_VAE_CONV=cudnn`, [`conv3d`]).
//!
//! The graphs follow the pattern cuDNN's frontend builds for attention (`sdpa_graph.rs`); cuDNN's
//! heuristics pick the fused engine, and plans are made once per shape and layout, per thread
//! and device (`run.rs`). Ordering with CubeCL's kernels as for cuBLAS
//! (`block_kernels/cublas.rs`): on CubeCL's own stream where CUPTI finds it, else host syncs
//! around the call. `REEL_FLASH=cudnn-queued` makes the attention's calls from CubeCL's server
//! thread, queued there after the kernels before them (`queued.rs`), as `cublas-queued` does
//! for the products.

mod conv;
mod graph;
mod ops;
mod queued;
mod run;
mod sdpa;
mod sdpa_graph;

use std::cell::Cell;
use std::sync::{Mutex, OnceLock};

pub use conv::{conv3d, conv3d_on};
pub use queued::queued_runs;

use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::cuda::CudaRuntime;
use cudarc::cudnn::sys as dnn;

/// The environment variable that picks the `flash` kernels' library ([`Flash`]): `cudnn` (the
/// default), `cudnn-queued`, or `reel` (Reel's tiled kernels, which repeat bit for bit).
pub const FLASH_ENV: &str = "REEL_FLASH";

/// Which library runs the `flash` attention's bf16/f16 calls on `cuda` ([`FLASH_ENV`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flash {
    /// Reel's tiled kernels (`reel`).
    Reel,
    /// cuDNN, called from the training thread (`cudnn`, the default): it waits for CubeCL's
    /// server thread to hand over each buffer's address.
    Cudnn,
    /// cuDNN, called from CubeCL's server thread as a task queued after the kernels before it
    /// (`cudnn-queued`; `run.rs`): the training thread does not wait.
    CudnnQueued,
}

impl Flash {
    /// The [`FLASH_ENV`] value that names it.
    pub fn name(self) -> &'static str {
        match self {
            Flash::Reel => "reel",
            Flash::Cudnn => "cudnn",
            Flash::CudnnQueued => "cudnn-queued",
        }
    }
}

/// Why cuDNN did not run an attention call.
#[derive(Debug, thiserror::Error)]
pub enum CudnnError {
    /// `libcudnn` did not load.
    #[error(
        "libcudnn was not found (put the CUDA toolkit's lib64, or the nvidia-cudnn wheel's lib, \
         on LD_LIBRARY_PATH)"
    )]
    Missing,
    /// The `libcudnn` found is older than cuDNN 9 (its version number, e.g. 8906 for 8.9.6).
    #[error("the libcudnn found is version {0}; Reel's attention graphs need cuDNN 9")]
    Version(usize),
    /// The inputs are outside what the graph takes.
    #[error("{0}")]
    Unsupported(String),
    /// A cuDNN or CUDA call failed.
    #[error("{0}")]
    Call(String),
    /// No engine of cuDNN's heuristics runs the graph (each one's reason).
    #[error("no cuDNN engine runs the graph: {0}")]
    NoEngine(String),
}

thread_local! {
    /// This thread's override of [`FLASH_ENV`] (the tests' choice).
    static CHOSEN: Cell<Option<Flash>> = const { Cell::new(None) };
    /// Forwards cuDNN ran on this thread.
    static RUNS: Cell<usize> = const { Cell::new(0) };
    /// Backwards cuDNN ran on this thread.
    static BACKWARD_RUNS: Cell<usize> = const { Cell::new(0) };
}

/// The library of the `flash` attention: this thread's [`choose`], else [`FLASH_ENV`] (read
/// once; unset is `cudnn`; another value is named on stderr and means `cudnn`).
pub fn flash() -> Flash {
    static ENV: OnceLock<Flash> = OnceLock::new();
    CHOSEN.with(Cell::get).unwrap_or_else(|| {
        *ENV.get_or_init(|| {
            let all = [Flash::Cudnn, Flash::CudnnQueued, Flash::Reel];
            let flash = match std::env::var(FLASH_ENV) {
                Err(_) => Flash::Cudnn,
                Ok(value) => all
                    .into_iter()
                    .find(|f| f.name() == value)
                    .unwrap_or_else(|| {
                        eprintln!(
                        "reel: {FLASH_ENV}={value:?} is none of \"cudnn\", \"cudnn-queued\" and \
                         \"reel\"; using cudnn"
                    );
                        Flash::Cudnn
                    }),
            };
            // Under Burn's fusion layer the attention runs inside the fusion thread's tasks,
            // whose panics CubeCL catches: a queued call's failure could not stop the run.
            if cfg!(feature = "fusion") && flash == Flash::CudnnQueued {
                eprintln!(
                    "reel: {FLASH_ENV}=cudnn-queued is not available with Burn's fusion layer; \
                     using cudnn"
                );
                return Flash::Cudnn;
            }
            flash
        })
    })
}

/// Whether the `flash` attention runs on cuDNN ([`flash`] is not [`Flash::Reel`]).
pub fn chosen() -> bool {
    flash() != Flash::Reel
}

/// Sets this thread's choice (`None`: back to [`FLASH_ENV`]).
pub fn choose(flash: Option<Flash>) {
    CHOSEN.with(|c| c.set(flash));
}

/// How many forwards and backwards cuDNN has run on this thread.
pub fn runs() -> (usize, usize) {
    (RUNS.with(Cell::get), BACKWARD_RUNS.with(Cell::get))
}

/// Whether cuDNN is [`chosen`] for inputs of `dtype`: its graphs take bf16 and f16 only, so
/// float32 calls (cubek's or the fused kernels' forwards) go elsewhere without a note.
fn chosen_for(dtype: burn::tensor::DType) -> bool {
    use burn::tensor::DType::{BF16, F16};
    matches!(dtype, BF16 | F16) && chosen()
}

/// [`forward`] when cuDNN is [`chosen`], `R` is CUDA and the inputs are bf16 or f16: `None`
/// when not, or when cuDNN could not run the call (each distinct reason is named once on
/// stderr).
pub(super) fn forward_if_chosen<R: CubeRuntime>(
    q: &CubeTensor<R>,
    k: &CubeTensor<R>,
    v: &CubeTensor<R>,
) -> Option<(CubeTensor<R>, CubeTensor<R>)> {
    if !chosen_for(q.dtype) {
        return None;
    }
    let [q, k, v] = [q, k, v].map(|t| as_cuda(t.clone()));
    let (o, lse) = noted(forward(q?, k?, v?))?;
    Some((from_cuda(o), from_cuda(lse)))
}

/// [`backward`] when cuDNN is [`chosen`] and `R` is CUDA, as [`forward_if_chosen`].
pub(super) fn backward_if_chosen<R: CubeRuntime>(
    qkv: [&CubeTensor<R>; 3],
    o: &CubeTensor<R>,
    lse: &CubeTensor<R>,
    d_out: &CubeTensor<R>,
) -> Option<(CubeTensor<R>, CubeTensor<R>, CubeTensor<R>)> {
    if !chosen_for(qkv[0].dtype) {
        return None;
    }
    let [q, k, v] = qkv.map(|t| as_cuda(t.clone()));
    let [o, lse, d_out] = [o, lse, d_out].map(|t| as_cuda(t.clone()));
    let [dq, dk, dv] = noted(backward([q?, k?, v?], o?, lse?, d_out?))?;
    Some((from_cuda(dq), from_cuda(dk), from_cuda(dv)))
}

/// `result`'s value, or `None` after naming its error on stderr (each distinct one once: a run
/// can hold calls cuDNN takes and calls it refuses).
fn noted<T>(result: Result<T, CudnnError>) -> Option<T> {
    static NOTED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    result
        .map_err(|e| {
            let why = e.to_string();
            let mut noted = NOTED.lock().unwrap_or_else(|e| e.into_inner());
            if !noted.contains(&why) {
                eprintln!(
                    "reel: flash attention on cuDNN: {why}; Reel's attention kernels run instead \
                     ({FLASH_ENV}=reel chooses them from the start)"
                );
                noted.push(why);
            }
        })
        .ok()
}

/// `t` as a CUDA tensor when `R` is CUDA.
fn as_cuda<R: CubeRuntime>(t: CubeTensor<R>) -> Option<CubeTensor<CudaRuntime>> {
    let any: Box<dyn std::any::Any> = Box::new(t);
    any.downcast::<CubeTensor<CudaRuntime>>().ok().map(|t| *t)
}

/// Back from [`as_cuda`] (`R` is CUDA there).
fn from_cuda<R: CubeRuntime>(t: CubeTensor<CudaRuntime>) -> CubeTensor<R> {
    let any: Box<dyn std::any::Any> = Box::new(t);
    *any.downcast::<CubeTensor<R>>()
        .unwrap_or_else(|_| panic!("from_cuda: {} is not CUDA", std::any::type_name::<R>()))
}

/// `(o [B, H, Sq, Dv], lse [B, H, Sq] float32)` of `q [B, H, Sq, D]`, `k [B, H, Sk, D]`,
/// `v [B, H, Sk, Dv]` (bf16 or f16, any strides with a contiguous head dim) on cuDNN; `o` is
/// laid out as `q` is.
pub fn forward(
    q: CubeTensor<CudaRuntime>,
    k: CubeTensor<CudaRuntime>,
    v: CubeTensor<CudaRuntime>,
) -> Result<(CubeTensor<CudaRuntime>, CubeTensor<CudaRuntime>), CudnnError> {
    let result = sdpa::forward(q, k, v, present()?)?;
    RUNS.with(|r| r.set(r.get() + 1));
    Ok(result)
}

/// `[dq, dk, dv]`, laid out like `q, k, v`, from the forward's `o` and `lse` and the output
/// gradient `d_out [B, H, Sq, Dv]` (cast to the inputs' dtype when it is not), on cuDNN.
pub fn backward(
    qkv: [CubeTensor<CudaRuntime>; 3],
    o: CubeTensor<CudaRuntime>,
    lse: CubeTensor<CudaRuntime>,
    d_out: CubeTensor<CudaRuntime>,
) -> Result<[CubeTensor<CudaRuntime>; 3], CudnnError> {
    let version = present()?;
    let grads = sdpa::backward(qkv, o, lse, d_out, version)?;
    BACKWARD_RUNS.with(|r| r.set(r.get() + 1));
    Ok(grads)
}

/// cuDNN's version (e.g. 92800 for 9.28.0) when `libcudnn` loads and is cuDNN 9 or later
/// (looked for once).
pub(super) fn present() -> Result<usize, CudnnError> {
    static VERSION: OnceLock<Option<usize>> = OnceLock::new();
    // SAFETY: loading the library runs its initialisers (cuDNN's own); `cudnnGetVersion`
    // exists in every cuDNN.
    let version =
        VERSION.get_or_init(|| unsafe { dnn::is_culib_present().then(|| dnn::cudnnGetVersion()) });
    match *version {
        None => Err(CudnnError::Missing),
        Some(v) if v < 90000 => Err(CudnnError::Version(v)),
        Some(v) => Ok(v),
    }
}

/// `Unsupported` with the reason when cuDNN `version` (e.g. 91500 for 9.15.0) cannot run a
/// call that cuDNN's C++ frontend refuses for that version (the changes it makes instead, these
/// graphs make too: [`padding`]). `backward`: for a backward, whether its `dO` is laid out as
/// its `o`.
///
/// - 9.10.0 and 9.10.1: the frontend refuses attention on them (known bugs).
/// - before 9.5.1: the backward assumes `dO` has `o`'s strides (PyTorch copies it so).
pub(super) fn check_version(version: usize, backward: Option<bool>) -> Result<(), CudnnError> {
    let refuse = |why: String| Err(CudnnError::Unsupported(why));
    let dotted = format!(
        "{}.{}.{}",
        version / 10_000,
        version / 100 % 100,
        version % 100
    );
    if (91_000..91_002).contains(&version) {
        return refuse(format!(
            "cuDNN {dotted} has known attention bugs (cuDNN's frontend refuses 9.10.0 and 9.10.1)"
        ));
    }
    if version < 90_501 && backward == Some(false) {
        return refuse(format!(
            "cuDNN {dotted} (before 9.5.1) reads dO as laid out like o, and this dO is not"
        ));
    }
    Ok(())
}

/// The padding mask a backward graph carries on cuDNN `version` for `keys` keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Padding {
    /// None.
    None,
    /// The scores outside the sequence lengths (here the full lengths, passed as int32
    /// tensors) set to −∞ before the softmax, and the products sized by those lengths: what
    /// cuDNN's frontend adds to a backward of a key count off the 128 grid on cuDNN 9.15.0 and
    /// older (the fused backward reads past the keys without it).
    Mask,
    /// [`Padding::Mask`] with the lowest float instead of −∞, applied again after the
    /// statistics are subtracted: the frontend's form of the mask before cuDNN 9.10.
    MaskTwice,
}

/// The [`Padding`] of a backward of `keys` keys on cuDNN `version`.
pub(super) fn padding(version: usize, keys: usize) -> Padding {
    if version > 91_500 || keys.is_multiple_of(128) {
        Padding::None
    } else if version < 91_000 {
        Padding::MaskTwice
    } else {
        Padding::Mask
    }
}

#[cfg(test)]
mod tests {
    use super::{check_version, padding, Padding};

    /// The reason `check_version` gives, or `None` when it accepts.
    fn version_refuses(version: usize, backward: Option<bool>) -> Option<String> {
        check_version(version, backward)
            .err()
            .map(|e| e.to_string())
    }

    #[test]
    fn cuda_cudnn_versions_the_frontend_refuses_are_refused() {
        // 9.10.0 and 9.10.1, forward and backward.
        for v in [91_000, 91_001] {
            assert!(
                version_refuses(v, None).is_some_and(|w| w.contains("9.10.")),
                "{v}"
            );
            assert!(version_refuses(v, Some(true)).is_some(), "{v}");
        }
        assert_eq!(version_refuses(91_002, None), None);
        assert_eq!(version_refuses(91_400, Some(true)), None);
        // dO laid out unlike o: refused before 9.5.1 only.
        let why = version_refuses(90_500, Some(false)).expect("9.5.0, dO unlike o");
        assert!(why.contains("9.5.0"), "{why}");
        assert_eq!(version_refuses(90_500, Some(true)), None);
        assert_eq!(version_refuses(90_500, None), None);
        assert_eq!(version_refuses(90_501, Some(false)), None);
    }

    #[test]
    fn cuda_cudnn_backwards_off_the_128_grid_get_a_padding_mask_up_to_9_15_0() {
        for keys in [8190, 150, 1] {
            assert_eq!(padding(91_500, keys), Padding::Mask, "{keys}");
            assert_eq!(padding(91_400, keys), Padding::Mask, "{keys}");
            assert_eq!(padding(91_002, keys), Padding::Mask, "{keys}");
            assert_eq!(padding(90_900, keys), Padding::MaskTwice, "{keys}");
            assert_eq!(padding(90_000, keys), Padding::MaskTwice, "{keys}");
            assert_eq!(padding(91_501, keys), Padding::None, "{keys}");
            assert_eq!(padding(92_800, keys), Padding::None, "{keys}");
        }
        for keys in [8192, 128] {
            assert_eq!(padding(91_400, keys), Padding::None, "{keys}");
            assert_eq!(padding(90_000, keys), Padding::None, "{keys}");
        }
    }
}
