"""NVTX ranges for phases, layers and attention sub-steps, and the record of the phases a program opened.

Uses the `nvtx` package (a C extension: a push/pop is well under a microsecond and does nothing visible when
no profiler is attached); falls back to `torch.cuda.nvtx`, then to nothing. While a torch.profiler records,
each range is also a `record_function`, so the same names appear in Chrome traces. Inside a `torch.compile`d
region ranges are skipped: they would break the graph.

Phases (`marked=True`, what `profiler_kit.phase` opens) go to the NVTX domain `profiler_kit`, so that readers
of an nsys export tell them from the program's own ranges; their names are kept in order of first use for the
torch.profiler recorder, which lists them in the trace's metadata. `torch.cuda.nvtx` has no domains: there
phases are plain ranges.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch

PHASE_DOMAIN = "profiler_kit"

try:
    import nvtx as _nvtx

    # Bound now: a recorder in a profiled program may patch the package's functions to mirror them.
    _nvtx_push, _nvtx_pop = _nvtx.push_range, _nvtx.pop_range

    def _push(name: str, marked: bool = False) -> None:
        _nvtx_push(name, domain=PHASE_DOMAIN if marked else None)

    def _pop(marked: bool = False) -> None:
        _nvtx_pop(domain=PHASE_DOMAIN if marked else None)

    BACKEND = "nvtx"
except ImportError:  # the GPU image has no nvtx package unless it is carried
    if torch.cuda.is_available():
        _cuda_push, _cuda_pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop

        def _push(name: str, marked: bool = False) -> None:
            _cuda_push(name)

        def _pop(marked: bool = False) -> None:
            _cuda_pop()

        BACKEND = "torch.cuda.nvtx"
    else:

        def _push(name: str, marked: bool = False) -> None:
            return None

        def _pop(marked: bool = False) -> None:
            return None

        BACKEND = "none"

_state = {"enabled": True, "record_function": False}
# Names opened as phases, in order of first use (a dict keeps the order).
_phases: dict[str, None] = {}
# Told of every range opened (its name) and closed (None) here: the recorder's step counter.
_observers: list[Callable[[str | None], None]] = []


def set_enabled(enabled: bool) -> None:
    """Turn all ranges on or off (`--no-nvtx`)."""
    _state["enabled"] = enabled


def set_record_function(enabled: bool) -> None:
    """Also emit torch.profiler `record_function` ranges while no profiler is known to record."""
    _state["record_function"] = enabled


def is_enabled() -> bool:
    return _state["enabled"]


def phase_names() -> list[str]:
    """The phases opened so far in this process, in order of first use."""
    return list(_phases)


def observe(observer: Callable[[str | None], None]) -> None:
    """Call `observer(name)` when a range opens and `observer(None)` when one closes."""
    _observers.append(observer)


def notify(name: str | None) -> None:
    for observer in _observers:
        observer(name)


def recording() -> bool:
    """Whether ranges are also `record_function`s now."""
    return _state["record_function"] or torch.autograd._profiler_enabled()


@contextlib.contextmanager
def nvtx_range(name: str, marked: bool = False) -> Iterator[None]:
    """A range `name` over the block; `marked` makes it a phase (see the module docstring)."""
    if not _state["enabled"] or torch.compiler.is_compiling():
        yield
        return
    push_range(name, marked)
    try:
        yield
    finally:
        pop_range()


# Open ranges of `push_range`, per thread: hooks open a range in one call and close it in another.
_open = threading.local()
# Stands for a range `push_range` skipped while ranges were off, so that its `pop_range` pops nothing.
_SKIPPED = object()


def push_range(name: str, marked: bool = False) -> None:
    """Open a range that `pop_range` on the same thread closes (module hooks cannot use a `with` block)."""
    if torch.compiler.is_compiling():
        return
    stack = _open.__dict__.setdefault("stack", [])
    if not _state["enabled"]:
        stack.append(_SKIPPED)
        return
    if marked:
        _phases.setdefault(name, None)
    record = torch.profiler.record_function(name) if recording() else None
    if record is not None:
        record.__enter__()
    stack.append((record, marked))
    _push(name, marked)
    notify(name)


def pop_range() -> None:
    """Close the innermost range `push_range` opened on this thread; nothing when none is open."""
    stack = _open.__dict__.get("stack")
    if not stack or torch.compiler.is_compiling():
        return
    entry = stack.pop()
    if entry is _SKIPPED:
        return
    record, marked = entry
    _pop(marked)
    notify(None)
    if record is not None:
        record.__exit__(None, None, None)
