"""The memory recorder inside a program run by `profiler-kit memory -- COMMAND`: the CUDA caching allocator's
history over the program's window, and the storages of its parameters, gradients and optimizer state.

The window follows the other recorders (`child`): the steps `profiler_kit.capture` marks; else the program's
`torch.cuda.profiler.start()`/`stop()`; else from CUDA's start-up (the first allocation comes after it) to
exit. At the window's start and after every optimizer step a capture of the storages is taken
(`memory.storages`); the optimizers are the ones alive at the window's start and every one that steps (a
global optimizer step hook), the parameters those they hold. When the window ends the snapshot gets the
recorder's metadata under `profiler_kit` and is pickled to `<stem>.pickle` (`<stem>.rank<R>.pickle` per
torchrun worker). A window still open at exit, as when an out-of-memory error ends the program, is dumped
then, so the snapshot at the failure is kept.
"""

from __future__ import annotations

import atexit
import datetime
import gc
import json
import pickle
import sys
import weakref
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from profiler_kit.memory.snapshot import EMBEDDED_KEY, SIDECAR_FORMAT, SIDECAR_VERSION
from profiler_kit.memory.storages import STORAGES_KEY, capture_storages, trace_clock_us
from profiler_kit.recording.child import CAPTURE, PROGRAM_WINDOW, Window


class MemoryRecorder:
    """Records the allocator's history over the window into `path` (see the module docstring)."""

    def __init__(self, path: Path, max_entries: int, window: Window) -> None:
        self.path = path
        self.max_entries = max_entries
        self.window = window
        self.recording = False
        self.done = False
        self.captures: list[dict] = []
        self.optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self.steps = 0
        self.oom: str | None = None
        register_optimizer_step_post_hook(self._after_step)
        self._excepthook = sys.excepthook
        sys.excepthook = self._on_uncaught
        atexit.register(self.stop)

    def _capture(self, label: str) -> None:
        self.captures.append(capture_storages([], list(self.optimizers), label, trace_clock_us()))

    def _begin(self) -> None:
        from profiler_kit.memory.recorder import start_history

        start_history(self.max_entries)
        self.recording = True
        self.captures = []
        # type(), not isinstance(): the latter reads `__class__`, which some lazy or deprecated objects answer
        # with a warning or an import.
        self.optimizers.update(o for o in gc.get_objects() if issubclass(type(o), torch.optim.Optimizer))
        self._capture("window start")

    def _after_step(self, optimizer: torch.optim.Optimizer, _args: tuple, _kwargs: dict) -> None:
        self.optimizers.add(optimizer)
        if self.recording:
            self.steps += 1
            self._capture(f"optimizer step {self.steps}")

    def _on_uncaught(self, kind: type, value: BaseException, tb: object) -> None:
        if isinstance(value, torch.cuda.OutOfMemoryError):
            from profiler_kit.memory.recorder import oom_summary

            self.oom = oom_summary(value)
        self._excepthook(kind, value, tb)

    def begin_whole_run(self) -> None:
        """Record from CUDA's start-up (now, when it runs already) to exit, unless a window opens."""
        torch.cuda._lazy_call(self._whole_run)

    def _whole_run(self) -> None:
        if not self.recording and not self.done:
            self._begin()

    def declare(self) -> None:
        return None

    def start(self, kind: str = CAPTURE) -> None:
        if self.done:
            return
        self.window.open(kind)
        self._begin()  # clears what the whole-run history held so far

    def stop(self, steps: int | None = None) -> None:
        if self.done or not self.recording:
            return
        self.done = True
        self.window.close(steps)
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        snapshot[EMBEDDED_KEY] = self.metadata()
        try:
            from profiler_kit.memory.recorder import SNAPSHOT_PICKLE_PROTOCOL, write_atomically

            write_atomically(self.path, pickle.dumps(snapshot, protocol=SNAPSHOT_PICKLE_PROTOCOL))
        except OSError as exc:  # at the program's exit: one line on its stderr, no traceback
            print(f"profiler-kit: {self.path}: could not be written ({exc.strerror or exc})", file=sys.stderr)
        self.window.report()

    def metadata(self) -> dict:
        """The recorder's metadata as plain JSON values (what the restricted unpickler of `summarize` reads)."""
        from profiler_kit.memory.recorder import STACKS

        meta = {
            "format": SIDECAR_FORMAT,
            "version": SIDECAR_VERSION,
            "snapshot": self.path.name,
            "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch_version": str(torch.__version__),
            "device_name": torch.cuda.get_device_name(),
            "window": self.window.kind,
            "max_entries": self.max_entries,
            "stacks": STACKS,
            "program_oom": self.oom,
            STORAGES_KEY: self.captures,
        }
        return json.loads(json.dumps(meta))

    def program_start(self) -> None:
        self.start(PROGRAM_WINDOW)

    def program_stop(self) -> None:
        self.stop()
