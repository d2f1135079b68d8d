"""The FlashAttention forward in Gluon, warp-specialised the way FlashAttention-3 arranges it on Hopper.

An 8-warp Triton block issues both warp groups' work in one instruction stream, so each one's exp2 waits for
the same matmuls. This kernel splits a 128-row query block between two consumer warp groups of 64 rows each
and feeds them from a producer warp:

- the producer warp streams K and V tiles by TMA into a ring of STAGES slots; both consumers share them, and
  a slot is refilled once both have released it;
- inside a consumer, per key tile j: issue S_j = Q Kⱼᵀ and the previous tile's O += P_{j−1} V_{j−1}, wait for
  S_j alone, run the online softmax on it while P_{j−1} V_{j−1} is still on the tensor cores, then wait for
  that, rescale O and release tile j−1's slot. Nothing stays in flight across the loop's back edge (ptxas
  serialises every wgmma otherwise);
- PINGPONG makes the two consumers issue their matmuls in turn (two mbarriers passed back and forth), so that
  one warp group's exp2 runs while the other's matmuls do.

The math follows `triton_kernels.fwd`: scores in base-2 units (qk_scale = log2(e)/√d), the probabilities cast
to the input dtype before P·V, O divided by the row sum at the end, L saved in natural-log units. Rows and
keys are read through (Z·H·N, d) views, so a tile reaching past N reads the next head's rows: keys past N_K
are masked out of the scores, and rows past N_Q are computed and not stored.

Scope: 16-bit, contiguous (Z, H, N, d) q, k, v with d ∈ {64, 128}, on compute capability 9.x with Triton's
Gluon; `common.usable` says whether a call qualifies, `dispatch` whether it runs.
"""

from __future__ import annotations

import math

import torch
import triton

from profiler_kit.attention.gluon_kernels.common import compile_gluon, gluon, tile_descriptor
from profiler_kit.attention.options import GluonForwardConfig
from profiler_kit.attention.record import KernelLaunch, LaunchRecord
from profiler_kit.attention.triton_kernels.configs import LOG2E, head_group

# Rows per consumer warp group: one wgmma M of 64 per warp group of 4 warps.
GROUP_ROWS = 64
# Launch register cap: 12 warps (two 4-warp consumers and the producer, padded to a warp group) × 168 fit
# the SM's 64K registers. `warp_specialize` then reassigns them with `setmaxnreg`: the producer gets
# PRODUCER_REGS (the least allowed), the worker consumer CONSUMER_REGS and the default partition (the other
# consumer) 256 in Triton 3.6, which uses up the 3 × 168 exactly; a larger CONSUMER_REGS would ask for more
# registers than the block holds.
LAUNCH_MAXNREG = 168
CONSUMER_REGS = 224
PRODUCER_REGS = 24

