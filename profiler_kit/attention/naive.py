"""Naive attention: the full score matrix, a softmax over it, and a matmul with the values.

This is the baseline the flash implementations are measured against, written the way most PyTorch code
writes it. Every step runs in the input dtype: PyTorch's matmul and softmax kernels accumulate in fp32
internally for bf16/fp16, and storing the N×N scores and probabilities in the input dtype is what a user of
this code pays in memory. Called on float64 tensors it is the tests' reference.

Causal masking with different query and key lengths is aligned to the top left (query i sees keys 0..i), the
same convention as the flash implementations and `scaled_dot_product_attention`.
"""

from __future__ import annotations

import math

import torch


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
) -> torch.Tensor:
    """softmax(q kᵀ / √d) v over `(..., seq, d)` tensors, with keys j > i masked out when `is_causal`."""
    scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))
    if is_causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        visible = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v
