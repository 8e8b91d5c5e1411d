//! The calls that run cuDNN's flash-attention graphs ([`super::sdpa_graph`]) on CubeCL
//! tensors: what a plan depends on ([`Key`]), the buffers each call allocates and the tensors
//! it binds to the graphs' uids.
//!
//! Shapes: `q [B, H, Sq, D]`, `k [B, H, Sk, D]`, `v [B, H, Sk, Dv]`, `o`, `dO [B, H, Sq, Dv]`,
//! statistics `[B, H, Sq, 1]` float32 (Reel's log-sum-exp `[B, H, Sq]`).

use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::{empty_device_contiguous_dtype, zeros_client};
use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::CudaRuntime;
use cudarc::cudnn::sys as dnn;

use super::run::{self, Call, PlanKey};
use super::sdpa_graph::{backward_ops, forward_ops, uid::*};
use super::{CudnnError, Padding};
use crate::wan::fused_attention::{as_dtype, empty_in_layout_of};

/// What a plan depends on: the dtype, and the dims and strides of `q, k, v` (in that order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Key {
    pub(super) dtype: DType,
    pub(super) dims: [[i64; 4]; 3],
    pub(super) strides: [[i64; 4]; 3],
    /// The forward's output, or the backward's `o, dO, dq, dk, dv`: their strides.
    pub(super) more: [[i64; 4]; 5],
    /// The float32 buffers' strides as `[B, H, Sq, ·]`: the statistics, and (backward) the
    /// row sums and dq's sums, read from each buffer. cuDNN's own are packed
    /// ([`packed_rows`]), and so are the statistics of Reel's forwards (CubeCL would pad
    /// the rows: on CUDA a `[B, H, 200]` buffer would have strides `[H·256, 256, 1]`); the
    /// graphs still declare whatever strides a buffer has.
    pub(super) buffers: [[i64; 4]; 3],
    /// The backward's padding mask ([`super::padding`]).
    pub(super) padding: Padding,
}

impl Key {
    /// The key of `q, k, v` (the other strides zero), or why the graphs do not take them.
    pub(super) fn of(qkv: [&CubeTensor<CudaRuntime>; 3]) -> Result<Self, CudnnError> {
        let [q, k, v] = qkv;
        let unsupported = |why: String| Err(CudnnError::Unsupported(why));
        if !matches!(q.dtype, DType::BF16 | DType::F16) || k.dtype != q.dtype || v.dtype != q.dtype
        {
            return unsupported(format!(
                "dtypes {:?} {:?} {:?}, not bf16 or f16",
                q.dtype, k.dtype, v.dtype
            ));
        }
        let dims = qkv.map(|t| {
            let s = t.meta.shape();
            [s[0], s[1], s[2], s[3]].map(|d| d as i64)
        });
        let strides = qkv.map(strides);
        let (d, dv) = (dims[0][3], dims[2][3]);
        if d % 8 != 0 || dv % 8 != 0 || d > 256 || dv > 256 {
            return unsupported(format!(
                "head dims {d} and {dv} (cuDNN takes multiples of 8 up to 256)"
            ));
        }
        if strides.iter().any(|s| s[3] != 1) {
            return unsupported(format!(
                "strides {strides:?}: the head dim must be contiguous"
            ));
        }
        Ok(Self {
            dtype: q.dtype,
            dims,
            strides,
            more: [[0; 4]; 5],
            buffers: [[0; 4]; 3],
            padding: Padding::None,
        })
    }

    /// The strides of `rows`, a float32 `[B, H, Sq]` buffer (the statistics or the row sums),
    /// as `[B, H, Sq, 1]`, or why the graphs do not take it.
    pub(super) fn rows_of(
        &self,
        name: &str,
        rows: &CubeTensor<CudaRuntime>,
    ) -> Result<[i64; 4], CudnnError> {
        let [b, h, sq, ..] = self.sizes();
        let dims: Vec<i64> = rows.meta.shape().iter().map(|&d| d as i64).collect();
        let s = rows.meta.strides();
        if rows.dtype != DType::F32 || dims != [b, h, sq] || s[2] != 1 {
            return Err(CudnnError::Unsupported(format!(
                "{name}: {:?} {dims:?} with strides {s:?}, not float32 [{b}, {h}, {sq}] with \
                 contiguous rows",
                rows.dtype
            )));
        }
        Ok([s[0] as i64, s[1] as i64, 1, 1])
    }

