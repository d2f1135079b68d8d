"""The recorders a profiled program runs under: torch.profiler (`TorchRecorder`) and Nsight Systems
(`NsysRecorder`); the memory history is `history.MemoryRecorder`. Each is told by `profiler_kit.capture` (through
`api`) or by the program's `torch.cuda.profiler.start()`/`stop()` (through `mirror`) when its window opens and
closes, and keeps the window (`window.ChildWindow`) up to date; `recorder.Recorder` is the contract they keep.

torch.profiler records from start-up and drops what it recorded once a window opens; the Chrome trace lists
in its metadata (`profiler_kit`) the phases the program opened, the notes of what could not be recorded, the
process's place in its job and its host (torch.profiler names the host itself only in some releases), whose clock
the traces of one job's processes share.

Under nsys the `cudaProfilerApi` capture range opens at the first marked step, at the program's own `start()`
when its main script calls it, else at the first CUDA call, in every recorded process of the job (nsys records
from the first one's start). It closes when the last of the job's processes on this host closes its window
(the processes count themselves in a folder the parent gives them): nsys ends the capture at the first
`cudaProfilerStop`, which would cut the other ranks' last steps short. Each process marks its place in the job
(`nvtx_ranges.process_mark`) once the range is open.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import socket
import sys
import warnings
from pathlib import Path

import torch

from profiler_kit import nvtx_ranges
from profiler_kit.names import KIND_PHASE
from profiler_kit.nvtx_ranges import process_mark
from profiler_kit.recording import api
from profiler_kit.recording.channel import CAPTURE, PROGRAM_WINDOW, WHOLE_RUN
from profiler_kit.recording.marks import Marks
from profiler_kit.recording.notes import RECORDING_WINDOW, Notes
from profiler_kit.recording.recorder import Recorder
from profiler_kit.recording.window import ChildWindow

# The start of the warning torch.profiler gives at every start in torch 2.10-2.11 (a regular expression).
PROFILER_CYCLE_WARNING = r"Warning: Profiler clears events at the end of each cycle"
# A main script that calls these opens its own cudaProfilerApi window (torch.profiler.profile does not).
_OPENS_WINDOW = re.compile(r"\bcuda\.profiler\.(start|profile)\s*\(|\bcudaProfilerStart\b")


def synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class PhaseNames:
    """The names opened as phases (`profiler_kit.phase`), in order of first use: a range-event observer."""

    def __init__(self) -> None:
        self.names: dict[str, None] = {}

    def __call__(self, opened: bool, name: str, kind: str, _token: int, _number: int | None) -> None:
        if opened and kind == KIND_PHASE:
            self.names.setdefault(name, None)


class TorchRecorder(Recorder):
    """torch.profiler (CPU operators, and CUDA kernels when CUDA is available) over the whole run, or over the
    window the program opens. It starts with the program; on a machine with CUDA (`cuda`) a whole run starts
    again at the program's first CUDA call, as under nsys (what ran before is start-up, and a profiler started
    before CUDA was is not the one a program would start)."""

    def __init__(self, trace: Path, window: ChildWindow, marks: Marks, notes: Notes, place: dict[str, int],
                 cuda: bool = False) -> None:
        super().__init__(window, marks, notes, place)
        self.trace = trace
        self.phases = PhaseNames()
        self.profiler: torch.profiler.profile | None = None
        self.cuda = cuda

    def observers(self) -> list:
        return [self.notes.guard("the phase names", self.phases)]

    def _at_cuda_start(self) -> None:
        if self.profiler is not None and not self.done and self.window.kind == WHOLE_RUN:
            self._stop_profiler()
            self._begin()

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
        nvtx_ranges.resume_records()

    def _stop_profiler(self) -> None:
        nvtx_ranges.end_records()  # the open ranges' record_functions end in the recording they began in
        self.profiler.stop()

    def begin(self) -> None:
        """Record the whole run unless a window opens (see the class docstring)."""
        atexit.register(self.notes.guard(RECORDING_WINDOW, self.stop))
        self._begin()
        if self.cuda:
            torch.cuda._lazy_call(self.notes.guard("the whole run's restart at the first CUDA call",
                                                   self._at_cuda_start))

    def start(self, kind: str = CAPTURE) -> None:
        if self.done:
            return
        synchronize()
        if self.profiler is not None:
            self._stop_profiler()  # what ran before the window is dropped
        self.window.open(kind)
        self._begin()

    def stop(self, steps: int | None = None) -> None:
        if self.done or self.profiler is None:
            return
        self._end_window(steps)
        synchronize()
        self.notes.guard("the trace's metadata (phase names, notes, rank)", self._add_metadata)()
        self._stop_profiler()
        self._write(self.trace, lambda: self.profiler.export_chrome_trace(str(self.trace)))
        self.window.report()

    def _add_metadata(self) -> None:
        meta = {**self.described, "phases": list(self.phases.names), "notes": self.notes.lines, **self.place,
                "host": socket.gethostname()}
        self.profiler.add_metadata_json("profiler_kit", json.dumps(meta))


class JobStop:
    """Whether this process is the last of its job on this host to close its window: each one that closes
    leaves a file in the job's folder, and the one that finds as many files as the job has processes here
    (torchrun's LOCAL_WORLD_SIZE; one without it) is the last."""

    def __init__(self, folder: str | None, processes: int) -> None:
        self.folder = Path(folder) if folder else None
        self.processes = processes

    def last(self) -> bool:
        if self.folder is None or self.processes <= 1:
            return True
        (self.folder / f"stopped.{os.getpid()}").touch()
        return len(list(self.folder.glob("stopped.*"))) >= self.processes


class NsysRecorder(Recorder):
    """The `cudaProfilerApi` range of `nsys profile --capture-range=cudaProfilerApi` (see the module
    docstring); `ranged` False when nsys records the whole run without one. `whole_run`: the range is open for
    the whole run (opened at the first CUDA call, or nsys records without one)."""

    def __init__(self, window: ChildWindow, marks: Marks, notes: Notes, place: dict[str, int], ranged: bool,
                 job: JobStop) -> None:
        super().__init__(window, marks, notes, place)
        self.ranged = ranged
        self.job = job
        self.declared = False
        self.whole_run = False

    def begin(self) -> None:
        atexit.register(self.notes.guard(RECORDING_WINDOW, self._at_exit))
        if not self.ranged:  # the whole run is recorded: the place is marked now
            self.whole_run = True
            self._mark_place()
            return
        torch.cuda._lazy_call(self.notes.guard("the capture range", self.on_cuda_init))

    def _at_exit(self) -> None:
        self.marks.finish()
        if self.whole_run:  # the range is still open: the place is marked again, for a report read from the end
            self._mark_place()
        self.window.report()

    def _mark_place(self) -> None:
        if self.place:
            self.notes.guard("the process's rank in the report", process_mark)(self.place)

    def declare(self) -> None:
        self.declared = True
        super().declare()
        if self.whole_run:
            print("profiler-kit: CUDA was in use before profiler_kit.capture was made, so the whole run is "
                  "recorded; make the capture before the first CUDA call to record the marked steps only",
                  file=sys.stderr)

    def on_cuda_init(self) -> None:
        if self.declared:
            return
        if opens_own_window(getattr(sys.modules.get("__main__"), "__file__", None)):
            print("profiler-kit: the program opens its own window (torch.cuda.profiler.start()): nsys records "
                  "that window; --no-capture records the whole run", file=sys.stderr)
            return
        api.cuda_profiler_start()
        self.whole_run = True
        self._mark_place()

    def start(self, kind: str = CAPTURE) -> None:
        if self.whole_run:
            return
        api.profiler_range(True)
        self.window.open(kind)
        self._mark_place()

    def stop(self, steps: int | None = None) -> None:
        if not self.whole_run:
            self.window.close(steps)
            if self.ranged and torch.cuda.is_available() and self.job.last():
                synchronize()
                api.cuda_profiler_stop()

    def program_start(self) -> None:
        if self.whole_run or self.declared or not self.ranged:
            return  # the range is open already, capture holds it, or nsys records the whole run
        api.cuda_profiler_start()
        self.window.open(PROGRAM_WINDOW)
        self._mark_place()

    def program_stop(self) -> None:
        if self.whole_run or self.declared or not self.ranged:
            return  # stopping would end the capture that holds the whole run
        self.window.close()
        if self.job.last():
            synchronize()
            api.cuda_profiler_stop()


def opens_own_window(main: str | os.PathLike | None) -> bool:
    """Whether the program's main script `main` calls `torch.cuda.profiler.start()` (or cudaProfilerStart)."""
    try:
        return main is not None and bool(_OPENS_WINDOW.search(Path(main).read_text(errors="replace")))
    except OSError:
        return False
