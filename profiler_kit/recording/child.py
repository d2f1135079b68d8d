"""The recorders that run inside a program profiled by `profiler-kit nsys -- COMMAND`.

The parent process describes what to record in environment variables (the only channel into a program it
does not control, and one that torchrun passes on to its workers); `install_from_environment` reads them once,
in the `sitecustomize` that the parent puts first on PYTHONPATH:

    PROFILER_KIT_RECORD       torch: record with torch.profiler; nsys: open the cudaProfilerApi range
    PROFILER_KIT_TRACE        torch: the trace's path without `.json.gz`
    PROFILER_KIT_RANKS_ONLY   1: record only processes that have a RANK (torchrun's workers, not torchrun)

Without `profiler_kit.capture` the whole run is recorded: torch.profiler from start-up to exit, or the
`cudaProfilerApi` range from the first CUDA call. With it, only the marked steps: torch.profiler drops what it
recorded before them, and the `cudaProfilerApi` range opens at the first marked step when the capture was made
before the first CUDA call.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import torch

from profiler_kit.recording import api
from profiler_kit.errors import ProfilerKitError
from profiler_kit.files import replaced_when_complete

RECORD = "PROFILER_KIT_RECORD"
TRACE = "PROFILER_KIT_TRACE"
RANKS_ONLY = "PROFILER_KIT_RANKS_ONLY"
ENV_KEYS = (RECORD, TRACE, RANKS_ONLY)
TRACE_SUFFIX = ".json.gz"


def trace_path(stem: str | os.PathLike, rank: str | None) -> Path:
    """`<stem>.json.gz`, or `<stem>.rank<R>.json.gz` for a process of a distributed job."""
    stem = Path(stem)
    return stem.with_name(stem.name + (f".rank{rank}" if rank is not None else "") + TRACE_SUFFIX)


def _synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class TorchRecorder:
    """torch.profiler (CPU operators, and CUDA kernels when CUDA is available) from start-up, or over the
    steps `capture` marks; the Chrome trace is written under a temporary name and renamed when complete."""

    def __init__(self, trace: Path) -> None:
        self.trace = trace
        self.profiler: torch.profiler.profile | None = None
        self.done = False

    def _begin(self) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(activities=activities)
        self.profiler.start()

    def begin_whole_run(self) -> None:
        self._begin()
        atexit.register(self.stop)

    def declare(self) -> None:
        return None

    def start(self) -> None:
        if self.done:
            return
        _synchronize()
        if self.profiler is not None:
            self.profiler.stop()  # what ran before the marked steps is dropped
        self._begin()

    def stop(self) -> None:
        if self.done or self.profiler is None:
            return
        _synchronize()
        self.profiler.stop()
        self.done = True
        try:
            with replaced_when_complete(self.trace, overwrite=False) as partial:
                self.profiler.export_chrome_trace(str(partial))
        except ProfilerKitError as exc:  # at the program's exit: one line on its stderr, no traceback
            print(f"profiler-kit: {exc}", file=sys.stderr)


class NsysRecorder(api.CudaProfilerRecorder):
    """The `cudaProfilerApi` range: opened at the first CUDA call unless a capture was made before it."""

    def __init__(self) -> None:
        super().__init__()
        self.declared = False

    def declare(self) -> None:
        self.declared = True
        super().declare()

    def on_cuda_init(self) -> None:
        if not self.declared:
            torch.cuda.profiler.start()
            self.whole_run = True


def install_from_environment(env: Mapping[str, str]) -> None:
    """Set up the recorder `env` asks for in this process (see the module docstring)."""
    env = dict(env)
    backend = env.get(RECORD)
    rank = env.get("RANK") if env.get("WORLD_SIZE") else None
    if backend is None or (env.get(RANKS_ONLY) == "1" and rank is None):
        return
    for key in ENV_KEYS:  # processes this one starts are not recorded again
        os.environ.pop(key, None)
    if backend == "torch":
        recorder = TorchRecorder(trace_path(env[TRACE], rank))
        api.set_recorder(recorder)
        recorder.begin_whole_run()
    elif backend == "nsys":
        nsys_recorder = NsysRecorder()
        api.set_recorder(nsys_recorder)
        torch.cuda._lazy_call(nsys_recorder.on_cuda_init)
    else:
        raise ValueError(f"{RECORD}={backend!r}: expected torch or nsys")
