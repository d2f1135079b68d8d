"""The recorders that run inside a profiled program (`profiler-kit nsys [--model ...] [-- COMMAND]`,
`profiler-kit memory -- COMMAND`).

The parent process describes what to record in environment variables (the only channel into a program it
does not control, and one that torchrun passes on to its workers); `install_from_environment` reads them once,
in the `sitecustomize` that the parent puts first on PYTHONPATH:

    PROFILER_KIT_RECORD       torch: record with torch.profiler; nsys: the program runs under nsys;
                              memory: record the CUDA memory history (`history`)
    PROFILER_KIT_TRACE        torch, memory: where the trace or snapshot goes, without `.json.gz`/`.pickle`
    PROFILER_KIT_MAX_ENTRIES  memory: the history's ring size
    PROFILER_KIT_WINDOW       nsys with a cudaProfilerApi capture range: open it (see below); else whole run
    PROFILER_KIT_RANKS_ONLY   1: record only processes that have a RANK (torchrun's workers, not torchrun)

What is recorded (the window): the steps `profiler_kit.capture` marks; else what the program opens with
`torch.cuda.profiler.start()` and closes with `stop()`; else the whole run. torch.profiler records from
start-up and drops what it recorded once a window opens. Under nsys the `cudaProfilerApi` range opens at the
first marked step, at the program's own `start()` when its main script calls it, else at the first CUDA call.
Each recorded process prints one line `profiler-kit window: {json}` on stderr (what it recorded and how many
steps), which the parent reads.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import torch

from profiler_kit.errors import literal
from profiler_kit.recording import api, mirror, ranges

RECORD = "PROFILER_KIT_RECORD"
TRACE = "PROFILER_KIT_TRACE"
WINDOW = "PROFILER_KIT_WINDOW"
RANKS_ONLY = "PROFILER_KIT_RANKS_ONLY"
MAX_ENTRIES = "PROFILER_KIT_MAX_ENTRIES"
ENV_KEYS = (RECORD, TRACE, WINDOW, RANKS_ONLY, MAX_ENTRIES)
TRACE_SUFFIX = ".json.gz"
SNAPSHOT_SUFFIX = ".pickle"
WINDOW_PREFIX = "profiler-kit window: "
# What a recording holds.
WHOLE_RUN, CAPTURE, PROGRAM_WINDOW = "whole run", "profiler_kit.capture", "torch.cuda.profiler"
# The start of the warning torch.profiler gives at every start in torch 2.10-2.11 (a regular expression).
PROFILER_CYCLE_WARNING = r"Warning: Profiler clears events at the end of each cycle"
# A main script that calls these opens its own cudaProfilerApi window (torch.profiler.profile does not).
_OPENS_WINDOW = re.compile(r"\bcuda\.profiler\.(start|profile)\s*\(|\bcudaProfilerStart\b")


def trace_path(stem: str | os.PathLike, rank: str | None, suffix: str = TRACE_SUFFIX) -> Path:
    """`<stem>.json.gz` (or another `suffix`), or `<stem>.rank<R>.json.gz` for a process of a distributed job."""
    stem = Path(stem)
    return stem.with_name(stem.name + (f".rank{rank}" if rank is not None else "") + suffix)


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class StepCounter:
    """Counts the ranges opened at the top level of the main thread while it is on: the steps of a window
    are the most frequent of those names (`step`, or the first phase of a loop without one)."""

    def __init__(self) -> None:
        self.depth = 0
        self.on = True
        self.counts: Counter[str] = Counter()

    def __call__(self, name: str | None) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        if name is None:
            self.depth = max(self.depth - 1, 0)
            return
        if self.depth == 0 and self.on:
            self.counts[name] += 1
        self.depth += 1

    def restart(self) -> None:
        self.counts.clear()
        self.on = True

    def steps(self) -> int | None:
        return self.counts.most_common(1)[0][1] if self.counts else None


class Window:
    """What this process records, said once on stderr for the parent."""

    def __init__(self) -> None:
        self.kind = WHOLE_RUN
        self.steps: int | None = None
        self.counter = StepCounter()
        self.reported = False
        ranges.observe(self.counter)

    def open(self, kind: str) -> None:
        self.kind = kind
        self.counter.restart()

    def close(self, steps: int | None = None) -> None:
        self.counter.on = False
        self.steps = steps if steps is not None else self.counter.steps()

    def report(self) -> None:
        if self.reported:
            return
        self.reported = True
        if self.counter.on:
            self.close()
        said = {"kind": self.kind, "steps": self.steps, "nvtx_dropped": not nvtx_reaches_tool()}
        print(WINDOW_PREFIX + json.dumps(said), file=sys.stderr, flush=True)


def nvtx_reaches_tool() -> bool:
    """False when a tool such as nsys is attached (NVTX_INJECTION64_PATH) but the `nvtx` package records
    nothing: recent nvtx releases ask the tool `nvtxDomainIsEnabled`, which older nsys (Debian's 2022.4) do
    not answer, and then drop every range."""
    if ranges.BACKEND != "nvtx" or not os.environ.get("NVTX_INJECTION64_PATH"):
        return True
    import nvtx

    return type(nvtx.get_domain()).__name__ != "DummyDomain"


class TorchRecorder:
    """torch.profiler (CPU operators, and CUDA kernels when CUDA is available) from start-up, or over the
    window the program opens; the Chrome trace lists the program's phases in its metadata."""

    def __init__(self, trace: Path, window: Window) -> None:
        self.trace = trace
        self.window = window
        self.profiler: torch.profiler.profile | None = None
        self.done = False

    def _begin(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(activities=activities)
        with warnings.catch_warnings():
            # torch 2.10-2.11 warn at every start that events are cleared between cycles: the recorder's own
            # start has no cycles, and the program's warnings are not touched.
            warnings.filterwarnings("ignore", message=PROFILER_CYCLE_WARNING, category=UserWarning)
            self.profiler.start()

    def begin_whole_run(self) -> None:
        self._begin()
        atexit.register(self.stop)

    def declare(self) -> None:
        return None

    def start(self, kind: str = CAPTURE) -> None:
        if self.done:
            return
        _synchronize()
        if self.profiler is not None:
            self.profiler.stop()  # what ran before the window is dropped
        self.window.open(kind)
        self._begin()

    def stop(self, steps: int | None = None) -> None:
        if self.done or self.profiler is None:
            return
        _synchronize()
        self.done = True
        self.window.close(steps)
        self.profiler.add_metadata_json(ranges.PHASE_DOMAIN, json.dumps({"phases": ranges.phase_names()}))
        self.profiler.stop()
        try:
            self.profiler.export_chrome_trace(str(self.trace))
        except OSError as exc:  # at the program's exit: one line on its stderr, no traceback
            print(f"profiler-kit: {literal(self.trace)}: could not be written ({exc.strerror or exc})", file=sys.stderr)
        self.window.report()

    def program_start(self) -> None:
        self.start(PROGRAM_WINDOW)

    def program_stop(self) -> None:
        self.stop()


class NsysRecorder(api.CudaProfilerRecorder):
    """The `cudaProfilerApi` range of `nsys profile --capture-range=cudaProfilerApi`: opened at the first
    marked step, at the program's own `torch.cuda.profiler.start()`, or (neither foreseen) at the first CUDA
    call for the whole run."""

    def __init__(self, window: Window) -> None:
        super().__init__()
        self.window = window
        self.declared = False
        atexit.register(self.window.report)

    def declare(self) -> None:
        self.declared = True
        super().declare()

    def on_cuda_init(self) -> None:
        if self.declared:
            return
        if opens_own_window(getattr(sys.modules.get("__main__"), "__file__", None)):
            print("profiler-kit: the program opens its own window (torch.cuda.profiler.start()): nsys records "
                  "that window; --no-capture records the whole run", file=sys.stderr)
            return
        api.cuda_profiler_start()
        self.whole_run = True

    def start(self) -> None:
        super().start()
        if not self.whole_run:
            self.window.open(CAPTURE)

    def stop(self, steps: int) -> None:
        super().stop(steps)
        if not self.whole_run:
            self.window.close(steps)

    def program_start(self) -> None:
        if self.whole_run or self.declared:
            return  # the range is open already, or capture holds it
        api.cuda_profiler_start()
        self.window.open(PROGRAM_WINDOW)

    def program_stop(self) -> None:
        if self.whole_run or self.declared:
            return  # stopping would end the capture that holds the whole run
        api.cuda_profiler_stop()
        self.window.close()


def opens_own_window(main: str | os.PathLike | None) -> bool:
    """Whether the program's main script `main` calls `torch.cuda.profiler.start()` (or cudaProfilerStart)."""
    try:
        return main is not None and bool(_OPENS_WINDOW.search(Path(main).read_text(errors="replace")))
    except OSError:
        return False


def _nothing() -> None:
    return None


def install_from_environment(env: Mapping[str, str]) -> None:
    """Set up the recorder `env` asks for in this process (see the module docstring)."""
    env = dict(env)
    backend = env.get(RECORD)
    # Under a launcher each worker writes a trace of its own; a process that is one rank already (the built-in
    # workload under torchrun) writes the one its parent named.
    ranked = env.get(RANKS_ONLY) == "1"
    rank = env.get("RANK") if ranked and env.get("WORLD_SIZE") else None
    if backend is None or (ranked and rank is None):
        return
    for key in ENV_KEYS:  # processes this one starts are not recorded again
        os.environ.pop(key, None)
    window = Window()
    if backend == "torch":
        recorder = TorchRecorder(trace_path(env[TRACE], rank), window)
        api.set_recorder(recorder)
        mirror.install(record=True)
        mirror.patch_cuda_profiler(recorder.program_start, recorder.program_stop)
        recorder.begin_whole_run()
    elif backend == "nsys":
        mirror.install(record=False)
        if env.get(WINDOW) != "1":  # no capture range: the whole run is recorded
            if not torch.cuda.is_available():  # the program's window calls would fail here, and mean nothing
                mirror.patch_cuda_profiler(_nothing, _nothing)
            atexit.register(window.report)
            return
        nsys_recorder = NsysRecorder(window)
        api.set_recorder(nsys_recorder)
        mirror.patch_cuda_profiler(nsys_recorder.program_start, nsys_recorder.program_stop)
        torch.cuda._lazy_call(nsys_recorder.on_cuda_init)
    elif backend == "memory":
        from profiler_kit.recording.history import MemoryRecorder

        memory = MemoryRecorder(trace_path(env[TRACE], rank, SNAPSHOT_SUFFIX), int(env[MAX_ENTRIES]), window)
        api.set_recorder(memory)
        ranges.set_record_function(True)  # phases become record_function ranges, which the history keeps
        mirror.install(record=True)
        mirror.patch_cuda_profiler(memory.program_start, memory.program_stop)
        memory.begin_whole_run()
    else:
        raise ValueError(f"{RECORD}={backend!r}: expected torch, nsys or memory")
