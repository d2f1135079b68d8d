"""A profiled program's own ranges and capture window, seen by its recorder without a change to the program.

`install` wraps the range functions a program may call: `torch.cuda.nvtx.range_push`/`range_pop` (and so
`torch.cuda.nvtx.range`) and the `nvtx` package's `push_range`/`pop_range` and `annotate`. Every range still
goes to NVTX as before; with `record` it is also a `record_function` of the same name while one records (so a
torch.profiler trace, or a memory history, holds the ranges nsys would), and each one is told to the step counter
(`ranges.notify`). `patch_cuda_profiler` routes `torch.cuda.profiler.start`/`stop` to the recorder.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import torch

from profiler_kit.recording import ranges

# Open record_functions of the mirrored ranges, per thread (None where no profiler recorded at the push).
_open = threading.local()


def _opened(name: str, record: bool) -> None:
    rf = None
    if record and ranges.recording():
        rf = torch.profiler.record_function(name)
        rf.__enter__()
    _open.__dict__.setdefault("stack", []).append(rf)
    ranges.notify(name)


def _closed() -> None:
    stack = _open.__dict__.get("stack")
    if not stack:
        return
    rf = stack.pop()
    ranges.notify(None)
    if rf is not None:
        rf.__exit__(None, None, None)


def _mirror_torch_nvtx(record: bool) -> None:
    module = torch.cuda.nvtx
    push, pop = module.range_push, module.range_pop
    # A CPU build of torch has no NVTX (its calls raise): the ranges then exist for the recorder alone.
    has_nvtx = type(module._nvtx).__name__ != "_NVTXStub"

    @functools.wraps(push)
    def range_push(msg: str) -> int:
        _opened(msg, record)
        return push(msg) if has_nvtx else 0

    @functools.wraps(pop)
    def range_pop() -> int:
        _closed()
        return pop() if has_nvtx else 0

    module.range_push, module.range_pop = range_push, range_pop


def _mirror_nvtx_package(record: bool) -> None:
    try:
        import nvtx
        import nvtx.nvtx as impl
    except ImportError:
        return
    push, pop, annotate = impl.push_range, impl.pop_range, impl.annotate

    @functools.wraps(push)
    def push_range(message: str | None = None, *args, **kwargs) -> None:
        _opened(message or "", record)
        push(message, *args, **kwargs)

    @functools.wraps(pop)
    def pop_range(*args, **kwargs) -> None:
        _closed()
        pop(*args, **kwargs)

    class mirrored_annotate(annotate):  # noqa: N801 (stands in for `nvtx.annotate`)
        def __enter__(self):
            _opened(self.init_args[0] or "", record)
            return super().__enter__()

        def __exit__(self, *exc: object) -> bool:
            _closed()
            return super().__exit__(*exc)

        def __call__(self, func: Callable) -> Callable:
            inner = super().__call__(func)
            name = self.init_args[0] or func.__name__

            @functools.wraps(func)
            def ranged(*args, **kwargs):
                _opened(name, record)
                try:
                    return inner(*args, **kwargs)
                finally:
                    _closed()

            return ranged

    for module in (nvtx, impl):
        module.push_range, module.pop_range, module.annotate = push_range, pop_range, mirrored_annotate


def install(record: bool) -> None:
    """Mirror the program's NVTX ranges (see the module docstring)."""
    _mirror_torch_nvtx(record)
    _mirror_nvtx_package(record)


def patch_cuda_profiler(start: Callable[[], None], stop: Callable[[], None]) -> None:
    """`torch.cuda.profiler.start()`/`stop()` (and its `profile()` block) call `start`/`stop` instead."""
    module = torch.cuda.profiler
    module.start, module.stop = start, stop
