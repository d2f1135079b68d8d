"""The attention implementations, by the one set of names that the benchmark, the profiler and the model use.

| name             | what runs                                                                               |
|------------------|-----------------------------------------------------------------------------------------|
| `naive`          | `reference.naive_attention`: full scores, softmax, matmul, in the input dtype            |
| `compiled`       | `naive` through `torch.compile`                                                          |
| `sdpa`           | `scaled_dot_product_attention` with the backend PyTorch picks                            |
| `sdpa-flash`     | SDPA pinned to its FlashAttention backend                                                |
| `sdpa-cudnn`     | SDPA pinned to its cuDNN backend                                                         |
| `sdpa-efficient` | SDPA pinned to its memory-efficient backend                                              |
| `flash`          | `flash_attention`: the Triton kernels where they run, the tiled PyTorch reference elsewhere |
| `flash-torch`    | `reference.FlashAttentionPytorch`, the tiled PyTorch reference                           |
| `flash-triton`   | `FlashAttentionTriton`: the Triton (and Gluon) kernels only, on CUDA or the interpreter   |
| `flash-op`       | the operator `torch.ops.profiler_kit.flash_attention` (`op`), also when called eagerly     |

`BENCH_IMPLS` is what `attention bench` runs without `--impl`; the model (`--attention`) takes any name, with
the causal mask always on, and defaults to `naive`. Kernel modules are imported only when an implementation
is made, so that importing this module stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from profiler_kit.attention.options import INTERPRET
from profiler_kit.names import ATTENTION_IMPLS

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SDPA_BACKENDS = {"sdpa-flash": "FLASH_ATTENTION", "sdpa-cudnn": "CUDNN_ATTENTION",
                 "sdpa-efficient": "EFFICIENT_ATTENTION"}
NAMES = ATTENTION_IMPLS
BENCH_IMPLS = ("naive", "compiled", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "flash-torch", "flash-triton")
# Implementations that keep the N×N probabilities for the backward; all others keep only O and the logsumexp.
MATERIALIZING_IMPLS = ("naive", "compiled")


def input_shape(batch: int, heads: int | None, seq: int, d: int) -> tuple[int, ...]:
    """The shape of q, k, v: (batch, heads, seq, d), or (batch, seq, d) when `heads` is None."""
    return (batch, seq, d) if heads is None else (batch, heads, seq, d)


def check_name(name: str) -> None:
    """Raise ValueError unless `name` is one of NAMES."""
    if name not in NAMES:
        raise ValueError(f"unknown implementation {name!r}; choose from {', '.join(NAMES)}")


def _sdpa(backend: str | None, causal: bool) -> AttentionFn:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # The fused backends take (B, H, N, d) only; a missing head dim becomes a head dim of 1 (a view).
        three_d = q.dim() == 3
        if three_d:
            q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
        if backend is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        else:
            with sdpa_kernel(getattr(SDPBackend, backend)):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return out.squeeze(1) if three_d else out

    return run


def make_impl(name: str, causal: bool, device: torch.device | None = None) -> AttentionFn:
    """The implementation `name` as f(q, k, v) with `causal` bound. With a `device`, an implementation that
    cannot run there at all (Triton without CUDA or the interpreter) raises RuntimeError here."""
    check_name(name)
    if name == "sdpa" or name in SDPA_BACKENDS:
        return _sdpa(SDPA_BACKENDS.get(name), causal)
    if name in ("naive", "compiled"):
        from profiler_kit.attention.reference import naive_attention

        if name == "naive":
            return lambda q, k, v: naive_attention(q, k, v, is_causal=causal)
        # A fresh, shape-specialised compile per config: reusing one would hit dynamo's recompile limit over a
        # sweep and silently fall back to eager.
        torch._dynamo.reset()
        # Timing the backward alone replays one retained graph; AOTAutograd's donated buffers forbid that
        # (backward with retain_graph=True raises), so the compiled backward keeps its saved buffers here.
        torch._functorch.config.donated_buffer = False
        compiled = torch.compile(naive_attention, dynamic=False)
        return lambda q, k, v: compiled(q, k, v, is_causal=causal)
    if name == "flash-torch":
        from profiler_kit.attention.reference import FlashAttentionPytorch

        return lambda q, k, v: FlashAttentionPytorch.apply(q, k, v, causal)
    if name == "flash-op":
        from profiler_kit.attention.op import flash_attention_op

        return lambda q, k, v: flash_attention_op(q, k, v, causal)
    from profiler_kit.attention.triton_kernels.function import flash_attention, triton_attention

    if name == "flash":
        return lambda q, k, v: flash_attention(q, k, v, causal)
    if device is not None and device.type != "cuda" and not INTERPRET:
        raise RuntimeError("Triton kernels need a CUDA device; on a CPU start with TRITON_INTERPRET=1")
    return lambda q, k, v: triton_attention(q, k, v, causal)
