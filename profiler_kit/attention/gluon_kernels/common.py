"""What the Gluon attention kernels share: Gluon's imports under the names this Triton gives them, the wgmma
accumulator layouts, the query-tile loads, masks and stores of the backward, TMA descriptors, whether a call can
run in Gluon at all (`usable`), and compiling a Gluon kernel for sm_90 without a GPU.

Rows and keys are read through (Z·H·N, d) views of contiguous (Z, H, N, d) tensors, so a tile reaching past N
reads the next head's rows: the kernels mask those out of their sums and never store them.
"""

from __future__ import annotations

import torch
import triton

try:  # Triton ≥ 3.5 ships Gluon; without it the Triton kernels run alone.
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
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


if gluon is not None:

    @gluon.jit
    def load_query_tile(desc_q, desc_do, desc_l, desc_d, q_s, do_s, l_s, d_s, bars, slot, row, pid_bh, start_m,
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
    def probabilities(qk, lse2, qk_scale, rows, keys, N_Q, N_K, masked, CAUSAL: gl.constexpr,
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
    def needs_mask(start_m, start_n, N_Q, keys_past_end, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    CAUSAL: gl.constexpr):
        """Whether the (BLOCK_N keys from start_n × BLOCK_M queries from start_m) tile needs `probabilities`'s
        mask: it reaches past N_Q, its keys past N_K (`keys_past_end`), or, causal, it holds the diagonal."""
        masked = (start_m + BLOCK_M > N_Q) | keys_past_end
        if CAUSAL:
            masked = masked | (start_m < start_n + BLOCK_N)
        return masked

    @gluon.jit
    def store_dkdv(DK, DV, dk, dv, pid_bh, start_n, stride_gz, stride_gh, stride_gn, H, N_K, layout: gl.constexpr):
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



def usable(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, do4: torch.Tensor | None = None) -> bool:
    """Whether the Gluon kernels take these (Z, H, N, d) tensors (and dO, for the backward): Gluon present, a
    16-bit dtype, d in HEAD_DIMS, non-empty contiguous tensors on a GPU of compute capability 9.x."""
    tensors = (q4, k4, v4) if do4 is None else (q4, k4, v4, do4)
    return (gluon is not None and q4.dtype in GLUON_DTYPES and q4.shape[-1] in HEAD_DIMS and q4.is_cuda
            and q4.shape[2] > 0 and k4.shape[2] > 0
            and torch.cuda.get_device_capability(q4.device)[0] == 9
            and all(t.is_contiguous() and t.dtype == q4.dtype for t in tensors))


def tile_descriptor(t: torch.Tensor, rows: int):
    """TMA descriptor of the (Z·H·N, d) view of a contiguous 16-bit (Z, H, N, d) tensor, in tiles of `rows` rows."""
    d = t.shape[-1]
    layout = gl.NVMMASharedLayout.get_default_for([rows, d], getattr(gl, GLUON_DTYPES[t.dtype]))
    return TensorDescriptor.from_tensor(t.reshape(-1, d), [rows, d], layout)


def backward_descriptors(q4, k4, v4, do4, lse2, delta, n_q: int, block_m: int, block_n: int) -> list:
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
