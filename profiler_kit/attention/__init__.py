"""Attention implementations: naive PyTorch, FlashAttention-2 in tiled PyTorch, and in Triton and Gluon.

All take `(..., seq, d)` tensors; see `reference` for the shared input contract and the causal convention.
Layout: `reference` (naive and tiled PyTorch), `triton_kernels` (Triton kernels, configs, launcher, autograd
Function), `gluon_kernels` (Hopper forward and fused backward), `dispatch` (which kernels a call runs),
`options` (the kernel choices a caller can make), `op` (the torch.library operators that torch.compile traces),
`record` (which kernels ran), `registry` (the named implementations), `machine_code` (sm_90 compiles without a
GPU), `bench` and `bench_tables` (the benchmark).

The public names below are imported on first use, so that `registry` (which the model and the CLI read for
the implementation names) can be imported without Triton.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "AttentionInputError": "reference",
    "FlashAttentionPytorch": "reference",
    "naive_attention": "reference",
    "FlashAttentionTriton": "triton_kernels.function",
    "flash_attention": "triton_kernels.function",
    "tuned_configs": "triton_kernels.bwd",
    "FlashOptions": "options",
    "GluonBackwardConfig": "options",
    "GluonForwardConfig": "options",
    "flash_options": "options",
    "LaunchRecord": "record",
    "launch_record": "record",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_PUBLIC[name]}"), name)