    /// The inputs' cuDNN data type.
    pub(super) fn io(&self) -> dnn::cudnnDataType_t {
        match self.dtype {
            DType::F16 => dnn::cudnnDataType_t::CUDNN_DATA_HALF,
            _ => dnn::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        }
    }

    /// `[B, H, Sq, Sk, D, Dv]`.
    pub(super) fn sizes(&self) -> [i64; 6] {
        let [q, k, v] = self.dims;
        [q[0], q[1], q[2], k[2], q[3], v[3]]
    }

    /// The scores' scale, `1/√D`.
    pub(super) fn scale(&self) -> f32 {
        1.0 / (self.dims[0][3] as f32).sqrt()
    }
}

/// `t`'s strides as cuDNN takes them.
pub(super) fn strides(t: &CubeTensor<CudaRuntime>) -> [i64; 4] {
    let s = t.meta.strides();
    [s[0], s[1], s[2], s[3]].map(|x| x as i64)
}

/// `(o [B, H, Sq, Dv], lse [B, H, Sq] float32)` on cuDNN `version`; `o` is laid out as `q`
/// is.
pub(super) fn forward(
    q: CubeTensor<CudaRuntime>,
    k: CubeTensor<CudaRuntime>,
    v: CubeTensor<CudaRuntime>,
    version: usize,
) -> Result<(CubeTensor<CudaRuntime>, CubeTensor<CudaRuntime>), CudnnError> {
    super::check_version(version, None)?;
    let key = Key::of([&q, &k, &v])?;
    let [b, h, sq, _, _, dv] = key.sizes().map(|d| d as usize);
    let out = empty_in_layout_of(&q, [b, h, sq, dv], q.dtype);
    let lse = packed_rows(&q);
    let mut key = key;
    key.more[0] = strides(&out);
    key.buffers[0] = key.rows_of("the statistics", &lse)?;
    run::execute(Call {
        key: PlanKey::Forward(key),
        graph: &|| forward_ops(&key),
        tensors: &[(Q, &q), (K, &k), (V, &v), (O, &out), (STATS, &lse)],
        scalars: &[(SCALE, key.scale())],
    })?;
    Ok((out, lse))
}

/// `(dq, dk, dv)` laid out like `q, k, v`, from the saved `o`, `lse` and the output gradient
/// `d_out` (cast to the inputs' dtype and given a contiguous head dim where it has not), on
/// cuDNN `version` (what it cannot run there is refused: [`super::check_version`]).
pub(super) fn backward(
    [q, k, v]: [CubeTensor<CudaRuntime>; 3],
    o: CubeTensor<CudaRuntime>,
    lse: CubeTensor<CudaRuntime>,
    d_out: CubeTensor<CudaRuntime>,
    version: usize,
) -> Result<[CubeTensor<CudaRuntime>; 3], CudnnError> {
    let key = Key::of([&q, &k, &v])?;
    if o.dtype != key.dtype {
        return Err(CudnnError::Unsupported(format!(
            "o in {:?} beside inputs in {:?}",
            o.dtype, key.dtype
        )));
    }
    let d_out = as_dtype(d_out, key.dtype);
    let d_out = if d_out.meta.strides()[3] == 1 {
        d_out
    } else {
        burn_cubecl::kernel::into_contiguous(d_out)
    };
    super::check_version(version, Some(strides(&d_out) == strides(&o)))?;
    let [b, h, sq, sk, d, _] = key.sizes().map(|x| x as usize);
    let like = |t: &CubeTensor<CudaRuntime>| empty_in_layout_of(t, t.meta.shape().dims(), t.dtype);
    let (dq, dk, dv) = (like(&q), like(&k), like(&v));
    // Float32 buffers the graph needs: the rows' `Σ dO∘O`, and dq's float32 sums, packed
    // as cuDNN's frontend declares them and zeroed whole (cuDNN before 9.6 did not clear
    // them itself, and may clear them as one range after).
    let row_sums = packed_rows(&q);
    let dq_sums = packed_zeros(&q, [b, h, sq, d]);
    let mut key = key;
    key.padding = super::padding(version, sk);
    key.more = [&o, &d_out, &dq, &dk, &dv].map(strides);
    key.buffers = [
        key.rows_of("the statistics", &lse)?,
        key.rows_of("the row sums", &row_sums)?,
        strides(&dq_sums),
    ];
    if key.more.iter().chain(&key.buffers).any(|s| s[3] != 1) {
        return Err(CudnnError::Unsupported(format!(
            "o, dO, dq, dk, dv strides {:?} and float32 buffers' {:?}: the head dim must be \
             contiguous",
            key.more, key.buffers
        )));
    }
    let mut tensors = vec![
        (Q, &q),
        (K, &k),
        (V, &v),
        (O, &o),
        (D_OUT, &d_out),
        (STATS, &lse),
        (DQ, &dq),
        (DK, &dk),
        (DV, &dv),
        (ROW_SUMS, &row_sums),
        (DQ_SUMS, &dq_sums),
    ];
    let mut scalars = vec![(SCALE, key.scale()), (ONE, 1.0)];
    let lengths = match key.padding {
        Padding::None => None,
        _ => Some([lengths(&q, b, sq)?, lengths(&q, b, sk)?]),
    };
    if let Some([seq_q, seq_kv]) = &lengths {
        tensors.extend([(SEQ_Q, seq_q), (SEQ_KV, seq_kv)]);
        scalars.push((FILL, fill(key.padding)));
    }
    run::execute(Call {
        key: PlanKey::Backward(key),
        graph: &|| backward_ops(&key),
        tensors: &tensors,
        scalars: &scalars,
    })?;
    Ok([dq, dk, dv])
}

