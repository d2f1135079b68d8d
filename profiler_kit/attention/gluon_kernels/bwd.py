"""The whole FlashAttention backward in one Gluon kernel, arranged the way FlashAttention-3 arranges it on Hopper.

The split backward (`triton_kernels.bwd`: a dK/dV kernel and a dQ kernel) runs 7 matmuls per score: it recomputes
q·kᵀ and dO·vᵀ in the dQ kernel. This kernel runs 5. It shares a 128-key block between two consumer warp groups and
splits dQ between them by columns, so each holds only a (query rows × d/2) slice of it:

- a producer warp streams the query tiles (q, dO, LSE2, Delta of BLOCK_M = 64 or 128 rows) by TMA into a ring of
  STAGES slots; a slot is refilled once both consumers have released it;
- consumer g (of 2) owns keys [64g, 64g + 64) of the block. Per query tile it computes Sᵀ = K_g qᵀ and
  dPᵀ = V_g dOᵀ, Pᵀ = exp2(Sᵀ·scale − LSE2) and dSᵀ = Pᵀ ∘ (dPᵀ − Delta); dV_g += Pᵀ dO and dK_g += dSᵀ q with
  Pᵀ and dSᵀ as register operands; and writes dSᵀ into its half of a shared (128 keys × query rows) tile;
- once both halves are written (an mbarrier each consumer arrives on), consumer g computes columns
  [g·d/2, (g+1)·d/2) of the tile's dQ = dS K over all 128 keys, from shared memory, and adds it into a zeroed
  fp32 accumulator by a TMA reduction (`cp.reduce.async.bulk.tensor`) that runs while the next tile is worked on.

dSᵀ tiles alternate between two buffers. A consumer that has passed tile j's mbarrier knows the other one has
finished tile j−1, dQ included, so buffer j % 2 is free again without a second mbarrier. The sum into dQ runs in
an order set by timing, so dQ is not bitwise reproducible.

Scope: 16-bit, contiguous (Z, H, N, d) q, k, v, dO with d ∈ {64, 128}, on compute capability 9.x with Triton's
Gluon; `common.usable` says whether a call qualifies, `dispatch` whether it runs.
"""

from __future__ import annotations

import torch
import triton

from profiler_kit.attention.gluon_kernels.common import (
    backward_descriptors,
    block_descriptor,
    compile_gluon,
    gluon,
)
from profiler_kit.attention.options import GluonBackwardConfig
from profiler_kit.attention.record import KernelLaunch, LaunchRecord
from profiler_kit.attention.triton_kernels.configs import LOG2E

# The configs offered per head dim, each compiled for sm_90 without serialised matmuls, and causal without
# spills. At d = 128 the consumers need 240 registers each, so neither DEFER nor a third stage fits there;
# 128-row query tiles (d = 64 only) fit when dV is waited for together with dPᵀ.
CONFIGS: dict[int, list[GluonBackwardConfig]] = {
    64: [GluonBackwardConfig(2, True, 64), GluonBackwardConfig(3, True, 64), GluonBackwardConfig(2, False, 64),
         GluonBackwardConfig(2, False, 128)],
    128: [GluonBackwardConfig(2, False, 64)],
}
# Keys per consumer warp group (one wgmma M of 64 per group of 4 warps), and the default query rows per tile.
GROUP_ROWS = 64
# Launch register cap and the per-partition split: 12 warps × 168 registers, i.e. 3 × 168 per thread of a warp
# group. The producer is the default partition here (4 warps, of which one thread issues the loads), so that the two
# consumers, as workers, can have CONSUMER_REGS each; `setmaxnreg` leaves the producer 504 − 2 × 240 = 24. In
# `fwd` a consumer is the default partition, which Triton 3.6 gives 256, and the other consumer 224.
LAUNCH_MAXNREG = 168
CONSUMER_REGS = 240

