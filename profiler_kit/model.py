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
        # Normalise in fp32 whatever the input dtype (F.rms_norm: one kernel where PyTorch fuses it); return the
        # input dtype.
        return F.rms_norm(x.float(), self.weight.shape, self.weight.float(), self.eps).to(x.dtype)


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
        # The block's own range (`range_name`) is opened by the model around this call: a block compiled on its
        # own then reads no per-block value, so every block shares one compiled code.
        with nvtx_range("attention"):
            x = x + self.attn(self.norm1(x))
        with nvtx_range("ffn"):
            x = x + self.ffn(self.norm2(x))
        return x


class LinearCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of the logits `hidden @ weightᵀ` against `targets`, `chunk_rows` rows at a time.

    The gradient of a row's loss with respect to its logits, softmax − one-hot, is known as soon as its
    log-softmax is: the forward turns each chunk of logits into that gradient (in the matmul dtype) and, when a
    gradient is wanted, ends with the backward's two matmuls. So neither the full logits in fp32 nor their
    log-softmax is ever kept; the backward only scales the two saved gradients.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk_rows: int) -> torch.Tensor:
        wants_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_logits = hidden.new_empty((hidden.shape[0], weight.shape[0])) if wants_grad else None
        for start in range(0, hidden.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            log_probs = torch.log_softmax(hidden[rows] @ weight.T, dim=-1, dtype=torch.float32)
            picked = targets[rows, None]
            total -= log_probs.gather(1, picked).sum()
            if wants_grad:
                probs = log_probs.exp_().scatter_add_(1, picked, log_probs.new_full(picked.shape, -1.0))
                grad_logits[rows] = probs
        if wants_grad:
            ctx.save_for_backward(grad_logits @ weight, grad_logits.T @ hidden)
        return total

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        scale = grad_total.to(grad_hidden.dtype)
        return grad_hidden * scale, grad_weight * scale, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk_rows: int | None) -> torch.Tensor:
    """Mean cross-entropy (fp32) of the logits `hidden @ weightᵀ` over the rows of `hidden` (..., d) against
    `targets` (...). `chunk_rows` None: the logits as one tensor, then F.cross_entropy on their fp32 copy; else
    `LinearCrossEntropy`. Under autocast the matmuls run in the autocast dtype either way."""
    hidden, targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    if chunk_rows is None:
        return F.cross_entropy((hidden @ weight.T).float(), targets)
    if torch.is_autocast_enabled(hidden.device.type):
        dtype = torch.get_autocast_dtype(hidden.device.type)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    with torch.autocast(hidden.device.type, enabled=False):
        return LinearCrossEntropy.apply(hidden, weight, targets, chunk_rows) / targets.numel()


class TransformerLM(nn.Module):
    """Token embedding → pre-norm blocks → final RMSNorm → LM head (untied).

    Called with targets it returns the mean cross-entropy instead of the logits, computed by
    `linear_cross_entropy` with `loss_chunk_rows`.
    """

    def __init__(self, cfg: ModelConfig, attention: str = "naive", loss_chunk_rows: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.loss_chunk_rows = loss_chunk_rows
        attn = attention_fn(attention)
        rope = RotaryEmbedding(cfg.head_dim, cfg.context_length, cfg.rope_theta)
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(TransformerBlock(cfg, attn, rope, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(_init_weights)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if tokens.shape[-1] > self.cfg.context_length:
            raise ProfilerKitError(
                f"sequence of {tokens.shape[-1]} tokens exceeds the context length {self.cfg.context_length}"
            )
        x = self.embedding(tokens)
        for layer in self.layers:
            with nvtx_range(layer.range_name):
                x = layer(x)
        x = self.norm(x)
        if targets is None:
            return self.lm_head(x)
        return linear_cross_entropy(x, self.lm_head.weight, targets, self.loss_chunk_rows)


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.trunc_normal_(module.weight, std=INIT_STD, a=-2 * INIT_STD, b=2 * INIT_STD)
