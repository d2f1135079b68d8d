"""The whole FlashAttention backward in one Gluon kernel, arranged the way FlashAttention-3 arranges it on Hopper.

Why. The split backward (`flash_triton_bwd`: a dK/dV kernel and a dQ kernel) runs 7 matmuls per score, cuDNN's
backward 5: it recomputes q·kᵀ and dO·vᵀ in the dQ kernel. At d = 128 the matmuls are most of the work, and our
non-causal N = 8192 backward took 11.7–13.0 ms against cuDNN's 10.0–10.2 (docs/results/attention-h100.md, step 22).
Step 17's fused kernel (`flash_gluon_bwd.fused`, one 4-warp group per 64-key tile) could not hold dQ's tile at
d = 128 and lost at d = 64. FlashAttention-3 shares a 128-key block between two consumer warp groups and splits
dQ between them by columns, so each holds only a 64 × d/2 slice of it:

- a producer warp streams the query tiles (q, dO, LSE2, Delta of BLOCK_M = 64 or 128 rows) by TMA into a ring of
  STAGES slots;
  a slot is refilled once both consumers have released it;
- consumer g (of 2) owns keys [64g, 64g + 64) of the block. Per query tile it computes Sᵀ = K_g qᵀ and
  dPᵀ = V_g dOᵀ, Pᵀ = exp2(Sᵀ·scale − LSE2) and dSᵀ = Pᵀ ∘ (dPᵀ − Delta); dV_g += Pᵀ dO and dK_g += dSᵀ q with
  Pᵀ and dSᵀ as register operands; and writes dSᵀ into its half of a shared (128 keys × 64 queries) tile;
- once both halves are written (an mbarrier each consumer arrives on), consumer g computes columns
  [g·d/2, (g+1)·d/2) of the tile's dQ = dS K over all 128 keys, from shared memory, and adds it into a zeroed
  fp32 accumulator by a TMA reduction (`cp.reduce.async.bulk.tensor`) that runs while the next tile is worked on.

dSᵀ tiles alternate between two buffers. A consumer that has passed tile j's mbarrier knows the other one has
finished tile j−1, dQ included, so buffer j % 2 is free again without a second mbarrier. The sum into dQ runs in
an order set by timing, so dQ is not bitwise reproducible.

Scope: 16-bit, contiguous (Z, H, N, d) q, k, v, dO with d ∈ {64, 128}, on compute capability 9.x with Triton's
Gluon (3.6); `flash_gluon_bwd.usable` says whether a call qualifies, `chosen` whether `flash_triton_bwd.flash_backward`
runs it: by default on large calls, where on the H100 it beat the split backward by 5% (causal N = 4096) to 21%
(non-causal N = 8192) at d = 128, and by 7–11% at d = 64 with 128-row query tiles.
"""

from __future__ import annotations

import os

import torch
import triton

from profiler_kit.attention import flash_gluon_bwd, flash_gluon_fwd
from profiler_kit.attention.flash_gluon_bwd import gluon
from profiler_kit.attention.flash_triton_launch import LOG2E

BWD_ENV = "PROFILER_KIT_FLASH_GLUON_BWD"
# The configs offered per head dim, each compiled for sm_90 (Triton 3.6) without serialised matmuls, and causal
# without spills. (Non-causal, the loop-invariant mask operands of the masked tiles at the ends spill: 64 bytes at
# d = 128, 208 with 128-row query tiles.) At d = 128 the consumers need 240 registers each: with tile j−1's dK and dV
# deferred beside tile j's q·kᵀ (DEFER) or with 3 query-tile stages, ptxas spills and issues every wgmma alone.
# 128-row query tiles (block_m, d = 64 only) fit in 240 registers when dV is waited for together with dPᵀ.
CONFIGS: dict[int, list[dict]] = {
    64: [{"stages": 2, "defer": True, "block_m": 64}, {"stages": 3, "defer": True, "block_m": 64},
         {"stages": 2, "defer": False, "block_m": 64}, {"stages": 2, "defer": False, "block_m": 128}],
    128: [{"stages": 2, "defer": False, "block_m": 64}],
}
# The config `flash_triton_bwd.flash_backward` runs by default per head dim, on calls with at least
# `flash_gluon_fwd.MIN_WORK` (its launch goes through Python, as the Gluon forward's does); elsewhere the split
# backward. On the H100 it took the non-causal N = 8192, d = 128 backward from 13.12 to 10.33 ms (cuDNN's 10.53) and
# the causal N = 4096 one from 1.737 to 1.645 (cuDNN's 1.602) (docs/results/attention-h100.md, step 23). At d = 64
# its 64-row query tiles were within the runs' spread of the split kernels; 128-row ones took the leaderboard's
# backward from 3.417 to 3.037 ms (cuDNN's 3.255), the grid's causal N = 16384 one from 1.706 to 1.584 and the
# non-causal N = 16384 one from 6.737 to 6.263 (step 24).
DEFAULTS: dict[int, dict] = {64: {"stages": 2, "defer": False, "block_m": 128},
                              128: {"stages": 2, "defer": False, "block_m": 64}}
