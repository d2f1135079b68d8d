"""profiler-kit: where the time and memory of a Transformer LM training step go on an NVIDIA GPU.

`phase`, `capture` and `instrument` (from `profiler_kit.recording.api`) mark up any training program; they load torch
on first use, so importing the package alone stays cheap."""

from __future__ import annotations

from typing import Any

from profiler_kit.environment import VERSION

__version__ = VERSION
__all__ = ["capture", "instrument", "phase"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from profiler_kit.recording import api

        globals().update({attr: getattr(api, attr) for attr in __all__})  # later lookups skip this function
        return globals()[name]
    raise AttributeError(f"module 'profiler_kit' has no attribute {name!r}")
