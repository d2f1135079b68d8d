"""The FlashAttention-2 backward's dK/dV kernel in Gluon, with the exp2 overlapping the tensor cores.

Why Gluon. The Triton dK/dV kernel (`flash_triton_bwd`) keeps the tensor cores about 60% busy on the H100
(docs/results/attention-h100.md, step 13). Its warps wait at the top of each iteration for q·kᵀ and, with
it, for the previous tile's dV and dK matmuls, since a wgmma wait counts finished groups in issue order
(step 14). Issuing q·kᵀ before the previous tile's dV and dK lets the exp2 wait for q·kᵀ alone, but Triton
3.6 cannot express that: its pass that makes matmuls asynchronous gives every matmul whose result is used
inside the loop a wait for all outstanding groups (step 16). Gluon, Triton's lower-level language, leaves
the matmuls' issue order, their waits and the TMA ring to the kernel.

Per query tile j of a key tile, the order of work is:

    q·kᵀ_j, dPᵀ_j = V dO_jᵀ               (async)
    dK += dSᵀ_{j-1} Q_{j-1}, dV += Pᵀ_{j-1} dO_{j-1}   (async, deferred from tile j-1, A from registers)
    wait until q·kᵀ_j is done              (three groups still in flight)
    Pᵀ_j = exp2(q·kᵀ_j·scale − LSE2_j)
    wait until dPᵀ_j is done               (two groups still in flight)
    dSᵀ_j = Pᵀ_j ∘ (dPᵀ_j − Delta_j)
    wait for all; refill tile j−1's slot

Nothing stays in flight across the loop's back edge: a version that kept q·kᵀ_{j+1} in flight there made
ptxas serialise every wgmma (warning C7514), so each iteration drains, as FlashAttention-3's forward does.
Tile 0's deferred dK and dV add zeros; the last tile's run after the loop.

Tiles arrive by TMA into a ring of STAGES slots (q, dO, LSE2 and Delta of one query tile per slot, one
mbarrier each). A slot is refilled once both matmuls that read it (dV, dK) are known to be done. The math
and masking follow `flash_triton_bwd`; rows and keys past the ends, and the causal diagonal, are masked
on the tiles that need it (q and dO tiles come from (Z·H·N, d) views, so rows past N belong to the next
head and must be masked, which `needs_mask` does).

`fused` (d = 64) is the same kernel with dQ added: each tile's dSᵀ also goes to shared memory, dQ = dS K is a
fifth matmul, and its fp32 tile is added into a global accumulator by a TMA reduction, so that the backward
needs 5 matmuls and one exp2 per score instead of 7 and two. On the H100 it was slower than the two Triton
kernels it replaces (docs/results/attention-h100.md, step 17), so it too is opt-in.

Scope: 16-bit q, k, v, dO that are contiguous (Z, H, N, d) tensors with d ∈ {64, 128}, on compute
capability 9.0 with Triton's Gluon (3.6). `usable` says whether a call qualifies.
"""

from __future__ import annotations

import os

import torch
import triton

from profiler_kit.attention.flash_triton_launch import LOG2E

