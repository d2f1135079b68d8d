"""An NVTX-annotated pre-norm Transformer LM: RMSNorm, causal multi-head attention with RoPE, SwiGLU.

Every layer runs in its own NVTX range (`layer_<i>`) holding `attention` and `ffn`; naive attention also
marks `attn_scores`, `softmax` and `attn_value`, so a profile can split attention time into its matmuls and
its softmax. The attention implementation is any name of `profiler_kit.attention.registry`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from profiler_kit.attention.registry import NAMES, AttentionFn, make_impl
from profiler_kit.errors import ProfilerKitError
from profiler_kit.nvtx_ranges import nvtx_range
from profiler_kit.presets import ModelConfig

# Every implementation of the attention registry; the model runs each with the causal mask.
ATTENTION_IMPLS = NAMES
# Initial weights: std 0.02 truncated at ±2σ, as in GPT-2.
INIT_STD = 0.02
RMSNORM_EPS = 1e-5

def attention_fn(name: str) -> AttentionFn:
    """The registry's implementation `name` (`profiler_kit.attention.registry`), causal."""
    if name not in ATTENTION_IMPLS:
        raise ProfilerKitError(f"unknown attention {name!r}; choose from {', '.join(ATTENTION_IMPLS)}")
    return make_impl(name, causal=True)


class RMSNorm(nn.Module):
    def __init__(self, d_model: int, eps: float = RMSNORM_EPS) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 whatever the input dtype; return the input dtype.
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """RoPE on pairs of adjacent features; cos/sin tables are buffers, not parameters."""

    def __init__(self, head_dim: int, context_length: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(context_length, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[-2]
        cos, sin = self.cos[:t].to(x.dtype), self.sin[:t].to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        return rotated.flatten(-2)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: AttentionFn, rope: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.attention = attention
        self.rope = rope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.num_heads, d // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k = self.rope(q), self.rope(k)
        y = self.attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, attention: AttentionFn, rope: RotaryEmbedding, index: int) -> None:
        super().__init__()
        self.range_name = f"layer_{index}"
        self.norm1 = RMSNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg, attention, rope)
        self.norm2 = RMSNorm(cfg.d_model)
        self.ffn = SwiGLU(cfg.d_model, cfg.d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with nvtx_range(self.range_name):
            with nvtx_range("attention"):
                x = x + self.attn(self.norm1(x))
            with nvtx_range("ffn"):
                x = x + self.ffn(self.norm2(x))
        return x


class TransformerLM(nn.Module):
    """Token embedding → pre-norm blocks → final RMSNorm → LM head (untied)."""

    def __init__(self, cfg: ModelConfig, attention: str = "naive") -> None:
        super().__init__()
        self.cfg = cfg
        attn = attention_fn(attention)
        rope = RotaryEmbedding(cfg.head_dim, cfg.context_length, cfg.rope_theta)
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(TransformerBlock(cfg, attn, rope, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(_init_weights)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.shape[-1] > self.cfg.context_length:
            raise ProfilerKitError(
                f"sequence of {tokens.shape[-1]} tokens exceeds the context length {self.cfg.context_length}"
            )
        x = self.embedding(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.trunc_normal_(module.weight, std=INIT_STD, a=-2 * INIT_STD, b=2 * INIT_STD)
