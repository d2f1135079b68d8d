"""FlashAttention-2 as an autograd Function over the Triton (and, where `dispatch` picks them, Gluon) kernels,
and `flash_attention`, the public entry point.

This module checks the inputs, folds the leading dims and wires forward and backward together; `dispatch`
chooses the kernels. The Function keeps the options its forward ran with and the launch record of both
passes on its context (`record.launch_record(out)` reads it).
"""

from __future__ import annotations

import torch

from profiler_kit.attention import dispatch
from profiler_kit.attention.op import flash_attention_op
from profiler_kit.attention.options import INTERPRET, FlashOptions, current_options
from profiler_kit.attention.reference import AttentionInputError, FlashAttentionPytorch, check_attention_inputs
from profiler_kit.attention.triton_kernels.tiles import as_4d


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

    Same contract as FlashAttentionPytorch (see `reference`): `(..., seq, d)` inputs, head dims 16–128,
    fp32/bf16/fp16, different query and key lengths, causal masking aligned to the top left. fp32 runs its
    matmuls in TF32. `options` (default: those in force, `options.flash_options`) choose the kernels.
    """

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                options: FlashOptions | None = None) -> torch.Tensor:
        check_attention_inputs(q, k, v)
        _check_triton_device(q)
        options = options or current_options()
        out, lse, record = dispatch.forward(as_4d(q), as_4d(k), as_4d(v), is_causal, options)
        out, lse = out.view(q.shape), lse.view(q.shape[:-1])
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = is_causal
        ctx.options = options
        ctx.launch_record = record
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv, record = dispatch.backward(as_4d(q), as_4d(k), as_4d(v), as_4d(out), lse, as_4d(grad_out),
                                               ctx.is_causal, ctx.options)
        ctx.launch_record = ctx.launch_record + record
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape), None, None


def triton_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                     options: FlashOptions | None = None) -> torch.Tensor:
    """The Triton kernels over `(..., seq, d)` tensors (CUDA, or the CPU interpreter)."""
    return FlashAttentionTriton.apply(q, k, v, causal, options)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    options: FlashOptions | None = None) -> torch.Tensor:
    """FlashAttention-2 over `(..., seq, d)` tensors: the Triton kernels where `dispatch.triton_runs`, else the
    PyTorch tiled implementation, which computes the same result.

    On the CPU the Triton kernels run only under TRITON_INTERPRET=1 (set before import; slow, meant for tests)
    and not in bf16, which the interpreter cannot compute.

    Under `torch.compile` the call is the operator `torch.ops.profiler_kit.flash_attention` (`op`), which the
    compiler traces into the Triton kernels themselves, with the options in force when it compiles (`options`
    applies to eager calls only). Called eagerly it is the autograd Function, whose host path is the shorter:
    torch.library's dispatch of an operator with an autograd formula costs several times a Function's.
    """
    if torch.compiler.is_compiling():
        return flash_attention_op(q, k, v, causal)
    if dispatch.triton_runs(q):
        return FlashAttentionTriton.apply(q, k, v, causal, options)
    return FlashAttentionPytorch.apply(q, k, v, causal)