try:  # Triton ≥ 3.5 ships Gluon; without it the Triton kernels run alone.
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    @gluon.constexpr_function
    def wgmma_layout(n_cols, warps=4):
        """The register layout of a wgmma accumulator `n_cols` wide, over `warps` warps stacked along its rows."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, n_cols, 16])

    # Names that changed after Triton 3.6: the TMA load (`async_load` later) and the CTA barrier (`barrier`).
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    tma_reduce_add = getattr(tma, "async_atomic_add", None)
    if tma_reduce_add is None:  # Triton 3.6: the op exists, its Python wrapper came later.
        from triton._C.libtriton import ir
        from triton.experimental.gluon.language._core import builtin

        @builtin
        def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
            """Add the shared-memory tile `src` into the global tile at `coord` (cp.reduce.async.bulk.tensor)."""
            coord = _semantic._convert_to_ir_values(coord, require_i64=False)
            _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                                      src.handle)
except ImportError:  # pragma: no cover - depends on the installed Triton
    gluon = None

GLUON_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
HEAD_DIMS = (64, 128)
# The fused kernel holds dK, dV, q·kᵀ, dPᵀ and a dQ tile in registers: at d = 128 that is over 255 per thread.
FUSED_HEAD_DIMS = (64,)


if gluon is not None:

    @gluon.jit
    def _load_query_tile(desc_q, desc_do, desc_l, desc_d, q_s, do_s, l_s, d_s, bars, slot, row, pid_bh, start_m,
                         pred):
        """Start the TMA copies of one query tile (q, dO, LSE2, Delta) into `slot`, signalling bars[slot]."""
        bar = bars.index(slot)
        nbytes: gl.constexpr = 2 * desc_q.block_type.nbytes + 2 * desc_l.block_type.nbytes
        mbarrier.expect(bar, nbytes, pred=pred)
        tma_load(desc_q, [row, 0], bar, q_s.index(slot), pred=pred)
        tma_load(desc_do, [row, 0], bar, do_s.index(slot), pred=pred)
        tma_load(desc_l, [pid_bh, start_m], bar, l_s.index(slot), pred=pred)
        tma_load(desc_d, [pid_bh, start_m], bar, d_s.index(slot), pred=pred)

    @gluon.jit
    def _probabilities(qk, lse2, qk_scale, rows, keys, N_Q, N_K, masked, CAUSAL: gl.constexpr,
                       MASK_KEYS: gl.constexpr):
        """Pᵀ = exp2(q·kᵀ·scale − LSE2) of a (keys × queries) tile. On a `masked` tile (one reaching past the
        ends, or a causal diagonal one) P is zero past N_Q, past N_K with MASK_KEYS, and where a key comes
        after the query when CAUSAL. The dK/dV kernel leaves keys past N_K unmasked (their rows are not
        stored), which saves registers."""
        p = gl.exp2(qk * qk_scale - lse2[None, :])
        if masked:
            if CAUSAL:
                visible = (rows[None, :] < N_Q) & (keys[:, None] <= rows[None, :])
            else:
                visible = (rows[None, :] < N_Q) & (keys[:, None] >= 0)
            if MASK_KEYS:
                visible = visible & (keys[:, None] < N_K)
            p = gl.where(visible, p, 0.0)
        return p

    @gluon.jit
    def _needs_mask(start_m, start_n, N_Q, keys_past_end, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    CAUSAL: gl.constexpr):
        """Whether the (BLOCK_N keys from start_n × BLOCK_M queries from start_m) tile needs `_probabilities`'s
        mask: it reaches past N_Q, its keys past N_K (`keys_past_end`), or, causal, it holds the diagonal."""
        masked = (start_m + BLOCK_M > N_Q) | keys_past_end
        if CAUSAL:
            masked = masked | (start_m < start_n + BLOCK_N)
        return masked

    @gluon.jit
    def _start_key_tile(desc_q, desc_k, desc_v, desc_do, desc_l, desc_d, N_Q, N_K, CAUSAL: gl.constexpr,
                        HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                        STAGES: gl.constexpr):
        """The program's (key tile, batch·head) and the query tiles it visits (from `lo`, `n_tiles` of them);
        K, V and the ring of query-tile slots with their mbarriers, allocated, and the TMA loads of K, V and
        the first STAGES query tiles started."""
        dtype: gl.constexpr = desc_q.dtype
        pid_bh = gl.program_id(1)
        start_n = gl.program_id(0) * BLOCK_N
        q_row0 = pid_bh * N_Q
        # Causal: query tiles before the key tile see none of its keys.
        lo = (start_n // BLOCK_M) * BLOCK_M if CAUSAL else 0
        n_tiles = gl.cdiv(N_Q - lo, BLOCK_M)
        k_s = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], desc_k.layout)
        v_s = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], desc_v.layout)
        q_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], desc_q.layout)
        do_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], desc_do.layout)
        l_s = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], desc_l.layout)
        d_s = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], desc_d.layout)
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        for s in gl.static_range(STAGES):
            mbarrier.init(bars.index(s), count=1)
        fence_async_shared()
        mbarrier.expect(kv_bar, 2 * desc_k.block_type.nbytes)
        tma_load(desc_k, [pid_bh * N_K + start_n, 0], kv_bar, k_s)
        tma_load(desc_v, [pid_bh * N_K + start_n, 0], kv_bar, v_s)
        for t in gl.static_range(STAGES):
            _load_query_tile(desc_q, desc_do, desc_l, desc_d, q_s, do_s, l_s, d_s, bars, t,
                             q_row0 + lo + t * BLOCK_M, pid_bh, lo + t * BLOCK_M, t < n_tiles)
        return pid_bh, start_n, q_row0, lo, n_tiles, k_s, v_s, q_s, do_s, l_s, d_s, kv_bar, bars

    @gluon.jit
    def _store_dkdv(DK, DV, dk, dv, pid_bh, start_n, stride_gz, stride_gh, stride_gn, H, N_K, layout: gl.constexpr):
        """Store one key tile's dK and dV (already scaled and cast) into (Z, H, N_K, d) tensors."""
        out_rows = start_n + gl.arange(0, dk.shape[0], layout=gl.SliceLayout(1, layout))
        out_cols = gl.arange(0, dk.shape[1], layout=gl.SliceLayout(0, layout))
        z = pid_bh // H
        h = pid_bh % H
        offsets = (z.to(gl.int64) * stride_gz + h.to(gl.int64) * stride_gh + out_rows[:, None] * stride_gn
                   + out_cols[None, :])
        inside = (out_rows[:, None] < N_K) & (out_cols[None, :] < dk.shape[1])
        gl.store(DK + offsets, dk, mask=inside)
        gl.store(DV + offsets, dv, mask=inside)

    @gluon.jit
    def _dkdv_kernel(desc_q, desc_k, desc_v, desc_do, desc_l, desc_d, DK, DV,
                     stride_gz, stride_gh, stride_gn, H, N_Q, N_K, qk_scale, sm_scale,
                     HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     CAUSAL: gl.constexpr, NUM_WARPS: gl.constexpr):
        """dK, dV of one (key tile, batch·head); the module docstring gives the order of work."""
        dtype: gl.constexpr = desc_q.dtype
        # Score tiles are (keys × queries), dK/dV tiles (keys × d): one wgmma layout for each width.
        mma_s: gl.constexpr = wgmma_layout(BLOCK_M, NUM_WARPS)
        mma_o: gl.constexpr = wgmma_layout(HEAD_DIM, NUM_WARPS)
        a_regs: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
        cols_of: gl.constexpr = gl.SliceLayout(0, mma_s)

        pid_bh, start_n, q_row0, lo, n_tiles, k_s, v_s, q_s, do_s, l_s, d_s, kv_bar, bars = _start_key_tile(
            desc_q, desc_k, desc_v, desc_do, desc_l, desc_d, N_Q, N_K, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES)

        keys = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma_s))
        queries = gl.arange(0, BLOCK_M, layout=cols_of)
        zero_s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, mma_s)
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, mma_o)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, mma_o)
        # The A operands (registers) of the dV and dK matmuls in flight: kept alive until they are done.
        p_prev = gl.zeros([BLOCK_N, BLOCK_M], dtype, a_regs)
        ds_prev = gl.zeros([BLOCK_N, BLOCK_M], dtype, a_regs)

        mbarrier.wait(kv_bar, 0)
        if n_tiles > 0:
            for j in range(n_tiles):
                slot = j % STAGES
                # Tile j-1's slot (slot 0 for j = 0, whose deferred dV and dK add zeros).
                prev = (j + STAGES - 1) % STAGES if j > 0 else 0
                start_m = lo + j * BLOCK_M
                mbarrier.wait(bars.index(slot), (j // STAGES) & 1)
                qk = warpgroup_mma(k_s, q_s.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
                dp = warpgroup_mma(v_s, do_s.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
                dk_acc = warpgroup_mma(ds_prev, q_s.index(prev), dk, is_async=True)
                dv_acc = warpgroup_mma(p_prev, do_s.index(prev), dv, is_async=True)
                qk = warpgroup_mma_wait(3, deps=[qk])
                masked = _needs_mask(start_m, start_n, N_Q, False, BLOCK_M, BLOCK_N, CAUSAL)
                p = _probabilities(qk, l_s.index(slot).reshape([BLOCK_M]).load(cols_of), qk_scale, start_m + queries,
                                   keys, N_Q, N_K, masked, CAUSAL, False)
                p_op = gl.convert_layout(p.to(dtype), a_regs)
                dp = warpgroup_mma_wait(2, deps=[dp])
                delta = d_s.index(slot).reshape([BLOCK_M]).load(cols_of)
                ds_op = gl.convert_layout((p * (dp - delta[None, :])).to(dtype), a_regs)
                # Everything retired: tile j-1's dV and dK, so its slot may be refilled with tile j-1+STAGES.
                dk, dv, p_prev, ds_prev = warpgroup_mma_wait(0, deps=[dk_acc, dv_acc, p_prev, ds_prev])
                p_prev = p_op
                ds_prev = ds_op
                refill = j - 1 + STAGES
                cta_barrier()
                _load_query_tile(desc_q, desc_do, desc_l, desc_d, q_s, do_s, l_s, d_s, bars, refill % STAGES,
                                 q_row0 + lo + refill * BLOCK_M, pid_bh, lo + refill * BLOCK_M,
                                 (j >= 1) & (refill < n_tiles))
            last = (n_tiles - 1) % STAGES
            dk_acc = warpgroup_mma(ds_prev, q_s.index(last), dk, is_async=True)
            dv_acc = warpgroup_mma(p_prev, do_s.index(last), dv, is_async=True)
            dk, dv = warpgroup_mma_wait(0, deps=[dk_acc, dv_acc])

        mbarrier.invalidate(kv_bar)
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(s))
        _store_dkdv(DK, DV, (dk * sm_scale).to(dtype), dv.to(dtype), pid_bh, start_n, stride_gz, stride_gh,
                    stride_gn, H, N_K, mma_o)


    @gluon.jit
    def _fused_kernel(desc_q, desc_k, desc_v, desc_do, desc_l, desc_d, desc_dq, DK, DV,
                      stride_gz, stride_gh, stride_gn, H, N_Q, N_K, qk_scale, sm_scale,
                      HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                      CAUSAL: gl.constexpr, NUM_WARPS: gl.constexpr):
        """dK, dV of one (key tile, batch·head), and its share of dQ added into an fp32 accumulator by TMA
        reductions; `fused` gives the order of work."""
        dtype: gl.constexpr = desc_q.dtype
        mma_s: gl.constexpr = wgmma_layout(BLOCK_M, NUM_WARPS)
        mma_o: gl.constexpr = wgmma_layout(HEAD_DIM, NUM_WARPS)
        a_regs: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
        cols_of: gl.constexpr = gl.SliceLayout(0, mma_s)

        pid_bh, start_n, q_row0, lo, n_tiles, k_s, v_s, q_s, do_s, l_s, d_s, kv_bar, bars = _start_key_tile(
            desc_q, desc_k, desc_v, desc_do, desc_l, desc_d, N_Q, N_K, CAUSAL, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES)
        # dSᵀ of the previous tile (A of dK, transposed A of dQ) and the dQ tile on its way out.
        ds_s = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M],
                                         gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype))
        dq_s = gl.allocate_shared_memory(gl.float32, [BLOCK_M, HEAD_DIM], desc_dq.layout)
        ds_s.store(gl.zeros([BLOCK_N, BLOCK_M], dtype, mma_s))
        fence_async_shared()
        cta_barrier()

        keys = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma_s))
        queries = gl.arange(0, BLOCK_M, layout=cols_of)
        zero_s = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, mma_s)
        zero_q = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, mma_o)
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, mma_o)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, mma_o)
        p_prev = gl.zeros([BLOCK_N, BLOCK_M], dtype, a_regs)
        keys_past_end = start_n + BLOCK_N > N_K

        mbarrier.wait(kv_bar, 0)
        if n_tiles > 0:
            for j in range(n_tiles):
                slot = j % STAGES
                prev = (j + STAGES - 1) % STAGES if j > 0 else 0
                start_m = lo + j * BLOCK_M
                mbarrier.wait(bars.index(slot), (j // STAGES) & 1)
                qk = warpgroup_mma(k_s, q_s.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
                dp = warpgroup_mma(v_s, do_s.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
                dv_acc = warpgroup_mma(p_prev, do_s.index(prev), dv, is_async=True)
                dk_acc = warpgroup_mma(ds_s, q_s.index(prev), dk, is_async=True)
                dq_acc = warpgroup_mma(ds_s.permute((1, 0)), k_s, zero_q, use_acc=False, is_async=True)
                qk = warpgroup_mma_wait(4, deps=[qk])
                masked = _needs_mask(start_m, start_n, N_Q, keys_past_end, BLOCK_M, BLOCK_N, CAUSAL)
                p = _probabilities(qk, l_s.index(slot).reshape([BLOCK_M]).load(cols_of), qk_scale, start_m + queries,
                                   keys, N_Q, N_K, masked, CAUSAL, True)
                p_op = gl.convert_layout(p.to(dtype), a_regs)
                dp = warpgroup_mma_wait(3, deps=[dp])
                delta = d_s.index(slot).reshape([BLOCK_M]).load(cols_of)
                ds = (p * (dp - delta[None, :])).to(dtype)
                dk, dv, dq, p_prev = warpgroup_mma_wait(0, deps=[dk_acc, dv_acc, dq_acc, p_prev])
                p_prev = p_op
                # Tile j-1's reduction must have read dq_s before it is written again.
                tma.store_wait(0)
                dq_s.store(dq)
                ds_s.store(ds)
                fence_async_shared()
                cta_barrier()
                if j > 0:
                    tma_reduce_add(desc_dq, [q_row0 + start_m - BLOCK_M, 0], dq_s)
                refill = j - 1 + STAGES
                _load_query_tile(desc_q, desc_do, desc_l, desc_d, q_s, do_s, l_s, d_s, bars, refill % STAGES,
                                 q_row0 + lo + refill * BLOCK_M, pid_bh, lo + refill * BLOCK_M,
                                 (j >= 1) & (refill < n_tiles))
            last = (n_tiles - 1) % STAGES
            dv_acc = warpgroup_mma(p_prev, do_s.index(last), dv, is_async=True)
            dk_acc = warpgroup_mma(ds_s, q_s.index(last), dk, is_async=True)
            dq_acc = warpgroup_mma(ds_s.permute((1, 0)), k_s, zero_q, use_acc=False, is_async=True)
            dk, dv, dq = warpgroup_mma_wait(0, deps=[dk_acc, dv_acc, dq_acc])
            tma.store_wait(0)
            dq_s.store(dq)
            fence_async_shared()
            cta_barrier()
            tma_reduce_add(desc_dq, [q_row0 + lo + (n_tiles - 1) * BLOCK_M, 0], dq_s)
            tma.store_wait(0)

        mbarrier.invalidate(kv_bar)
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(s))
        _store_dkdv(DK, DV, (dk * sm_scale).to(dtype), dv.to(dtype), pid_bh, start_n, stride_gz, stride_gh,
                    stride_gn, H, N_K, mma_o)


DKDV_ENV = "PROFILER_KIT_FLASH_GLUON_DKDV"
# What the last Gluon launches ran, per kernel name ("fwd", "dkdv"), for `flash_triton.describe_last_configs`.
last_launch: dict[str, str] = {}


def chosen_dkdv(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, do4: torch.Tensor,
                causal: bool) -> dict | None:
    """The keyword arguments of `dkdv` for this call, or None where the Triton dK/dV kernel runs: by default,
    since the Gluon kernel did not win on the issue 6 shapes (docs/results/attention-h100.md, steps 16 and 22).
    PROFILER_KIT_FLASH_GLUON_DKDV="BLOCK_M,BLOCK_N,STAGES,WARPS" (e.g. "64,64,2,4") picks that config wherever
    `usable`; "0" or unset, the Triton kernel."""
    setting = os.environ.get(DKDV_ENV, "")
    if setting in ("", "0") or not usable(q4, k4, v4, do4):
        return None
    return dict(zip(("block_m", "block_n", "stages", "num_warps"), map(int, setting.split(",")), strict=True))


def usable(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, do4: torch.Tensor,
           head_dims: tuple[int, ...] = HEAD_DIMS) -> bool:
    """Whether `dkdv` (or, with FUSED_HEAD_DIMS, `fused`) takes these (Z, H, N, d) tensors: Gluon present, a
    16-bit dtype, d in `head_dims`, contiguous tensors on a GPU of compute capability 9.x."""
    return (gluon is not None and q4.dtype in GLUON_DTYPES and q4.shape[-1] in head_dims and q4.is_cuda
            and torch.cuda.get_device_capability(q4.device)[0] == 9
            and all(t.is_contiguous() and t.dtype == q4.dtype for t in (q4, k4, v4, do4)))


def tile_descriptor(t: torch.Tensor, rows: int):
    """TMA descriptor of the (Z·H·N, d) view of a contiguous 16-bit (Z, H, N, d) tensor, in tiles of `rows` rows."""
    d = t.shape[-1]
    layout = gl.NVMMASharedLayout.get_default_for([rows, d], getattr(gl, GLUON_DTYPES[t.dtype]))
    return TensorDescriptor.from_tensor(t.reshape(-1, d), [rows, d], layout)


def _descriptors(q4, k4, v4, do4, lse2, delta, n_q: int, block_m: int, block_n: int) -> list:
    """TMA descriptors of (Z·H·N, d) views of q, k, v, dO and of the (Z·H, N_Q) statistics."""
    stats = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    return [
        tile_descriptor(q4, block_m), tile_descriptor(k4, block_n), tile_descriptor(v4, block_n),
        tile_descriptor(do4, block_m),
        *(TensorDescriptor(t, [t.shape[0], n_q], [t.stride(0), 1], [1, block_m], stats) for t in (lse2, delta)),
    ]


def block_descriptor(t: torch.Tensor, block: list[int]):
    """TMA descriptor of a 2-D fp32 tensor (a dQ accumulator) in tiles of shape `block`."""
    return TensorDescriptor.from_tensor(t, block, gl.NVMMASharedLayout.get_default_for(block, gl.float32))


def dkdv(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, do4: torch.Tensor, lse2: torch.Tensor,
         delta: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, causal: bool, block_m: int = 64,
         block_n: int = 64, stages: int = 3, num_warps: int = 4) -> None:
    """Write dK and dV into the contiguous (Z, H, N_K, d) `dk`, `dv`, from the D pre-pass's (Z·H, stat_rows)
    LSE2 and Delta (`flash_triton_bwd`). The caller checks `usable` first."""
    z, h, n_q, d = q4.shape
    n_k = k4.shape[2]
    descs = _descriptors(q4, k4, v4, do4, lse2, delta, n_q, block_m, block_n)
    grid = (triton.cdiv(n_k, block_n), z * h)
    last_launch["dkdv"] = f"gluon {block_m}x{block_n} w{num_warps} s{stages}"
    _dkdv_kernel[grid](*descs, dk, dv, *dk.stride()[:3], h, n_q, n_k, LOG2E / d ** 0.5, 1.0 / d ** 0.5,
                       HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal,
                       NUM_WARPS=num_warps, num_warps=num_warps)


def fused(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, do4: torch.Tensor, lse2: torch.Tensor,
          delta: torch.Tensor, dq_acc: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, causal: bool,
          block_m: int = 64, block_n: int = 64, stages: int = 3, num_warps: int = 4) -> None:
    """Write dK and dV as `dkdv` does, and add dQ/scale into the zeroed fp32 (Z·H·N_Q, d) `dq_acc`.

    Per query tile j of a key tile the kernel issues q·kᵀ_j and dPᵀ_j, then tile j−1's dV, dK = dSᵀ Q and
    dQ = dS K, the last two reading dSᵀ_{j−1} from shared memory; it waits for q·kᵀ_j with four groups in
    flight and for dPᵀ_j with three, as `dkdv` does with three and two. dQ_{j−1} goes from registers to shared
    memory and from there into `dq_acc` by a TMA reduction that runs while the next tiles are worked on. The
    sum's order depends on timing, so dQ is not bitwise reproducible."""
    z, h, n_q, d = q4.shape
    n_k = k4.shape[2]
    descs = _descriptors(q4, k4, v4, do4, lse2, delta, n_q, block_m, block_n)
    grid = (triton.cdiv(n_k, block_n), z * h)
    _fused_kernel[grid](*descs, block_descriptor(dq_acc, [block_m, d]), dk, dv, *dk.stride()[:3], h, n_q, n_k,
                        LOG2E / d ** 0.5, 1.0 / d ** 0.5,
                        HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal,
                        NUM_WARPS=num_warps, num_warps=num_warps)


def compile_sm90(head_dim: int, block_m: int = 64, block_n: int = 64, stages: int = 3, num_warps: int = 4,
                 causal: bool = True, with_dq: bool = False):
    """Compile the dK/dV kernel (or, `with_dq`, the fused one) for sm_90 (bf16) on any machine, GPU or not, so
    that what ptxas makes of a config can be checked without one (tests, scripts). Returns a triton
    CompiledKernel, not loaded."""
    rows = 4 * max(block_m, block_n)
    q4, k4, v4, do4 = (torch.empty(1, 1, rows, head_dim, dtype=torch.bfloat16) for _ in range(4))
    lse2, delta = (torch.empty(1, rows, dtype=torch.float32) for _ in range(2))
    descs = dict(zip(("desc_q", "desc_k", "desc_v", "desc_do", "desc_l", "desc_d"),
                     _descriptors(q4, k4, v4, do4, lse2, delta, rows, block_m, block_n), strict=True))
    descs["desc_dq"] = block_descriptor(torch.empty(rows, head_dim), [block_m, head_dim])
    consts = {"HEAD_DIM": head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n, "STAGES": stages, "CAUSAL": causal,
              "NUM_WARPS": num_warps}
    return compile_gluon(_fused_kernel if with_dq else _dkdv_kernel, descs, consts,
                         {"DK": "*bf16", "DV": "*bf16", "qk_scale": "fp32", "sm_scale": "fp32"},
                         {"num_warps": num_warps})


def compile_gluon(kernel, descs: dict, consts: dict, types: dict[str, str], options: dict):
    """Compile a Gluon kernel for sm_90 without a GPU: `descs` gives its descriptor parameters (by name), `consts`
    its constexprs, `types` the Triton types of its other non-i32 parameters; `options` go to triton.compile."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    names = kernel.arg_names
    signature = {}
    for name in names:
        if name in consts:
            signature[name] = "constexpr"
        elif name in descs:
            signature[name] = mangle_type(descs[name])
        else:
            signature[name] = types.get(name, "i32")
    constexprs = {(names.index(n),): v for n, v in consts.items()}
    return triton.compile(GluonASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                          target=GPUTarget("cuda", 90, 32), options=options)
