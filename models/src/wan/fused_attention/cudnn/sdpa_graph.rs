//! cuDNN's flash-attention graphs in its documented pattern: the one its C++ frontend builds
//! for `sdpa` without masks or dropout, and for `sdpa_backward` with the padding mask it adds
//! on cuDNN 9.15 and older where the keys are not a multiple of 128 ([`Padding`]).
//! [`super::sdpa`] runs them.
//!
//! The graphs read `k` (and, backward, `v`) transposed, through their strides.

use cudarc::cudnn::sys as dnn;
use dnn::cudnnPointwiseMode_t as Pw;
use dnn::cudnnReduceTensorOp_t::{CUDNN_REDUCE_TENSOR_ADD, CUDNN_REDUCE_TENSOR_MAX};

use super::graph::{Desc, TensorSpec, F32};
use super::ops;
use super::sdpa::Key;
use super::{CudnnError, Padding};
use uid::*;

/// The tensors' uids in the graphs and variant packs.
pub(super) mod uid {
    pub const Q: i64 = 1;
    pub const K: i64 = 2;
    pub const V: i64 = 3;
    pub const O: i64 = 4;
    pub const STATS: i64 = 5;
    pub const SCALE: i64 = 6;
    pub const D_OUT: i64 = 7;
    pub const DQ: i64 = 8;
    pub const DK: i64 = 9;
    pub const DV: i64 = 10;
    pub const ROW_SUMS: i64 = 11;
    pub const DQ_SUMS: i64 = 12;
    pub const ONE: i64 = 13;
    pub const SEQ_Q: i64 = 14;
    pub const SEQ_KV: i64 = 15;
    pub const FILL: i64 = 16;
}

/// A non-virtual tensor.
fn real(uid: i64, dtype: dnn::cudnnDataType_t, dims: [i64; 4], strides: [i64; 4]) -> TensorSpec {
    TensorSpec::device(uid, dtype, dims, strides)
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
pub(super) fn forward_ops(key: &Key) -> Result<Vec<Desc>, CudnnError> {
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
pub(super) fn backward_ops(key: &Key) -> Result<Vec<Desc>, CudnnError> {
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
    use burn::tensor::DType;

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

    /// cuDNN's heuristics propose engines for both graphs on an H100 described by its
    /// properties (`graph::H100`), in bf16 and f16, at Wan's 8190 tokens and at uneven lengths: the
    /// graphs have the pattern of cuDNN's fused attention engines (a graph they do not
    /// recognise gets none); the backward also with padded statistics, and with the padding
    /// mask cuDNN 9.15.0 and older need off the 128 grid (in the form this version needs).
    /// Needs `libcudnn` and, for its heuristics, `libcublasLt`, not a
    /// GPU: `bench/cudnn-check.sh` runs it without one (making the plans needs the device).
    #[test]
    fn cuda_cudnn_heuristics_take_the_graphs() {
        use super::super::graph::{assert_engines, described_device, H100};
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
                    assert_engines(&device, &format!("{name} {dtype:?} {shape:?}"), ops);
                }
            }
        }
    }
}