if gluon is not None:
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from profiler_kit.attention.gluon_kernels.common import (
        cta_barrier,
        load_query_tile,
        needs_mask,
        probabilities,
        store_dkdv,
        tma_load,
        tma_reduce_add,
        wgmma_layout,
    )

    _REGS = gl.constexpr([CONSUMER_REGS, CONSUMER_REGS])

    @gluon.jit
    def _query_producer(desc_q, desc_do, desc_l, desc_d, q_s, do_s, l_s, d_s, ready, empty, q_row0, pid_bh, lo,
                        n_tiles, STAGES: gl.constexpr):
        """Producer warp: query tile j goes into slot j % STAGES once both consumers have released it."""
        rows_m: gl.constexpr = q_s.shape[1]
        for j in range(n_tiles):
            slot = j % STAGES
            mbarrier.wait(empty.index(slot), ((j // STAGES) & 1) ^ 1)
            load_query_tile(desc_q, desc_do, desc_l, desc_d, q_s, do_s, l_s, d_s, ready, slot,
                             q_row0 + lo + j * rows_m, pid_bh, lo + j * rows_m, True)

    @gluon.jit
    def _consumer(k_s, v_s, q_s, do_s, l_s, d_s, ds_s, dq_s, ready, empty, ds_full, desc_dq, DK, DV,
                  stride_gz, stride_gh, stride_gn, H, N_Q, N_K, qk_scale, sm_scale, pid_bh, block_n, q_row0, lo,
                  n_tiles, GROUP: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                  DEFER: gl.constexpr):
        """Consumer GROUP's 64 keys of the block: the loop of the module docstring, then its dK and dV stored."""
        dtype: gl.constexpr = q_s.dtype
        rows_m: gl.constexpr = q_s.shape[1]
        rows_n: gl.constexpr = k_s.shape[0] // 2
        half_d: gl.constexpr = HEAD_DIM // 2
        mma_s: gl.constexpr = wgmma_layout(rows_m)
        mma_o: gl.constexpr = wgmma_layout(HEAD_DIM)
        mma_q: gl.constexpr = wgmma_layout(half_d)
        a_regs: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
        cols_of: gl.constexpr = gl.SliceLayout(0, mma_s)

        start_n = block_n + GROUP * rows_n
        k_mine = k_s.slice(GROUP * rows_n, rows_n, dim=0)
        v_mine = v_s.slice(GROUP * rows_n, rows_n, dim=0)
        k_cols = k_s.slice(GROUP * half_d, half_d, dim=1)
        keys = start_n + gl.arange(0, rows_n, layout=gl.SliceLayout(1, mma_s))
        queries = gl.arange(0, rows_m, layout=cols_of)
        zero_s = gl.zeros([rows_n, rows_m], gl.float32, mma_s)
        zero_q = gl.zeros([rows_m, half_d], gl.float32, mma_q)
        dk = gl.zeros([rows_n, HEAD_DIM], gl.float32, mma_o)
        dv = gl.zeros([rows_n, HEAD_DIM], gl.float32, mma_o)
        keys_past_end = start_n + rows_n > N_K

        # DEFER: tile j-1's dK and dV are issued beside tile j's q·kᵀ and dPᵀ, so that
        # the softmax runs while they are on the tensor cores; tile -1's add zeros.
        p_prev = gl.zeros([rows_n, rows_m], dtype, a_regs)
        ds_prev = gl.zeros([rows_n, rows_m], dtype, a_regs)
        for j in range(n_tiles):
            slot = j % STAGES
            prev = (j + STAGES - 1) % STAGES if j > 0 else 0
            buf = j % 2
            start_m = lo + j * rows_m
            mbarrier.wait(ready.index(slot), (j // STAGES) & 1)
            qk = warpgroup_mma(k_mine, q_s.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            dp = warpgroup_mma(v_mine, do_s.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            if DEFER:
                dk_acc = warpgroup_mma(ds_prev, q_s.index(prev), dk, is_async=True)
                dv_acc = warpgroup_mma(p_prev, do_s.index(prev), dv, is_async=True)
                qk = warpgroup_mma_wait(3, deps=[qk])
            else:
                qk = warpgroup_mma_wait(1, deps=[qk])
            # dQ sums over keys, so keys past N_K (the next head's rows) are masked here too.
            masked = needs_mask(start_m, start_n, N_Q, keys_past_end, rows_m, rows_n, CAUSAL)
            p = probabilities(qk, l_s.index(slot).reshape([rows_m]).load(cols_of), qk_scale, start_m + queries,
                               keys, N_Q, N_K, masked, CAUSAL, True)
            p_op = gl.convert_layout(p.to(dtype), a_regs)
            if DEFER:
                dp = warpgroup_mma_wait(2, deps=[dp])
            else:
                dv = warpgroup_mma(p_op, do_s.index(slot), dv, is_async=True)
                if rows_m > rows_n:
                    # 128-query tiles: dSᵀ needs the registers that Pᵀ holds for dV, so dV ends with dPᵀ.
                    dp, dv, p_op = warpgroup_mma_wait(0, deps=[dp, dv, p_op])
                else:
                    dp = warpgroup_mma_wait(1, deps=[dp])
            delta = d_s.index(slot).reshape([rows_m]).load(cols_of)
            ds = (p * (dp - delta[None, :])).to(dtype)
            ds_op = gl.convert_layout(ds, a_regs)
            if DEFER:
                dk, dv, p_prev, ds_prev = warpgroup_mma_wait(0, deps=[dk_acc, dv_acc, p_prev, ds_prev])
                mbarrier.arrive(empty.index(prev), count=1, pred=j > 0)
                p_prev = p_op
                ds_prev = ds_op
            else:
                dk_acc = warpgroup_mma(ds_op, q_s.index(slot), dk, is_async=True)
            # dSᵀ into this group's half of the shared tile; all 128 threads' stores are done (and visible to
            # the tensor cores) before the one arrive that stands for the group.
            ds_s.index(buf).slice(GROUP * rows_n, rows_n, dim=0).store(ds)
            fence_async_shared()
            cta_barrier()
            mbarrier.arrive(ds_full.index(buf), count=1)
            mbarrier.wait(ds_full.index(buf), (j // 2) & 1)
            dq_acc = warpgroup_mma(ds_s.index(buf).permute((1, 0)), k_cols, zero_q, use_acc=False, is_async=True)
            if DEFER:
                dq = warpgroup_mma_wait(0, deps=[dq_acc])
            else:
                dk, dv, dq, p_op, ds_op = warpgroup_mma_wait(0, deps=[dk_acc, dv, dq_acc, p_op, ds_op])
                mbarrier.arrive(empty.index(slot), count=1)
            # The previous tile's reduction has read dq_s (in the thread that issued it) before anyone writes it.
            tma.store_wait(0)
            cta_barrier()
            dq_s.store(dq)
            fence_async_shared()
            cta_barrier()
            tma_reduce_add(desc_dq, [q_row0 + start_m, GROUP * half_d], dq_s)
        if DEFER and n_tiles > 0:
            last = (n_tiles - 1) % STAGES
            dk_acc = warpgroup_mma(ds_prev, q_s.index(last), dk, is_async=True)
            dv_acc = warpgroup_mma(p_prev, do_s.index(last), dv, is_async=True)
            dk, dv = warpgroup_mma_wait(0, deps=[dk_acc, dv_acc])
        tma.store_wait(0)
        store_dkdv(DK, DV, (dk * sm_scale).to(dtype), dv.to(dtype), pid_bh, start_n, stride_gz, stride_gh,
                    stride_gn, H, N_K, mma_o)

    @gluon.jit
    def _fused_kernel(desc_q, desc_k, desc_v, desc_do, desc_l, desc_d, desc_dq, DK, DV,
                      stride_gz, stride_gh, stride_gn, H, N_Q, N_K, qk_scale, sm_scale,
                      HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, DEFER: gl.constexpr):
        """dK, dV of one (128-key block, batch·head) and its share of dQ (module docstring)."""
        dtype: gl.constexpr = desc_q.dtype
        rows_m: gl.constexpr = desc_q.block_type.shape[0]
        rows_n: gl.constexpr = desc_k.block_type.shape[0] // 2
        pid_bh = gl.program_id(1)
        block_n = gl.program_id(0) * 2 * rows_n
        q_row0 = pid_bh * N_Q
        # Causal: query tiles before the block see none of its keys.
        lo = block_n if CAUSAL else 0
        n_tiles = gl.cdiv(N_Q - lo, rows_m)

        k_s = gl.allocate_shared_memory(dtype, [2 * rows_n, HEAD_DIM], desc_k.layout)
        v_s = gl.allocate_shared_memory(dtype, [2 * rows_n, HEAD_DIM], desc_v.layout)
        q_s = gl.allocate_shared_memory(dtype, [STAGES, rows_m, HEAD_DIM], desc_q.layout)
        do_s = gl.allocate_shared_memory(dtype, [STAGES, rows_m, HEAD_DIM], desc_do.layout)
        l_s = gl.allocate_shared_memory(gl.float32, [STAGES, 1, rows_m], desc_l.layout)
        d_s = gl.allocate_shared_memory(gl.float32, [STAGES, 1, rows_m], desc_d.layout)
        ds_s = gl.allocate_shared_memory(dtype, [2, 2 * rows_n, rows_m],
                                         gl.NVMMASharedLayout.get_default_for([2 * rows_n, rows_m], dtype))
        dq_s = gl.allocate_shared_memory(gl.float32, [2, rows_m, HEAD_DIM // 2], desc_dq.layout)
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(ready.index(s), count=1)
            mbarrier.init(empty.index(s), count=2)
        for b in gl.static_range(2):
            mbarrier.init(ds_full.index(b), count=2)
        fence_async_shared()
        mbarrier.expect(kv_bar, 2 * desc_k.block_type.nbytes)
        tma_load(desc_k, [pid_bh * N_K + block_n, 0], kv_bar, k_s)
        tma_load(desc_v, [pid_bh * N_K + block_n, 0], kv_bar, v_s)
        mbarrier.wait(kv_bar, 0)

        gl.warp_specialize([
            (_query_producer, (desc_q, desc_do, desc_l, desc_d, q_s, do_s, l_s, d_s, ready, empty, q_row0, pid_bh,
                               lo, n_tiles, STAGES)),
            (_consumer, (k_s, v_s, q_s, do_s, l_s, d_s, ds_s, dq_s.index(0), ready, empty, ds_full, desc_dq, DK, DV,
                         stride_gz, stride_gh, stride_gn, H, N_Q, N_K, qk_scale, sm_scale, pid_bh, block_n, q_row0,
                         lo, n_tiles, 0, HEAD_DIM, STAGES, CAUSAL, DEFER)),
            (_consumer, (k_s, v_s, q_s, do_s, l_s, d_s, ds_s, dq_s.index(1), ready, empty, ds_full, desc_dq, DK, DV,
                         stride_gz, stride_gh, stride_gn, H, N_Q, N_K, qk_scale, sm_scale, pid_bh, block_n, q_row0,
                         lo, n_tiles, 1, HEAD_DIM, STAGES, CAUSAL, DEFER)),
        ], [4, 4], _REGS)

        mbarrier.invalidate(kv_bar)
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(s))
            mbarrier.invalidate(empty.index(s))
        for b in gl.static_range(2):
            mbarrier.invalidate(ds_full.index(b))


def _descriptors(q4, k4, v4, do4, lse2, delta, dq_acc, block_m: int) -> list:
    """TMA descriptors: q, dO (tiles of `block_m` rows), k, v (128-row blocks), the statistics, and the fp32
    (Z·H·N_Q, d) dQ accumulator in (block_m × d/2) tiles."""
    n_q, d = q4.shape[2], q4.shape[3]
    descs = backward_descriptors(q4, k4, v4, do4, lse2, delta, n_q, block_m, 2 * GROUP_ROWS)
    return [*descs, block_descriptor(dq_acc, [block_m, d // 2])]


def fused(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, do4: torch.Tensor, lse2: torch.Tensor,
          delta: torch.Tensor, dq_acc: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, causal: bool,
          config: GluonBackwardConfig) -> LaunchRecord:
    """Write dK and dV into the contiguous (Z, H, N_K, d) `dk`, `dv` and add dQ/scale into the zeroed fp32
    (Z·H·N_Q, d) `dq_acc`, from the D pre-pass's LSE2 and Delta (`triton_kernels.bwd.statistics`). The caller
    checks `common.usable` first."""
    z, h, n_q, d = q4.shape
    n_k = k4.shape[2]
    grid = (triton.cdiv(n_k, 2 * GROUP_ROWS), z * h)
    _fused_kernel[grid](*_descriptors(q4, k4, v4, do4, lse2, delta, dq_acc, config.block_m), dk, dv,
                        *dk.stride()[:3], h, n_q, n_k, LOG2E / d ** 0.5, 1.0 / d ** 0.5, HEAD_DIM=d,
                        STAGES=config.stages, CAUSAL=causal, DEFER=config.defer, num_warps=4,
                        maxnreg=LAUNCH_MAXNREG)
    described = f"gluon fused {2 * GROUP_ROWS}x{config.block_m} s{config.stages}" + (" defer" if config.defer else "")
    return LaunchRecord((KernelLaunch("dkdv", described),))


def compile_kernel(head_dim: int, causal: bool, config: GluonBackwardConfig):
    """The kernel compiled for sm_90 (bf16) on any machine, GPU or not; a triton CompiledKernel, not loaded."""
    rows = 8 * GROUP_ROWS
    q4, k4, v4, do4 = (torch.empty(1, 1, rows, head_dim, dtype=torch.bfloat16) for _ in range(4))
    lse2, delta = (torch.empty(1, rows, dtype=torch.float32) for _ in range(2))
    names = ("desc_q", "desc_k", "desc_v", "desc_do", "desc_l", "desc_d", "desc_dq")
    descs = dict(zip(names, _descriptors(q4, k4, v4, do4, lse2, delta, torch.empty(rows, head_dim), config.block_m),
                     strict=True))
    return compile_gluon(
        _fused_kernel, descs, {"HEAD_DIM": head_dim, "STAGES": config.stages, "CAUSAL": causal, "DEFER": config.defer},
        {"DK": "*bf16", "DV": "*bf16", "qk_scale": "fp32", "sm_scale": "fp32"},
        {"num_warps": 4, "maxnreg": LAUNCH_MAXNREG})
