"""The memory recorder inside a program run by `profiler-kit memory -- COMMAND` (and `memory --model`, the built-in
workload as a program): the CUDA caching allocator's history over the program's window, its phases by step, and
the storages of its parameters, gradients and optimizer state.

The window follows the other recorders (`recorders`): the steps `profiler_kit.capture` marks; else the program's
`torch.cuda.profiler.start()`/`stop()`; else from CUDA's start-up (the first allocation comes after it) to exit.
At the window's start and after every optimizer step a capture of the storages is taken (`memory.storages`);
the optimizers are the ones alive at the window's start and every one that steps (a global optimizer step hook),
the parameters those they hold, and the DDP and `fully_shard` modules alive at the window's start add their
buckets and unsharded parameters. Every range closed while the history records (`PhaseLog`) is listed with its
kind, the program's step it ran in and its peak; the ranges of the recorder's own marks are also
`record_function` ranges, so the snapshot's annotations hold them. When the window ends the snapshot gets the
recorder's metadata under `profiler_kit` (`memory.snapshot.EMBEDDED_KEY`) and is pickled to `<stem>.pickle`
(`<stem>.rank<R>.pickle` per torchrun worker). A window still open at exit, as when an out-of-memory error ends
the program, is dumped then, so the snapshot at the failure is kept, with the step and phase the allocation
failed in.

Stacks are Python frames only (`stacks="python"`): they name the model code that allocated, which is what the
analysis reports. C++ frames (`"all"`) make every event slower to record, the dump slow to symbolise and the file
several times larger, for frames inside torch that the analysis skips anyway.

The allocator's peak counters are the program's: the recorder reads them and resets them only at the start of a
window `profiler_kit.capture` marks (the program asked profiler-kit to measure those steps). A phase's peak is
the counter's rise during it, None when the counter did not rise (the phase's peak is then below an earlier
one; the analysis replays the trace for it).
"""

from __future__ import annotations

import atexit
import datetime
import gc
import inspect
import json
import os
import pickle
import re
import sys
import threading
import weakref
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from profiler_kit import nvtx_ranges
from profiler_kit.memory.snapshot import EMBEDDED_KEY, SIDECAR_FORMAT, SIDECAR_VERSION
from profiler_kit.memory.storages import STORAGES_KEY, capture_storages, trace_clock_us
from profiler_kit.names import KIND_AUTO, KIND_PHASE, KIND_PROGRAM, STEP
from profiler_kit.phase_rule import library
from profiler_kit.recording.channel import CAPTURE, WHOLE_RUN
from profiler_kit.recording.marks import Marks
from profiler_kit.recording.notes import RECORDING_WINDOW, Notes
from profiler_kit.recording.recorder import Recorder
from profiler_kit.recording.window import ChildWindow

SNAPSHOT_PICKLE_PROTOCOL = 4  # what memory_viz reads; pinned because Python 3.14 defaults to protocol 5
STACKS = "python"
GIB, MIB = 2**30, 2**20


def oom_summary(exc: BaseException) -> str:
    """The useful head of torch's multi-sentence OOM message: how much it tried to allocate."""
    text = " ".join(str(exc).split())
    match = re.search(r"Tried to allocate [\d.,]+ \w+", text)
    return match.group(0) if match else text[:160]


def start_history(max_entries: int) -> None:
    kwargs = {"context": "all", "stacks": STACKS, "max_entries": max_entries}
    # Without clearing, a second recording in the same process keeps the first one's events; without global
    # annotations, only ranges opened on this thread are kept. Older torch releases lack one or both flags.
    accepted = inspect.signature(torch.cuda.memory._record_memory_history_impl).parameters
    for flag in ("clear_history", "global_record_annotations"):
        if flag in accepted:
            kwargs[flag] = True
    torch.cuda.memory._record_memory_history(enabled="all", **kwargs)


