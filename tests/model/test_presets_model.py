"""Presets, the analytic parameter count, and the model's shapes, causality and NVTX ranges."""

import pytest
import torch

from profiler_kit import nvtx_ranges
from profiler_kit.errors import ProfilerKitError
from profiler_kit.model import TransformerLM
from profiler_kit.presets import PRESETS, ModelConfig, count_parameters, from_name

SPEC = {  # d_model, d_ff, layers, heads of the GPT-2 and GPT-3 sizes
    "small": (768, 3072, 12, 12),
    "medium": (1024, 4096, 24, 16),
    "large": (1280, 5120, 36, 20),
    "xl": (1600, 6400, 48, 25),
    "2.7B": (2560, 10240, 32, 32),
}


@pytest.mark.parametrize("name", list(SPEC))
def test_preset_shapes_match_the_spec(name):
    cfg = from_name(name, context_length=128)
    assert (cfg.d_model, cfg.d_ff, cfg.num_layers, cfg.num_heads) == SPEC[name]
    assert cfg.vocab_size == 10_000 and cfg.context_length == 128


@pytest.mark.parametrize("name", list(PRESETS))
def test_parameter_count_formula_equals_the_built_model(name):
    cfg = from_name(name, context_length=16)
    with torch.device("meta"):  # no memory: count shapes only, even for 2.7B
        model = TransformerLM(cfg)
    assert sum(p.numel() for p in model.parameters()) == count_parameters(cfg)


def test_known_parameter_counts():
    # Hand-computed: 2·V·d + L·(4d² + 3·d·d_ff + 2d) + d
    assert (
        count_parameters(from_name("small"))
        == 2 * 10_000 * 768 + 12 * (4 * 768**2 + 3 * 768 * 3072 + 2 * 768) + 768
    )
    assert count_parameters(from_name("xl")) == 1_998_235_200


def test_from_name_errors():
    with pytest.raises(ProfilerKitError, match="unknown model"):
        from_name("gpt5")
    with pytest.raises(ProfilerKitError, match="positive"):
        from_name("small", context_length=0)
    assert from_name("XL").name == "xl"
    with pytest.raises(ProfilerKitError):
        ModelConfig("bad", d_model=100, d_ff=10, num_layers=1, num_heads=3)


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_model_is_causal_and_attention_impls_agree(attention):
    torch.manual_seed(0)
    cfg = from_name("tiny", context_length=32)
    model = TransformerLM(cfg, attention=attention)
    tokens = torch.randint(0, cfg.vocab_size, (2, 32))
    logits = model(tokens)
    assert logits.shape == (2, 32, cfg.vocab_size)
    changed = tokens.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % cfg.vocab_size
    # Changing later tokens never changes earlier positions' logits.
    torch.testing.assert_close(model(changed)[:, :20], logits[:, :20])
    assert not torch.allclose(model(changed)[:, 20:], logits[:, 20:])


def test_naive_and_sdpa_give_the_same_logits():
    cfg = from_name("tiny", context_length=24)
    torch.manual_seed(1)
    naive = TransformerLM(cfg, attention="naive")
    sdpa = TransformerLM(cfg, attention="sdpa")
    sdpa.load_state_dict(naive.state_dict())
    tokens = torch.randint(0, cfg.vocab_size, (3, 24))
    torch.testing.assert_close(naive(tokens), sdpa(tokens), atol=1e-5, rtol=1e-5)


def test_sequence_longer_than_context_is_refused():
    model = TransformerLM(from_name("tiny", context_length=8))
    with pytest.raises(ProfilerKitError, match="exceeds the context length"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_nvtx_ranges_nest_per_layer_and_turn_off(monkeypatch):
    pushed = []
    monkeypatch.setattr(nvtx_ranges, "_push", lambda name, marked=False: pushed.append(name))
    monkeypatch.setattr(nvtx_ranges, "_pop", lambda marked=False: None)
    model = TransformerLM(from_name("tiny", context_length=8), attention="naive")
    model(torch.zeros(1, 8, dtype=torch.long))
    assert pushed[:5] == ["layer_0", "attention", "attn_scores", "softmax", "attn_value"]
    assert "ffn" in pushed and "layer_1" in pushed
    pushed.clear()
    nvtx_ranges.set_enabled(False)
    try:
        model(torch.zeros(1, 8, dtype=torch.long))
    finally:
        nvtx_ranges.set_enabled(True)
    assert pushed == []
