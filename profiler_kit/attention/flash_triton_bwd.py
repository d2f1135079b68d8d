"""FlashAttention-2 backward in Triton: a D pre-pass, a dK/dV kernel and a dQ kernel, no atomics.

With P_ij = exp(s_ij/√d - L_i) recomputed from the saved logsumexp and D_i = Σ_d dO_id O_id:

    dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP - D),   dQ = dS K / √d,   dK = dSᵀ Q / √d.

`_flash_attn_bwd_dkdv_kernel` owns one key tile and loops over the query tiles that see it;
`_flash_attn_bwd_dq_kernel` owns one query tile and loops over the key tiles it sees. Each output tile has a
single writer, so no atomics and no zero-initialisation are needed, and the autotuner may rerun them freely.
P is recomputed twice (once per kernel): the price of having no atomics.

Ragged tails need little masking: rows past N_Q load q = dO = 0 and so add nothing to dK/dV, and keys past
N_K load k = v = 0 and add nothing to dQ; the MASKED loops still zero P there, since exp2(-L) of a padded
score can overflow. Padded head-dim columns are zeros throughout. Layout, precision and tuning follow
`flash_triton_fwd`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from profiler_kit.attention.flash_triton_fwd import (
    _LOG2E,
    LOG2E,
    TUNING_KEY,
    as_4d,
    block_d,
    configs,
    launch,
    load_tile,
    seq_bucket,
    smem_pruner,
    store_tile,
    strides3,
)

# Rows per program of the D pre-pass: it is memory-bound, so any size that fills a block will do.
PREPROCESS_BLOCK_M = 128


@triton.jit
def _flash_attn_bwd_preprocess_kernel(
    Out, DO, Delta,
    stride_oz, stride_oh, stride_on,
    stride_dz, stride_dh, stride_dn,
    H, N_Q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """Delta_i = Σ_d dO_id · O_id in fp32, one program per (query tile, batch·head)."""
    pid_bh = tl.program_id(1)
    off_z = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    o = load_tile(Out + off_z * stride_oz + off_h * stride_oh, rows, N_Q, stride_on, HEAD_DIM, BLOCK_D, True)
    do = load_tile(DO + off_z * stride_dz + off_h * stride_dh, rows, N_Q, stride_dn, HEAD_DIM, BLOCK_D, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(Delta + pid_bh.to(tl.int64) * N_Q + rows, delta, mask=rows < N_Q)


@triton.jit
def _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, l_base, d_base, stride_qn, stride_dn, cols,
                      start, stop, N_Q, qk_scale,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                      MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Accumulate the dK, dV of one key tile over query tiles [start, stop), working on transposed tiles
    (keys × queries) so that Pᵀ and dSᵀ come out of tl.dot directly."""
    offs_m = tl.arange(0, BLOCK_M)
    for start_m in range(start, stop, BLOCK_M):
        rows = start_m + offs_m
        q = load_tile(q_base, rows, N_Q, stride_qn, HEAD_DIM, BLOCK_D, MASKED)
        do = load_tile(do_base, rows, N_Q, stride_dn, HEAD_DIM, BLOCK_D, MASKED)
        if MASKED:
            lse2 = tl.load(l_base + rows, mask=rows < N_Q, other=0.0) * _LOG2E
            delta = tl.load(d_base + rows, mask=rows < N_Q, other=0.0)
        else:
            lse2 = tl.load(l_base + rows) * _LOG2E
            delta = tl.load(d_base + rows)
        p_t = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse2[None, :])
        if MASKED:
            visible = rows[None, :] < N_Q
            if CAUSAL:
                visible = visible & (cols[:, None] <= rows[None, :])
            p_t = tl.where(visible, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def _flash_attn_bwd_dkdv_kernel(
    Q, K, V, DO, L, Delta, DK, DV,
    stride_qz, stride_qh, stride_qn,
    stride_kz, stride_kh, stride_kn,
    stride_vz, stride_vh, stride_vn,
    stride_dz, stride_dh, stride_dn,
    stride_gz, stride_gh, stride_gn,
    H, N_Q, N_K, qk_scale, sm_scale, SEQ_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dK, dV for one (key tile, batch·head). DK and DV share the strides (stride_g*) of their allocation.

    Causal: queries before the key tile are skipped, the BLOCK_N / BLOCK_M query tiles on the diagonal are
    masked and the rest run unmasked (needs BLOCK_N % BLOCK_M == 0). Key tiles past N_Q store zeros.
    """
    pid_bh = tl.program_id(1)
    off_z = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    start_n = tl.program_id(0) * BLOCK_N
    cols = start_n + tl.arange(0, BLOCK_N)

    k = load_tile(K + off_z * stride_kz + off_h * stride_kh, cols, N_K, stride_kn, HEAD_DIM, BLOCK_D, True)
    v = load_tile(V + off_z * stride_vz + off_h * stride_vh, cols, N_K, stride_vn, HEAD_DIM, BLOCK_D, True)
    q_base = Q + off_z * stride_qz + off_h * stride_qh
    do_base = DO + off_z * stride_dz + off_h * stride_dh
    l_base = L + pid_bh.to(tl.int64) * N_Q
    d_base = Delta + pid_bh.to(tl.int64) * N_Q
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    full_rows = (N_Q // BLOCK_M) * BLOCK_M
    if CAUSAL:
        diagonal_stop = tl.minimum(start_n + BLOCK_N, N_Q)
        dk, dv = _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, l_base, d_base, stride_qn, stride_dn, cols,
                                   start_n, diagonal_stop, N_Q, qk_scale,
                                   HEAD_DIM, BLOCK_D, BLOCK_M, True, CAUSAL)
        start = start_n + BLOCK_N
    else:
        start = 0
    dk, dv = _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, l_base, d_base, stride_qn, stride_dn, cols,
                               start, full_rows, N_Q, qk_scale,
                               HEAD_DIM, BLOCK_D, BLOCK_M, False, CAUSAL)
    dk, dv = _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, l_base, d_base, stride_qn, stride_dn, cols,
                               tl.maximum(start, full_rows), N_Q, N_Q, qk_scale,
                               HEAD_DIM, BLOCK_D, BLOCK_M, True, CAUSAL)

    g_off = off_z * stride_gz + off_h * stride_gh
    store_tile(DK + g_off, (dk * sm_scale).to(DK.dtype.element_ty), cols, N_K, stride_gn, HEAD_DIM, BLOCK_D)
    store_tile(DV + g_off, dv.to(DV.dtype.element_ty), cols, N_K, stride_gn, HEAD_DIM, BLOCK_D)


@triton.jit
def _dq_key_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, rows, start, stop, N_K,
                  qk_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                  MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    """Accumulate the dQ of one query tile over key tiles [start, stop)."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(start, stop, BLOCK_N):
        cols = start_n + offs_n
        k = load_tile(k_base, cols, N_K, stride_kn, HEAD_DIM, BLOCK_D, MASKED)
        v = load_tile(v_base, cols, N_K, stride_vn, HEAD_DIM, BLOCK_D, MASKED)
        p = tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale - lse2[:, None])
        if MASKED:
            visible = cols[None, :] < N_K
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None])
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def _flash_attn_bwd_dq_kernel(
    Q, K, V, DO, L, Delta, DQ,
    stride_qz, stride_qh, stride_qn,
    stride_kz, stride_kh, stride_kn,
    stride_vz, stride_vh, stride_vn,
    stride_dz, stride_dh, stride_dn,
    stride_gz, stride_gh, stride_gn,
    H, N_Q, N_K, qk_scale, sm_scale, SEQ_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dQ for one (query tile, batch·head), key tiles split as in the forward (BLOCK_M % BLOCK_N == 0)."""
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_z = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    start_m = pid_m * BLOCK_M
    rows = start_m + tl.arange(0, BLOCK_M)

    q = load_tile(Q + off_z * stride_qz + off_h * stride_qh, rows, N_Q, stride_qn, HEAD_DIM, BLOCK_D, True)
    do = load_tile(DO + off_z * stride_dz + off_h * stride_dh, rows, N_Q, stride_dn, HEAD_DIM, BLOCK_D, True)
    lse2 = tl.load(L + pid_bh.to(tl.int64) * N_Q + rows, mask=rows < N_Q, other=0.0) * _LOG2E
    delta = tl.load(Delta + pid_bh.to(tl.int64) * N_Q + rows, mask=rows < N_Q, other=0.0)
    k_base = K + off_z * stride_kz + off_h * stride_kh
    v_base = V + off_z * stride_vz + off_h * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    full_keys = (N_K // BLOCK_N) * BLOCK_N
    if CAUSAL:
        unmasked_stop = tl.minimum(start_m, full_keys)
        stop = tl.minimum(start_m + BLOCK_M, N_K)
    else:
        unmasked_stop = full_keys
        stop = N_K
    dq = _dq_key_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, rows,
                       0, unmasked_stop, N_K, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_N, False, CAUSAL)
    dq = _dq_key_tiles(dq, q, do, lse2, delta, k_base, v_base, stride_kn, stride_vn, rows,
                       unmasked_stop, stop, N_K, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_N, True, CAUSAL)

    g_off = off_z * stride_gz + off_h * stride_gh
    store_tile(DQ + g_off, (dq * sm_scale).to(DQ.dtype.element_ty), rows, N_Q, stride_gn, HEAD_DIM, BLOCK_D)


# (BLOCK_M, BLOCK_N, warps, stages), most preferred first. The dK/dV kernel keeps a wide key tile resident
# and streams narrow query tiles (BLOCK_N % BLOCK_M == 0); the dQ kernel is its mirror image
# (BLOCK_M % BLOCK_N == 0). Four warps spill the d = 128 accumulators of the wide tiles; eight do not.
_DKDV_SHAPES = [
    (32, 128, 4, 3), (32, 128, 8, 3), (64, 128, 8, 3), (32, 64, 4, 3), (64, 64, 4, 3), (32, 64, 4, 2),
]
_DQ_SHAPES = [
    (128, 32, 4, 3), (128, 32, 8, 3), (128, 64, 8, 3), (64, 32, 4, 3), (64, 64, 4, 3), (64, 32, 4, 2),
]

# Resident: K and V (dK/dV) or Q and dO (dQ); streamed: the other pair.
_dkdv_pruner = smem_pruner(resident=("BLOCK_N", "BLOCK_N"), streamed=("BLOCK_M", "BLOCK_M"))
_dq_pruner = smem_pruner(resident=("BLOCK_M", "BLOCK_M"), streamed=("BLOCK_N", "BLOCK_N"))
_dkdv_tuned = triton.autotune(
    configs=configs(_DKDV_SHAPES), key=TUNING_KEY, prune_configs_by={"early_config_prune": _dkdv_pruner}
)(_flash_attn_bwd_dkdv_kernel)
_dq_tuned = triton.autotune(
    configs=configs(_DQ_SHAPES), key=TUNING_KEY, prune_configs_by={"early_config_prune": _dq_pruner}
)(_flash_attn_bwd_dq_kernel)

# Interpreter tiles: small, and two streamed tiles per resident one so the causal diagonal spans two tiles.
_DKDV_INTERPRET_BLOCKS = {"BLOCK_M": 16, "BLOCK_N": 32}
_DQ_INTERPRET_BLOCKS = {"BLOCK_M": 32, "BLOCK_N": 16}


def flash_backward(
    q4: torch.Tensor,
    k4: torch.Tensor,
    v4: torch.Tensor,
    o4: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the three backward kernels on (Z, H, seq, d) views of q, k, v, o; `grad_out` has the shape of
    the original q and `lse` is the forward's fp32 L.

    Returns dQ, dK, dV as contiguous (Z, H, seq, d) tensors in the input dtype.
    """
    z, h, n_q, d = q4.shape
    n_k = k4.shape[2]
    do4 = as_4d(grad_out)
    lse = lse.reshape(z * h, n_q)
    delta = torch.empty((z * h, n_q), dtype=torch.float32, device=q4.device)
    dq = torch.empty((z, h, n_q, d), dtype=q4.dtype, device=q4.device)
    dk = torch.empty((z, h, n_k, d), dtype=k4.dtype, device=k4.device)
    dv = torch.empty_like(dk)
    bd = block_d(d)

    _flash_attn_bwd_preprocess_kernel[(triton.cdiv(n_q, PREPROCESS_BLOCK_M), z * h)](
        o4, do4, delta, *strides3(o4), *strides3(do4), h, n_q,
        HEAD_DIM=d, BLOCK_D=bd, BLOCK_M=PREPROCESS_BLOCK_M,
    )
    common = (*strides3(q4), *strides3(k4), *strides3(v4), *strides3(do4))
    scalars = (h, n_q, n_k, LOG2E / math.sqrt(d), 1.0 / math.sqrt(d), seq_bucket(max(n_q, n_k)))
    consts = {"HEAD_DIM": d, "BLOCK_D": bd, "CAUSAL": causal}
    dkdv_args = (q4, k4, v4, do4, lse, delta, dk, dv, *common, *strides3(dk), *scalars)
    dq_args = (q4, k4, v4, do4, lse, delta, dq, *common, *strides3(dq), *scalars)
    launch(_dkdv_tuned, _dkdv_pruner, _DKDV_INTERPRET_BLOCKS,
           lambda meta: (triton.cdiv(n_k, meta["BLOCK_N"]), z * h), dkdv_args, consts)
    launch(_dq_tuned, _dq_pruner, _DQ_INTERPRET_BLOCKS,
           lambda meta: (triton.cdiv(n_q, meta["BLOCK_M"]), z * h), dq_args, consts)
    return dq, dk, dv


def tuned_configs() -> dict[str, dict]:
    """The autotuner's choice per tuning key so far, for each tuned kernel of this module."""
    return {
        "_flash_attn_bwd_dkdv_kernel": dict(_dkdv_tuned.cache),
        "_flash_attn_bwd_dq_kernel": dict(_dq_tuned.cache),
    }
