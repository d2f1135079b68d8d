"""FlashAttention-2 forward in Triton, and the tile helpers and launch plumbing the backward shares.

Layout. Inputs arrive as `(..., seq, d)`; `as_4d` views them as (Z, H, seq, d) without copying when the
strides allow (the model's permuted (batch, heads, seq, d) q/k/v included) and the kernels take the Z and H
strides separately, so folding heads into the batch costs nothing. The last dim must be contiguous.

Loads. On GPUs with TMA (compute capability 9.0+) 16-bit tiles move through (Z, H, seq, d) tensor
descriptors: one bulk copy per tile, with the zero fill of ragged rows and padded columns done by the
hardware (`load_rows`). Best config against best config, that took the bf16 d = 128 forward on the H100 from
0.647 to 0.591 ms (causal, N = 4096) and from 4.44 to 3.97 ms (non-causal, N = 8192); see
docs/results/attention-h100.md. Elsewhere, and for fp32, tiles are loaded through pointers.

Head dims. The tile's head dim BLOCK_D is the next power of two ≥ d; when d is not a power of two (80 for the
2.7B preset) loads and stores are masked along d and the padded columns are zeros, which add nothing to q·k or
p·v. Powers of two take unmasked loads.

Precision. `tl.dot` takes bf16/fp16 operands and accumulates in fp32; the probabilities are cast to the
input dtype before p·v, as in FlashAttention-2. fp32 inputs run tl.dot at Triton's default precision, which
is TF32 on Ampere and later (10-bit mantissa): expect ~1e-3 relative error against float64, not ~1e-6.

Softmax. Scores are kept in base-2 units: qk_scale = log2(e)/√d folds the softmax scale into exp2, so each
score costs one FMA and one exp2. The saved logsumexp L is in natural-log units (it is part of the API).

Tuning. Block sizes, warps, stages and (backward, d = 128) warp specialisation come from `triton.autotune`,
keyed on the head dim, causal flag, TMA use, dtypes (added by Triton) and a power-of-two bucket of the
sequence length; `scripts/flash_tune.py` times every candidate config and chose the lists. Lengths are
runtime arguments, so a new length does not recompile (beyond Triton's one variant for lengths not divisible
by 16); a new bucket re-times the already compiled configs. The first call per head dim, dtype and causal
flag compiles every config that fits in shared memory (tens of seconds). With
PROFILER_KIT_FLASH_AUTOTUNE=0 each kernel runs the first such config of its list instead (a sound H100
default) and compiles once. Under TRITON_INTERPRET=1 (CPU tests) a small fixed config is used: tuning there
would only time the interpreter. Once a call's shapes have been through the autotuner, later calls with the
same shapes, strides and alignment launch the chosen compiled kernel directly (`flash_triton_launch`).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from profiler_kit.attention import flash_gluon_fwd
from profiler_kit.attention.flash_triton_launch import (
    INTERPRET,
    LOG2E,
    Kernel,
    block_d,
    descriptors,
    grid_2d,
    head_group,
    smem_pruner,
    tensor_signature,
    tma_usable,
)

# ln(2) turns a base-2 logsumexp into a natural one inside kernels.
_LN2: tl.constexpr = tl.constexpr(math.log(2.0))
_LOG2E: tl.constexpr = tl.constexpr(LOG2E)
# The interpreter runs no inline PTX (`register_operand`); tests may patch the launcher's INTERPRET, not this.
_INTERPRETED: tl.constexpr = tl.constexpr(INTERPRET)

# Sequence lengths up to this share one tuning (short runs are dominated by launch overhead anyway);
# lengths past the cap reuse the cap's tuning.
SEQ_BUCKET_MIN = 1024
SEQ_BUCKET_MAX = 16384


def seq_bucket(n: int) -> int:
    """The autotune bucket of a sequence length: a power of two in [SEQ_BUCKET_MIN, SEQ_BUCKET_MAX]."""
    return min(triton.next_power_of_2(max(n, SEQ_BUCKET_MIN)), SEQ_BUCKET_MAX)


def as_4d(t: torch.Tensor) -> torch.Tensor:
    """View `(..., seq, d)` as (Z, H, seq, d) with a contiguous last dim; copies only when it must."""
    if t.stride(-1) != 1:
        t = t.contiguous()
    if t.dim() == 2:
        return t[None, None]
    if t.dim() == 3:
        return t[:, None]
    if t.dim() == 4:
        return t  # a reshape would make the same view again, at a few µs of host time per tensor
    return t.reshape(-1, *t.shape[-3:])


def strides3(t: torch.Tensor) -> tuple[int, int, int]:
    """The Z, H and seq strides of a (Z, H, seq, d) tensor (the d stride is 1)."""
    return t.stride(0), t.stride(1), t.stride(2)


@triton.jit
def grid_position(HEAD_FIRST: tl.constexpr, HEAD_GROUP: tl.constexpr):
    """(tile, tiles, batch·head) of this program. The GPU starts blocks in the order of their linear index,
    axis 0 fastest, so the grid order decides which programs run together and which run last:
    - HEAD_FIRST, a (Z·H, tiles) grid: tile 0 of every head before tile 1 of any;
    - else a (tiles, Z·H) grid, taken in groups of HEAD_GROUP heads: within a group tile 0 of each of its
      heads, then tile 1, and so on; group after group. HEAD_GROUP = 1 is one head's tiles after another's.
    With causal masks a kernel's tiles differ in length (the kernels start the longest first), and only an
    order that interleaves heads ends with the short ones: one head after another ends a causal launch with
    that head's long tiles. Small groups keep what runs together within a few heads' K and V, which stay in
    the L2 (`flash_triton_launch.head_group`)."""
    if HEAD_FIRST:
        tile = tl.program_id(1)
        tiles = tl.num_programs(1)
        bh = tl.program_id(0)
    else:
        tiles = tl.num_programs(0)
        if HEAD_GROUP == 1:
            tile = tl.program_id(0)
            bh = tl.program_id(1)
        else:
            linear = tl.program_id(1) * tiles + tl.program_id(0)
            first = linear // (HEAD_GROUP * tiles) * HEAD_GROUP  # the group's first head
            rest = linear - first * tiles
            size = tl.minimum(tl.num_programs(1) - first, HEAD_GROUP)  # the last group may be smaller
            tile = rest // size
            bh = first + rest % size
    return tile, tiles, bh


@triton.jit
def tile_program(HEAD_FIRST: tl.constexpr, HEAD_GROUP: tl.constexpr):
    """(index, count) of this program's tile along the kernel's tile axis (`grid_position`)."""
    tile, tiles, _ = grid_position(HEAD_FIRST, HEAD_GROUP)
    return tile, tiles


@triton.jit
def program_head(H, HEAD_FIRST: tl.constexpr, HEAD_GROUP: tl.constexpr):
    """This program's batch·head index (`grid_position`) and its (z, h): int32 for descriptor offsets, int64
    for pointer offsets, which can pass 2³¹ elements."""
    _, _, pid_bh = grid_position(HEAD_FIRST, HEAD_GROUP)
    z = pid_bh // H
    h = pid_bh % H
    return pid_bh, z, h, z.to(tl.int64), h.to(tl.int64)


@triton.jit
def query_tile_index(CAUSAL: tl.constexpr, HEAD_FIRST: tl.constexpr, HEAD_GROUP: tl.constexpr):
    """The query tile a program owns, last-first when causal so that the longest programs start first."""
    pid, count = tile_program(HEAD_FIRST, HEAD_GROUP)
    if CAUSAL:
        pid = count - 1 - pid
    return pid


@triton.jit
def key_ranges(start_m, N_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """How a query tile starting at row start_m walks the keys: tiles [0, unmasked_stop) need no mask, tiles
    [unmasked_stop, stop) do (the ragged last one and, when causal, those crossing the diagonal), keys past
    stop are not visited. Returns (unmasked_stop, stop). When causal, the unmasked tiles end at the last whole
    key tile before start_m: with BLOCK_N > BLOCK_M the diagonal can start inside a key tile."""
    full_keys = (N_K // BLOCK_N) * BLOCK_N
    if CAUSAL:
        unmasked_stop = tl.minimum(start_m // BLOCK_N * BLOCK_N, full_keys)
        stop = tl.minimum(start_m + BLOCK_M, N_K)
    else:
        unmasked_stop = full_keys
        stop = N_K
    return unmasked_stop, stop


@triton.jit
def load_tile(base, rows, n_rows, stride_row, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              CHECK_ROWS: tl.constexpr):
    """Load a (len(rows), BLOCK_D) tile; out-of-range rows and padded head-dim columns read as zeros.

    Each mask is applied only when needed: a column mask would stop the loads from being vectorised.
    """
    offs_d = tl.arange(0, BLOCK_D)
    ptrs = base + rows[:, None] * stride_row + offs_d[None, :]
    if HEAD_DIM == BLOCK_D:
        if CHECK_ROWS:
            tile = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
        else:
            tile = tl.load(ptrs)
    else:
        if CHECK_ROWS:
            tile = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM), other=0.0)
        else:
            tile = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    return tile


@triton.jit
def store_tile(base, tile, rows, n_rows, stride_row, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Store the rows < n_rows and the columns < HEAD_DIM of a (len(rows), BLOCK_D) tile."""
    offs_d = tl.arange(0, BLOCK_D)
    ptrs = base + rows[:, None] * stride_row + offs_d[None, :]
    if HEAD_DIM == BLOCK_D:
        tl.store(ptrs, tile, mask=rows[:, None] < n_rows)
    else:
        tl.store(ptrs, tile, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def load_rows(desc, base, z, h, start, n_rows, stride_row, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr,
              BLOCK_D: tl.constexpr, CHECK_ROWS: tl.constexpr, TMA: tl.constexpr):
    """Rows [start, start + BLOCK) of head (z, h) as a (BLOCK, BLOCK_D) tile, zeros past n_rows and HEAD_DIM.

    TMA: one bulk copy through the (Z, H, seq, d) descriptor `desc`, which fills the zeros in hardware.
    Otherwise: pointer loads from `base`, the head's first row.
    """
    if TMA:
        tile = desc.load([z, h, start, 0]).reshape(BLOCK, BLOCK_D)
    else:
        tile = load_tile(base, start + tl.arange(0, BLOCK), n_rows, stride_row, HEAD_DIM, BLOCK_D, CHECK_ROWS)
    return tile


@triton.jit
def register_operand(tile, REGS: tl.constexpr):
    """`tile`, or with REGS a copy of it made by an opaque identity (one PTX mov per 32 bits), for a resident
    tile used as the first operand of tl.dot in a loop. Triton 3.6 feeds a wgmma's first operand from shared
    memory when the tile was loaded there (the "SS" form) and from registers when it was computed ("RS"); the
    copy makes a loaded tile count as computed. Why (the "regs" config flag, docs/results/attention-h100.md
    step 19): at 64×64×16 an SS wgmma reads 2 KB of each operand per 32 tensor-core clocks, the SM's whole
    shared-memory bandwidth (128 B per clock, derived). On the H100 it made the d = 64 dK/dV kernel 4.3%
    faster and the head-first forward ~2%; the dQ kernel gained nothing."""
    if REGS and not _INTERPRETED:
        tile = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [tile], dtype=tile.dtype, is_pure=True,
                                         pack=32 // tile.dtype.primitive_bitwidth)
    return tile


@triton.jit
def store_rows(desc, base, tile, z, h, start, n_rows, stride_row, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr,
               BLOCK_D: tl.constexpr, TMA: tl.constexpr):
    """Store a (BLOCK, BLOCK_D) tile as rows [start, start + BLOCK) of head (z, h), the counterpart of load_rows;
    rows past n_rows and columns past HEAD_DIM are dropped."""
    if TMA:
        desc.store([z, h, start, 0], tile.reshape(1, 1, BLOCK, BLOCK_D))
    else:
        store_tile(base, tile, start + tl.arange(0, BLOCK), n_rows, stride_row, HEAD_DIM, BLOCK_D)


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


# Most preferred first (the default without autotuning). The first four won `scripts/flash_tune.py` on the
# H100 (bf16, d = 64 and 128): 128-row query tiles keep the tensor cores busy, and 8 warps hold 128×128 score
# tiles and d = 128 accumulators without spilling (4 warps on 128-row tiles ran ~1.6× slower at d = 128).
# The two-stage and 64-row configs keep fp32 at d = 128 within shared memory. The head-first one (a (Z·H,
# tiles) grid) won by 5% on the causal d = 64 leaderboard shape and lost by 8–24% on the d = 128 ones, whose
# 64 heads no longer share the L2 (docs/results/attention-h100.md, step 9): the pruner offers it alone where
# `head_first_wanted` (causal, d ≤ 64) and drops it elsewhere. It feeds q to q·kᵀ from registers ("regs",
# `register_operand`): 1.224–1.225 against 1.241–1.255 ms without, in two sweeps (step 19).
_FWD_SHAPES = [
    (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (128, 64, 8, 3, "head_first", "regs"),
    (64, 64, 4, 3), (128, 64, 4, 3), (128, 64, 4, 2), (64, 64, 4, 2),
]
# Interpreter tiles: small (fast on CPU) yet with BLOCK_M = 2·BLOCK_N, so the causal diagonal spans two tiles.
_fwd = Kernel(_flash_attn_fwd_kernel, _FWD_SHAPES,
              smem_pruner(resident=("BLOCK_M",), streamed=("BLOCK_N", "BLOCK_N"), order_by_shape=True),
              interpret_blocks={"BLOCK_M": 32, "BLOCK_N": 16, "WS": False, "HEAD_FIRST": False, "REGS": False})


def flash_forward(
    q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, causal: bool, config: triton.Config | None = None,
    tma: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward on (Z, H, seq, d) views: (O, contiguous (Z, H, N_Q, d), and fp32 L (Z·H, N_Q)).

    `config` pins the block sizes, warps and stages instead of autotuning (for tuning sweeps). `tma` picks
    descriptor (True) or pointer (False) loads; by default TMA wherever `tma_usable` allows it, except in the
    interpreter, where tests choose. With neither given, the Gluon forward runs instead where
    `flash_gluon_fwd.chosen` picks a config for the call.
    """
    gluon = flash_gluon_fwd.chosen(q4, k4, v4, causal) if config is None and tma is None else None
    if gluon is not None:
        _fwd.last_config = _fwd.last_plan = None  # no Triton launch (and none for the C++ path) this call
        return flash_gluon_fwd.forward(q4, k4, v4, causal, **gluon)
    z, h, n_q, d = q4.shape
    n_k = k4.shape[2]
    out = torch.empty((z, h, n_q, d), dtype=q4.dtype, device=q4.device)
    lse = torch.empty((z * h, n_q), dtype=torch.float32, device=q4.device)
    if tma is None:
        tma = not INTERPRET and tma_usable(q4, k4, v4)
    descs = descriptors(q4, k4, v4, out) if tma else [None] * 4
    args = (
        q4, k4, v4, out, lse, *descs, *strides3(q4), *strides3(k4), *strides3(v4), *strides3(out),
        h, n_q, n_k, LOG2E / math.sqrt(d), seq_bucket(max(n_q, n_k)),
    )
    consts = {"HEAD_DIM": d, "BLOCK_D": block_d(d), "CAUSAL": causal, "TMA": tma, "HEAD_GROUP": head_group(causal)}
    grid = lambda meta: grid_2d(triton.cdiv(n_q, meta["BLOCK_M"]), z * h, meta)
    _fwd(grid, args, consts, (causal, tma, *map(tensor_signature, (q4, k4, v4))), config)
    return out, lse


def tuned_configs() -> dict[str, dict]:
    """The autotuner's choice per tuning key so far, for each tuned kernel of this module."""
    return {"_flash_attn_fwd_kernel": _fwd.tuning_cache()}


def last_configs() -> dict[str, triton.Config | None]:
    """The config each tuned kernel of this module ran last, autotuned or planned (None before any)."""
    return {"fwd": _fwd.last_config}


def last_cpp_specs() -> dict[str, tuple | None]:
    """The C++ launch spec (`flash_cpp.launch_spec`) of the forward's last launch, None where it has none."""
    return {"fwd": _fwd.last_cpp_spec}
