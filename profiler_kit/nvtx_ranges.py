"""NVTX ranges: the phases, layers and attention sub-steps a program marks, the recorder's automatic marks, and
the stream of range events a recorder listens to.

Uses the `nvtx` package (a C extension: a push/pop is well under a microsecond and does nothing visible when
no profiler is attached); falls back to `torch.cuda.nvtx`, then to nothing. While a torch.profiler records
(or after `set_record_function(True)`, as the memory recorder asks), each range is also a `record_function`,
so the same names appear in Chrome traces and memory snapshots. Inside a `torch.compile`d region ranges are
skipped: they would break the graph.

Two shapes of range:
- `push_range`/`pop_range` (and `nvtx_range`): a stack per thread, as NVTX push/pop. `marked=True` makes the
  range a phase (what `profiler_kit.phase` opens), pushed in the NVTX domain `profiler_kit` so that readers of
  an nsys export tell it from the program's own ranges. `torch.cuda.nvtx` has no domains: there phases are
  plain ranges.
- `mark_start`/`mark_end`: the recorder's automatic marks (`forward`, `backward`, `optimizer_step`, `step`).
  They open in one hook and close in another, so they are NVTX start/end ranges (process-wide, never popped by
  the program's own pops) of the domain `profiler_kit`, category `auto`, a step's number as the int64 payload;
  a `record_function` named `profiler_kit::<name>` (`profiler_kit::step#<number>`) is ended by its handle.
- `module_start`/`module_end`: the recorder's module marks, start/end ranges of the same domain in the module
  categories (`names.MODULE_CATEGORIES`), a `record_function` `profiler_kit::<category>::<path>`.

Every range opened or closed here but the module marks, or by the recorder's mirrors of the program's own ranges,
is told to the observers as `observer(opened, name, kind, token, number)`: the kind is `phase`, `auto` or
`program` (`names.RANGE_KINDS`), the token tells one range's close from another's, the number is a step's.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator

import torch

from profiler_kit.names import (
    AUTO_CATEGORY,
    AUTO_PREFIX,
    KIND_AUTO,
    KIND_PHASE,
    KIND_PROGRAM,
    MARK_DOMAIN,
    MODULES_KEY,
    PROCESS_CATEGORY,
    STEP,
)

PHASE_DOMAIN = MARK_DOMAIN

try:
    import nvtx as _nvtx

    # Bound now: a recorder in a profiled program may patch the package's functions to mirror them.
    _nvtx_push, _nvtx_pop = _nvtx.push_range, _nvtx.pop_range

    def _push(name: str, marked: bool = False) -> None:
        _nvtx_push(name, domain=PHASE_DOMAIN if marked else None)

    def _pop(marked: bool = False) -> None:
        _nvtx_pop(domain=PHASE_DOMAIN if marked else None)

    def _start(name: str, number: int | None, category: str = AUTO_CATEGORY) -> object:
        domain = _nvtx.get_domain(MARK_DOMAIN)
        attributes = domain.get_event_attributes(name, None, category, number)
        return domain.start_range(attributes)

    def _end(handle: object) -> None:
        if handle is not None:
            _nvtx.get_domain(MARK_DOMAIN).end_range(handle)

    def _mark(message: str, category: str) -> None:
        _nvtx.mark(message, domain=MARK_DOMAIN, category=category)

    BACKEND = "nvtx"
except ImportError:  # the GPU image has no nvtx package unless it is carried
    if torch.cuda.is_available():
        _cuda_push, _cuda_pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
        _cuda_start, _cuda_end = torch.cuda.nvtx.range_start, torch.cuda.nvtx.range_end

        def _push(name: str, marked: bool = False) -> None:
            _cuda_push(name)

        def _pop(marked: bool = False) -> None:
            _cuda_pop()

        def _start(name: str, number: int | None, category: str = AUTO_CATEGORY) -> object:
            return _cuda_start(auto_name(name, number, category))

        def _end(handle: object) -> None:
            _cuda_end(handle)

        def _mark(message: str, category: str) -> None:
            torch.cuda.nvtx.mark(f"{AUTO_PREFIX}{category} {message}")

        BACKEND = "torch.cuda.nvtx"
    else:

        def _push(name: str, marked: bool = False) -> None:
            return None

        def _pop(marked: bool = False) -> None:
            return None

        def _start(name: str, number: int | None, category: str = AUTO_CATEGORY) -> object:
            return None

        def _end(handle: object) -> None:
            return None

        def _mark(message: str, category: str) -> None:
            return None

        BACKEND = "none"

_state = {"enabled": True, "record_function": False}
Observer = Callable[[bool, str, str, int, "int | None"], None]
# Told of every range opened and closed (see the module docstring): the recorder's instruments.
_observers: list[Observer] = []
_tokens = itertools.count(1)
# The record_function ops, bound once: a range is entered and ended by its handle, out of any `with` block.
_rf_enter = torch.ops.profiler._record_function_enter_new
_rf_exit = torch.ops.profiler._record_function_exit._RecordFunction
# The record_function of each open range (token → (name, handle); None: not recorded now). A handle is ended
# only while the recording it began in runs: `end_records` before a recorder stops, `resume_records` after one
# starts, so no range straddles two recordings (ending one in another would call the callbacks of the first).
_records: dict[int, tuple[str, object]] = {}


def set_enabled(enabled: bool) -> None:
    """Turn all ranges on or off (`--no-nvtx`)."""
    _state["enabled"] = enabled


def set_record_function(enabled: bool) -> None:
    """Also emit torch.profiler `record_function` ranges while no profiler is known to record."""
    _state["record_function"] = enabled


def is_enabled() -> bool:
    return _state["enabled"]


def observe(observer: Observer) -> None:
    """Call `observer(opened, name, kind, token, number)` whenever a range opens or closes."""
    _observers.append(observer)


def new_token() -> int:
    """A token no other range has (for the mirrors of the program's ranges, which notify themselves)."""
    return next(_tokens)


def notify(opened: bool, name: str, kind: str, token: int, number: int | None = None) -> None:
    for observer in _observers:
        observer(opened, name, kind, token, number)


def recording() -> bool:
    """Whether ranges are also `record_function`s now."""
    return _state["record_function"] or torch.autograd._profiler_enabled()


def open_record(token: int, name: str) -> None:
    """The record_function of range `token`, named `name`, when ranges are recorded now."""
    if recording():
        _records[token] = (name, _rf_enter(name, None))


def close_record(token: int) -> None:
    entry = _records.pop(token, None)
    if entry is not None and entry[1] is not None:
        _rf_exit(entry[1])


def end_records() -> None:
    """Before a recording stops: end the record_function of every open range (see `_records`)."""
    for token, (name, handle) in list(_records.items()):
        if handle is not None:
            _records[token] = (name, None)
            _rf_exit(handle)


def resume_records() -> None:
    """After a recording starts: a record_function for every range still open, from now."""
    if recording():
        for token, (name, handle) in list(_records.items()):
            if handle is None:
                _records[token] = (name, _rf_enter(name, None))


def auto_name(name: str, number: int | None = None, category: str = AUTO_CATEGORY) -> str:
    """A name of the domain `profiler_kit` where no NVTX domain carries it: an automatic mark's
    (`profiler_kit::forward`, `profiler_kit::step#3`), or a range of another category
    (`profiler_kit::module::blocks.3`)."""
    if category != AUTO_CATEGORY:
        return f"{AUTO_PREFIX}{category}::{name}"
    return f"{AUTO_PREFIX}{name}" + ("" if number is None else f"#{number}")


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
    token = next(_tokens)
    if _observers:  # first: an observer may start the recording that this range then belongs to
        notify(True, name, KIND_PHASE if marked else KIND_PROGRAM, token)
    open_record(token, name)
    stack.append((marked, name, token))
    _push(name, marked)


def pop_range() -> None:
    """Close the innermost range `push_range` opened on this thread; nothing when none is open."""
    stack = _open.__dict__.get("stack")
    if not stack or torch.compiler.is_compiling():
        return
    entry = stack.pop()
    if entry is _SKIPPED:
        return
    marked, name, token = entry
    _pop(marked)
    if _observers:
        notify(False, name, KIND_PHASE if marked else KIND_PROGRAM, token)
    close_record(token)


class Mark:
    """An open automatic mark: what `mark_end` closes."""

    __slots__ = ("name", "number", "token", "nvtx")

    def __init__(self, name: str, number: int | None, token: int, nvtx: object) -> None:
        self.name, self.number, self.token, self.nvtx = name, number, token, nvtx


def mark_start(name: str, number: int | None = None) -> Mark:
    """Open an automatic mark `name` (a step's `number` with it) on any thread; `mark_end` closes it on any
    thread, whatever the program pushed or popped meanwhile."""
    token = next(_tokens)
    if _observers:  # first: an observer may start the recording that this mark then belongs to
        notify(True, name, KIND_AUTO, token, number)
    open_record(token, auto_name(name, number))
    return Mark(name, number, token, _start(name, number))


def mark_end(mark: Mark) -> None:
    _end(mark.nvtx)
    if _observers:
        notify(False, mark.name, KIND_AUTO, mark.token, mark.number)
    close_record(mark.token)


def module_start(path: str, category: str, record_name: str) -> Mark:
    """Open a module mark (`recording.modules`): a start/end range `path` of the domain's `category` and, while
    ranges are recorded, a `record_function` named `record_name` (`auto_name(path, None, category)`). The
    instruments are not told of it: module marks are no phases and no steps."""
    token = next(_tokens)
    open_record(token, record_name)
    return Mark(path, None, token, _start(path, None, category))


def module_end(mark: Mark) -> None:
    _end(mark.nvtx)
    close_record(mark.token)


def step_mark(number: int) -> Mark:
    """Open the mark of the program's step `number` (0-based, counted from its first step)."""
    return mark_start(STEP, number)


def modules_mark(text: str) -> None:
    """An NVTX mark holding the recording's module metadata (JSON `text`), in the domain `profiler_kit`,
    category `modules`: what a report of nsys, which has no other metadata, says of the process's modules."""
    _mark(text, MODULES_KEY)


def process_mark(fields: dict[str, int]) -> None:
    """An NVTX mark `key=value ...` in the domain `profiler_kit`, category `process`: where this process sits
    in its job (rank, world size, local rank, node), read back from an nsys export."""
    _mark(" ".join(f"{key}={value}" for key, value in fields.items()), PROCESS_CATEGORY)
