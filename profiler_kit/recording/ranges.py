"""NVTX ranges for the workload: phases, layers, attention sub-steps.

Uses the `nvtx` package (a C extension: a push/pop is well under a microsecond and does nothing visible when
no profiler is attached); falls back to `torch.cuda.nvtx`, then to nothing. While a torch.profiler backend
records (or any torch.profiler is recording), each range is also a `record_function`, so the same names appear
in Chrome traces. Inside a `torch.compile`d region ranges are skipped: they would break the graph.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

try:
    import nvtx as _nvtx

    def _push(name: str) -> None:
        _nvtx.push_range(name)

    def _pop() -> None:
        _nvtx.pop_range()

    BACKEND = "nvtx"
except ImportError:  # the GPU image has no nvtx package unless it is carried
    if torch.cuda.is_available():
        _push, _pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
        BACKEND = "torch.cuda.nvtx"
    else:

        def _push(name: str) -> None:
            return None

        def _pop() -> None:
            return None

        BACKEND = "none"

_state = {"enabled": True, "record_function": False}


def set_enabled(enabled: bool) -> None:
    """Turn all ranges on or off (`--no-nvtx`)."""
    _state["enabled"] = enabled


def set_record_function(enabled: bool) -> None:
    """Also emit torch.profiler `record_function` ranges (the torch backend of `profiler-kit nsys`)."""
    _state["record_function"] = enabled


def is_enabled() -> bool:
    return _state["enabled"]


def _recording() -> bool:
    return _state["record_function"] or torch.autograd._profiler_enabled()


@contextlib.contextmanager
def nvtx_range(name: str) -> Iterator[None]:
    if not _state["enabled"] or torch.compiler.is_compiling():
        yield
        return
    record = torch.profiler.record_function(name) if _recording() else contextlib.nullcontext()
    _push(name)
    try:
        with record:
            yield
    finally:
        _pop()


# Open record_functions of `push_range`, per thread: hooks open a range in one call and close it in another.
_open = threading.local()
# Stands for a range `push_range` skipped while ranges were off, so that its `pop_range` pops nothing.
_SKIPPED = object()


def push_range(name: str) -> None:
    """Open a range that `pop_range` on the same thread closes (module hooks cannot use a `with` block)."""
    if torch.compiler.is_compiling():
        return
    stack = _open.__dict__.setdefault("stack", [])
    if not _state["enabled"]:
        stack.append(_SKIPPED)
        return
    record = torch.profiler.record_function(name) if _recording() else None
    if record is not None:
        record.__enter__()
    stack.append(record)
    _push(name)


def pop_range() -> None:
    """Close the innermost range `push_range` opened on this thread; nothing when none is open."""
    stack = _open.__dict__.get("stack")
    if not stack or torch.compiler.is_compiling():
        return
    record = stack.pop()
    if record is _SKIPPED:
        return
    _pop()
    if record is not None:
        record.__exit__(None, None, None)
