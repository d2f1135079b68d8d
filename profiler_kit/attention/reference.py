"""The PyTorch reference implementations: naive attention and FlashAttention-2 over tiles, and the input
contract every implementation shares.

`naive_attention` builds the full score matrix, a softmax over it and a matmul with the values, the way most
PyTorch code writes it. Every step runs in the input dtype (PyTorch's matmul and softmax kernels accumulate in
fp32 internally for bf16/fp16), so the N×N scores and probabilities cost what they cost a user of this code.
Each step runs in its own NVTX range (`attn_scores`, `softmax`, `attn_value`), so that a profile can split its
time. Called on float64 tensors it is the tests' reference.

`FlashAttentionPytorch` walks query and key tiles in Python and keeps, per query row, a running maximum and a
running sum of exponentials (the online softmax), so the full score matrix never exists. Each tile is upcast
to fp32, so the arithmetic is fp32 whatever the input dtype; the output is cast back to the input dtype. The
backward pass recomputes the probabilities of each tile from the saved logsumexp L = log Σ_j exp(s_ij)
instead of storing them. It is the readable reference for the Triton kernels.

The input contract (`check_attention_inputs`):

- q, k, v are `(..., seq, d)` with the same leading dims (any number of them, folded into one batch dim);
- the query and key lengths may differ;
- d is the same for q, k and v and lies in [MIN_HEAD_DIM, MAX_HEAD_DIM] (any value, not only powers of two);
- dtype is fp32, bf16 or fp16, the same for all three, and all three sit on one device.

Causal masking with different query and key lengths is aligned to the top left, as in
`torch.nn.functional.scaled_dot_product_attention`: query i sees keys 0..i. Every query row sees at least
key 0, so no row is fully masked.
"""

from __future__ import annotations

import math

import torch

from profiler_kit.errors import ProfilerKitError
from profiler_kit.nvtx_ranges import nvtx_range

MIN_HEAD_DIM = 16
MAX_HEAD_DIM = 128
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Square tiles; 64 keeps the Python loop short while still showing the tiling.
TILE_SIZE = 64


class AttentionInputError(ProfilerKitError, ValueError):
    """q, k, v breaking the input contract: a ValueError for library callers, a one-line error for the CLI."""


def check_attention_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise AttentionInputError unless q, k, v follow the contract in this module's docstring."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise AttentionInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise AttentionInputError(f"{name} must have shape (..., seq, d), got {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise AttentionInputError(f"{name} has dtype {t.dtype}; supported: float32, bfloat16, float16")
    if not (q.dtype == k.dtype == v.dtype):
        raise AttentionInputError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise AttentionInputError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}")
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise AttentionInputError(
            f"q, k, v leading dims differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    d = q.shape[-1]
    if k.shape[-1] != d or v.shape[-1] != d:
        raise AttentionInputError(f"head dims differ: q {d}, k {k.shape[-1]}, v {v.shape[-1]}")
    if not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
        raise AttentionInputError(f"head dim {d} unsupported; it must be in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}]")
    if k.shape[-2] != v.shape[-2]:
        raise AttentionInputError(f"k has {k.shape[-2]} keys but v has {v.shape[-2]} values")
    if q.numel() == 0 or k.numel() == 0:
        raise AttentionInputError(f"empty inputs: q {tuple(q.shape)}, k {tuple(k.shape)}")


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
) -> torch.Tensor:
    """softmax(q kᵀ / √d) v over `(..., seq, d)` tensors, with keys j > i masked out when `is_causal`."""
    with nvtx_range("attn_scores"):
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))
        if is_causal:
            n_q, n_k = q.shape[-2], k.shape[-2]
            visible = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~visible, float("-inf"))
    with nvtx_range("softmax"):
        probs = torch.softmax(scores, dim=-1)
    with nvtx_range("attn_value"):
        return probs @ v


def _tiles(n: int) -> list[tuple[int, int]]:
    """[start, stop) bounds of the tiles covering 0..n; the last one is ragged when n % TILE_SIZE != 0."""
    return [(start, min(start + TILE_SIZE, n)) for start in range(0, n, TILE_SIZE)]


def _causal_relation(q_tile: tuple[int, int], k_tile: tuple[int, int]) -> str:
    """'skip' when every (query, key) pair of the tiles is masked, 'full' when none is, else 'diagonal'."""
    (q_start, q_stop), (k_start, k_stop) = q_tile, k_tile
    if k_start > q_stop - 1:
        return "skip"
    return "full" if k_stop - 1 <= q_start else "diagonal"


