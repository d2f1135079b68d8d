"""The recorder's automatic marks: forward, backward, optimizer step and steps of any program, found with
PyTorch's own global hooks, without a change to the program.

- `forward`: one micro-batch's forward pass, from the start of an outermost `nn.Module` call (global module
  forward pre- and post-hooks) to the start of its backward: the program's next module calls (the blocks of a
  model called from a loop, a loss module) and what it computes between them (the loss) are part of it. It ends
  where a backward, an optimizer step or the step begins or ends, or where the module that opened it is called
  again at the outermost level (the next micro-batch of a loop without backward: evaluation, inference); the
  last one of a run without backward ends with the window. Module calls inside an outermost call, on any thread,
  are part of it; a module call made while a backward runs (activation-checkpoint recomputation) belongs to
  that backward.
- `backward`: each `Tensor.backward`, `torch.autograd.backward` or `torch.autograd.grad` call, from entry to
  return (the kernels the autograd threads launch meanwhile fall in it by the readers' cross-thread rule); one
  called inside another is part of it.
- `optimizer_step`: each `Optimizer.step` of any optimizer class (global optimizer step pre- and post-hooks).
- `step`: in a program that has made an optimizer (any `torch.optim.Optimizer`, seen as it is made), a step ends
  with an optimizer step, so several forward/backward pairs (gradient accumulation) are one step; a program
  without one (an inference loop, gradients without an update) gets a step per outermost forward, from one to the
  next. A step opens with the first mark after the previous step, and carries the program's own step number
  (0-based). When the program marks its steps with `profiler_kit.capture`, those are the steps instead
  (`capture_steps`).

The marks are `nvtx_ranges.mark_start`/`mark_end` ranges, so each recorder gets them in its own form (NVTX under
nsys, `record_function` under torch.profiler and the memory history) and every instrument hears of them through the
range events. Inside a `torch.compile`d region the hooks return at once, leaving no trace in the graph, and a
backward a compiler runs on fake tensors while it traces is no `backward`; a module compiled in place
(`module.compile()`) has its compiled call wrapped so that the hooks run around it, as they run around a
`torch.compile(module)` wrapper's call: the outermost compiled call is one `forward`. The same module hooks and
backward wrapper drive the module marks (`modules`) when they are on. Each hook runs under the recorder's guard
(`notes`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch._guards
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from profiler_kit.names import BACKWARD, FORWARD, OPTIMIZER_STEP
from profiler_kit.nvtx_ranges import Mark, mark_end, mark_start, step_mark
from profiler_kit.recording.modules import ModuleMarks
from profiler_kit.recording.notes import Notes

WHAT = "the automatic marks (forward, backward, optimizer_step, steps)"
_is_compiling = torch.compiler.is_compiling


def _traced() -> bool:
    """Whether torch traces rather than runs: dynamo compiling a frame, or a compiler's fake tensors (AOTAutograd
    traces a compiled module's backward with `torch.autograd.grad` on them, which is no backward of the
    program's)."""
    return _is_compiling() or torch._guards.detect_fake_mode() is not None


