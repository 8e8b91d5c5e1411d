//! The flash-attention graphs in cuDNN's documented pattern (the one its C++ frontend builds for
//! `sdpa` and `sdpa_backward` without masks or dropout), and the calls that run them on CubeCL
//! tensors.
//!
//! Shapes: `q [B, H, Sq, D]`, `k [B, H, Sk, D]`, `v [B, H, Sk, Dv]`, `o`, `dO [B, H, Sq, Dv]`,
//! statistics `[B, H, Sq, 1]` float32 (Reel's log-sum-exp `[B, H, Sq]`). The graphs read `k`
//! (and, backward, `v`) transposed, through their strides.

use burn::tensor::{DType, Shape};
use burn_cubecl::ops::numeric::{empty_device_contiguous_dtype, zeros_client};
use burn_cubecl::tensor::CubeTensor;
use cubecl::cuda::CudaRuntime;
use cudarc::cudnn::sys as dnn;
use dnn::cudnnPointwiseMode_t as Pw;
use dnn::cudnnReduceTensorOp_t::{CUDNN_REDUCE_TENSOR_ADD, CUDNN_REDUCE_TENSOR_MAX};

use super::graph::{Desc, TensorSpec, F32};
use super::ops;
use super::run::{self, Call, PlanKey};
use super::{CudnnError, Padding};
use crate::wan::fused_attention::{as_dtype, empty_in_layout_of};

/// What a plan depends on: the dtype, and the dims and strides of `q, k, v` (in that order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Key {
    dtype: DType,
    dims: [[i64; 4]; 3],
    strides: [[i64; 4]; 3],
    /// The forward's output, or the backward's `o, dO, dq, dk, dv`: their strides.
    more: [[i64; 4]; 5],
    /// The float32 buffers' strides as `[B, H, Sq, ·]`: the statistics, and (backward) the
    /// row sums and dq's sums, read from each buffer. cuDNN's own are packed
    /// ([`packed_rows`]), and so are the statistics of Reel's forwards (CubeCL would pad
    /// the rows: on CUDA a `[B, H, 200]` buffer would have strides `[H·256, 256, 1]`); the
    /// graphs still declare whatever strides a buffer has.
    buffers: [[i64; 4]; 3],
    /// The backward's padding mask ([`super::padding`]).
    padding: Padding,
}

