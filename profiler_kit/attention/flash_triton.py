"""FlashAttention-2 in Triton as an autograd Function, and `flash_attention`, the public entry point.

Layers: the @triton.jit kernels and their launchers live in `flash_triton_fwd` / `flash_triton_bwd`, the launch
plumbing both share in `flash_triton_launch`; this module checks the inputs, folds the leading dims and wires
forward and backward together.
"""

from __future__ import annotations

import torch

from profiler_kit.attention import flash_triton_bwd, flash_triton_fwd
from profiler_kit.attention.flash_torch import (
    AttentionInputError,
    FlashAttentionPytorch,
    check_attention_inputs,
)
from profiler_kit.attention.flash_triton_bwd import flash_backward
from profiler_kit.attention.flash_triton_fwd import as_4d, flash_forward
from profiler_kit.attention.flash_triton_launch import CONFIG_FLAGS, INTERPRET


def _check_triton_device(q: torch.Tensor) -> None:
    if q.device.type != "cuda" and not INTERPRET:
        raise AttentionInputError(
            f"FlashAttentionTriton needs CUDA tensors, got {q.device} "
            "(set TRITON_INTERPRET=1 before importing profiler_kit to run the kernels on the CPU interpreter)"
        )
    if INTERPRET and q.dtype == torch.bfloat16:
        # The interpreter stores bf16 as raw uint16 and tl.dot multiplies the bit patterns (triton#11584).
        raise AttentionInputError("the Triton interpreter cannot compute bfloat16; use fp16/fp32 or a GPU")


class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 forward and backward in Triton. Saves exactly q, k, v, o and the fp32 logsumexp.

    Same contract as FlashAttentionPytorch (see `flash_torch`): `(..., seq, d)` inputs, head dims 16–128,
    fp32/bf16/fp16, different query and key lengths, causal masking aligned to the top left. fp32 runs its
    matmuls in TF32.
    """

    @staticmethod
    def forward(
        ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
    ) -> torch.Tensor:
        check_attention_inputs(q, k, v)
        _check_triton_device(q)
        out, lse = flash_forward(as_4d(q), as_4d(k), as_4d(v), is_causal)
        out, lse = out.view(q.shape), lse.view(q.shape[:-1])
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = is_causal
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_backward(as_4d(q), as_4d(k), as_4d(v), as_4d(out), lse, grad_out, ctx.is_causal)
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape), None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """FlashAttention-2 over `(..., seq, d)` tensors: the Triton kernels on CUDA.

    On the CPU the Triton kernels run only under TRITON_INTERPRET=1 (set before import; slow, meant for tests)
    and not in bf16, which the interpreter cannot compute; otherwise the PyTorch tiled implementation computes
    the same result.
    """
    if q.device.type == "cuda" or (INTERPRET and q.dtype != torch.bfloat16):
        return FlashAttentionTriton.apply(q, k, v, causal)
    return FlashAttentionPytorch.apply(q, k, v, causal)


# The Triton kernels by the names `last_configs` and `flash_backward(configs_by_kernel=…)` use, for scripts
# that compile or pin one of them (scripts/flash_tune.py, scripts/flash_sass.py).
JIT_KERNELS = {
    "fwd": flash_triton_fwd._flash_attn_fwd_kernel,
    "dkdv": flash_triton_bwd._flash_attn_bwd_dkdv_kernel,
    "dq": flash_triton_bwd._flash_attn_bwd_dq_kernel,
}
# Their shipped config lists, as (BLOCK_M, BLOCK_N, warps, stages, *flags) tuples.
SHIPPED_SHAPES = {
    "fwd": flash_triton_fwd._fwd.shapes, "dkdv": flash_triton_bwd._dkdv.shapes, "dq": flash_triton_bwd._dq.shapes,
}


def tuned_configs() -> dict[str, dict]:
    """Per Triton kernel, the autotuner's chosen config for each tuning key seen in this process."""
    return {**flash_triton_fwd.tuned_configs(), **flash_triton_bwd.tuned_configs()}


def describe_last_configs() -> str:
    """The configs the autotuner last ran, one line for a result row: "fwd 128x64 w8 s3; dkdv …; dq …"
    (BLOCK_MxBLOCK_N, warps, stages, then the config's flags: "ws", "head-first", "overlap", "maxnreg=R").
    Empty when nothing went through the autotuner (it was switched off)."""
    last = {**flash_triton_fwd.last_configs(), **flash_triton_bwd.last_configs()}
    return "; ".join(
        f"{kernel} {c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']} w{c.num_warps} s{c.num_stages}"
        + "".join(f" {flag.replace('_', '-')}" for flag, const in CONFIG_FLAGS.items() if c.kwargs.get(const))
        + (f" maxnreg={c.maxnreg}" if c.maxnreg else "")
        for kernel, c in last.items()
        if c is not None
    )