def _tile_mask(q_tile: tuple[int, int], k_tile: tuple[int, int], device: torch.device) -> torch.Tensor:
    """True where key j is visible to query i (j ≤ i) inside one tile pair."""
    rows = torch.arange(*q_tile, device=device)[:, None]
    cols = torch.arange(*k_tile, device=device)[None, :]
    return cols <= rows


def _flash_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled forward over (batch, seq, d): output in the input dtype, fp32 logsumexp (batch, seq_q)."""
    batch, n_q, d = q.shape
    scale = 1.0 / math.sqrt(d)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, n_q, dtype=torch.float32, device=q.device)
    for q_tile in _tiles(n_q):
        qi = q[:, slice(*q_tile)].float()
        rows = q_tile[1] - q_tile[0]
        row_max = torch.full((batch, rows), float("-inf"), device=q.device)
        row_sum = torch.zeros(batch, rows, device=q.device)
        acc = torch.zeros(batch, rows, d, device=q.device)
        for k_tile in _tiles(k.shape[1]):
            relation = _causal_relation(q_tile, k_tile) if is_causal else "full"
            if relation == "skip":
                continue
            kj, vj = k[:, slice(*k_tile)].float(), v[:, slice(*k_tile)].float()
            scores = qi @ kj.transpose(1, 2) * scale
            if relation == "diagonal":
                scores = scores.masked_fill(~_tile_mask(q_tile, k_tile, q.device), float("-inf"))
            new_max = torch.maximum(row_max, scores.amax(dim=-1))
            probs = torch.exp(scores - new_max[..., None])
            # Rescale what was accumulated under the old maximum (exp(-inf) = 0 on the first tile).
            correction = torch.exp(row_max - new_max)
            row_sum = row_sum * correction + probs.sum(dim=-1)
            acc = acc * correction[..., None] + probs @ vj
            row_max = new_max
        out[:, slice(*q_tile)] = (acc / row_sum[..., None]).to(q.dtype)
        lse[:, slice(*q_tile)] = row_max + torch.log(row_sum)
    return out, lse


def _flash_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    is_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients over (batch, seq, d) tensors, recomputing P_ij = exp(s_ij - L_i) tile by tile.

    With D_i = Σ_d dO_id O_id (= Σ_j P_ij dP_ij), the softmax backward is dS = P ∘ (dP - D).
    """
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    delta = (grad_out.float() * out.float()).sum(dim=-1)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=q.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=q.device)
    for k_tile in _tiles(k.shape[1]):
        ks = slice(*k_tile)
        kj, vj = k[:, ks].float(), v[:, ks].float()
        for q_tile in _tiles(q.shape[1]):
            relation = _causal_relation(q_tile, k_tile) if is_causal else "full"
            if relation == "skip":
                continue
            qs = slice(*q_tile)
            qi, dOi = q[:, qs].float(), grad_out[:, qs].float()
            probs = torch.exp(qi @ kj.transpose(1, 2) * scale - lse[:, qs, None])
            if relation == "diagonal":
                probs = probs.masked_fill(~_tile_mask(q_tile, k_tile, q.device), 0.0)
            dv[:, ks] += probs.transpose(1, 2) @ dOi
            dprobs = dOi @ vj.transpose(1, 2)
            dscores = probs * (dprobs - delta[:, qs, None])
            dq[:, qs] += dscores @ kj * scale
            dk[:, ks] += dscores.transpose(1, 2) @ qi * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _fold(t: torch.Tensor) -> torch.Tensor:
    """(..., seq, d) → (batch, seq, d), the leading dims folded into one (a view when the layout allows)."""
    return t.reshape(-1, t.shape[-2], t.shape[-1])


class FlashAttentionPytorch(torch.autograd.Function):
    """FlashAttention-2 with torch ops over tiles. Saves exactly q, k, v, o and the fp32 logsumexp."""

    @staticmethod
    def forward(
        ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
    ) -> torch.Tensor:
        check_attention_inputs(q, k, v)
        out, lse = _flash_forward(_fold(q), _fold(k), _fold(v), is_causal)
        out, lse = out.view(q.shape), lse.view(q.shape[:-1])
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = is_causal
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        lse = lse.reshape(-1, q.shape[-2])
        folded = (_fold(t) for t in (q, k, v, out))
        dq, dk, dv = _flash_backward(*folded, lse, _fold(grad_out), ctx.is_causal)
        return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape), None
