"""A profiled program's own ranges and capture window, seen by every recorder without a change to the program.

`install` wraps the range functions a program may call:
- `torch.cuda.nvtx.range_push`/`range_pop` (and so `torch.cuda.nvtx.range`) and the `nvtx` package's
  `push_range`/`pop_range` and `annotate`: each range still goes to NVTX as before and, while a
  `record_function` would be recorded (torch.profiler, the memory history), is also a `record_function` of the
  same name, so a trace or a snapshot holds the ranges nsys would;
- `torch.profiler.record_function` (also `torch.autograd.profiler.record_function`, as a context manager or a
  decorator): each range is also an NVTX range of the same name, so nsys records what torch.profiler would.
Every range is told to the recorder's instruments (`nvtx_ranges.notify`, kind `program`). `patch_cuda_profiler`
routes `torch.cuda.profiler.start`/`stop` to the recorder. Each mirror runs under the recorder's guard
(`notes`): if it fails, the program's own call still happens.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import torch

from profiler_kit import nvtx_ranges
from profiler_kit.names import KIND_PROGRAM
from profiler_kit.recording.notes import Notes

WHAT = "the program's own ranges (torch.cuda.nvtx, nvtx, record_function)"
# Open mirrored ranges, per thread: (name, token).
_open = threading.local()


def _opened(name: str) -> None:
    token = nvtx_ranges.new_token()
    nvtx_ranges.notify(True, name, KIND_PROGRAM, token)
    nvtx_ranges.open_record(token, name)
    _open.__dict__.setdefault("stack", []).append((name, token))


def _closed() -> None:
    stack = _open.__dict__.get("stack")
    if not stack:
        return
    name, token = stack.pop()
    nvtx_ranges.notify(False, name, KIND_PROGRAM, token)
    nvtx_ranges.close_record(token)


def _mirror_torch_nvtx(opened: Callable[[str], None], closed: Callable[[], None]) -> None:
    module = torch.cuda.nvtx
    push, pop = module.range_push, module.range_pop
    # A CPU build of torch has no NVTX (its calls raise): the ranges then exist for the recorder alone.
    has_nvtx = type(module._nvtx).__name__ != "_NVTXStub"

    @functools.wraps(push)
    def range_push(msg: str) -> int:
        opened(msg)
        return push(msg) if has_nvtx else 0

    @functools.wraps(pop)
    def range_pop() -> int:
        closed()
        return pop() if has_nvtx else 0

    module.range_push, module.range_pop = range_push, range_pop


def _mirror_nvtx_package(opened: Callable[[str], None], closed: Callable[[], None]) -> None:
    try:
        import nvtx
        import nvtx.nvtx as impl
    except ImportError:
        return
    push, pop, annotate = impl.push_range, impl.pop_range, impl.annotate

    @functools.wraps(push)
    def push_range(message: str | None = None, *args, **kwargs) -> None:
        opened(message or "")
        push(message, *args, **kwargs)

    @functools.wraps(pop)
    def pop_range(*args, **kwargs) -> None:
        closed()
        pop(*args, **kwargs)

    class mirrored_annotate(annotate):  # noqa: N801 (stands in for `nvtx.annotate`)
        def __enter__(self):
            opened(self.init_args[0] or "")
            return super().__enter__()

        def __exit__(self, *exc: object) -> bool:
            closed()
            return super().__exit__(*exc)

        def __call__(self, func: Callable) -> Callable:
            inner = super().__call__(func)
            name = self.init_args[0] or func.__name__

            @functools.wraps(func)
            def ranged(*args, **kwargs):
                opened(name)
                try:
                    return inner(*args, **kwargs)
                finally:
                    closed()

            return ranged

    for module in (nvtx, impl):
        module.push_range, module.pop_range, module.annotate = push_range, pop_range, mirrored_annotate


def _nvtx_opened(name: str) -> None:
    nvtx_ranges._push(name)
    token = nvtx_ranges.new_token()
    _open.__dict__.setdefault("functions", []).append((name, token))
    nvtx_ranges.notify(True, name, KIND_PROGRAM, token)


def _nvtx_closed() -> None:
    functions = _open.__dict__.get("functions")
    if not functions:
        return
    name, token = functions.pop()
    nvtx_ranges.notify(False, name, KIND_PROGRAM, token)
    nvtx_ranges._pop()


def _mirror_record_function(opened: Callable[[str], None], closed: Callable[[], None]) -> None:
    """Each `record_function` range also an NVTX range (the class is patched, so PyTorch's own uses, e.g.
    `Optimizer.step#…`, are mirrored too; `torch.compile` never calls these methods)."""
    cls = torch.autograd.profiler.record_function
    enter, leave = cls.__enter__, cls.__exit__

    @functools.wraps(enter)
    def __enter__(self):  # noqa: N807 (a method of record_function)
        result = enter(self)
        opened(self.name)
        return result

    @functools.wraps(leave)
    def __exit__(self, *exc: object):  # noqa: N807
        closed()
        return leave(self, *exc)

    cls.__enter__, cls.__exit__ = __enter__, __exit__


def install(notes: Notes) -> None:
    """Mirror the program's ranges (see the module docstring)."""
    opened, closed = notes.guard(WHAT, _opened), notes.guard(WHAT, _closed)
    _mirror_torch_nvtx(opened, closed)
    _mirror_nvtx_package(opened, closed)
    _mirror_record_function(notes.guard(WHAT, _nvtx_opened), notes.guard(WHAT, _nvtx_closed))


def patch_cuda_profiler(start: Callable[[], None], stop: Callable[[], None]) -> None:
    """`torch.cuda.profiler.start()`/`stop()` (and its `profile()` block) call `start`/`stop` instead."""
    module = torch.cuda.profiler
    module.start, module.stop = start, stop
