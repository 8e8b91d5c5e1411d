//! CubeCL kernels of the fused attention: one forward kernel (online softmax, writes the
//! output and the per-row log-sum-exp) and two backward kernels (FlashAttention-2: `dQ` per
//! query row, `dK`/`dV` per key row, scores recomputed tile by tile in registers).
//!
//! Layout: `q [B, H, Sq, D]`, `k [B, H, Sk, D]`, `v [B, H, Sk, Dv]`, any strides; one cube per
//! `(row tile, b·H + h)`, one unit per row. Tiles of the other sequence are staged in shared
//! memory as float32. All arithmetic is float32 whatever the input dtype `F`.

// The `#[cube(launch)]` macro generates undocumented launch modules and structs.
#![allow(missing_docs)]

use cubecl::prelude::*;

/// Score of padded keys and initial running maximum (WGSL has no `-inf` literal).
pub(super) const NEG_BIG: f32 = -1.0e30;
/// Log-sum-exp given to padded query rows in the key-side kernel: their probabilities are 0.
pub(super) const POS_BIG: f32 = 1.0e30;

/// Offset of element `(bh, row, col)` of a `[B, H, S, C]` tensor with `heads` heads.
#[cube]
pub(super) fn offset<E: CubePrimitive>(
    t: &Tensor<E>,
    bh: usize,
    heads: usize,
    row: usize,
    col: usize,
) -> usize {
    (bh / heads) * t.stride(0) + (bh % heads) * t.stride(1) + row * t.stride(2) + col * t.stride(3)
}

/// Offset of the statistic of row `row` in a `[B, H, S]` tensor with `heads` heads.
#[cube]
pub(super) fn stat_offset(t: &Tensor<f32>, bh: usize, heads: usize, row: usize) -> usize {
    (bh / heads) * t.stride(0) + (bh % heads) * t.stride(1) + row * t.stride(2)
}

/// Row `row` of `t` (`[B, H, S, C]`, `c` columns) times `factor` into the local array `dst`
/// as float32; zeros when the row is not `valid`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_row<F: Float>(
    t: &Tensor<F>,
    dst: &mut Array<f32>,
    bh: usize,
    heads: usize,
    row: usize,
    valid: bool,
    factor: f32,
    #[comptime] c: usize,
) {
    for i in 0..c {
        let mut val = 0.0f32;
        if valid {
            val = f32::cast_from(t[offset(t, bh, heads, row, i)]) * factor;
        }
        dst[i] = val;
    }
}

/// Stage `tile` rows starting at `row0` of `t` (`[B, H, S, C]`, `c` columns) into `dst` as
/// float32, zero past the end of the sequence. All units of the cube take part.
#[cube]
fn stage_rows<F: Float>(
    t: &Tensor<F>,
    dst: &mut SharedMemory<f32>,
    bh: usize,
    row0: usize,
    #[comptime] tile: usize,
    #[comptime] c: usize,
    #[comptime] units: usize,
) {
    let heads = t.shape(1);
    let len = t.shape(2);
    let mut idx = UNIT_POS_X as usize;
    while idx < tile * c {
        let row = row0 + idx / c;
        let mut val = 0.0f32;
        if row < len {
            val = f32::cast_from(t[offset(t, bh, heads, row, idx % c)]);
        }
        dst[idx] = val;
        idx += units;
    }
}