if gluon is not None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from profiler_kit.attention.gluon_kernels.common import tma_load, wgmma_layout

    _REGS = gl.constexpr([CONSUMER_REGS, PRODUCER_REGS])
    _LN2 = gl.constexpr(math.log(2.0))

    @gluon.jit
    def _block_position(CAUSAL: gl.constexpr, HEAD_GROUP: gl.constexpr):
        """(query block, batch·head) of this program on a (blocks, Z·H) grid, in the order of
        `triton_kernels.tiles.grid_position` (tiles-first, in groups of HEAD_GROUP heads), last block first when
        causal so that the longest programs start first."""
        blocks = gl.num_programs(0)
        linear = gl.program_id(1) * blocks + gl.program_id(0)
        first = linear // (HEAD_GROUP * blocks) * HEAD_GROUP
        size = gl.minimum(gl.num_programs(1) - first, HEAD_GROUP)
        block = (linear - first * blocks) // size
        if CAUSAL:
            block = blocks - 1 - block
        return block, first + (linear - first * blocks) % size

    @gluon.jit
    def _kv_producer(desc_k, desc_v, k_s, v_s, k_ready, v_ready, empty, kv_row0, n_tiles,
                     BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
        """Producer warp: key tile j goes into slot j % STAGES once both consumers have released it."""
        for j in range(n_tiles):
            slot = j % STAGES
            mbarrier.wait(empty.index(slot), ((j // STAGES) & 1) ^ 1)
            mbarrier.expect(k_ready.index(slot), desc_k.block_type.nbytes)
            tma_load(desc_k, [kv_row0 + j * BLOCK_N, 0], k_ready.index(slot), k_s.index(slot))
            mbarrier.expect(v_ready.index(slot), desc_v.block_type.nbytes)
            tma_load(desc_v, [kv_row0 + j * BLOCK_N, 0], v_ready.index(slot), v_s.index(slot))

    @gluon.jit
    def _consumer(q_s, k_s, v_s, q_bar, k_ready, v_ready, empty, my_turn, their_turn, Out, L, pid_bh, row0,
                  n_tiles, N_Q, N_K, qk_scale,
                  HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                  PINGPONG: gl.constexpr):
        """One warp group's 64 query rows from `row0`: the online softmax over n_tiles key tiles (the order of
        work is in the module docstring), then O and L stored."""
        dtype: gl.constexpr = q_s.dtype
        rows_n: gl.constexpr = q_s.shape[0]
        mma_s: gl.constexpr = wgmma_layout(BLOCK_N)
        mma_o: gl.constexpr = wgmma_layout(HEAD_DIM)
        p_regs: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
        row_of_s: gl.constexpr = gl.SliceLayout(1, mma_s)
        row_of_o: gl.constexpr = gl.SliceLayout(1, mma_o)

        rows = row0 + gl.arange(0, rows_n, layout=row_of_s)
        key_offsets = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma_s))
        zero_s = gl.zeros([rows_n, BLOCK_N], gl.float32, mma_s)
        acc = gl.zeros([rows_n, HEAD_DIM], gl.float32, mma_o)
        m_i = gl.full([rows_n], float("-inf"), gl.float32, row_of_s)
        l_i = gl.zeros([rows_n], gl.float32, row_of_s)
        # P of the tile whose P·V is in flight (zeros before the first: its P·V adds nothing).
        p_prev = gl.zeros([rows_n, BLOCK_N], dtype, p_regs)

        mbarrier.wait(q_bar, 0)
        for j in range(n_tiles):
            slot = j % STAGES
            prev = (j + STAGES - 1) % STAGES if j > 0 else 0
            prev_phase = ((j - 1) // STAGES) & 1 if j > 0 else 0
            start_n = j * BLOCK_N
            mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
            mbarrier.wait(v_ready.index(prev), prev_phase)
            if PINGPONG:
                mbarrier.wait(my_turn, j & 1)
            s = warpgroup_mma(q_s, k_s.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            acc_next = warpgroup_mma(p_prev, v_s.index(prev), acc, is_async=True)
            if PINGPONG:
                mbarrier.arrive(their_turn, count=1)
            s = warpgroup_mma_wait(1, deps=[s])
            # Only the ragged last tile and, when causal, tiles reaching past this group's first row need masks.
            masked = start_n + BLOCK_N > N_K
            if CAUSAL:
                masked = masked | (start_n + BLOCK_N > row0 + 1)
            if masked:
                keys = start_n + key_offsets
                visible = (keys[None, :] < N_K) & (rows[:, None] >= 0)
                if CAUSAL:
                    visible = visible & (keys[None, :] <= rows[:, None])
                s = gl.where(visible, s, float("-inf"))
            # Every row sees key 0 in the first tile, so m_new is finite from then on.
            m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
            p = gl.exp2(s * qk_scale - m_new[:, None])
            alpha = gl.exp2(m_i - m_new)
            l_i = l_i * alpha + gl.sum(p, 1)
            m_i = m_new
            p_op = gl.convert_layout(p.to(dtype), p_regs)
            acc, p_prev = warpgroup_mma_wait(0, deps=[acc_next, p_prev])
            acc = acc * gl.convert_layout(alpha, row_of_o)[:, None]
            mbarrier.arrive(empty.index(prev), count=1, pred=j > 0)
            p_prev = p_op
        last = (n_tiles - 1) % STAGES
        mbarrier.wait(v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
        acc = warpgroup_mma(p_prev, v_s.index(last), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc])

        out = (acc / gl.convert_layout(l_i, row_of_o)[:, None]).to(dtype)
        out_rows = row0 + gl.arange(0, rows_n, layout=row_of_o)
        out_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, mma_o))
        head_base = pid_bh.to(gl.int64) * N_Q
        offsets = (head_base + out_rows[:, None]) * HEAD_DIM + out_cols[None, :]
        gl.store(Out + offsets, out, mask=(out_rows[:, None] < N_Q) & (out_cols[None, :] < HEAD_DIM))
        gl.store(L + head_base + rows, (m_i + gl.log2(l_i)) * _LN2, mask=rows < N_Q)

    @gluon.jit
    def _fwd_kernel(desc_q, desc_k, desc_v, Out, L, N_Q, N_K, qk_scale,
                    HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                    PINGPONG: gl.constexpr, HEAD_GROUP: gl.constexpr):
        """O and L of one (128-row query block, batch·head): two consumer warp groups of 64 rows and a
        producer warp (module docstring)."""
        dtype: gl.constexpr = desc_q.dtype
        rows_n: gl.constexpr = desc_q.block_type.shape[0]
        block, pid_bh = _block_position(CAUSAL, HEAD_GROUP)
        start_m = block * 2 * rows_n
        # Causal: key tiles past the block's last row are never visited.
        stop = gl.minimum(start_m + 2 * rows_n, N_K) if CAUSAL else N_K
        n_tiles = gl.cdiv(stop, BLOCK_N)

        q_s = gl.allocate_shared_memory(dtype, [2, rows_n, HEAD_DIM], desc_q.layout)
        k_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_k.layout)
        v_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_v.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for t in gl.static_range(2):
            mbarrier.init(turns.index(t), count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(s), count=1)
            mbarrier.init(v_ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=2)
        fence_async_shared()
        mbarrier.expect(q_bar, 2 * desc_q.block_type.nbytes)
        for g in gl.static_range(2):
            tma_load(desc_q, [pid_bh * N_Q + start_m + g * rows_n, 0], q_bar, q_s.index(g))
        # The first group has the first turn.
        mbarrier.arrive(turns.index(0), count=1)

        gl.warp_specialize([
            (_consumer, (q_s.index(0), k_s, v_s, q_bar, k_ready, v_ready, empty, turns.index(0), turns.index(1),
                         Out, L, pid_bh, start_m, n_tiles, N_Q, N_K, qk_scale,
                         HEAD_DIM, BLOCK_N, STAGES, CAUSAL, PINGPONG)),
            (_consumer, (q_s.index(1), k_s, v_s, q_bar, k_ready, v_ready, empty, turns.index(1), turns.index(0),
                         Out, L, pid_bh, start_m + rows_n, n_tiles, N_Q, N_K, qk_scale,
                         HEAD_DIM, BLOCK_N, STAGES, CAUSAL, PINGPONG)),
            (_kv_producer, (desc_k, desc_v, k_s, v_s, k_ready, v_ready, empty, pid_bh * N_K, n_tiles,
                            BLOCK_N, STAGES)),
        ], [4, 1], _REGS)

        mbarrier.invalidate(q_bar)
        for t in gl.static_range(2):
            mbarrier.invalidate(turns.index(t))
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(k_ready.index(s))
            mbarrier.invalidate(v_ready.index(s))
            mbarrier.invalidate(empty.index(s))


def _descriptors(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, block_n: int) -> list:
    """TMA descriptors of (Z·H·N, d) views: q in tiles of GROUP_ROWS rows, k and v in tiles of block_n."""
    return [tile_descriptor(t, rows) for t, rows in ((q4, GROUP_ROWS), (k4, block_n), (v4, block_n))]


def _consts(d: int, causal: bool, config: GluonForwardConfig) -> dict:
    return {"HEAD_DIM": d, "BLOCK_N": config.block_n, "STAGES": config.stages, "CAUSAL": causal,
            "PINGPONG": config.pingpong, "HEAD_GROUP": head_group(causal)}


def forward(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, causal: bool,
            config: GluonForwardConfig) -> tuple[torch.Tensor, torch.Tensor, LaunchRecord]:
    """O (contiguous (Z, H, N_Q, d)), the fp32 L (Z·H, N_Q) and the launch record, as
    `triton_kernels.fwd.flash_forward` returns them. Blocks are 128 query rows (two consumer warp groups). The
    caller checks `common.usable` first."""
    z, h, n_q, d = q4.shape
    n_k = k4.shape[2]
    out = torch.empty((z, h, n_q, d), dtype=q4.dtype, device=q4.device)
    lse = torch.empty((z * h, n_q), dtype=torch.float32, device=q4.device)
    block_m = 2 * GROUP_ROWS  # one 64-row group per consumer
    grid = (triton.cdiv(n_q, block_m), z * h)
    _fwd_kernel[grid](*_descriptors(q4, k4, v4, config.block_n), out, lse, n_q, n_k, LOG2E / math.sqrt(d),
                      **_consts(d, causal, config), num_warps=4, maxnreg=LAUNCH_MAXNREG)
    described = f"gluon {block_m}x{config.block_n} s{config.stages}" + (" ping-pong" if config.pingpong else "")
    return out, lse, LaunchRecord((KernelLaunch("fwd", described),))


def compile_kernel(head_dim: int, causal: bool, config: GluonForwardConfig):
    """The forward compiled for sm_90 (bf16) on any machine, GPU or not; a triton CompiledKernel, not loaded."""
    rows = 4 * max(config.block_n, 2 * GROUP_ROWS)
    q4, k4, v4 = (torch.empty(1, 1, rows, head_dim, dtype=torch.bfloat16) for _ in range(3))
    descs = dict(zip(("desc_q", "desc_k", "desc_v"), _descriptors(q4, k4, v4, config.block_n), strict=True))
    return compile_gluon(_fwd_kernel, descs, _consts(head_dim, causal, config),
                         {"Out": "*bf16", "L": "*fp32", "qk_scale": "fp32"},
                         {"num_warps": 4, "maxnreg": LAUNCH_MAXNREG})
