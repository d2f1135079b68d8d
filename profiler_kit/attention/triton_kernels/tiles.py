"""The tile helpers the Triton attention kernels share: how programs map to tiles and heads, and how tiles
are loaded and stored.

Layout. Inputs arrive as `(..., seq, d)`; `as_4d` views them as (Z, H, seq, d) without copying when the
strides allow (the model's permuted (batch, heads, seq, d) q/k/v included) and the kernels take the Z and H
strides separately, so folding heads into the batch costs nothing. The last dim must be contiguous.

Loads. On GPUs with TMA (compute capability 9.0+) 16-bit tiles move through (Z, H, seq, d) tensor
descriptors: one bulk copy per tile, with the zero fill of ragged rows and padded columns done by the
hardware (`load_rows`). Elsewhere, and for fp32, tiles are loaded through pointers.

Head dims. The tile's head dim BLOCK_D is the next power of two ≥ d; when d is not a power of two loads and
stores are masked along d and the padded columns are zeros, which add nothing to q·k or p·v.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from profiler_kit.attention.options import INTERPRET
from profiler_kit.attention.triton_kernels.configs import LOG2E

# ln(2) turns a base-2 logsumexp into a natural one inside kernels.
_LN2: tl.constexpr = tl.constexpr(math.log(2.0))
_LOG2E: tl.constexpr = tl.constexpr(LOG2E)
# The interpreter runs no inline PTX (`register_operand`).
_INTERPRETED: tl.constexpr = tl.constexpr(INTERPRET)

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
def scale_fp32(scale):
    """A float scalar argument as fp32: Inductor passes Python floats to the kernels it launches as fp64, which
    would carry fp64 through the softmax (and break `tl.dot`'s fp32 accumulator); Triton's own launcher
    already passes fp32, for which this is a no-op."""
    return tl.cast(scale, tl.float32)


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
    the L2 (`configs.head_group`)."""
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
    copy makes a loaded tile count as computed, which frees shared-memory bandwidth: at 64×64×16 an SS wgmma
    reads as much shared memory per clock as the SM delivers."""
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