/// Forward: `out = softmax(scale·q·kᵀ)·v` and `lse [B, H, Sq]` (float32, of the scaled
/// scores). `units` query rows per cube, `tile` keys per shared-memory tile.
#[cube(launch)]
pub fn attention_forward<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    out: &mut Tensor<F>,
    lse: &mut Tensor<f32>,
    scale: f32,
    #[comptime] d: usize,
    #[comptime] dv: usize,
    #[comptime] units: usize,
    #[comptime] tile: usize,
    #[define(F)] _dtype: StorageType,
) {
    let bh = CUBE_POS_Y as usize;
    let heads = q.shape(1);
    let seq_q = q.shape(2);
    let seq_k = k.shape(2);
    let row = CUBE_POS_X as usize * units + UNIT_POS_X as usize;
    let valid = row < seq_q;

    let mut q_reg = Array::<f32>::new(d);
    let mut acc = Array::<f32>::new(dv);
    let mut s = Array::<f32>::new(tile);
    load_row(q, &mut q_reg, bh, heads, row, valid, scale, d);
    for c in 0..dv {
        acc[c] = 0.0f32;
    }
    let mut m = f32::new(NEG_BIG);
    let mut l = 0.0f32;

    let mut ks = SharedMemory::<f32>::new(tile * d);
    let mut vs = SharedMemory::<f32>::new(tile * dv);
    let num_tiles = seq_k.div_ceil(tile);
    for t in 0..num_tiles {
        let key0 = t * tile;
        stage_rows(k, &mut ks, bh, key0, tile, d, units);
        stage_rows(v, &mut vs, bh, key0, tile, dv, units);
        sync_cube();
        if valid {
            let mut m_new = m;
            for j in 0..tile {
                let mut score = f32::new(NEG_BIG);
                if key0 + j < seq_k {
                    let mut dot = 0.0f32;
                    for c in 0..d {
                        dot += q_reg[c] * ks[j * d + c];
                    }
                    score = dot;
                }
                s[j] = score;
                m_new = f32::max(m_new, score);
            }
            let corr = f32::exp(m - m_new);
            l *= corr;
            for c in 0..dv {
                acc[c] *= corr;
            }
            for j in 0..tile {
                let p = f32::exp(s[j] - m_new);
                l += p;
                for c in 0..dv {
                    acc[c] += p * vs[j * dv + c];
                }
            }
            m = m_new;
        }
        sync_cube();
    }

    if valid {
        let inv = 1.0f32 / l;
        for c in 0..dv {
            out[offset(out, bh, heads, row, c)] = F::cast_from(acc[c] * inv);
        }
        lse[stat_offset(lse, bh, heads, row)] = m + f32::ln(l);
    }
}

/// Backward, query side: `dq = scale·Σⱼ p·(dp − Δ)·kⱼ` per query row, and `delta = Δ = Σ dO∘O` per
/// row (float32 `[B, H, Sq]`, read by [`attention_backward_kv`](fn@attention_backward_kv)).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn attention_backward_q<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    out: &Tensor<F>,
    d_out: &Tensor<F>,
    lse: &Tensor<f32>,
    dq: &mut Tensor<F>,
    delta: &mut Tensor<f32>,
    scale: f32,
    #[comptime] d: usize,
    #[comptime] dv: usize,
    #[comptime] units: usize,
    #[comptime] tile: usize,
    #[define(F)] _dtype: StorageType,
) {
    let bh = CUBE_POS_Y as usize;
    let heads = q.shape(1);
    let seq_q = q.shape(2);
    let seq_k = k.shape(2);
    let row = CUBE_POS_X as usize * units + UNIT_POS_X as usize;
    let valid = row < seq_q;

    let mut q_reg = Array::<f32>::new(d);
    let mut do_reg = Array::<f32>::new(dv);
    let mut dq_acc = Array::<f32>::new(d);
    let mut dlt = 0.0f32;
    let mut row_lse = f32::new(POS_BIG);
    load_row(q, &mut q_reg, bh, heads, row, valid, scale, d);
    load_row(d_out, &mut do_reg, bh, heads, row, valid, 1.0f32, dv);
    for c in 0..d {
        dq_acc[c] = 0.0f32;
    }
    if valid {
        for c in 0..dv {
            dlt += do_reg[c] * f32::cast_from(out[offset(out, bh, heads, row, c)]);
        }
    }
    if valid {
        row_lse = lse[stat_offset(lse, bh, heads, row)];
        delta[stat_offset(delta, bh, heads, row)] = dlt;
    }

    let mut ks = SharedMemory::<f32>::new(tile * d);
    let mut vs = SharedMemory::<f32>::new(tile * dv);
    let num_tiles = seq_k.div_ceil(tile);
    for t in 0..num_tiles {
        let key0 = t * tile;
        stage_rows(k, &mut ks, bh, key0, tile, d, units);
        stage_rows(v, &mut vs, bh, key0, tile, dv, units);
        sync_cube();
        if valid {
            for j in 0..tile {
                if key0 + j < seq_k {
                    let mut score = 0.0f32;
                    for c in 0..d {
                        score += q_reg[c] * ks[j * d + c];
                    }
                    let mut dp = 0.0f32;
                    for c in 0..dv {
                        dp += do_reg[c] * vs[j * dv + c];
                    }
                    let ds = f32::exp(score - row_lse) * (dp - dlt);
                    for c in 0..d {
                        dq_acc[c] += ds * ks[j * d + c];
                    }
                }
            }
        }
        sync_cube();
    }

    if valid {
        for c in 0..d {
            dq[offset(dq, bh, heads, row, c)] = F::cast_from(dq_acc[c] * scale);
        }
    }
}

