"""The implementation registry: one set of names for the benchmark, the profiler and the model."""

from __future__ import annotations

import pytest
import torch

from profiler_kit.attention import naive_attention, registry
from profiler_kit.attention.options import INTERPRET
from profiler_kit.errors import ProfilerKitError
from profiler_kit.model import ATTENTION_IMPLS, attention_fn
from profiler_kit.recording.builtin import AttentionProfileConfig

CPU = torch.device("cpu")


def test_benchmark_defaults_and_model_names_come_from_the_registry():
    assert set(registry.BENCH_IMPLS) <= set(registry.NAMES)
    assert ATTENTION_IMPLS == registry.NAMES
    assert {"naive", "sdpa", "flash", "flash-triton", "sdpa-cudnn"} <= set(registry.NAMES)


@pytest.mark.parametrize("name", ["naive", "sdpa", "flash", "flash-torch", "compiled"])
def test_each_cpu_implementation_computes_causal_attention(name):
    q, k, v = (torch.randn(2, 3, 40, 16) for _ in range(3))
    want = naive_attention(q.double(), k.double(), v.double(), is_causal=True)
    got = registry.make_impl(name, causal=True, device=CPU)(q, k, v)
    assert (got.double() - want).abs().max().item() < 1e-4


def test_triton_without_a_gpu_or_the_interpreter_is_refused_up_front(monkeypatch):
    monkeypatch.setattr(registry, "INTERPRET", False)
    with pytest.raises(RuntimeError, match="CUDA device"):
        registry.make_impl("flash-triton", causal=True, device=CPU)
    # `flash` falls back to the tiled PyTorch implementation instead.
    registry.make_impl("flash", causal=True, device=CPU)


def test_unknown_names_are_refused_with_the_choices():
    with pytest.raises(ValueError, match="unknown implementation 'magic'; choose from naive, compiled, sdpa"):
        registry.make_impl("magic", causal=True)
    with pytest.raises(ProfilerKitError, match="unknown attention 'magic'"):
        attention_fn("magic")
    with pytest.raises(ProfilerKitError, match="unknown implementation magic"):
        AttentionProfileConfig(("magic",)).validate()


def test_model_flash_runs_the_flash_path():
    """The model's `flash` is `flash_attention`: the Triton kernels under the interpreter, else PyTorch tiles."""
    q, k, v = (torch.randn(1, 2, 33, 16, requires_grad=True) for _ in range(3))
    out = attention_fn("flash")(q, k, v)
    expected = "FlashAttentionTriton" if INTERPRET else "FlashAttentionPytorch"
    assert type(out.grad_fn).__name__.startswith(expected)
