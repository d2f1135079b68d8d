"""The Python API for profiling your own training program: `phase`, `capture` and `instrument`.

    import profiler_kit
    profiler_kit.instrument(model, depth=2)             # per-block ranges, forward and backward
    cap = profiler_kit.capture(warmup=5, steps=3)       # record steps 5, 6 and 7 only
    for batch in loader:
        with cap.step():                                # a step, numbered from 0
            with profiler_kit.phase("fwd"):
                loss = model(batch)
            ...

Every range is an NVTX range (what Nsight Systems records) and, while a torch.profiler records, a
`record_function` of the same name; a `phase` is marked as one (NVTX domain `profiler_kit`, and listed in the
torch.profiler trace's metadata), so that summaries take it as a phase before any other range. Without a
profiler attached a range costs an NVTX push and pop and a few checks in Python: microseconds, about what
PyTorch spends launching one kernel. `capture` tells whichever recorder runs the program when to start and
stop (the `cudaProfilerApi` range under `profiler-kit nsys`, the torch.profiler window under `--backend torch`,
the memory history under `profiler-kit memory`), and its steps are the program's steps: each is a `step` mark
(`nvtx_ranges.step_mark`) carrying its number, counted from 0.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Protocol

import torch
from torch import nn

from profiler_kit.errors import ProfilerKitError
from profiler_kit.nvtx_ranges import mark_end, pop_range, push_range, step_mark

# torch warns when a module's inputs need no gradient (an embedding's token ids): its backward range is then
# empty, which is what `instrument` documents.
_NO_INPUT_GRAD_WARNING = "Full backward hook is firing when gradients are computed with respect to module outputs"
# Bound now: in a profiled program the recorder routes the program's own calls of these to itself.
cuda_profiler_start, cuda_profiler_stop = torch.cuda.profiler.start, torch.cuda.profiler.stop


class phase(contextlib.ContextDecorator):  # noqa: N801 (used like a function: `with profiler_kit.phase("fwd")`)
    """A named phase of the program: an NVTX range in domain `profiler_kit` and, while torch.profiler records,
    a `record_function`. A context manager and a decorator; inside a `torch.compile`d region it does nothing."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> phase:
        push_range(self.name, marked=True)
        return self

    def __exit__(self, *exc: object) -> None:
        pop_range()


class Listener(Protocol):
    """What `capture` and `describe` tell: that a capture exists (its steps are then the program's), when the
    marked steps start and stop (`stop` with how many steps were recorded), and the program's own metadata. In a
    process profiler-kit records, its recorder under the guard (`child.Guarded`; the contract is
    `recorder.Recorder`); elsewhere `NoRecorder`."""

    def declare(self) -> None: ...

    def start(self) -> None: ...

    def stop(self, steps: int) -> None: ...

    def describe(self, fields: dict) -> None: ...


def profiler_range(opened: bool) -> None:
    """Open (`opened`) or close the `cudaProfilerApi` range once the GPU has run what was launched; without
    CUDA, nothing."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        (cuda_profiler_start if opened else cuda_profiler_stop)()


class NoRecorder:
    """Where profiler-kit records nothing in the process (a program run by hand, perhaps under `nsys profile
    --capture-range=cudaProfilerApi`): the marked steps open and close the `cudaProfilerApi` range."""

    def declare(self) -> None:
        return None

    def start(self) -> None:
        profiler_range(True)

    def stop(self, steps: int) -> None:
        profiler_range(False)

    def describe(self, fields: dict) -> None:
        return None


_recorder: list[Listener] = [NoRecorder()]


def set_recorder(recorder: Listener) -> None:
    """Route `capture` and `describe` to `recorder` (`child` calls this in every process profiler-kit
    records)."""
    _recorder[0] = recorder


def recorder() -> Listener:
    return _recorder[0]


def describe(**fields: object) -> None:
    """Add `fields` (plain JSON values) to the metadata of the recording the program runs under, where the
    recorder keeps metadata (the memory snapshot, the torch.profiler trace)."""
    recorder().describe(fields)


class capture:  # noqa: N801 (reads as a call: `cap = profiler_kit.capture(warmup=5, steps=3)`)
    """Marks the steps to record: `warmup` steps run unrecorded, then `steps` steps are recorded. Wrap each
    step of the loop in `with cap.step():`; steps after the recorded ones run unrecorded. As a context
    manager around the loop it also stops recording when the loop ends early."""

    def __init__(self, warmup: int = 0, steps: int = 1) -> None:
        if warmup < 0 or steps < 1:
            raise ProfilerKitError(f"capture needs warmup ≥ 0 and steps ≥ 1, got warmup={warmup}, steps={steps}")
        self.warmup, self.steps = warmup, steps
        self.index = self.first = 0
        self.recording = False
        recorder().declare()

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """One step of the loop, a `step` mark numbered from 0; recording starts before step `warmup` and stops
        after step `warmup + steps - 1`."""
        if self.index == self.warmup:
            recorder().start()
            self.recording = True
            self.first = self.index
        mark = step_mark(self.index)
        try:
            yield
        finally:
            mark_end(mark)
        self.index += 1
        if self.recording and self.index == self.warmup + self.steps:
            self._stop()

    def _stop(self) -> None:
        recorder().stop(self.index - self.first)
        self.recording = False

    def __enter__(self) -> capture:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.recording:
            self._stop()


class Instrumented:
    """The hooks `instrument` added; `remove()` takes them off again."""

    def __init__(self, handles: list[torch.utils.hooks.RemovableHandle], names: list[str]) -> None:
        self.handles = handles
        self.names = names

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def instrument(model: nn.Module, depth: int = 1, backward: bool = True) -> Instrumented:
    """Ranges `<path>.forward` and `<path>.backward` around every submodule of `model` down to `depth` levels
    (`blocks` is depth 1, `blocks.0` depth 2), by module hooks: the backward ones run on the autograd thread,
    so each block's backward kernels get a range of their own. A module whose inputs need no gradient (an
    embedding) gets an empty backward range: its hook fires before its backward runs. For a model under
    `torch.compile`, pass `backward=False`: module backward hooks break the graph (they need compiled
    autograd), forward hooks do not."""
    if depth < 1:
        raise ProfilerKitError(f"instrument needs depth ≥ 1, got {depth}")
    warnings.filterwarnings("ignore", message=_NO_INPUT_GRAD_WARNING)
    handles: list[torch.utils.hooks.RemovableHandle] = []
    names: list[str] = []
    for name, module in model.named_modules():
        if not name or name.count(".") >= depth:
            continue
        names.append(name)
        forward, backward_name = f"{name}.forward", f"{name}.backward"
        handles += [
            module.register_forward_pre_hook(lambda _m, _a, n=forward: push_range(n)),
            module.register_forward_hook(lambda _m, _a, _o: pop_range()),
        ]
        if backward:
            handles += [
                module.register_full_backward_pre_hook(lambda _m, _g, n=backward_name: push_range(n)),
                module.register_full_backward_hook(lambda _m, _gi, _go: pop_range()),
            ]
    return Instrumented(handles, names)
