"""Inputs, the float64 reference and the tolerances that the attention kernel tests share."""

from __future__ import annotations

import math

import torch

from profiler_kit.attention import naive_attention

HAS_CUDA = torch.cuda.is_available()
DEVICE = "cuda" if HAS_CUDA else "cpu"

# Largest error allowed, relative to the largest magnitude of the float64 reference tensor. CPU: about 4× the
# largest error seen (fp32 is exact fp32 arithmetic; fp16 and bf16 round P and dS to 11 and 8 bits). CUDA:
# tl.dot runs fp32 as TF32 (10-bit mantissa, like fp16) and sequences are 10× longer, so the bounds are wider;
# a wrong tile or mask gives errors of order 1.
TOLERANCE = {
    "cpu": {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2},
    "cuda": {torch.float32: 1e-2, torch.float16: 1e-2, torch.bfloat16: 3e-2},
}


def make_inputs(lead, n_q, n_k, d, dtype, device=DEVICE, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*lead, n, d, generator=gen) for n in (n_q, n_k, n_k))
    grad_out = torch.randn(*lead, n_q, d, generator=gen)
    to = dict(dtype=dtype, device=device)
    return [t.to(**to).requires_grad_() for t in (q, k, v)], grad_out.to(**to)


def reference(q, k, v, grad_out, causal):
    """Output, logsumexp and gradients in float64 from the naive implementation."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out = naive_attention(q64, k64, v64, is_causal=causal)
    out.backward(grad_out.double())
    scores = q64.detach() @ k64.detach().transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        visible = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, -1)
    return {"o": out.detach(), "L": lse, "dq": q64.grad, "dk": k64.grad, "dv": v64.grad}


def run_impl(impl, q, k, v, grad_out, causal):
    out = impl.apply(q, k, v, causal)
    lse = out.grad_fn.saved_tensors[4]
    out.backward(grad_out)
    return {"o": out.detach(), "L": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad}


def rel_err(actual, expected):
    return ((actual.double() - expected).abs().max() / expected.abs().max()).item()


def assert_matches_reference(impl, lead, n_q, n_k, d, causal, dtype):
    (q, k, v), grad_out = make_inputs(lead, n_q, n_k, d, dtype)
    got = run_impl(impl, q, k, v, grad_out, causal)
    want = reference(q, k, v, grad_out, causal)
    tolerance = TOLERANCE[DEVICE][dtype]
    for name, expected in want.items():
        assert got[name].shape == expected.shape, name
        assert got[name].dtype == (torch.float32 if name == "L" else dtype), name
        err = rel_err(got[name], expected)
        assert err <= tolerance, f"{name}: relative error {err:.2e} > {tolerance:.0e}"