/// An int32 `[B, 1, 1, 1]` tensor on `like`'s device holding `n` for each of the `b` samples:
/// a padding mask's sequence lengths (the full lengths: the mask only makes cuDNN's fused
/// backward stay within them).
fn lengths(
    like: &CubeTensor<CudaRuntime>,
    b: usize,
    n: usize,
) -> Result<CubeTensor<CudaRuntime>, CudnnError> {
    let n = i32::try_from(n)
        .map_err(|_| CudnnError::Unsupported(format!("{n} tokens (more than int32 counts)")))?;
    let bytes: Vec<u8> = (0..b).flat_map(|_| n.to_ne_bytes()).collect();
    let handle = like.client.create_from_slice(&bytes);
    let shape = Shape::new([b, 1, 1, 1]);
    Ok(CubeTensor::new_contiguous(
        like.client.clone(),
        like.device.clone(),
        shape,
        handle,
        DType::I32,
    ))
}

/// The value masked scores take: −∞, or the lowest float where cuDNN's frontend uses it
/// (before 9.10, [`Padding::MaskTwice`]).
fn fill(padding: Padding) -> f32 {
    match padding {
        Padding::MaskTwice => f32::MIN,
        _ => f32::NEG_INFINITY,
    }
}

/// A float32 buffer of `shape` on `like`'s device, packed (no row padding: CubeCL pads the
/// rows of a 4-D allocation, e.g. 24 floats to 32) and zero in every byte: filled as one
/// flat row, then viewed in `shape`.
fn packed_zeros(like: &CubeTensor<CudaRuntime>, shape: [usize; 4]) -> CubeTensor<CudaRuntime> {
    let n = shape.iter().product::<usize>();
    let flat = zeros_client(
        like.client.clone(),
        like.device.clone(),
        Shape::new([n]),
        DType::F32,
    );
    CubeTensor::new_contiguous(
        flat.client,
        flat.device,
        Shape::new(shape),
        flat.handle,
        DType::F32,
    )
}

/// An uninitialized float32 `[B, H, Sq]` buffer for `q`'s rows, packed (`[H·Sq, Sq, 1]`): the
/// layout cuDNN's frontend gives its statistics. (Reel's kernels read any row strides.)
fn packed_rows(q: &CubeTensor<CudaRuntime>) -> CubeTensor<CudaRuntime> {
    let s = q.meta.shape();
    let shape = Shape::new([s[0], s[1], s[2]]);
    empty_device_contiguous_dtype(q.client.clone(), q.device.clone(), shape, DType::F32)
}