def write_atomically(path: Path, data: bytes) -> None:
    """Write beside the target, then rename: an interrupted dump never leaves a truncated file behind."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _distributed_module(module: torch.nn.Module) -> bool:
    """A DDP module, or one that `fully_shard` manages (FSDP2): the storage captures read their buckets and
    unsharded parameters."""
    return isinstance(module, torch.nn.parallel.DistributedDataParallel) or hasattr(type(module), "_get_fsdp_state")


class PhaseLog:
    """A range-event observer: every range of the kinds phase and auto, and every range of the program's own
    on its main thread that lies in no phase and at most one deep (not PyTorch's), closed while `on`, as the
    metadata's `phases` entries (C3): phase, kind, step, start_time_us, end_time_us, completed,
    peak_allocated_bytes. `peak` reads the allocator's peak counter."""

    def __init__(self, peak) -> None:
        self.peak = peak
        self.on = False
        self.step = 0  # the program's step the next range runs in
        # token → [name, kind, step, start_us, peak counter at the start, whether an allocation failed in it]
        self.open: dict[int, list] = {}
        self.rows: list[dict] = []
        self.phase_depth = 0
        self.program_depth = 0
        self.main = threading.main_thread()

    def __call__(self, opened: bool, name: str, kind: str, token: int, number: int | None) -> None:
        if kind == KIND_AUTO and name == STEP:
            if number is not None:
                self.step = number if opened else number + 1
            return
        if kind == KIND_PROGRAM:
            if threading.current_thread() is not self.main:
                return
            depth = self.program_depth
            self.program_depth = depth + 1 if opened else max(depth - 1, 0)
            if opened and (self.phase_depth or depth > 1 or library(name)):
                return
        elif kind == KIND_PHASE:
            self.phase_depth = self.phase_depth + 1 if opened else max(self.phase_depth - 1, 0)
        if opened:
            if self.on:
                self.open[token] = [name, kind, self.step, trace_clock_us(), self.peak(), False]
            return
        entry = self.open.pop(token, None)
        if entry is not None:
            self.rows.append(self._row(entry, completed=not entry[5]))

    def fail(self) -> None:
        """An allocation failed: the ranges open now do not complete, even when the program's error closes them."""
        for entry in self.open.values():
            entry[5] = True

    def _row(self, entry: list, completed: bool) -> dict:
        name, kind, step, start_us, counter, _ = entry
        now = self.peak()
        return {"phase": name, "kind": kind, "step": step, "start_time_us": start_us,
                "end_time_us": trace_clock_us(), "completed": completed,
                "peak_allocated_bytes": now if counter is not None and now is not None and now > counter else None}

    def start(self) -> None:
        self.on, self.rows, self.open = True, [], {}

    def stop(self) -> list[dict]:
        """The rows, the ranges still open at the end among them (not completed)."""
        self.on = False
        rows = self.rows + [self._row(entry, completed=False) for entry in self.open.values()]
        self.open = {}
        return sorted(rows, key=lambda row: (row["start_time_us"], row["end_time_us"]))

    def innermost(self) -> tuple[int, str | None]:
        """The step and the innermost open phase (a phase range, else an automatic mark) now."""
        for kind in (KIND_PHASE, KIND_AUTO):
            names = [entry[0] for entry in self.open.values() if entry[1] == kind]
            if names:
                return self.step, names[-1]
        return self.step, None


class MemoryRecorder(Recorder):
    """Records the allocator's history over the window into `path` (see the module docstring)."""

    def __init__(self, path: Path, max_entries: int, window: ChildWindow, marks: Marks, notes: Notes,
                 place: dict[str, int]) -> None:
        super().__init__(window, marks, notes, place)
        self.path = path
        self.max_entries = max_entries
        self.recording = False
        self.counters = False  # the window's peak counters are the recorder's to report
        self.captures: list[dict] = []
        self.optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self.modules: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # DDP's and fully_shard's
        self.oom: dict | None = None  # where an allocation failed: step, phase, size
        self.program_oom: str | None = None  # the out-of-memory error that ended the program
        self.phases = PhaseLog(self._peak)

    def observers(self) -> list:
        return [self.notes.guard("the phases' memory", self.phases)]

    def _peak(self) -> int | None:
        return torch.cuda.max_memory_allocated() if self.recording else None

    def begin(self) -> None:
        """Record from CUDA's start-up (now, when it runs already) to exit, unless a window opens."""
        nvtx_ranges.set_record_function(True)  # ranges become record_function ranges, which the history keeps
        register_optimizer_step_post_hook(self.notes.guard("the storages after optimizer steps", self._after_step))
        self._excepthook = sys.excepthook
        sys.excepthook = self._on_uncaught
        atexit.register(self.notes.guard(RECORDING_WINDOW, self.stop))
        torch.cuda._lazy_call(self.notes.guard("the memory history", self._whole_run))

    def _whole_run(self) -> None:
        self.notes.guard("the step and phase of an out-of-memory error", self._observe_oom)()
        if not self.recording and not self.done:
            self._begin(counters=True)

    def _observe_oom(self) -> None:
        if hasattr(torch._C, "_cuda_attach_out_of_memory_observer"):
            observer = self.notes.guard("the step and phase of an out-of-memory error", self._on_oom)
            torch._C._cuda_attach_out_of_memory_observer(observer)

    def _begin(self, counters: bool) -> None:
        nvtx_ranges.end_records()  # the open ranges' annotations end in the history they began in
        start_history(self.max_entries)
        nvtx_ranges.resume_records()
        self.recording = True
        self.counters = counters
        self.captures = []
        self.phases.start()
        # type(), not isinstance(): the latter reads `__class__`, which some lazy or deprecated objects answer
        # with a warning or an import.
        for kind, found in ((torch.optim.Optimizer, self.optimizers), (torch.nn.Module, self.modules)):
            found.update(o for o in gc.get_objects() if issubclass(type(o), kind) and (
                kind is torch.optim.Optimizer or _distributed_module(o)))
        self.notes.guard("the storages at the window's start", self._capture)("window start")

    def _capture(self, label: str) -> None:
        self.captures.append(capture_storages([], list(self.optimizers), label, trace_clock_us(),
                                              list(self.modules)))

    def _after_step(self, optimizer: torch.optim.Optimizer, _args: tuple, _kwargs: dict) -> None:
        self.optimizers.add(optimizer)
        if self.recording:
            self._capture(f"optimizer step {len(self.captures)}")

    def _on_oom(self, _device: int, alloc: int, _allocated: int, _free: int) -> None:
        step, phase = self.phases.innermost()
        self.phases.fail()
        size = f"{alloc / GIB:.2f} GiB" if alloc >= GIB else f"{alloc / MIB:.2f} MiB"
        self.oom = {"step": step, "phase": phase or "outside phases", "summary": f"Tried to allocate {size}",
                    "message": ""}

    def _on_uncaught(self, kind: type, value: BaseException, tb: object) -> None:
        if isinstance(value, torch.cuda.OutOfMemoryError):
            self.program_oom = oom_summary(value)
            if self.oom is not None:
                self.oom["summary"], self.oom["message"] = self.program_oom, str(value)
        self._excepthook(kind, value, tb)

    def start(self, kind: str = CAPTURE) -> None:
        if self.done:
            return
        self.window.open(kind)
        if kind == CAPTURE:
            torch.cuda.reset_peak_memory_stats()
        self._begin(counters=kind == CAPTURE)  # clears what the whole-run history held so far

    def stop(self, steps: int | None = None) -> None:
        if self.done or not self.recording:
            return
        self._end_window(steps)
        torch.cuda.synchronize()
        nvtx_ranges.end_records()
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        snapshot[EMBEDDED_KEY] = self.metadata()
        self.recording = False
        self._write(self.path, lambda: write_atomically(self.path, pickle.dumps(snapshot,
                                                                             protocol=SNAPSHOT_PICKLE_PROTOCOL)))
        self.window.report()

    def metadata(self) -> dict:
        """The recorder's metadata as plain JSON values (what the restricted unpickler of `summarize` reads)."""
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
            "phases": self.phases.stop(),
            "oom": self.oom,
            "program_oom": self.program_oom,
            "notes": self.notes.lines,
            STORAGES_KEY: self.captures,
            **self.place,
            **self.described,
        }
        if self.counters and self.window.kind in (CAPTURE, WHOLE_RUN):
            meta["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
            meta["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        return json.loads(json.dumps(meta))
