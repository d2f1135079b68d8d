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
would only time the interpreter.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable

import torch
import triton
import triton.language as tl

try:  # Triton ≥ 3.4; without it every tile moves through pointers.
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - depends on the installed Triton
    TensorDescriptor = None

# Read once, like Triton itself does when @triton.jit runs.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
LOG2E = math.log2(math.e)
# ln(2) turns a base-2 logsumexp into a natural one inside kernels.
_LN2: tl.constexpr = tl.constexpr(math.log(2.0))
_LOG2E: tl.constexpr = tl.constexpr(LOG2E)

# Sequence lengths up to this share one tuning (short runs are dominated by launch overhead anyway);
# lengths past the cap reuse the cap's tuning.
SEQ_BUCKET_MIN = 1024
SEQ_BUCKET_MAX = 16384
# Shared memory one block may use on H100 (227 KiB); configs estimated above it are not compiled at all.
SMEM_BUDGET_BYTES = 227 * 1024
AUTOTUNE_ENV = "PROFILER_KIT_FLASH_AUTOTUNE"


def seq_bucket(n: int) -> int:
    """The autotune bucket of a sequence length: a power of two in [SEQ_BUCKET_MIN, SEQ_BUCKET_MAX]."""
    return min(triton.next_power_of_2(max(n, SEQ_BUCKET_MIN)), SEQ_BUCKET_MAX)


def block_d(head_dim: int) -> int:
    """The tile's head dim: the next power of two ≥ d (tl.arange and tl.dot need powers of two ≥ 16)."""
    return max(triton.next_power_of_2(head_dim), 16)


def as_4d(t: torch.Tensor) -> torch.Tensor:
    """View `(..., seq, d)` as (Z, H, seq, d) with a contiguous last dim; copies only when it must."""
    if t.stride(-1) != 1:
        t = t.contiguous()
    if t.dim() == 2:
        return t[None, None]
    if t.dim() == 3:
        return t[:, None]
    return t.reshape(-1, *t.shape[-3:])


def strides3(t: torch.Tensor) -> tuple[int, int, int]:
    """The Z, H and seq strides of a (Z, H, seq, d) tensor (the d stride is 1)."""
    return t.stride(0), t.stride(1), t.stride(2)


def ws_allowed(elem_bytes: int, head_dim: int, tma: bool) -> bool:
    """Where warp-specialised configs are offered: the only case where they compiled and won a tuning sweep
    (Triton 3.6, H100: 16-bit, d = 128, TMA loads, 8 warps). Elsewhere they are pruned, because a config
    that fails to compile (the 4-warp ones did) would end the autotuner's run instead of losing to the others."""
    return elem_bytes == 2 and head_dim == 128 and tma


def smem_pruner(resident: tuple[str, ...], streamed: tuple[str, ...]) -> Callable:
    """An `early_config_prune` keeping the configs whose tiles fit in SMEM_BUDGET_BYTES (and warp-specialised
    ones only where `ws_allowed`).

    `resident` names the block sizes of the (rows × BLOCK_D) tiles a program loads once, `streamed` those the
    pipeliner keeps `num_stages` copies of. For these kernels the estimate equals Triton's allocation for the
    forward and over-counts the backward a little; Triton rejects (OutOfResources) whatever slips through.
    """

    def smem_bytes(config: triton.Config, elem: int, width: int) -> int:
        once = sum(config.kwargs[r] for r in resident)
        pipelined = config.num_stages * sum(config.kwargs[r] for r in streamed)
        return (once + pipelined) * width * elem

    def prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
        elem, width = named_args["Q"].element_size(), block_d(kwargs["HEAD_DIM"])
        if not ws_allowed(elem, kwargs["HEAD_DIM"], kwargs["TMA"]):
            configs = [c for c in configs if not c.kwargs["WS"]]
        kept = [c for c in configs if smem_bytes(c, elem, width) <= SMEM_BUDGET_BYTES]
        # The autotuner refuses an empty list: fall back to the smallest config.
        return kept or [min(configs, key=lambda c: smem_bytes(c, elem, width))]

    return prune


