"""The FlashAttention-2 backward in Triton: a D pre-pass, a dK/dV kernel and a dQ kernel, no atomics.

With P_ij = exp(s_ij/√d - L_i) recomputed from the saved logsumexp and D_i = Σ_d dO_id O_id:

    dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP - D),   dQ = dS K / √d,   dK = dSᵀ Q / √d.

`_flash_attn_bwd_dkdv_kernel` owns one key tile and loops over the query tiles that see it;
`_flash_attn_bwd_dq_kernel` owns one query tile and loops over the key tiles it sees. Each output tile has a
single writer, so no atomics and no zero-initialisation are needed, the result is deterministic, and the
autotuner may rerun them freely. P is recomputed twice (7 matmuls where FlashAttention-2 counts 5).

Ragged tails need little masking: rows past N_Q load q = dO = 0 and so add nothing to dK/dV, and keys past
N_K load k = v = 0 and add nothing to dQ; the MASKED loops still zero P there, since exp2(-L) of a padded
score can overflow. Padded head-dim columns are zeros throughout. Layout, precision and tuning follow `fwd`.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from profiler_kit.attention.options import INTERPRET, FlashOptions
from profiler_kit.attention.record import LaunchRecord
from profiler_kit.attention.triton_kernels.configs import (
    DKDV_SHAPES,
    DQ_SHAPES,
    LOG2E,
    block_d,
    grid_2d,
    head_group,
    seq_bucket,
    smem_pruner,
)
from profiler_kit.attention.triton_kernels.fwd import FWD
from profiler_kit.attention.triton_kernels.launcher import (
    Kernel,
    descriptors,
    record,
    row_descriptors,
    tensor_signature,
    tma_usable,
)
from profiler_kit.attention.triton_kernels.tiles import (
    _LOG2E,
    key_ranges,
    load_rows,
    load_tile,
    program_head,
    query_tile_index,
    register_operand,
    scale_fp32,
    store_tile,
    strides3,
    tile_program,
)

# Rows per program of the D pre-pass: it is memory-bound, so any size that fills a block will do.
PREPROCESS_BLOCK_M = 128
# LSE2 and Delta rows are padded to a multiple of 4 fp32 (16 bytes): TMA needs 16-byte aligned row strides.
STAT_ALIGN: tl.constexpr = tl.constexpr(4)


@triton.jit
def stat_offset(pid_bh, N_Q):
    """Where batch·head pid_bh's row of the (Z·H, stat_rows(N_Q)) LSE2 and Delta arrays starts (int64)."""
    return pid_bh.to(tl.int64) * ((N_Q + STAT_ALIGN - 1) // STAT_ALIGN * STAT_ALIGN)


def stat_rows(n_q: int) -> int:
    """The row stride of the LSE2 and Delta arrays: n_q padded to STAT_ALIGN."""
    return triton.cdiv(n_q, STAT_ALIGN.value) * STAT_ALIGN.value


@triton.jit
def _flash_attn_bwd_preprocess_kernel(
    Out, DO, L, Delta, LSE2,
    stride_oz, stride_oh, stride_on,
    stride_dz, stride_dh, stride_dn,
    H, N_Q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """Delta_i = Σ_d dO_id · O_id and LSE2_i = L_i · log2(e) in fp32, one program per (query tile,
    batch·head). LSE2 is L in the exp2 domain: the dK/dV kernel would otherwise rescale each query tile's L
    once per key tile."""
    pid_bh, _, _, off_z, off_h = program_head(H, False, 1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    o = load_tile(Out + off_z * stride_oz + off_h * stride_oh, rows, N_Q, stride_on, HEAD_DIM, BLOCK_D, True)
    do = load_tile(DO + off_z * stride_dz + off_h * stride_dh, rows, N_Q, stride_dn, HEAD_DIM, BLOCK_D, True)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    out_offsets = stat_offset(pid_bh, N_Q) + rows
    lse = tl.load(L + pid_bh.to(tl.int64) * N_Q + rows, mask=rows < N_Q)
    tl.store(Delta + out_offsets, delta, mask=rows < N_Q)
    tl.store(LSE2 + out_offsets, lse * _LOG2E, mask=rows < N_Q)


@triton.jit
def _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, l_base, d_base, desc_q, desc_do, desc_l, desc_d, pid_bh,
                      z, h, stride_qn, stride_dn, cols, start, stop, N_Q, qk_scale,
                      HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                      MASKED: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr,
                      OVERLAP: tl.constexpr):
    """Accumulate the dK, dV of one key tile over query tiles [start, stop), working on transposed tiles
    (keys × queries) so that Pᵀ and dSᵀ come out of tl.dot directly. OVERLAP: see `_flash_attn_bwd_dkdv_kernel`."""
    offs_m = tl.arange(0, BLOCK_M)
    for start_m in tl.range(start, stop, BLOCK_M, warp_specialize=WS):
        rows = start_m + offs_m
        q = load_rows(desc_q, q_base, z, h, start_m, N_Q, stride_qn, BLOCK_M, HEAD_DIM, BLOCK_D, MASKED, TMA)
        do = load_rows(desc_do, do_base, z, h, start_m, N_Q, stride_dn, BLOCK_M, HEAD_DIM, BLOCK_D, MASKED, TMA)
        if TMA:
            lse2 = desc_l.load([pid_bh, start_m]).reshape(BLOCK_M)
            delta = desc_d.load([pid_bh, start_m]).reshape(BLOCK_M)
        elif MASKED:
            lse2 = tl.load(l_base + rows, mask=rows < N_Q, other=0.0)
            delta = tl.load(d_base + rows, mask=rows < N_Q, other=0.0)
        else:
            lse2 = tl.load(l_base + rows)
            delta = tl.load(d_base + rows)
        qk_t = tl.dot(k, tl.trans(q))
        if OVERLAP:
            dp_t = tl.dot(v, tl.trans(do))
        p_t = tl.math.exp2(qk_t * qk_scale - lse2[None, :])
        if MASKED:
            visible = rows[None, :] < N_Q
            if CAUSAL:
                visible = visible & (cols[:, None] <= rows[None, :])
            p_t = tl.where(visible, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        if not OVERLAP:
            dp_t = tl.dot(v, tl.trans(do))
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def _flash_attn_bwd_dkdv_kernel(
    Q, K, V, DO, LSE2, Delta, DK, DV, DESC_Q, DESC_K, DESC_V, DESC_DO, DESC_LSE2, DESC_DELTA,
    stride_qz, stride_qh, stride_qn,
    stride_kz, stride_kh, stride_kn,
    stride_vz, stride_vh, stride_vn,
    stride_dz, stride_dh, stride_dn,
    stride_gz, stride_gh, stride_gn,
    H, N_Q, N_K, qk_scale, sm_scale, SEQ_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr, HEAD_FIRST: tl.constexpr,
    OVERLAP: tl.constexpr, REGS: tl.constexpr, HEAD_GROUP: tl.constexpr,
):
    """dK, dV for one (key tile, batch·head). DK and DV share the strides (stride_g*) of their allocation.
    With TMA, q, k, v and dO tiles move through the DESC_* descriptors (see `load_rows`), and each query
    tile's LSE2 and Delta through (Z·H, N_Q) descriptors of those arrays, which spares the load/store unit the
    many small pointer loads that reading them in the layout of the score tile's columns takes.

    Causal: queries before the key tile are skipped, the query tiles from start_n that cross the diagonal
    (BLOCK_N / BLOCK_M of them, or one when BLOCK_M ≥ BLOCK_N; BLOCK_N % BLOCK_M == 0 or BLOCK_M % BLOCK_N
    == 0) are masked and the rest run unmasked. Key tiles past N_Q store zeros.

    OVERLAP issues dPᵀ = V dOᵀ before the exp2 of Pᵀ rather than after dV's matmul. Triton waits for a
    matmul's result only where it is first used, so the tensor cores then compute dPᵀ while the exp2 runs,
    and dV's matmul while dSᵀ is formed; the cost is dPᵀ's registers, live across the exp2.
    """
    qk_scale, sm_scale = scale_fp32(qk_scale), scale_fp32(sm_scale)
    pid_bh, z, h, off_z, off_h = program_head(H, HEAD_FIRST, HEAD_GROUP)
    start_n = tile_program(HEAD_FIRST, HEAD_GROUP)[0] * BLOCK_N
    cols = start_n + tl.arange(0, BLOCK_N)

    k = load_rows(DESC_K, K + off_z * stride_kz + off_h * stride_kh, z, h, start_n, N_K, stride_kn, BLOCK_N,
                  HEAD_DIM, BLOCK_D, True, TMA)
    v = load_rows(DESC_V, V + off_z * stride_vz + off_h * stride_vh, z, h, start_n, N_K, stride_vn, BLOCK_N,
                  HEAD_DIM, BLOCK_D, True, TMA)
    k, v = register_operand(k, REGS), register_operand(v, REGS)
    q_base = Q + off_z * stride_qz + off_h * stride_qh
    do_base = DO + off_z * stride_dz + off_h * stride_dh
    l_base = LSE2 + stat_offset(pid_bh, N_Q)
    d_base = Delta + stat_offset(pid_bh, N_Q)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    if CAUSAL:
        # The query tiles from start_n that cross the diagonal: BLOCK_N / BLOCK_M of them, or one.
        diagonal_rows: tl.constexpr = (BLOCK_N + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        dk, dv = _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, l_base, d_base, DESC_Q, DESC_DO, DESC_LSE2,
                                   DESC_DELTA, pid_bh, z, h, stride_qn, stride_dn, cols, start_n,
                                   tl.minimum(start_n + diagonal_rows, N_Q), N_Q, qk_scale,
                                   HEAD_DIM, BLOCK_D, BLOCK_M, True, CAUSAL, TMA, WS, OVERLAP)
        start = start_n + diagonal_rows
    else:
        start = 0
    # Whole query tiles from `start` run unmasked, the ragged rest masked.
    full_rows = start + (tl.maximum(N_Q - start, 0) // BLOCK_M) * BLOCK_M
    dk, dv = _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, l_base, d_base, DESC_Q, DESC_DO, DESC_LSE2,
                               DESC_DELTA, pid_bh, z, h, stride_qn, stride_dn, cols, start, full_rows, N_Q, qk_scale,
                               HEAD_DIM, BLOCK_D, BLOCK_M, False, CAUSAL, TMA, WS, OVERLAP)
    dk, dv = _dkdv_query_tiles(dk, dv, k, v, q_base, do_base, l_base, d_base, DESC_Q, DESC_DO, DESC_LSE2,
                               DESC_DELTA, pid_bh, z, h, stride_qn, stride_dn, cols, tl.maximum(start, full_rows),
                               N_Q, N_Q, qk_scale,
                               HEAD_DIM, BLOCK_D, BLOCK_M, True, CAUSAL, TMA, WS, OVERLAP)

    g_off = off_z * stride_gz + off_h * stride_gh
    store_tile(DK + g_off, (dk * sm_scale).to(DK.dtype.element_ty), cols, N_K, stride_gn, HEAD_DIM, BLOCK_D)
    store_tile(DV + g_off, dv.to(DV.dtype.element_ty), cols, N_K, stride_gn, HEAD_DIM, BLOCK_D)


@triton.jit
def _dq_key_tiles(dq, q, do, lse2, delta, k_base, v_base, desc_k, desc_v, z, h, stride_kn, stride_vn, rows,
                  start, stop, N_K, qk_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                  MASKED: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr):
    """Accumulate the dQ of one query tile over key tiles [start, stop)."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(start, stop, BLOCK_N, warp_specialize=WS):
        cols = start_n + offs_n
        k = load_rows(desc_k, k_base, z, h, start_n, N_K, stride_kn, BLOCK_N, HEAD_DIM, BLOCK_D, MASKED, TMA)
        v = load_rows(desc_v, v_base, z, h, start_n, N_K, stride_vn, BLOCK_N, HEAD_DIM, BLOCK_D, MASKED, TMA)
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
    Q, K, V, DO, LSE2, Delta, DQ, DESC_Q, DESC_K, DESC_V, DESC_DO,
    stride_qz, stride_qh, stride_qn,
    stride_kz, stride_kh, stride_kn,
    stride_vz, stride_vh, stride_vn,
    stride_dz, stride_dh, stride_dn,
    stride_gz, stride_gh, stride_gn,
    H, N_Q, N_K, qk_scale, sm_scale, SEQ_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr, HEAD_FIRST: tl.constexpr, REGS: tl.constexpr,
    HEAD_GROUP: tl.constexpr,
):
    """dQ for one (query tile, batch·head), key tiles split as in the forward (BLOCK_M % BLOCK_N == 0)."""
    qk_scale, sm_scale = scale_fp32(qk_scale), scale_fp32(sm_scale)
    pid_bh, z, h, off_z, off_h = program_head(H, HEAD_FIRST, HEAD_GROUP)
    start_m = query_tile_index(CAUSAL, HEAD_FIRST, HEAD_GROUP) * BLOCK_M
    rows = start_m + tl.arange(0, BLOCK_M)

    q = load_rows(DESC_Q, Q + off_z * stride_qz + off_h * stride_qh, z, h, start_m, N_Q, stride_qn, BLOCK_M,
                  HEAD_DIM, BLOCK_D, True, TMA)
    do = load_rows(DESC_DO, DO + off_z * stride_dz + off_h * stride_dh, z, h, start_m, N_Q, stride_dn, BLOCK_M,
                   HEAD_DIM, BLOCK_D, True, TMA)
    q, do = register_operand(q, REGS), register_operand(do, REGS)
    lse2 = tl.load(LSE2 + stat_offset(pid_bh, N_Q) + rows, mask=rows < N_Q, other=0.0)
    delta = tl.load(Delta + stat_offset(pid_bh, N_Q) + rows, mask=rows < N_Q, other=0.0)
    k_base = K + off_z * stride_kz + off_h * stride_kh
    v_base = V + off_z * stride_vz + off_h * stride_vh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    unmasked_stop, stop = key_ranges(start_m, N_K, BLOCK_M, BLOCK_N, CAUSAL)
    dq = _dq_key_tiles(dq, q, do, lse2, delta, k_base, v_base, DESC_K, DESC_V, z, h, stride_kn, stride_vn, rows,
                       0, unmasked_stop, N_K, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_N, False, CAUSAL, TMA, WS)
    dq = _dq_key_tiles(dq, q, do, lse2, delta, k_base, v_base, DESC_K, DESC_V, z, h, stride_kn, stride_vn, rows,
                       unmasked_stop, stop, N_K, qk_scale, HEAD_DIM, BLOCK_D, BLOCK_N, True, CAUSAL, TMA, WS)

    g_off = off_z * stride_gz + off_h * stride_gh
    store_tile(DQ + g_off, (dq * sm_scale).to(DQ.dtype.element_ty), rows, N_Q, stride_gn, HEAD_DIM, BLOCK_D)


# Resident: K and V (dK/dV) or Q and dO (dQ); streamed: the other pair. Interpreter tiles: small, and two
# streamed tiles per resident one so the causal diagonal spans two tiles.
PREPROCESS = Kernel(_flash_attn_bwd_preprocess_kernel)
DKDV = Kernel(_flash_attn_bwd_dkdv_kernel, DKDV_SHAPES,
              smem_pruner(resident=("BLOCK_N", "BLOCK_N"), streamed=("BLOCK_M", "BLOCK_M")),
              interpret_blocks={"BLOCK_M": 16, "BLOCK_N": 32, "WS": False, "HEAD_FIRST": False, "OVERLAP": False,
                               "REGS": False},
              role="dkdv")
DQ = Kernel(_flash_attn_bwd_dq_kernel, DQ_SHAPES,
            smem_pruner(resident=("BLOCK_M", "BLOCK_M"), streamed=("BLOCK_N", "BLOCK_N"), order_by_shape=True),
            interpret_blocks={"BLOCK_M": 32, "BLOCK_N": 16, "WS": False, "HEAD_FIRST": False, "REGS": False},
            role="dq")


def statistics(o4: torch.Tensor, do4: torch.Tensor, lse: torch.Tensor, signature: tuple | None,
               options: FlashOptions | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The D pre-pass over (Z, H, N_Q, d) views of O and dO and the forward's fp32 L: LSE2 and Delta, fp32
    (Z·H, stat_rows(N_Q)) arrays that every backward kernel reads. Without a `signature` (a traced call,
    `fwd.flash_forward`) it launches through `Kernel.launch_traced`."""
    z, h, n_q, d = o4.shape
    lse = lse.reshape(z * h, n_q)
    delta = torch.empty((z * h, stat_rows(n_q)), dtype=torch.float32, device=o4.device)
    lse2 = torch.empty_like(delta)
    options = options or FlashOptions()
    if signature is not None and PREPROCESS.planned(signature, (o4, do4, lse, delta, lse2), options):
        return lse2, delta
    launch = (lambda meta: (triton.cdiv(n_q, PREPROCESS_BLOCK_M), z * h),
              (o4, do4, lse, delta, lse2, *strides3(o4), *strides3(do4), h, n_q),
              {"HEAD_DIM": d, "BLOCK_D": block_d(d), "BLOCK_M": PREPROCESS_BLOCK_M})
    if signature is None:
        PREPROCESS.launch_traced(*launch)
    else:
        PREPROCESS(*launch, signature, options=options)
    return lse2, delta


def backward_signature(causal: bool, tma: bool, *tensors: torch.Tensor) -> tuple:
    """The direct-launch signature of a backward call (`launcher.tensor_signature`)."""
    return (causal, tma, *map(tensor_signature, tensors))


def flash_backward(
    q4: torch.Tensor,
    k4: torch.Tensor,
    v4: torch.Tensor,
    o4: torch.Tensor,
    lse: torch.Tensor,
    do4: torch.Tensor,
    causal: bool,
    tma: bool | None = None,
    configs_by_kernel: dict[str, triton.Config] | None = None,
    options: FlashOptions | None = None,
    traced: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, LaunchRecord]:
    """The split backward on (Z, H, seq, d) views of q, k, v, o and dO, from the forward's fp32 L: the D
    pre-pass, then the dK/dV and dQ kernels.

    `tma` as in `fwd.flash_forward`. `configs_by_kernel` pins a config per kernel name ("dkdv", "dq") instead of
    autotuning, for tuning sweeps. `traced` as in `fwd.flash_forward`. Returns dQ, dK, dV as contiguous
    (Z, H, seq, d) tensors in the input dtype, and the launch record.
    """
    z, h, n_q, d = q4.shape
    n_k = k4.shape[2]
    if traced:
        tma = False
    elif tma is None:
        tma = not INTERPRET and tma_usable(q4, k4, v4, do4)
    pinned = configs_by_kernel or {}
    options = options or FlashOptions()
    signature = None if traced else backward_signature(causal, tma, q4, k4, v4, o4, do4, lse)
    lse2, delta = statistics(o4, do4, lse, signature, options)
    dq = torch.empty((z, h, n_q, d), dtype=q4.dtype, device=q4.device)
    dk = torch.empty((z, h, n_k, d), dtype=k4.dtype, device=k4.device)
    dv = torch.empty_like(dk)
    descs = descriptors(q4, k4, v4, do4) if tma else [None] * 4
    stat_descs = row_descriptors(lse2[:, :n_q], delta[:, :n_q]) if tma else [None] * 2
    dkdv_plan = dq_plan = None
    if signature is not None and not pinned:
        dkdv_plan = DKDV.planned(signature, (q4, k4, v4, do4, lse2, delta, dk, dv, *descs, *stat_descs), options)
        dq_plan = DQ.planned(signature, (q4, k4, v4, do4, lse2, delta, dq, *descs), options)
        if dkdv_plan is not None and dq_plan is not None:
            return dq, dk, dv, dkdv_plan.record + dq_plan.record
    common = (*strides3(q4), *strides3(k4), *strides3(v4), *strides3(do4))
    scalars = (h, n_q, n_k, LOG2E / math.sqrt(d), 1.0 / math.sqrt(d), seq_bucket(max(n_q, n_k)))
    consts = {"HEAD_DIM": d, "BLOCK_D": block_d(d), "CAUSAL": causal, "TMA": tma, "HEAD_GROUP": head_group(causal)}
    dkdv_args = (q4, k4, v4, do4, lse2, delta, dk, dv, *descs, *stat_descs, *common, *strides3(dk), *scalars)
    dq_args = (q4, k4, v4, do4, lse2, delta, dq, *descs, *common, *strides3(dq), *scalars)
    dkdv_grid = lambda meta: grid_2d(triton.cdiv(n_k, meta["BLOCK_N"]), z * h, meta)
    dq_grid = lambda meta: grid_2d(triton.cdiv(n_q, meta["BLOCK_M"]), z * h, meta)
    if traced:
        dkdv_config = DKDV.launch_traced(dkdv_grid, dkdv_args, consts, options)
        dq_config = DQ.launch_traced(dq_grid, dq_args, consts, options)
    else:
        # A kernel whose plan already ran above is not launched again.
        dkdv_config = dkdv_plan.config if dkdv_plan else DKDV(dkdv_grid, dkdv_args, consts, signature,
                                                              pinned.get("dkdv"), options)
        dq_config = dq_plan.config if dq_plan else DQ(dq_grid, dq_args, consts, signature, pinned.get("dq"), options)
    return dq, dk, dv, record("dkdv", dkdv_config) + record("dq", dq_config)


# The tuned Triton kernels by the names launch records, pinned configs and `machine_code.compile_sm90` use.
KERNELS = {"fwd": FWD, "dkdv": DKDV, "dq": DQ}


def tuned_configs() -> dict[str, dict]:
    """Per tuned Triton kernel, the autotuner's chosen config for each tuning key seen in this process."""
    return {kernel.fn.__name__: kernel.tuning_cache() for kernel in KERNELS.values()}