/// Backward, key side: `dv = Σᵢ p·dOᵢ` and `dk = scale·Σᵢ p·(dp − Δᵢ)·qᵢ` per key row, with
/// `Δ` from [`attention_backward_q`](fn@attention_backward_q) (launched first on the same stream).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn attention_backward_kv<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    d_out: &Tensor<F>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    dk: &mut Tensor<F>,
    dv_out: &mut Tensor<F>,
    scale: f32,
    #[comptime] d: usize,
    #[comptime] dv: usize,
    #[comptime] units: usize,
    #[comptime] tile: usize,
    #[define(F)] _dtype: StorageType,
) {
    let bh = CUBE_POS_Y as usize;
    let heads = q.shape(1);
    let seq_q = q.shape(2);
    let seq_k = k.shape(2);
    let row = CUBE_POS_X as usize * units + UNIT_POS_X as usize;
    let valid = row < seq_k;

    let mut k_reg = Array::<f32>::new(d);
    let mut v_reg = Array::<f32>::new(dv);
    let mut dk_acc = Array::<f32>::new(d);
    let mut dv_acc = Array::<f32>::new(dv);
    load_row(k, &mut k_reg, bh, heads, row, valid, 1.0f32, d);
    load_row(v, &mut v_reg, bh, heads, row, valid, 1.0f32, dv);
    for c in 0..d {
        dk_acc[c] = 0.0f32;
    }
    for c in 0..dv {
        dv_acc[c] = 0.0f32;
    }

    let mut qs = SharedMemory::<f32>::new(tile * d);
    let mut dos = SharedMemory::<f32>::new(tile * dv);
    let mut lses = SharedMemory::<f32>::new(tile);
    let mut deltas = SharedMemory::<f32>::new(tile);
    let num_tiles = seq_q.div_ceil(tile);
    for t in 0..num_tiles {
        let q0 = t * tile;
        stage_rows(q, &mut qs, bh, q0, tile, d, units);
        stage_rows(d_out, &mut dos, bh, q0, tile, dv, units);
        let mut i = UNIT_POS_X as usize;
        while i < tile {
            let qrow = q0 + i;
            let mut lv = f32::new(POS_BIG);
            let mut dl = 0.0f32;
            if qrow < seq_q {
                lv = lse[stat_offset(lse, bh, heads, qrow)];
                dl = delta[stat_offset(delta, bh, heads, qrow)];
            }
            lses[i] = lv;
            deltas[i] = dl;
            i += units;
        }
        sync_cube();
        if valid {
            for i in 0..tile {
                let mut score = 0.0f32;
                for c in 0..d {
                    score += qs[i * d + c] * k_reg[c];
                }
                let p = f32::exp(score * scale - lses[i]);
                let mut dp = 0.0f32;
                for c in 0..dv {
                    let g = dos[i * dv + c];
                    dv_acc[c] += p * g;
                    dp += g * v_reg[c];
                }
                let ds = p * (dp - deltas[i]);
                for c in 0..d {
                    dk_acc[c] += ds * qs[i * d + c];
                }
            }
        }
        sync_cube();
    }

    if valid {
        for c in 0..d {
            dk[offset(dk, bh, heads, row, c)] = F::cast_from(dk_acc[c] * scale);
        }
        for c in 0..dv {
            dv_out[offset(dv_out, bh, heads, row, c)] = F::cast_from(dv_acc[c]);
        }
    }
}
