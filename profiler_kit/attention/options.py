"""The kernel choices of the flash attention path, as one frozen options object, and the one read of the
environment in `profiler_kit.attention`.

`FlashOptions` holds every choice a caller may make about which kernels run: pass one per call
(`flash_attention(..., options=...)`, `FlashAttentionTriton.apply(q, k, v, causal, options)`) or set one for a
block with `flash_options(...)`. The forward captures the options in force when it runs and its backward uses
the same ones. `dispatch` applies them; nothing else reads them.

`INTERPRET` is TRITON_INTERPRET, read once at import, as Triton reads it when @triton.jit runs: under the
interpreter the kernels run on the CPU with fixed small tiles and no autotuning.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Literal

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

GluonMode = Literal["auto", "on", "off"]
GLUON_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class GluonForwardConfig:
    """A config of the Gluon forward: keys per K/V tile, K/V ring slots, and whether the two consumer warp
    groups take turns issuing their matmuls."""

    block_n: int = 128
    stages: int = 3
    pingpong: bool = False


@dataclass(frozen=True)
class GluonBackwardConfig:
    """A config of the fused Gluon backward: query-tile ring slots, whether tile j-1's dK and dV are issued
    beside tile j's first matmuls, and query rows per tile."""

    stages: int = 2
    defer: bool = False
    block_m: int = 64


@dataclass(frozen=True)
class FlashOptions:
    """Which kernels the flash attention path runs.

    - `autotune`: pick each Triton kernel's config by timing the candidates (False: the first candidate that
      fits runs, compiled once);
    - `direct_launch`: once a call's shapes have been autotuned, later calls with the same shapes launch the
      compiled kernel directly instead of going through Triton's dispatch;
    - `gluon_forward` / `gluon_backward`: "auto" runs the Gluon kernels where they are the default
      (`dispatch`), "on" wherever they can run, "off" never;
    - `gluon_forward_config` / `gluon_backward_config`: the config a Gluon kernel runs with (None: the default
      for the head dim).
    """

    autotune: bool = True
    direct_launch: bool = True
    gluon_forward: GluonMode = "auto"
    gluon_backward: GluonMode = "auto"
    gluon_forward_config: GluonForwardConfig | None = None
    gluon_backward_config: GluonBackwardConfig | None = None

    def __post_init__(self) -> None:
        for name in ("gluon_forward", "gluon_backward"):
            if getattr(self, name) not in GLUON_MODES:
                raise ValueError(f"{name} must be one of {', '.join(GLUON_MODES)}, got {getattr(self, name)!r}")


DEFAULT_OPTIONS = FlashOptions()
_current: ContextVar[FlashOptions | None] = ContextVar("flash_options", default=None)


def current_options() -> FlashOptions:
    """The options in force: those of the innermost `flash_options` block, else the defaults."""
    return _current.get() or DEFAULT_OPTIONS


@contextlib.contextmanager
def flash_options(options: FlashOptions | None = None, **changes) -> Iterator[FlashOptions]:
    """Run the block with `options` (default: those in force), with `changes` applied to its fields."""
    chosen = replace(options or current_options(), **changes)
    token = _current.set(chosen)
    try:
        yield chosen
    finally:
        _current.reset(token)
