"""FlashAttention-2 as PyTorch operators, so that `torch.compile` traces through it and Inductor sees its kernels.

`torch.ops.profiler_kit.flash_attention(q, k, v, is_causal)` takes `(..., seq, d)` tensors under the contract of
`reference` and returns the attention output. It is made of three operators:

- `profiler_kit::flash_attention_forward(q, k, v, is_causal) -> (out, lse)` and
  `profiler_kit::flash_attention_backward(q, k, v, out, lse, grad_out, is_causal) -> (dq, dk, dv)`, Triton
  operators (`torch.library.triton_op`) whose implementation also serves as their fake (meta) kernel; the
  backward is registered as the forward's autograd formula;
- `profiler_kit::flash_attention`, a composite of the forward (CompositeImplicitAutograd) that checks the
  inputs and returns the output alone.

On CUDA the operators run the kernels `dispatch` chooses, with the options in force (`options.flash_options`)
when the forward runs.
Called eagerly, they go through the launch layer with all of its choices (autotuning, direct launch, Gluon
kernels, TMA) and keep the launch record on the output's autograd node, as `FlashAttentionTriton` does.
Traced by `torch.compile`, every launch goes through `torch.library.wrap_triton`, so that the compiled graph holds
the Triton kernels themselves (pointer loads, configs timed by Inductor) instead of an opaque call. On any other
device the operators run the tiled PyTorch reference, which traces as ordinary PyTorch ops.
"""

import threading

import torch
from torch import Tensor
from torch._library.triton import is_wrap_triton_enabled

from profiler_kit.attention import dispatch
from profiler_kit.attention.options import current_options, flash_options
from profiler_kit.attention.record import LaunchRecord
from profiler_kit.attention.reference import _flash_backward, _flash_forward, _fold, check_attention_inputs
from profiler_kit.attention.triton_kernels.tiles import as_4d

NAMESPACE = "profiler_kit"

# The launch record of this thread's last operator call: an operator returns tensors only, so its autograd
# formula picks the record up here, right after the call.
_last = threading.local()


# Type hints are real classes here (no `from __future__ import annotations`): torch.library infers the
# operator schemas from them.
@torch.library.triton_op(f"{NAMESPACE}::flash_attention_forward", mutates_args=())
def flash_attention_forward(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> tuple[Tensor, Tensor]:
    """The output (shaped like q) and the fp32 logsumexp of each query row (shaped like q without d)."""
    if q.device.type == "cuda":
        # wrap_triton is off exactly when torch.library runs the operator on real tensors (eagerly).
        out, lse, _last.record = dispatch.forward(as_4d(q), as_4d(k), as_4d(v), is_causal, current_options(),
                                                  traced=is_wrap_triton_enabled())
    else:
        out, lse = _flash_forward(_fold(q), _fold(k), _fold(v), is_causal)
        _last.record = LaunchRecord()
    return out.view(q.shape), lse.view(q.shape[:-1])


@torch.library.triton_op(f"{NAMESPACE}::flash_attention_backward", mutates_args=())
def flash_attention_backward(
    q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, grad_out: Tensor, is_causal: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """dQ, dK, dV (shaped like q, k, v) from the forward's inputs, output and logsumexp."""
    if q.device.type == "cuda":
        dq, dk, dv, _last.record = dispatch.backward(as_4d(q), as_4d(k), as_4d(v), as_4d(out), lse,
                                                     as_4d(grad_out), is_causal, current_options(),
                                                     traced=is_wrap_triton_enabled())
    else:
        lse = lse.reshape(-1, q.shape[-2])
        dq, dk, dv = _flash_backward(_fold(q), _fold(k), _fold(v), _fold(out), lse, _fold(grad_out), is_causal)
        _last.record = LaunchRecord()
    return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)


def _setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    q, k, v, is_causal = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.is_causal = is_causal
    ctx.mark_non_differentiable(lse)
    ctx.options = current_options()
    ctx.launch_record = getattr(_last, "record", LaunchRecord())


def _backward(ctx, grad_out: Tensor, _grad_lse: Tensor | None) -> tuple[Tensor, Tensor, Tensor, None]:
    q, k, v, out, lse = ctx.saved_tensors
    with flash_options(ctx.options):  # the forward's options, also on autograd's own thread
        dq, dk, dv = flash_attention_backward(q, k, v, out, lse, grad_out, ctx.is_causal)
    ctx.launch_record = ctx.launch_record + getattr(_last, "record", LaunchRecord())
    return dq, dk, dv, None


flash_attention_forward.register_autograd(_backward, setup_context=_setup_context)

torch.library.define(f"{NAMESPACE}::flash_attention", "(Tensor q, Tensor k, Tensor v, bool is_causal=False) -> Tensor")


@torch.library.impl(f"{NAMESPACE}::flash_attention", "CompositeImplicitAutograd")
def _flash_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    check_attention_inputs(q, k, v)
    return flash_attention_forward(q, k, v, is_causal)[0]


flash_attention_op = torch.ops.profiler_kit.flash_attention
