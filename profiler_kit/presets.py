"""Model presets: a dataclass, a dict of named presets, `from_name`, the analytic parameter count, and a table of
the presets."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from profiler_kit.errors import ProfilerKitError

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_VOCAB_SIZE = 10_000
DEFAULT_BATCH_SIZE = 4
DEFAULT_CONTEXT_LENGTH = 256
# RoPE base frequency, as in the RoFormer paper and most LLaMA-style models.
ROPE_THETA = 10_000.0


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a TransformerLM. `context_length` is the longest sequence the model accepts (RoPE tables)."""

    name: str
    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    vocab_size: int = DEFAULT_VOCAB_SIZE
    context_length: int = DEFAULT_CONTEXT_LENGTH
    rope_theta: float = ROPE_THETA

    def __post_init__(self) -> None:
        if self.d_model % self.num_heads:
            raise ProfilerKitError(f"d_model {self.d_model} is not divisible by num_heads {self.num_heads}")
        if (self.d_model // self.num_heads) % 2:
            raise ProfilerKitError("RoPE needs an even head dimension")
        for field in ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "context_length"):
            if getattr(self, field) <= 0:
                raise ProfilerKitError(f"{field} must be positive, got {getattr(self, field)}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


# d_model / d_ff / layers / heads. small…xl follow GPT-2's sizes with a 4× SwiGLU width; 2.7B follows GPT-3's.
PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig("tiny", d_model=64, d_ff=256, num_layers=2, num_heads=4),
    "small": ModelConfig("small", d_model=768, d_ff=3072, num_layers=12, num_heads=12),
    "medium": ModelConfig("medium", d_model=1024, d_ff=4096, num_layers=24, num_heads=16),
    "large": ModelConfig("large", d_model=1280, d_ff=5120, num_layers=36, num_heads=20),
    "xl": ModelConfig("xl", d_model=1600, d_ff=6400, num_layers=48, num_heads=25),
    "2.7B": ModelConfig("2.7B", d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
}


def from_name(
    name: str, context_length: int = DEFAULT_CONTEXT_LENGTH, vocab_size: int = DEFAULT_VOCAB_SIZE
) -> ModelConfig:
    """The preset called `name` (case-insensitive), with the given context length and vocabulary."""
    by_lower = {k.lower(): v for k, v in PRESETS.items()}
    preset = by_lower.get(name.lower())
    if preset is None:
        raise ProfilerKitError(f"unknown model {name!r}; choose from {', '.join(PRESETS)}")
    if context_length <= 0:
        raise ProfilerKitError(f"context length must be positive, got {context_length}")
    return replace(preset, context_length=context_length, vocab_size=vocab_size)


def count_parameters(cfg: ModelConfig) -> int:
    """Exact trainable parameter count of `TransformerLM(cfg)`, from the architecture.

    embedding V·d + per layer (fused QKV 3d² + output d² + SwiGLU 3·d·d_ff + two RMSNorm gains 2d)
    + final RMSNorm d + untied LM head d·V. RoPE has no parameters.
    """
    d, f, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
    per_layer = 4 * d * d + 3 * d * f + 2 * d
    return V * d + cfg.num_layers * per_layer + d + d * V


def preset_table() -> pd.DataFrame:
    """One row per preset: its shape, exact parameter count, and the count without the embedding and LM head."""
    import pandas as pd  # here, not above: option callbacks look presets up while `--help` starts

    rows = []
    for cfg in PRESETS.values():
        params = count_parameters(cfg)
        rows.append(
            {
                "model": cfg.name,
                "d_model": cfg.d_model,
                "d_ff": cfg.d_ff,
                "layers": cfg.num_layers,
                "heads": cfg.num_heads,
                "head_dim": cfg.head_dim,
                "vocab": cfg.vocab_size,
                "params": params,
                "params_m": params / 1e6,
                "non_embedding_params": params - 2 * cfg.vocab_size * cfg.d_model,
            }
        )
    return pd.DataFrame(rows)
