"""What the parent (`runner`) and the recorders inside the program (`child`) tell each other, importable without
torch: the environment variables the parent sets, the files the child writes, and what each recorded process
says when it is done: one file `window.<pid>.json` in the job's folder (PROFILER_KIT_JOB_DIR, which the parent
makes for the run and reads when the program has ended; a file, not a line on stderr, so that the ranks of a job
writing at once never mix their words with each other's or the program's).

The window file's JSON:

    {"kind": "whole run" | "profiler_kit.capture" | "torch.cuda.profiler",
     "steps": int | null,                 # steps recorded (null: the program has no steps)
     "nvtx_dropped": bool,                # nsys ignored the `nvtx` package's ranges
     "rank": int | null,                  # the RANK the process had
     "step_ms": [[number, ms, recorded], ...],   # every step the program ran: its time, whether recorded
     "notes": [str, ...]}                 # what the recorder could not record, and why
"""

from __future__ import annotations

import json
import os
from pathlib import Path

RECORD = "PROFILER_KIT_RECORD"
TRACE = "PROFILER_KIT_TRACE"
WINDOW = "PROFILER_KIT_WINDOW"
RANKS_ONLY = "PROFILER_KIT_RANKS_ONLY"
MAX_ENTRIES = "PROFILER_KIT_MAX_ENTRIES"
# A folder the recorded processes of one job share: their window files, and (nsys) the count of those that
# closed their window, as the capture range ends when the last one does.
JOB_DIR = "PROFILER_KIT_JOB_DIR"
# 1: the machine has a CUDA device (the parent asked the driver): a whole run under torch.profiler starts again at
# the first CUDA call, as nsys records it.
CUDA = "PROFILER_KIT_CUDA"
# The module marks: `depth:N`, `all` or `none` (`names.module_depth`; without it, `defaults.DEFAULT_MODULES`).
MODULES = "PROFILER_KIT_MODULES"
ENV_KEYS = (RECORD, TRACE, WINDOW, RANKS_ONLY, MAX_ENTRIES, JOB_DIR, CUDA, MODULES)
TRACE_SUFFIX = ".json.gz"
SNAPSHOT_SUFFIX = ".pickle"
# What a recording holds.
WHOLE_RUN, CAPTURE, PROGRAM_WINDOW = "whole run", "profiler_kit.capture", "torch.cuda.profiler"
# Steps kept in the window file: a longer run keeps its first ones.
MAX_STEP_TIMES = 10_000


def trace_path(stem: str | os.PathLike, rank: str | int | None, suffix: str = TRACE_SUFFIX) -> Path:
    """`<stem>.json.gz` (or another `suffix`), or `<stem>.rank<R>.json.gz` for a process of a distributed job."""
    stem = Path(stem)
    return stem.with_name(stem.name + (f".rank{rank}" if rank is not None else "") + suffix)


def write_window(folder: str | os.PathLike, said: dict) -> None:
    """Say what this process recorded: `window.<pid>.json` in the job's folder, put in place complete."""
    path = Path(folder) / f"window.{os.getpid()}.json"
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(json.dumps(said, separators=(",", ":")))
    os.replace(tmp, path)


def read_windows(folder: str | os.PathLike) -> list[dict]:
    """What the job's recorded processes said, in the order their process ids sort; files that are not a JSON
    object are passed over."""
    said = []
    for path in sorted(Path(folder).glob("window.*.json")):
        try:
            value = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(value, dict):
            said.append(value)
    return said
