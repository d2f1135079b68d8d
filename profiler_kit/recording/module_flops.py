"""FLOPs per module over one step of the program, counted as `torch.utils.flop_counter.FlopCounterMode` counts
them: the same dispatch mode and formulas (matrix products, convolutions, scaled-dot-product and flash
attention, forward and backward), each operator's FLOPs added to every module call open around it.

The step counted is the program's first (its `step` mark numbered lowest, 0 for the recorder's own steps): a
warm-up step, outside a `profiler_kit.capture` window that skips at least one step, and the one step the
counting slows (every operator passes through Python). The recording's metadata names it, so that readers can
leave it out of times. An operator counts as:
- forward: run outside a backward, to every module call open on its thread (`modules`);
- backward: run inside a backward, to every module whose backward range is open;
- recompute: run in a module call inside a backward (activation checkpointing), to the recomputing calls.

The mode asks torch.compile to leave it out of compilation (`ignore_compile_internals`): a compiled module
compiles as it would without it (a mode that torch.compile sees makes it skip the code for good), and its
compiled code's calls of the counted operators (matrix products and attention outside Triton) are counted at
run time, to the compiled module's call. Not counted: anything outside the formulas (elementwise operators,
normalisations, a softmax outside fused attention, reductions, embeddings, the optimizer), custom operators and
Triton kernels without a formula (`torch.utils.flop_counter.register_flop_formula` adds one), matrix products a
compiler turns into Triton kernels, and CUDA-graph replays (the first step runs graphs' warm-up, which is
counted).
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode, _pop_mode, _push_mode
from torch.utils.flop_counter import FlopCounterMode, _FlopCounterMode

from profiler_kit.names import KIND_AUTO, STEP
from profiler_kit.recording.modules import ModuleMarks
from profiler_kit.recording.notes import Notes

WHAT = "the FLOPs per module"
FORWARD, BACKWARD, RECOMPUTE = "forward", "backward", "recompute"
_graph_task = torch._C._current_graph_task_id  # -1 outside a backward


class _Mode(_FlopCounterMode):
    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


class _Counter(FlopCounterMode):
    """FlopCounterMode's counting, each operator's FLOPs handed to `add` instead of its module tracker; inside the
    program's operator, so a failure goes to `failed` and never to the program."""

    def __init__(self, add: Callable[[int], None], failed: Callable[[BaseException], None]) -> None:
        super().__init__(display=False)
        self.add, self.failed = add, failed

    def _count_flops(self, func_packet, out, args, kwargs):
        formula = self.flop_registry.get(func_packet)
        if formula is not None:
            try:
                self.add(formula(*args, **kwargs, out_val=out))
            except Exception as exc:  # the program must run on whatever the recorder does
                self.failed(exc)
        return out


class StepFlops:
    """Counts the FLOPs of the program's first step per module into `modules.metadata["flops"]`: a range-event
    observer of the `step` marks (see the module docstring)."""

    def __init__(self, modules: ModuleMarks, notes: Notes) -> None:
        modules.finishing.append(notes.guard(WHAT, self.finish))
        self.modules = modules
        self.notes = notes
        self.mode: _Mode | None = None
        self.token: int | None = None
        self.number: int | None = None
        self.thread: int | None = None
        self.done = False
        self.counting = False
        self.total: dict[str, int] = defaultdict(int)
        self.per_module: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def __call__(self, opened: bool, name: str, kind: str, token: int, number: int | None) -> None:
        if kind != KIND_AUTO or name != STEP:
            return
        if opened and not self.done and self.mode is None and self.modules.on:
            self._start(token, number)
        elif not opened and token == self.token and self.mode is not None:
            self._stop()

    def finish(self) -> None:
        """The program ends inside the counted step: what was counted so far."""
        if self.mode is not None:
            self._stop()

    def _start(self, token: int, number: int | None) -> None:
        self.token, self.number, self.thread = token, number, threading.get_ident()
        self.mode = _Mode(_Counter(self._add, self._failed))
        self.mode.__enter__()
        self.counting = True

    def _stop(self) -> None:
        mode, self.mode, self.done, self.counting = self.mode, None, True, False
        if threading.get_ident() != self.thread:
            raise RuntimeError("the counted step ended on another thread than it began on")
        above = []
        while (top := _get_current_dispatch_mode()) is not None and top is not mode:
            above.append(_pop_mode())  # the program's modes opened inside the step and left open
        if top is mode:
            mode.__exit__(None, None, None)
        for other in reversed(above):
            _push_mode(other)
        if not self.notes.working(WHAT):
            return  # a count that stopped part way would mislead
        self.modules.metadata["flops"] = {
            "step": self.number, "total": dict(self.total),
            "modules": {path: dict(counts) for path, counts in sorted(self.per_module.items())}}
        self.modules.changed()

    def _add(self, flops: int) -> None:
        """Add an operator's FLOPs where they belong."""
        if not self.counting or not flops:
            return
        stack = self.modules.stack()
        if stack and stack[-1].recompute:
            kind, paths = RECOMPUTE, {call.place.path for call in stack if call.recompute}
        elif _graph_task() != -1:
            kind, paths = BACKWARD, {backward.place.path for backward in list(self.modules.backward.values())}
        else:
            kind, paths = FORWARD, {call.place.path for call in stack}
        self.total[kind] += flops
        for path in paths:
            self.per_module[path][kind] += flops

    def _failed(self, exc: BaseException) -> None:
        """The count stops here (the mode leaves at the step's end); the notes say why."""
        self.counting = False
        self.notes.lost(WHAT, exc)