def launch(tuned, pruner: Callable, interpret_blocks: dict, grid: Callable[[dict], tuple], args: tuple,
           consts: dict, config: triton.Config | None = None) -> None:
    """Run an autotuned kernel: tuned, on one config (`config`, or with autotuning off the first that fits),
    or interpreted on fixed blocks.

    `pruner` is the kernel's `smem_pruner`; `grid` maps the block sizes of a config to the launch grid. A
    config's pre_hook (it sizes TMA descriptors) runs whichever way the kernel is launched.
    """
    kernel = tuned.fn
    if config is None and not INTERPRET and os.environ.get(AUTOTUNE_ENV, "1") != "0":
        tuned[grid](*args, **consts)  # the common path: nothing more to do per call
        return
    nargs = dict(zip(kernel.arg_names, args, strict=False))
    if INTERPRET:
        config = triton.Config(interpret_blocks)
    elif config is None:
        config = pruner(tuned.configs, nargs, **consts)[0]
    meta = config.kwargs
    # Every config of a tuned kernel shares one pre_hook; a config pinned by the caller may not carry it.
    pre_hook = tuned.configs[0].pre_hook
    if pre_hook is not None:
        pre_hook({**nargs, **consts, **meta})
    options = {} if INTERPRET else {"num_warps": config.num_warps, "num_stages": config.num_stages}
    kernel[grid(meta)](*args, **consts, **meta, **options)


@triton.jit
def program_head(H):
    """This program's batch·head index (grid axis 1) and its (z, h): int32 for descriptor offsets, int64 for
    pointer offsets, which can pass 2³¹ elements."""
    pid_bh = tl.program_id(1)
    z = pid_bh // H
    h = pid_bh % H
    return pid_bh, z, h, z.to(tl.int64), h.to(tl.int64)


@triton.jit
def query_tile_index(CAUSAL: tl.constexpr):
    """Grid axis 0 as a query tile index, last-first when causal so that the longest programs start first."""
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        pid_m = tl.program_id(0)
    return pid_m


@triton.jit
def key_ranges(start_m, N_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """How a query tile starting at row start_m walks the keys: tiles [0, unmasked_stop) need no mask, tiles
    [unmasked_stop, stop) do (the ragged last one and, when causal, those crossing the diagonal), keys past
    stop are not visited. Returns (unmasked_stop, stop)."""
    full_keys = (N_K // BLOCK_N) * BLOCK_N
    if CAUSAL:
        unmasked_stop = tl.minimum(start_m, full_keys)
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
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr,
):
    """One program per (query tile, batch·head): O = softmax(q kᵀ/√d) v and L = logsumexp of each row.

    With TMA the tiles move through the DESC_* descriptors (see `load_rows`), else through pointers.

    Causal: key tiles wholly above the diagonal are never visited, tiles wholly below it run unmasked and only
    the BLOCK_M / BLOCK_N tiles on the diagonal pay for the mask (needs BLOCK_M % BLOCK_N == 0). Query tiles
    are taken last-first when causal so that the longest programs start first. SEQ_BUCKET is never read: it
    only keys the autotuner.
    """
    pid_bh, z, h, off_z, off_h = program_head(H)
    start_m = query_tile_index(CAUSAL) * BLOCK_M
    rows = start_m + tl.arange(0, BLOCK_M)

    q_base = Q + off_z * stride_qz + off_h * stride_qh
    k_base = K + off_z * stride_kz + off_h * stride_kh
    v_base = V + off_z * stride_vz + off_h * stride_vh
    q = load_rows(DESC_Q, q_base, z, h, start_m, N_Q, stride_qn, BLOCK_M, HEAD_DIM, BLOCK_D, True, TMA)

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


# Each descriptor argument's block is (1, 1, rows, BLOCK_D), with rows the block size named here.
_DESCRIPTOR_ROWS = {"DESC_Q": "BLOCK_M", "DESC_O": "BLOCK_M", "DESC_DO": "BLOCK_M", "DESC_K": "BLOCK_N",
                    "DESC_V": "BLOCK_N"}


def size_descriptors(nargs: dict) -> None:
    """Give the TMA descriptors among a launch's arguments the block shape of the config about to run.

    A config pre_hook: the descriptors are made once per call, before the autotuner picks block sizes.
    """
    for name, rows in _DESCRIPTOR_ROWS.items():
        if nargs.get(name) is not None:
            nargs[name].block_shape = [1, 1, nargs[rows], nargs["BLOCK_D"]]


def configs(shapes: list[tuple]) -> list[triton.Config]:
    """Autotune configs from (BLOCK_M, BLOCK_N, warps, stages[, warp-specialised]) tuples.

    Warp specialisation (WS) splits a key/query loop between producer warps issuing the loads and consumer
    warps doing the math, where Triton can partition it; off unless a tuple says so.
    """
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n, "WS": bool(ws and ws[0])}, num_warps=w, num_stages=s,
                      pre_hook=size_descriptors)
        for m, n, w, s, *ws in shapes
    ]


