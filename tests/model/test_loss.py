"""The LM loss: chunked linear cross-entropy against F.cross_entropy in float64, eagerly, under autocast and
compiled, and the model's loss against the cross-entropy of its own logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from profiler_kit.model import TransformerLM, linear_cross_entropy
from profiler_kit.presets import from_name

ROWS, D, VOCAB = 130, 32, 300


def _inputs(dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, ROWS // 2, D, generator=gen, dtype=dtype).requires_grad_()
    weight = (torch.randn(VOCAB, D, generator=gen, dtype=dtype) / D**0.5).requires_grad_()
    targets = torch.randint(0, VOCAB, (2, ROWS // 2), generator=gen)
    return hidden, weight, targets


def _float64_reference(hidden, weight, targets):
    h64, w64 = (t.detach().double().requires_grad_() for t in (hidden, weight))
    loss = F.cross_entropy((h64 @ w64.T).reshape(-1, VOCAB), targets.reshape(-1))
    return loss, torch.autograd.grad(loss, (h64, w64))


@pytest.mark.parametrize("chunk_rows", [None, 1, 48, 130, 512])
def test_loss_and_gradients_match_float64(chunk_rows):
    hidden, weight, targets = _inputs()
    loss = linear_cross_entropy(hidden, weight, targets, chunk_rows)
    grads = torch.autograd.grad(loss, (hidden, weight))
    want_loss, want_grads = _float64_reference(hidden, weight, targets)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), want_loss, rtol=1e-6, atol=0)
    for got, want in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-7)


def test_chunked_loss_under_autocast_matches_the_plain_loss():
    """Under bf16 autocast both run the matmuls in bf16 and the softmax in fp32."""
    hidden, weight, targets = _inputs()
    results = []
    for chunk_rows in (None, 48):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = linear_cross_entropy(hidden, weight, targets, chunk_rows)
        results.append((loss, torch.autograd.grad(loss, (hidden, weight))))
    (plain, plain_grads), (chunked, chunked_grads) = results
    assert chunked.dtype == torch.float32 and chunked_grads[1].dtype == torch.float32
    torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=0)
    for got, want in zip(chunked_grads, plain_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=1e-4)


def test_chunked_loss_without_gradients():
    hidden, weight, targets = _inputs()
    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight, targets, 48)
    assert loss.grad_fn is None
    torch.testing.assert_close(loss.double(), _float64_reference(hidden, weight, targets)[0], rtol=1e-6, atol=0)


@pytest.mark.parametrize("chunk_rows", [None, 24])
def test_model_loss_is_the_cross_entropy_of_its_logits_eager_and_compiled(chunk_rows):
    torch.manual_seed(0)
    model = TransformerLM(from_name("tiny", 32), attention="sdpa", loss_chunk_rows=chunk_rows)
    tokens, targets = (torch.randint(0, model.cfg.vocab_size, (2, 32)) for _ in range(2))
    logits = model(tokens)
    want = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    want_grads = torch.autograd.grad(want, list(model.parameters()))
    torch._dynamo.reset()
    for forward in (model, torch.compile(model, fullgraph=True, backend="aot_eager")):
        loss = forward(tokens, targets)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        torch.testing.assert_close(loss, want, rtol=1e-6, atol=0)
        for got, ref in zip(grads, want_grads, strict=True):
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-7)
