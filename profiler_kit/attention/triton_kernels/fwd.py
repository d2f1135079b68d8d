"""The FlashAttention-2 forward in Triton: the kernel and its launcher.

Precision. `tl.dot` takes bf16/fp16 operands and accumulates in fp32; the probabilities are cast to the
input dtype before p·v, as in FlashAttention-2. fp32 inputs run tl.dot at Triton's default precision, which
is TF32 on Ampere and later (10-bit mantissa): expect ~1e-3 relative error against float64, not ~1e-6.

Softmax. Scores are kept in base-2 units: qk_scale = log2(e)/√d folds the softmax scale into exp2, so each
score costs one FMA and one exp2. The saved logsumexp L is in natural-log units (it is part of the API).

Tuning. Block sizes, warps, stages and flags come from `triton.autotune` over `configs.FWD_SHAPES`, keyed on
the head dim, causal flag, TMA use, dtypes (added by Triton) and a power-of-two bucket of the sequence length.
Lengths are runtime arguments, so a new length does not recompile (beyond Triton's one variant for lengths
not divisible by 16); a new bucket re-times the already compiled configs. The first call per head dim, dtype
and causal flag compiles every config that fits in shared memory (tens of seconds). Under TRITON_INTERPRET=1
a small fixed config is used: tuning there would only time the interpreter.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from profiler_kit.attention.options import INTERPRET, FlashOptions
from profiler_kit.attention.record import LaunchRecord
from profiler_kit.attention.triton_kernels.configs import (
    FWD_SHAPES,
    LOG2E,
    block_d,
    grid_2d,
    head_group,
    seq_bucket,
    smem_pruner,
)
from profiler_kit.attention.triton_kernels.launcher import Kernel, descriptors, record, tensor_signature, tma_usable
from profiler_kit.attention.triton_kernels.tiles import (
    _LN2,
    key_ranges,
    load_rows,
    program_head,
    query_tile_index,
    register_operand,
    scale_fp32,
    store_rows,
    strides3,
)


@triton.jit
def _fwd_key_tiles(acc, m_i, l_i, q, k_base, v_base, desc_k, desc_v, z, h, stride_kn, stride_vn, rows,
                   start, stop, N_K, qk_scale,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                   MASKED: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr, WS: tl.constexpr):
    """Fold key tiles [start, stop) into the running max m_i, sum l_i and accumulator (online softmax).

    MASKED tiles are the ragged last one and, when causal, those crossing the diagonal; others skip masks.
    """
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(start, stop, BLOCK_N, warp_specialize=WS):
        cols = start_n + offs_n
        k = load_rows(desc_k, k_base, z, h, start_n, N_K, stride_kn, BLOCK_N, HEAD_DIM, BLOCK_D, MASKED, TMA)
        v = load_rows(desc_v, v_base, z, h, start_n, N_K, stride_vn, BLOCK_N, HEAD_DIM, BLOCK_D, MASKED, TMA)
        qk = tl.dot(q, tl.trans(k))
        if MASKED:
            visible = cols[None, :] < N_K
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None])
            qk = tl.where(visible, qk, float("-inf"))
        # Every row sees key 0 in the first tile processed, so m_new is finite from then on.
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _flash_attn_fwd_kernel(
    Q, K, V, Out, L, DESC_Q, DESC_K, DESC_V, DESC_O,
    stride_qz, stride_qh, stride_qn,
    stride_kz, stride_kh, stride_kn,
    stride_vz, stride_vh, stride_vn,
    stride_oz, stride_oh, stride_on,
    H, N_Q, N_K, qk_scale, SEQ_BUCKET,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr, HEAD_FIRST: tl.constexpr, REGS: tl.constexpr,
    HEAD_GROUP: tl.constexpr,
):
    """One program per (query tile, batch·head): O = softmax(q kᵀ/√d) v and L = logsumexp of each row.

    With TMA the tiles move through the DESC_* descriptors (see `load_rows`), else through pointers.

    Causal: key tiles wholly above the diagonal are never visited, tiles wholly below it run unmasked and only
    the BLOCK_M / BLOCK_N tiles on the diagonal pay for the mask (needs BLOCK_M % BLOCK_N == 0). Query tiles
    are taken last-first when causal so that the longest programs start first. SEQ_BUCKET is never read: it
    only keys the autotuner.
    """
    qk_scale = scale_fp32(qk_scale)
    pid_bh, z, h, off_z, off_h = program_head(H, HEAD_FIRST, HEAD_GROUP)
    start_m = query_tile_index(CAUSAL, HEAD_FIRST, HEAD_GROUP) * BLOCK_M
    rows = start_m + tl.arange(0, BLOCK_M)

    q_base = Q + off_z * stride_qz + off_h * stride_qh
    k_base = K + off_z * stride_kz + off_h * stride_kh
    v_base = V + off_z * stride_vz + off_h * stride_vh
    q = load_rows(DESC_Q, q_base, z, h, start_m, N_Q, stride_qn, BLOCK_M, HEAD_DIM, BLOCK_D, True, TMA)
    q = register_operand(q, REGS)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    unmasked_stop, stop = key_ranges(start_m, N_K, BLOCK_M, BLOCK_N, CAUSAL)
    acc, m_i, l_i = _fwd_key_tiles(acc, m_i, l_i, q, k_base, v_base, DESC_K, DESC_V, z, h, stride_kn, stride_vn,
                                   rows, 0, unmasked_stop, N_K, qk_scale,
                                   HEAD_DIM, BLOCK_D, BLOCK_N, False, CAUSAL, TMA, WS)
    acc, m_i, l_i = _fwd_key_tiles(acc, m_i, l_i, q, k_base, v_base, DESC_K, DESC_V, z, h, stride_kn, stride_vn,
                                   rows, unmasked_stop, stop, N_K, qk_scale,
                                   HEAD_DIM, BLOCK_D, BLOCK_N, True, CAUSAL, TMA, WS)

    out = (acc / l_i[:, None]).to(Out.dtype.element_ty)
    o_base = Out + off_z * stride_oz + off_h * stride_oh
    store_rows(DESC_O, o_base, out, z, h, start_m, N_Q, stride_on, BLOCK_M, HEAD_DIM, BLOCK_D, TMA)
    lse = (m_i + tl.math.log2(l_i)) * _LN2
    tl.store(L + pid_bh.to(tl.int64) * N_Q + rows, lse, mask=rows < N_Q)


# Interpreter tiles: small (fast on CPU) yet with BLOCK_M = 2·BLOCK_N, so the causal diagonal spans two tiles.
FWD = Kernel(_flash_attn_fwd_kernel, FWD_SHAPES,
             smem_pruner(resident=("BLOCK_M",), streamed=("BLOCK_N", "BLOCK_N"), order_by_shape=True),
             interpret_blocks={"BLOCK_M": 32, "BLOCK_N": 16, "WS": False, "HEAD_FIRST": False, "REGS": False},
             role="fwd")


def flash_forward(
    q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, causal: bool, config: triton.Config | None = None,
    tma: bool | None = None, options: FlashOptions | None = None, traced: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, LaunchRecord]:
    """Launch the forward on (Z, H, seq, d) views: O (contiguous (Z, H, N_Q, d)), the fp32 L (Z·H, N_Q) and
    the launch record.

    `config` pins the block sizes, warps and stages instead of autotuning (for tuning sweeps). `tma` picks
    descriptor (True) or pointer (False) loads; by default TMA wherever `tma_usable` allows it, except in the
    interpreter, where tests choose. `traced` (torch.compile is tracing the call, `attention.op`): pointer loads,
    launched through `Kernel.launch_traced`.
    """
    z, h, n_q, d = q4.shape
    n_k = k4.shape[2]
    out = torch.empty((z, h, n_q, d), dtype=q4.dtype, device=q4.device)
    lse = torch.empty((z * h, n_q), dtype=torch.float32, device=q4.device)
    if traced:
        tma = False
    elif tma is None:
        tma = not INTERPRET and tma_usable(q4, k4, v4)
    descs = descriptors(q4, k4, v4, out) if tma else [None] * 4
    options = options or FlashOptions()
    signature = None if traced else (causal, tma, *map(tensor_signature, (q4, k4, v4)))
    plan = None if traced or config is not None else FWD.planned(signature, (q4, k4, v4, out, lse, *descs), options)
    if plan is not None:
        return out, lse, plan.record
    args = (
        q4, k4, v4, out, lse, *descs, *strides3(q4), *strides3(k4), *strides3(v4), *strides3(out),
        h, n_q, n_k, LOG2E / math.sqrt(d), seq_bucket(max(n_q, n_k)),
    )
    consts = {"HEAD_DIM": d, "BLOCK_D": block_d(d), "CAUSAL": causal, "TMA": tma, "HEAD_GROUP": head_group(causal)}
    grid = lambda meta: grid_2d(triton.cdiv(n_q, meta["BLOCK_M"]), z * h, meta)
    if traced:
        ran = FWD.launch_traced(grid, args, consts, options)
    else:
        ran = FWD(grid, args, consts, signature, config, options)
    return out, lse, record("fwd", ran)
