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

Scope: 16-bit q, k, v, dO that are contiguous (Z, H, N, d) tensors with d ∈ {64, 128}, on compute
capability 9.0 with Triton's Gluon (3.6). `usable` says whether a call qualifies.
"""

from __future__ import annotations

import torch
import triton

from profiler_kit.attention.flash_triton_fwd import LOG2E

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

    # Names that changed after Triton 3.6: the TMA load (`async_load` later) and the CTA barrier (`barrier`).
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
except ImportError:  # pragma: no cover - depends on the installed Triton
    gluon = None

GLUON_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
HEAD_DIMS = (64, 128)


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
    def _dkdv_kernel(desc_q, desc_k, desc_v, desc_do, desc_l, desc_d, DK, DV,
                     stride_gz, stride_gh, stride_gn, H, N_Q, N_K, qk_scale, sm_scale,
                     HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                     CAUSAL: gl.constexpr, NUM_WARPS: gl.constexpr):
        """dK, dV of one (key tile, batch·head); the module docstring gives the order of work."""
        dtype: gl.constexpr = desc_q.dtype
        # Score tiles are (keys × queries), dK/dV tiles (keys × d): one wgmma layout for each width.
        mma_s: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
        mma_o: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NUM_WARPS, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
        a_regs: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_o, k_width=2)
        cols_of: gl.constexpr = gl.SliceLayout(0, mma_s)

        pid_n = gl.program_id(0)
        pid_bh = gl.program_id(1)
        start_n = pid_n * BLOCK_N
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
                lse2 = l_s.index(slot).reshape([BLOCK_M]).load(cols_of)
                p = gl.exp2(qk * qk_scale - lse2[None, :])
                rows = start_m + queries
                needs_mask = start_m + BLOCK_M > N_Q
                if CAUSAL:
                    needs_mask = needs_mask | (start_m < start_n + BLOCK_N)
                if needs_mask:
                    if CAUSAL:
                        visible = (rows[None, :] < N_Q) & (keys[:, None] <= rows[None, :])
                    else:
                        visible = (rows[None, :] < N_Q) & (keys[:, None] >= 0)
                    p = gl.where(visible, p, 0.0)
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
        out_rows = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, mma_o))
        out_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, mma_o))
        z = pid_bh // H
        h = pid_bh % H
        offsets = (z.to(gl.int64) * stride_gz + h.to(gl.int64) * stride_gh + out_rows[:, None] * stride_gn
                   + out_cols[None, :])
        inside = (out_rows[:, None] < N_K) & (out_cols[None, :] < HEAD_DIM)
        gl.store(DK + offsets, (dk * sm_scale).to(dtype), mask=inside)
        gl.store(DV + offsets, dv.to(dtype), mask=inside)


def usable(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, do4: torch.Tensor) -> bool:
    """Whether `dkdv` takes these (Z, H, N, d) tensors: Gluon present, a 16-bit dtype, d ∈ HEAD_DIMS,
    contiguous tensors on a GPU of compute capability 9.x."""
    return (gluon is not None and q4.dtype in GLUON_DTYPES and q4.shape[-1] in HEAD_DIMS and q4.is_cuda
            and torch.cuda.get_device_capability(q4.device)[0] == 9
            and all(t.is_contiguous() and t.dtype == q4.dtype for t in (q4, k4, v4, do4)))


def _descriptors(q4, k4, v4, do4, lse2, delta, n_q: int, block_m: int, block_n: int) -> list:
    """TMA descriptors of (Z·H·N, d) views of q, k, v, dO and of the (Z·H, N_Q) statistics."""
    d = q4.shape[-1]
    dtype = getattr(gl, GLUON_DTYPES[q4.dtype])
    rows = [gl.NVMMASharedLayout.get_default_for([b, d], dtype) for b in (block_m, block_n)]
    stats = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
    flat = [t.reshape(-1, d) for t in (q4, k4, v4, do4)]
    return [
        TensorDescriptor.from_tensor(flat[0], [block_m, d], rows[0]),
        TensorDescriptor.from_tensor(flat[1], [block_n, d], rows[1]),
        TensorDescriptor.from_tensor(flat[2], [block_n, d], rows[1]),
        TensorDescriptor.from_tensor(flat[3], [block_m, d], rows[0]),
        *(TensorDescriptor(t, [t.shape[0], n_q], [t.stride(0), 1], [1, block_m], stats) for t in (lse2, delta)),
    ]


def dkdv(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, do4: torch.Tensor, lse2: torch.Tensor,
         delta: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, causal: bool, block_m: int = 64,
         block_n: int = 64, stages: int = 3, num_warps: int = 4) -> None:
    """Write dK and dV into the contiguous (Z, H, N_K, d) `dk`, `dv`, from the D pre-pass's (Z·H, stat_rows)
    LSE2 and Delta (`flash_triton_bwd`). The caller checks `usable` first."""
    z, h, n_q, d = q4.shape
    n_k = k4.shape[2]
    descs = _descriptors(q4, k4, v4, do4, lse2, delta, n_q, block_m, block_n)
    grid = (triton.cdiv(n_k, block_n), z * h)
    _dkdv_kernel[grid](*descs, dk, dv, *dk.stride()[:3], h, n_q, n_k, LOG2E / d ** 0.5, 1.0 / d ** 0.5,
                       HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, CAUSAL=causal,
                       NUM_WARPS=num_warps, num_warps=num_warps)


def compile_sm90(head_dim: int, block_m: int = 64, block_n: int = 64, stages: int = 3, num_warps: int = 4,
                 causal: bool = True):
    """Compile the kernel for sm_90 (bf16) on any machine, GPU or not, so that what ptxas makes of a config can
    be checked without one (tests, scripts). Returns a triton CompiledKernel, not loaded."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    rows = 4 * max(block_m, block_n)
    q4, k4, v4, do4 = (torch.empty(1, 1, rows, head_dim, dtype=torch.bfloat16) for _ in range(4))
    lse2, delta = (torch.empty(1, rows, dtype=torch.float32) for _ in range(2))
    descs = dict(zip(("desc_q", "desc_k", "desc_v", "desc_do", "desc_l", "desc_d"),
                     _descriptors(q4, k4, v4, do4, lse2, delta, rows, block_m, block_n), strict=True))
    consts = {"HEAD_DIM": head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n, "STAGES": stages, "CAUSAL": causal,
              "NUM_WARPS": num_warps}
    names = _dkdv_kernel.arg_names
    signature = {}
    for name in names:
        if name in consts:
            signature[name] = "constexpr"
        elif name in descs:
            signature[name] = mangle_type(descs[name])
        else:
            signature[name] = {"DK": "*bf16", "DV": "*bf16", "qk_scale": "fp32", "sm_scale": "fp32"}.get(name, "i32")
    constexprs = {(names.index(n),): v for n, v in consts.items()}
    return triton.compile(GluonASTSource(fn=_dkdv_kernel, signature=signature, constexprs=constexprs),
                          target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