# Keys per consumer warp group (one wgmma M of 64 per group of 4 warps), and the default query rows per tile.
GROUP_ROWS = 64
# Launch register cap and the per-partition split: 12 warps × 168 registers, i.e. 3 × 168 per thread of a warp
# group. The producer is the default partition here (4 warps, of which one thread issues the loads), so that the two
# consumers, as workers, can have CONSUMER_REGS each; `setmaxnreg` leaves the producer 504 − 2 × 240 = 24. In
# `flash_gluon_fwd` a consumer is the default partition, which Triton 3.6 gives 256, and the other consumer 224.
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

    from profiler_kit.attention.flash_gluon_bwd import (
        _load_query_tile,
        _needs_mask,
        _probabilities,
        _store_dkdv,
        cta_barrier,
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
            _load_query_tile(desc_q, desc_do, desc_l, desc_d, q_s, do_s, l_s, d_s, ready, slot,
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

        # DEFER: tile j-1's dK and dV are issued beside tile j's q·kᵀ and dPᵀ (as in `flash_gluon_bwd`), so that
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
            masked = _needs_mask(start_m, start_n, N_Q, keys_past_end, rows_m, rows_n, CAUSAL)
            p = _probabilities(qk, l_s.index(slot).reshape([rows_m]).load(cols_of), qk_scale, start_m + queries,
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
        _store_dkdv(DK, DV, (dk * sm_scale).to(dtype), dv.to(dtype), pid_bh, start_n, stride_gz, stride_gh,
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


def chosen(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, do4: torch.Tensor) -> dict | None:
    """The keyword arguments of `fused` for this call, or None where the split backward runs.
    PROFILER_KIT_FLASH_GLUON_BWD=0 always picks the split backward; "STAGES,DEFER[,BLOCK_M]" (e.g. "2,1" or "2,0,128";
    BLOCK_M 64 when left out) picks that config of CONFIGS wherever `flash_gluon_bwd.usable`; unset, DEFAULTS decides
    per head dim for calls with at least `flash_gluon_fwd.MIN_WORK`."""
    setting = os.environ.get(BWD_ENV, "")
    if setting == "0":
        return None
    z, h, n_q, d = q4.shape
    if setting:
        stages, defer, block_m = (*(int(x) for x in setting.split(",")), GROUP_ROWS)[:3]
        config = {"stages": stages, "defer": bool(defer), "block_m": block_m}
        config = config if config in CONFIGS.get(d, []) else None
    else:
        config = DEFAULTS.get(d) if z * h * n_q * k4.shape[2] * d >= flash_gluon_fwd.MIN_WORK else None
    # Asked last: it queries the device, and this runs on every backward of the Python path.
    return config if config is not None and flash_gluon_bwd.usable(q4, k4, v4, do4) else None


def setting(config: dict) -> str:
    """The PROFILER_KIT_FLASH_GLUON_BWD value that picks `config` (one of CONFIGS)."""
    return f"{config['stages']},{int(config['defer'])},{config['block_m']}"


def _descriptors(q4, k4, v4, do4, lse2, delta, dq_acc, block_m: int) -> list:
    """TMA descriptors: q, dO (tiles of `block_m` rows), k, v (128-row blocks), the statistics, and the fp32
    (Z·H·N_Q, d) dQ accumulator in (block_m × d/2) tiles."""
    n_q, d = q4.shape[2], q4.shape[3]
    descs = flash_gluon_bwd._descriptors(q4, k4, v4, do4, lse2, delta, n_q, block_m, 2 * GROUP_ROWS)
    return [*descs, flash_gluon_bwd.block_descriptor(dq_acc, [block_m, d // 2])]


def fused(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, do4: torch.Tensor, lse2: torch.Tensor,
          delta: torch.Tensor, dq_acc: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, causal: bool,
          stages: int = 2, defer: bool = False, block_m: int = GROUP_ROWS) -> None:
    """Write dK and dV into the contiguous (Z, H, N_K, d) `dk`, `dv` and add dQ/scale into the zeroed fp32
    (Z·H·N_Q, d) `dq_acc`, from the D pre-pass's LSE2 and Delta (`flash_triton_bwd`); `stages` query-tile slots.
    The caller checks `flash_gluon_bwd.usable` first."""
    z, h, n_q, d = q4.shape
    n_k = k4.shape[2]
    grid = (triton.cdiv(n_k, 2 * GROUP_ROWS), z * h)
    flash_gluon_bwd.last_launch["dkdv"] = f"gluon fused {2 * GROUP_ROWS}x{block_m} s{stages}"
    _fused_kernel[grid](*_descriptors(q4, k4, v4, do4, lse2, delta, dq_acc, block_m), dk, dv, *dk.stride()[:3], h,
                        n_q, n_k, LOG2E / d ** 0.5, 1.0 / d ** 0.5, HEAD_DIM=d, STAGES=stages, CAUSAL=causal,
                        DEFER=defer, num_warps=4, maxnreg=LAUNCH_MAXNREG)


def compile_sm90(head_dim: int, stages: int = 2, causal: bool = True, defer: bool = False,
                 block_m: int = GROUP_ROWS):
    """Compile the kernel for sm_90 (bf16) on any machine, GPU or not, so that what ptxas makes of it can be
    checked without one (tests). Returns a triton CompiledKernel, not loaded."""
    rows = 8 * GROUP_ROWS
    q4, k4, v4, do4 = (torch.empty(1, 1, rows, head_dim, dtype=torch.bfloat16) for _ in range(4))
    lse2, delta = (torch.empty(1, rows, dtype=torch.float32) for _ in range(2))
    names = ("desc_q", "desc_k", "desc_v", "desc_do", "desc_l", "desc_d", "desc_dq")
    descs = dict(zip(names, _descriptors(q4, k4, v4, do4, lse2, delta, torch.empty(rows, head_dim), block_m),
                     strict=True))
    return flash_gluon_bwd.compile_gluon(
        _fused_kernel, descs, {"HEAD_DIM": head_dim, "STAGES": stages, "CAUSAL": causal, "DEFER": defer},
        {"DK": "*bf16", "DV": "*bf16", "qk_scale": "fp32", "sm_scale": "fp32"},
        {"num_warps": 4, "maxnreg": LAUNCH_MAXNREG})
