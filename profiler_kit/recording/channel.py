"""What the parent (`runner`) and the recorders inside the program (`child`) tell each other, importable without
torch: the environment variables the parent sets, the files the child writes, and the one line each recorded
process prints on stderr when it is done (`profiler-kit window: {json}`).

The window line's JSON:

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
# A folder the recorded processes of one job share (nsys: the capture range ends when its last process stops).
JOB_DIR = "PROFILER_KIT_JOB_DIR"
ENV_KEYS = (RECORD, TRACE, WINDOW, RANKS_ONLY, MAX_ENTRIES, JOB_DIR)
TRACE_SUFFIX = ".json.gz"
SNAPSHOT_SUFFIX = ".pickle"
WINDOW_PREFIX = "profiler-kit window: "
# What a recording holds.
WHOLE_RUN, CAPTURE, PROGRAM_WINDOW = "whole run", "profiler_kit.capture", "torch.cuda.profiler"
# Steps kept in the window line: a longer run keeps its first ones.
MAX_STEP_TIMES = 10_000


def trace_path(stem: str | os.PathLike, rank: str | int | None, suffix: str = TRACE_SUFFIX) -> Path:
    """`<stem>.json.gz` (or another `suffix`), or `<stem>.rank<R>.json.gz` for a process of a distributed job."""
    stem = Path(stem)
    return stem.with_name(stem.name + (f".rank{rank}" if rank is not None else "") + suffix)


def window_line(said: dict) -> str:
    """The line a recorded process prints when it is done."""
    return WINDOW_PREFIX + json.dumps(said, separators=(",", ":"))


def read_window_line(line: str) -> dict | None:
    """The JSON of a window line; None when the line is not one (or not a JSON object)."""
    if not line.startswith(WINDOW_PREFIX):
        return None
    try:
        said = json.loads(line[len(WINDOW_PREFIX):])
    except ValueError:
        return None
    return said if isinstance(said, dict) else None
