"""Attention implementations: naive PyTorch, FlashAttention-2 in tiled PyTorch and in Triton.

All take `(..., seq, d)` tensors; see `flash_torch` for the shared input contract and the causal convention.
"""

from profiler_kit.attention.flash_torch import AttentionInputError, FlashAttentionPytorch
from profiler_kit.attention.flash_triton import FlashAttentionTriton, flash_attention, tuned_configs
from profiler_kit.attention.naive import naive_attention

__all__ = [
    "AttentionInputError",
    "FlashAttentionPytorch",
    "FlashAttentionTriton",
    "flash_attention",
    "naive_attention",
    "tuned_configs",
]