class Marks:
    """The automatic marks of one process (see the module docstring), and the module marks when given (the same
    hooks call them)."""

    def __init__(self, notes: Notes, modules: ModuleMarks | None = None) -> None:
        self.notes = notes
        self.modules = modules
        self.forward: Mark | None = None
        self.first: torch.nn.Module | None = None  # the module whose outermost call opened the forward mark
        self.outer: torch.nn.Module | None = None  # the module whose outermost call runs now
        self.backward_depth = 0
        self.optimizer_depth = 0
        self.optimizer: Mark | None = None
        self.step: Mark | None = None
        self.number = 0  # the next step's
        self.own_steps = True
        self.has_optimizer = False  # the program made an optimizer: steps end with optimizer steps
        self.step_has_forward = False
        self.handles: list = []
        self.patched: list[tuple[object, str, Callable]] = []

    def install(self) -> None:
        guard = self.notes.guard
        self.handles = [  # the module hooks run on every module call: they guard themselves, at less cost
            register_module_forward_pre_hook(self._module_pre),
            register_module_forward_hook(self._module_post, always_call=True),
            register_optimizer_step_pre_hook(guard(WHAT, self._optimizer_pre)),
            register_optimizer_step_post_hook(guard(WHAT, self._optimizer_post)),
        ]
        for name in ("backward", "grad"):
            original = getattr(torch.autograd, name)
            self.patched.append((torch.autograd, name, original))
            setattr(torch.autograd, name, self._wrap_backward(original))
        made = torch.optim.Optimizer.__init__
        self.patched.append((torch.optim.Optimizer, "__init__", made))

        @functools.wraps(made)
        def __init__(optimizer, *args, **kwargs):  # noqa: N807 (stands in for Optimizer.__init__)
            self.has_optimizer = True
            made(optimizer, *args, **kwargs)

        torch.optim.Optimizer.__init__ = __init__
        compile_ = nn.Module.compile
        self.patched.append((nn.Module, "compile", compile_))

        @functools.wraps(compile_)
        def compile(module, *args, **kwargs):  # noqa: A001 (stands in for Module.compile)
            compile_(module, *args, **kwargs)
            guard(WHAT, self._hook_compiled_call)(module)
            if self.modules is not None:
                self.modules.forget()  # its insides get no ranges from now on

        nn.Module.compile = compile

    def remove(self) -> None:
        """Take the hooks off again (the program's marks end where they are)."""
        for handle in self.handles:
            handle.remove()
        for owner, name, original in self.patched:
            setattr(owner, name, original)
        self.handles, self.patched = [], []

    def capture_steps(self) -> None:
        """The program marks its own steps (`profiler_kit.capture`): no more steps of the marks' own."""
        self.own_steps = False
        if self.step is not None:
            self._close_step()

    # Steps

    def _open_step(self) -> None:
        self.step = step_mark(self.number)
        self.step_has_forward = False

    def _close_step(self) -> None:
        self._end_forward()
        step, self.step = self.step, None
        self.number += 1
        mark_end(step)

    def _enter(self, forward: bool) -> None:
        """A mark opens: the step it belongs to opens first when none is."""
        if not self.own_steps:
            return
        if self.step is not None and forward and self.step_has_forward and not self.has_optimizer:
            self._close_step()  # no optimizer: one step per outermost forward
        if self.step is None:
            self._open_step()
        if forward:
            self.step_has_forward = True

    def finish(self) -> None:
        """Close what is open (the window or the program ends)."""
        self._end_forward()
        if self.optimizer is not None:
            mark, self.optimizer = self.optimizer, None
            mark_end(mark)
        if self.step is not None:
            self._close_step()
        if self.modules is not None:
            self.modules.finish()

    # Forward

    # The outermost module call is known by its module: every call inside it (any module, any thread) costs one
    # check. In a compiled region the hooks return first thing, so the graph never reads the marks' state (which
    # would guard on it and recompile).

    def _module_pre(self, module: torch.nn.Module, _args: tuple) -> None:
        if _is_compiling():
            return
        if self.outer is not None or self.backward_depth:
            if self.modules is not None:
                self.modules.enter(module, recompute=self.backward_depth > 0)
            return
        self.outer = module
        if self.modules is not None:
            self.modules.outermost(module)
        if not self.notes.working(WHAT):
            return
        try:
            if module is self.first:  # called again: the next micro-batch
                self._end_forward()
            if self.forward is None:
                self._enter(forward=True)
                self.forward, self.first = mark_start(FORWARD), module
        except Exception as exc:  # the program must run on whatever the recorder does
            self.notes.lost(WHAT, exc)

    def _module_post(self, module: torch.nn.Module, _args: tuple, output: object) -> None:
        if _is_compiling():
            return
        if module is not self.outer:
            if self.modules is not None:
                self.modules.leave(module, output)
            return
        self.outer = None

    def _end_forward(self) -> None:
        """The open forward mark ends (its backward, an optimizer step, the next micro-batch or the step begins)."""
        mark, self.forward, self.first = self.forward, None, None
        if mark is not None:
            mark_end(mark)

    def _hook_compiled_call(self, module: nn.Module) -> None:
        """`module.compile()` compiles the module's call with the global hooks inside it, where they do nothing:
        they are called around the compiled call instead, as around any module call."""
        compiled = module._compiled_call_impl
        if compiled is None:
            return
        pre, post = self._module_pre, self._module_post

        def call(*args, **kwargs):
            if _is_compiling():  # traced into a caller's compiled graph
                return compiled(*args, **kwargs)
            pre(module, args)
            try:
                output = compiled(*args, **kwargs)
            except BaseException:
                post(module, args, None)
                raise
            post(module, args, output)
            return output

        module._compiled_call_impl = call

    # Backward

    def _begin_backward(self) -> Mark:
        self._end_forward()
        self._enter(forward=False)
        return mark_start(BACKWARD)

    def _end_backward(self, mark: Mark) -> None:
        mark_end(mark)

    def _wrap_backward(self, original: Callable) -> Callable:
        begin = self.notes.guard(WHAT, lambda: self._begin_backward())
        end = self.notes.guard(WHAT, lambda mark: self._end_backward(mark))

        @functools.wraps(original)
        def backward(*args, **kwargs):
            outermost = not self.backward_depth and not _traced()
            mark = begin() if outermost and self.notes.working(WHAT) else None
            self.backward_depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self.backward_depth -= 1
                if mark is not None:
                    end(mark)
                if outermost and self.modules is not None:
                    self.modules.backward_done()

        return backward

    # Optimizer step

    def _optimizer_pre(self, _optimizer: torch.optim.Optimizer, _args: tuple, _kwargs: dict) -> None:
        if _is_compiling():
            return
        self.optimizer_depth += 1
        if self.optimizer_depth == 1:
            self.has_optimizer = True
            self._end_forward()
            self._enter(forward=False)
            self.optimizer = mark_start(OPTIMIZER_STEP)

    def _optimizer_post(self, _optimizer: torch.optim.Optimizer, _args: tuple, _kwargs: dict) -> None:
        if _is_compiling() or not self.optimizer_depth:
            return
        self.optimizer_depth -= 1
        if self.optimizer_depth == 0 and self.optimizer is not None:
            mark, self.optimizer = self.optimizer, None
            mark_end(mark)
            if self.own_steps and self.step is not None:
                self._close_step()