@functools.cache
def _has_tma(device: torch.device) -> bool:
    """Compute capability 9.0+ (asked once per device: this sits on every attention call's path)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def tma_usable(*tensors: torch.Tensor) -> bool:
    """Whether the kernels may move these tensors' tiles by TMA: a GPU of compute capability 9.0+ (or the
    interpreter), Triton's TensorDescriptor, 16-bit data (fp32 configs already fill shared memory without
    TMA's buffers) and 16-byte aligned base pointers and strides."""
    first = tensors[0]
    if TensorDescriptor is None or first.element_size() != 2 or not (INTERPRET or _has_tma(first.device)):
        return False
    return all(
        t.data_ptr() % 16 == 0 and all(stride > 0 and stride * t.element_size() % 16 == 0 for stride in t.stride()[:-1])
        for t in tensors
    )


def descriptors(*tensors: torch.Tensor) -> list:
    """A TMA descriptor per (Z, H, seq, d) tensor; block shapes are set per launch by `size_descriptors`."""
    return [TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, 16, 16]) for t in tensors]


# Most preferred first (the default without autotuning). The first four won `scripts/flash_tune.py` on the
# H100 (bf16, d = 64 and 128): 128-row query tiles keep the tensor cores busy, and 8 warps hold 128×128 score
# tiles and d = 128 accumulators without spilling (4 warps on 128-row tiles ran ~1.6× slower at d = 128).
# The two-stage and 64-row configs keep fp32 at d = 128 within shared memory.
_FWD_SHAPES = [
    (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2),
    (64, 64, 4, 3), (128, 64, 4, 3), (128, 64, 4, 2), (64, 64, 4, 2),
]
TUNING_KEY = ["HEAD_DIM", "CAUSAL", "TMA", "SEQ_BUCKET"]

_fwd_pruner = smem_pruner(resident=("BLOCK_M",), streamed=("BLOCK_N", "BLOCK_N"))
_fwd_tuned = triton.autotune(
    configs=configs(_FWD_SHAPES), key=TUNING_KEY, prune_configs_by={"early_config_prune": _fwd_pruner}
)(_flash_attn_fwd_kernel)

# Interpreter tiles: small (fast on CPU) yet with BLOCK_M = 2·BLOCK_N, so the causal diagonal spans two tiles.
_FWD_INTERPRET_BLOCKS = {"BLOCK_M": 32, "BLOCK_N": 16, "WS": False}


def flash_forward(
    q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, causal: bool, config: triton.Config | None = None,
    tma: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward on (Z, H, seq, d) views: (O, contiguous (Z, H, N_Q, d), and fp32 L (Z·H, N_Q)).

    `config` pins the block sizes, warps and stages instead of autotuning (for tuning sweeps). `tma` picks
    descriptor (True) or pointer (False) loads; by default TMA wherever `tma_usable` allows it, except in the
    interpreter, where tests choose.
    """
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
    consts = {"HEAD_DIM": d, "BLOCK_D": block_d(d), "CAUSAL": causal, "TMA": tma}
    grid = lambda meta: (triton.cdiv(n_q, meta["BLOCK_M"]), z * h)
    launch(_fwd_tuned, _fwd_pruner, _FWD_INTERPRET_BLOCKS, grid, args, consts, config)
    return out, lse


def tuned_configs() -> dict[str, dict]:
    """The autotuner's choice per tuning key so far, for each tuned kernel of this module."""
    return {"_flash_attn_fwd_kernel": dict(_fwd_tuned.cache)}


def last_configs() -> dict[str, triton.Config | None]:
    """The config each tuned kernel of this module ran last through its autotuner (None before any)."""
    return {"fwd": getattr(_fwd_tuned, "best_config", None)}