impl Key {
    /// The key of `q, k, v` (the other strides zero), or why the graphs do not take them.
    fn of(qkv: [&CubeTensor<CudaRuntime>; 3]) -> Result<Self, CudnnError> {
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
    fn rows_of(&self, name: &str, rows: &CubeTensor<CudaRuntime>) -> Result<[i64; 4], CudnnError> {
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

    fn io(&self) -> dnn::cudnnDataType_t {
        match self.dtype {
            DType::F16 => dnn::cudnnDataType_t::CUDNN_DATA_HALF,
            _ => dnn::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        }
    }

    /// `[B, H, Sq, Sk, D, Dv]`.
    fn sizes(&self) -> [i64; 6] {
        let [q, k, v] = self.dims;
        [q[0], q[1], q[2], k[2], q[3], v[3]]
    }

    fn scale(&self) -> f32 {
        1.0 / (self.dims[0][3] as f32).sqrt()
    }
}

fn strides(t: &CubeTensor<CudaRuntime>) -> [i64; 4] {
    let s = t.meta.strides();
    [s[0], s[1], s[2], s[3]].map(|x| x as i64)
}

// The tensors' uids in the graphs and variant packs.
const Q: i64 = 1;
const K: i64 = 2;
const V: i64 = 3;
const O: i64 = 4;
const STATS: i64 = 5;
const SCALE: i64 = 6;
const D_OUT: i64 = 7;
const DQ: i64 = 8;
const DK: i64 = 9;
const DV: i64 = 10;
const ROW_SUMS: i64 = 11;
const DQ_SUMS: i64 = 12;
const ONE: i64 = 13;
const SEQ_Q: i64 = 14;
const SEQ_KV: i64 = 15;
const FILL: i64 = 16;

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
    // Float32 buffers the graph needs: the rows' `Σ dO∘O`, and dq's float32 sums (zeroed:
    // cuDNN before 9.6 did not clear them itself).
    let row_sums = packed_rows(&q);
    let zeros = |shape: [usize; 4]| {
        zeros_client(
            q.client.clone(),
            q.device.clone(),
            Shape::new(shape),
            DType::F32,
        )
    };
    let dq_sums = zeros([b, h, sq, d]);
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

/// An uninitialized float32 `[B, H, Sq]` buffer for `q`'s rows, packed (`[H·Sq, Sq, 1]`): the
/// layout cuDNN's frontend gives its statistics. (Reel's kernels read any row strides.)
fn packed_rows(q: &CubeTensor<CudaRuntime>) -> CubeTensor<CudaRuntime> {
    let s = q.meta.shape();
    let shape = Shape::new([s[0], s[1], s[2]]);
    empty_device_contiguous_dtype(q.client.clone(), q.device.clone(), shape, DType::F32)
}

/// A non-virtual tensor.
fn real(uid: i64, dtype: dnn::cudnnDataType_t, dims: [i64; 4], strides: [i64; 4]) -> TensorSpec {
    TensorSpec {
        uid,
        dtype,
        dims,
        strides,
        is_virtual: false,
        by_value: false,
    }
}

/// A host scalar (float32), broadcast.
fn scalar(uid: i64) -> Result<Desc, CudnnError> {
    TensorSpec {
        by_value: true,
        ..real(uid, F32, [1; 4], [1; 4])
    }
    .build()
}

/// `[B, H, rows, cols]` virtual float32, row-major.
fn virtual_(uid: i64, dims: [i64; 4]) -> Result<Desc, CudnnError> {
    TensorSpec::virtual_f32(uid, dims).build()
}

/// `t`'s last two dims (and strides) swapped: the transposed view.
fn swapped([a, b, c, d]: [i64; 4]) -> [i64; 4] {
    [a, b, d, c]
}

/// The float32 rows `[B, H, Sq, 1]` (Reel's `[B, H, Sq]` log-sum-exp, or the row sums), with
/// the buffer's own `strides`.
fn rows(uid: i64, key: &Key, strides: [i64; 4]) -> TensorSpec {
    let [b, h, sq, ..] = key.sizes();
    real(uid, F32, [b, h, sq, 1], strides)
}

/// The forward: `S = Q·Kᵀ`, scaled; softmax as max, subtract, exp, sum, divide, with the
/// statistics `max + log(sum)`; `O = P·V`.
fn forward_ops(key: &Key) -> Result<Vec<Desc>, CudnnError> {
    let io = key.io();
    let [b, h, sq, sk, _, dv] = key.sizes();
    let [qd, kd, vd] = key.dims;
    let [qs, ks, vs] = key.strides;
    let q = real(Q, io, qd, qs).build()?;
    let kt = real(K, io, swapped(kd), swapped(ks)).build()?;
    let v = real(V, io, vd, vs).build()?;
    let o = real(O, io, [b, h, sq, dv], key.more[0]).build()?;
    let stats = rows(STATS, key, key.buffers[0]).build()?;
    let scale = scalar(SCALE)?;
    let scores = |uid| virtual_(uid, [b, h, sq, sk]);
    let row = |uid| virtual_(uid, [b, h, sq, 1]);
    let (s, scaled, shifted, exp) = (scores(20)?, scores(21)?, scores(22)?, scores(23)?);
    let (max, sum, log) = (row(24)?, row(25)?, row(26)?);
    let p = TensorSpec {
        dtype: io,
        ..TensorSpec::virtual_f32(27, [b, h, sq, sk])
    }
    .build()?;
    Ok(vec![
        ops::matmul(&q, &kt, &s)?,
        ops::pointwise(Pw::CUDNN_POINTWISE_MUL, &s, Some(&scale), &scaled)?,
        ops::reduction(CUDNN_REDUCE_TENSOR_MAX, &scaled, &max)?,
        ops::pointwise(Pw::CUDNN_POINTWISE_SUB, &scaled, Some(&max), &shifted)?,
        ops::pointwise(Pw::CUDNN_POINTWISE_EXP, &shifted, None, &exp)?,
        ops::reduction(CUDNN_REDUCE_TENSOR_ADD, &exp, &sum)?,
        ops::pointwise(Pw::CUDNN_POINTWISE_LOG, &sum, None, &log)?,
        ops::pointwise(Pw::CUDNN_POINTWISE_ADD, &max, Some(&log), &stats)?,
        ops::pointwise(Pw::CUDNN_POINTWISE_DIV, &exp, Some(&sum), &p)?,
        ops::matmul(&p, &v, &o)?,
    ])
}

/// The backward, recomputing `P = exp(S·scale − stats)`: `dV = Pᵀ·dO`;
/// `dS = P ∘ (dO·Vᵀ − Σ dO∘O) · scale`; `dK = dSᵀ·Q`; `dQ = dS·K` summed in float32, then
/// cast. With a [`Padding`] mask, the scaled scores are masked before the statistics are
/// subtracted (and, [`Padding::MaskTwice`], again after), and every product is sized by the
/// sequence lengths, as cuDNN's frontend builds it.
fn backward_ops(key: &Key) -> Result<Vec<Desc>, CudnnError> {
    let io = key.io();
    let [b, h, sq, sk, _, dv] = key.sizes();
    let [qd, kd, vd] = key.dims;
    let [qs, ks, vs] = key.strides;
    let [os, dos, dqs, dks, dvs] = key.more;
    let q = real(Q, io, qd, qs).build()?;
    let kt = real(K, io, swapped(kd), swapped(ks)).build()?;
    let vt = real(V, io, swapped(vd), swapped(vs)).build()?;
    let o = real(O, io, [b, h, sq, dv], os).build()?;
    let d_out = real(D_OUT, io, [b, h, sq, dv], dos).build()?;
    let [stats_s, row_sums_s, dq_sums_s] = key.buffers;
    let stats = rows(STATS, key, stats_s).build()?;
    let dq = real(DQ, io, qd, dqs).build()?;
    let dk = real(DK, io, kd, dks).build()?;
    let dv_ = real(DV, io, vd, dvs).build()?;
    let row_sums = rows(ROW_SUMS, key, row_sums_s).build()?;
    let dq_sums = real(DQ_SUMS, F32, qd, dq_sums_s).build()?;
    let (scale, one) = (scalar(SCALE)?, scalar(ONE)?);
    // `dO ∘ O`, with the strides cuDNN's own frontend gives this virtual tensor.
    let d_out_o = TensorSpec {
        strides: [h * sq * dv, sq * dv, h * dv, 1],
        ..TensorSpec::virtual_f32(30, [b, h, sq, dv])
    }
    .build()?;
    let row_sum = virtual_(31, [b, h, sq, 1])?;
    let scores = |uid| virtual_(uid, [b, h, sq, sk]);
    let (s, scaled, shifted, p) = (scores(32)?, scores(33)?, scores(34)?, scores(35)?);
    let (dp, dp_centred, dp_p, ds) = (scores(36)?, scores(37)?, scores(38)?, scores(39)?);
    let mask = match key.padding {
        Padding::None => None,
        _ => Some(MaskInputs::new(b)?),
    };
    let [seq_q, seq_kv] = match &mask {
        Some(m) => [Some(&m.seq_q), Some(&m.seq_kv)],
        None => [None, None],
    };
    // `Pᵀ` and `dSᵀ` `[B, H, Sk, Sq]` in the inputs' dtype; `K` seen `[B, H, Sk, D]`.
    let transposed = |uid| {
        TensorSpec {
            dtype: io,
            dims: [b, h, sk, sq],
            strides: [h * sq * sk, sq * sk, 1, sk],
            ..TensorSpec::virtual_f32(uid, [b, h, sk, sq])
        }
        .build()
    };
    let (pt, dst) = (transposed(40)?, transposed(41)?);
    let k = TensorSpec {
        strides: ks,
        ..TensorSpec::virtual_f32(42, kd)
    }
    .build()?;
    let mut graph = vec![
        ops::pointwise(Pw::CUDNN_POINTWISE_MUL, &d_out, Some(&o), &d_out_o)?,
        ops::reduction(CUDNN_REDUCE_TENSOR_ADD, &d_out_o, &row_sum)?,
        ops::pointwise(Pw::CUDNN_POINTWISE_MUL, &row_sum, Some(&one), &row_sums)?,
        ops::matmul_sized(&q, &kt, &s, [seq_q, seq_kv, None])?,
        ops::pointwise(Pw::CUDNN_POINTWISE_MUL, &s, Some(&scale), &scaled)?,
    ];
    match &mask {
        None => graph.push(ops::pointwise(
            Pw::CUDNN_POINTWISE_SUB,
            &scaled,
            Some(&stats),
            &shifted,
        )?),
        Some(m) => {
            let masked = scores(43)?;
            graph.extend(m.ops(&scaled, &masked, [b, h, sq, sk], 50)?);
            // Before 9.10 the difference is masked again into `shifted`.
            let twice = key.padding == Padding::MaskTwice;
            let difference = if twice { scores(44)? } else { shifted.clone() };
            let sub = Pw::CUDNN_POINTWISE_SUB;
            graph.push(ops::pointwise(sub, &masked, Some(&stats), &difference)?);
            if twice {
                graph.extend(m.ops(&difference, &shifted, [b, h, sq, sk], 60)?);
            }
        }
    }
    graph.extend([
        ops::pointwise(Pw::CUDNN_POINTWISE_EXP, &shifted, None, &p)?,
        ops::reshape(&p, &pt)?,
        ops::matmul_sized(&pt, &d_out, &dv_, [seq_kv, None, seq_q])?,
        ops::matmul_sized(&d_out, &vt, &dp, [seq_q, seq_kv, None])?,
        ops::pointwise(Pw::CUDNN_POINTWISE_SUB, &dp, Some(&row_sums), &dp_centred)?,
        ops::pointwise(Pw::CUDNN_POINTWISE_MUL, &dp_centred, Some(&p), &dp_p)?,
        ops::pointwise(Pw::CUDNN_POINTWISE_MUL, &dp_p, Some(&scale), &ds)?,
        ops::reshape(&ds, &dst)?,
        ops::matmul_sized(&dst, &q, &dk, [seq_kv, None, seq_q])?,
        ops::reshape(&kt, &k)?,
        ops::matmul_sized(&ds, &k, &dq_sums, [seq_q, None, seq_kv])?,
        ops::pointwise(Pw::CUDNN_POINTWISE_IDENTITY, &dq_sums, None, &dq)?,
    ]);
    Ok(graph)
}

/// What a padding mask reads: the int32 `[B, 1, 1, 1]` sequence lengths of the queries and
/// the keys, and the value masked scores take (a host scalar).
struct MaskInputs {
    seq_q: Desc,
    seq_kv: Desc,
    fill: Desc,
}

impl MaskInputs {
    /// The tensors of a batch of `b`.
    fn new(b: i64) -> Result<Self, CudnnError> {
        let int32 = dnn::cudnnDataType_t::CUDNN_DATA_INT32;
        let seq = |uid| real(uid, int32, [b, 1, 1, 1], [1; 4]).build();
        Ok(Self {
            seq_q: seq(SEQ_Q)?,
            seq_kv: seq(SEQ_KV)?,
            fill: scalar(FILL)?,
        })
    }

    /// `masked` = `scores` (`dims`) where the row is below the query length and the column
    /// below the key length, the fill value elsewhere: cuDNN's frontend's padding mask, on
    /// virtual tensors of uids `first..first + 5`.
    fn ops(
        &self,
        scores: &Desc,
        masked: &Desc,
        dims: [i64; 4],
        first: i64,
    ) -> Result<Vec<Desc>, CudnnError> {
        let of = |uid, dtype| {
            TensorSpec {
                dtype,
                ..TensorSpec::virtual_f32(uid, dims)
            }
            .build()
        };
        let (int32, boolean) = (
            dnn::cudnnDataType_t::CUDNN_DATA_INT32,
            dnn::cudnnDataType_t::CUDNN_DATA_BOOLEAN,
        );
        let (row, col) = (of(first, int32)?, of(first + 1, int32)?);
        let (row_in, col_in) = (of(first + 2, boolean)?, of(first + 3, boolean)?);
        let inside = of(first + 4, boolean)?;
        Ok(vec![
            ops::gen_index(2, scores, &row)?,
            ops::gen_index(3, scores, &col)?,
            ops::logical(Pw::CUDNN_POINTWISE_CMP_LT, &row, &self.seq_q, &row_in)?,
            ops::logical(Pw::CUDNN_POINTWISE_CMP_LT, &col, &self.seq_kv, &col_in)?,
            ops::logical(Pw::CUDNN_POINTWISE_LOGICAL_AND, &row_in, &col_in, &inside)?,
            ops::select(scores, &self.fill, &inside, masked)?,
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key for `[B, S, H, D]` tensors seen as `[B, H, S, D]`, as the Wan blocks pass them.
    /// With `padded`, the statistics and row sums as CubeCL lays out a buffer on CUDA unless
    /// asked for a packed one (rows of 512 bytes or more padded to a multiple of 512 bytes,
    /// 128 values: Reel's forward's statistics before they were packed); else packed, as
    /// cuDNN's own calls and Reel's forwards allocate them.
    fn wan_key(dtype: DType, [b, h, sq, sk, d]: [i64; 5], padded: bool) -> Key {
        let bshd = |s: i64| [s * h * d, d, h * d, 1];
        let pitch = if padded {
            (sq as u64).next_multiple_of(128) as i64
        } else {
            sq
        };
        let rows = [h * pitch, pitch, 1, 1];
        Key {
            dtype,
            dims: [[b, h, sq, d], [b, h, sk, d], [b, h, sk, d]],
            strides: [bshd(sq), bshd(sk), bshd(sk)],
            more: [bshd(sq), bshd(sq), bshd(sq), bshd(sk), bshd(sk)],
            buffers: [rows, rows, [h * sq * d, sq * d, d, 1]],
            padding: Padding::None,
        }
    }

    /// An H100 80GB HBM3 as cuDNN's device properties describe it (the values of the
    /// CUDA device attributes cuDNN reads).
    const H100: &str = r#"{"deviceVer": 900, "driverVer": 12080, "cudaDeviceId": 0,
        "totalGlobalMem": 85045968896, "maxGridSize": [2147483647, 65535, 65535],
        "maxBlockSize": [1024, 1024, 64], "regsPerBlock": 65536, "multiProcessorCount": 132,
        "smCountOrigin": 0, "warpSize": 32, "maxSharedMemoryPerBlock": 49152,
        "maxSharedMemoryPerBlockOptin": 232448, "oversizedSharedMemoryPerBlock": 0,
        "reservedSharedMemoryPerBlock": 1024, "maxRegistersPerSM": 65536, "maxCtasPerSM": 32,
        "maxThreadsPerBlock": 1024, "maxThreadsPerSM": 2048, "pciDeviceId": 9008,
        "isTccDriver": 0, "supportCoopLaunch": 1, "smClockRateKHz": 1980000,
        "memClockRateKHz": 2619000, "memoryBusWidth": 5120, "l2CacheSize": 52428800,
        "deviceName": "NVIDIA H100 80GB HBM3"}"#;

    /// cuDNN's heuristics propose engines for both graphs on an H100 described by its
    /// properties ([`H100`]), in bf16 and f16, at Wan's 8190 tokens and at uneven lengths: the
    /// graphs have the pattern of cuDNN's fused attention engines (a graph they do not
    /// recognise gets none); the backward also with padded statistics, and with the padding
    /// mask cuDNN 9.15.0 and older need off the 128 grid (in the form this version needs).
    /// Needs `libcudnn` and, for its heuristics, `libcublasLt`, not a
    /// GPU: `bench/cudnn-check.sh` runs it without one (making the plans needs the device).
    #[test]
    fn cuda_cudnn_heuristics_take_the_graphs() {
        use super::super::graph::{described_device, engine_index, Plan, Target};
        let version =
            crate::wan::fused_attention::cudnn::present().unwrap_or_else(|e| panic!("{e}"));
        if version < 90800 {
            // Describing a device needs cuDNN 9.8; `cuda_cudnn_attention_matches_naive` checks
            // the graphs on the GPU itself.
            eprintln!("cuDNN {version} cannot describe a device (9.8 can): not checked here");
            return;
        }
        let device =
            described_device(H100).unwrap_or_else(|e| panic!("the H100's properties: {e}"));
        for dtype in [DType::BF16, DType::F16] {
            for shape in [[1, 12, 8190, 8190, 128], [2, 3, 200, 150, 64]] {
                let (packed, padded) = (wan_key(dtype, shape, false), wan_key(dtype, shape, true));
                let masked = Key {
                    padding: match version {
                        ..91_000 => Padding::MaskTwice,
                        _ => Padding::Mask,
                    },
                    ..packed
                };
                for (name, ops) in [
                    ("forward", forward_ops(&packed)),
                    ("backward", backward_ops(&packed)),
                    ("backward, padded statistics", backward_ops(&padded)),
                    ("backward, padding mask", backward_ops(&masked)),
                ] {
                    let what = format!("{name} {dtype:?} {shape:?}");
                    let ops = ops.unwrap_or_else(|e| panic!("{what}: {e}"));
                    let (_graph, _heuristics, configs) =
                        Plan::configs(Target::Described(&device), &ops)
                            .unwrap_or_else(|e| panic!("{what}: {e}"));
                    let engines: Vec<_> = configs
                        .iter()
                        .map(|c| engine_index(c).unwrap_or(-1))
                        .collect();
                    eprintln!("{what}: cuDNN's engines {engines:?}");
                    assert!(
                        !engines.is_empty(),
                        "{what}: cuDNN's heuristics propose no engine"
                    );
                }
            }
        }
    }
}
