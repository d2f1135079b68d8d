"""Kernels, launches and ranges from a torch.profiler Chrome trace (`export_chrome_trace`, `.json[.gz]`).

Complete events (`"ph": "X"`) carry microsecond `ts`/`dur` with nanosecond decimals. GPU work is `kernel`,
`gpu_memcpy` and `gpu_memset`; the CPU calls that launched it are `cuda_runtime` (cudaLaunchKernel) and
`cuda_driver` (cuLaunchKernel, used by Triton) events, linked to the GPU events by `args.correlation`.
`record_function` ranges (our NVTX ranges under the torch backend) are `user_annotation` events on the CPU
thread that opened them; those named in the trace's metadata `"profiler_kit": {"phases": [...]}` were opened
with `profiler_kit.phase` (column `marked`).

The events are streamed (`streamed_json`): each is reduced as it is read to the few numbers a summary uses, its
name to a code into one table of distinct names, so a trace of gigabytes is read in the memory of its numbers.
Without the `ijson` package the trace is read whole, within the input limit.

Fields are checked once as they are read: events without a name or usable times are skipped with a note;
ids that are not what torch.profiler writes make the trace an error naming the event and the field.
"""

from __future__ import annotations

import math
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.files import InputLimits, parse_json, read_bytes, read_gzip, read_head
from profiler_kit.kernels.cpu_ops import CPU_OP_CATEGORY, cpu_operators
from profiler_kit.kernels.trace import (
    MAX_TOTAL_NS,
    NO_LAUNCH,
    KernelTrace,
    LaunchMatcher,
    kernel_frame,
    memory_frame,
    range_frame,
)
from profiler_kit.streamed_json import GZIP_MAGIC, NotStrict, OutOfRange, StreamedObject, streamable

LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
MEMORY_CATEGORIES = ("gpu_memcpy", "gpu_memset")
RANGE_CATEGORY = "user_annotation"
EVENTS = "traceEvents"
NS_PER_US = 1_000
# Microsecond times at or above this would overflow int64 nanoseconds once summed.
MAX_US = 2.0**62 / NS_PER_US
SOURCE = "torch-trace"
# Ids (pid, tid, args.correlation, args.stream) are integers within [0, MAX_ID).
MAX_ID = 2**53
ID_FIELDS = ("pid", "tid", "args", "args.correlation", "args.stream")
# Each kind of event a summary reads: its categories, the times it needs and the fields it keeps (besides the
# name), in the order the kinds are checked.
KINDS = {
    "kernel": (("kernel",), ("ts", "dur"), ("ts", "dur", "args.correlation", "args.stream")),
    "launch": (LAUNCH_CATEGORIES, ("ts",), ("ts", "args.correlation", "pid")),
    "range": ((RANGE_CATEGORY,), ("ts", "dur"), ("ts", "dur", "pid", "tid")),
    "memory": (MEMORY_CATEGORIES, ("dur",), ("dur",)),
    "CPU operator": ((CPU_OP_CATEGORY,), ("ts", "dur"), ("ts", "dur", "pid", "tid")),
}
KIND_OF = {category: kind for kind, (categories, _, _) in KINDS.items() for category in categories}
# What a missing id stands for in each kept field.
MISSING = {"args.correlation": NO_LAUNCH, "args.stream": 0, "pid": 0, "tid": 0}
# Events reduced to numbers at a time.
BLOCK_EVENTS = 65_536


def load_torch_trace(path: Path, limits: InputLimits | None = None) -> KernelTrace:
    """The trace at `path`, streamed; read whole within `limits` without the `ijson` package, or when it is
    not strict JSON."""
    whole = "without the ijson package (which streams it), a torch.profiler trace"
    if streamable():
        try:
            events, meta = _streamed(path)
            whole = None
        except NotStrict:
            whole = "a torch.profiler trace that is not strict JSON (NaN, Infinity)"
    if whole is not None:
        events, meta = _read_whole(path, limits, whole)
    try:
        trace = events.trace(path, meta)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfilerKitError(f"{path}: a Chrome trace with malformed events ({exc!r})") from None
    trace.clock, trace.clock_offset_ns = _clock(meta)
    return trace


def _streamed(path: Path) -> tuple[_Events, dict]:
    """The events and the other members of the trace, streamed; numbers read exactly, in a second pass, only
    when one is beyond a float or a 64-bit integer (a hostile field)."""
    for exact in (False, True):
        events, source = _Events(), StreamedObject(path, EVENTS, exact)
        try:
            for event in source.items():
                events.add(event)
        except OutOfRange:
            continue
        return events, source.members()
    raise AssertionError("an exact reading has no numbers out of range")


def _read_whole(path: Path, limits: InputLimits | None, reader: str) -> tuple[_Events, dict]:
    """The events and the other members of the trace, read whole within `limits`; `reader` names it in the
    error past them."""
    gzipped = read_head(path, len(GZIP_MAGIC)) == GZIP_MAGIC
    data = read_gzip(path, limits, reader) if gzipped else read_bytes(path, limits, reader)
    obj = parse_json(data, path)
    if not isinstance(obj, dict) or not isinstance(obj.get(EVENTS), list):
        raise ProfilerKitError(f"{path}: JSON, but not a Chrome trace (no {EVENTS} list)")
    events = _Events()
    for event in obj.pop(EVENTS):
        events.add(event)
    return events, obj


def _clock(meta: dict) -> tuple[str | None, int]:
    """The host whose clock the trace's times are on (`host_name`), and the offset that puts them on it
    (`baseTimeNanoseconds`: an event's time is that plus its `ts`); no host when the trace does not name it."""
    host, base = meta.get("host_name"), meta.get("baseTimeNanoseconds", 0)
    usable = isinstance(host, str) and host and type(base) is int and 0 <= base < MAX_TOTAL_NS
    return (f"host {host}", base) if usable else (None, 0)


def _phase_names(meta: dict) -> tuple[list[str], list[str]]:
    """The names the recorder listed as opened with `profiler_kit.phase` (none when the trace has no list), and
    a note when the list is there but not a list of names."""
    recorder = meta.get("profiler_kit")
    if recorder is None:
        return [], []
    phases = recorder.get("phases") if isinstance(recorder, dict) else None
    names = [p for p in phases if isinstance(p, str)] if isinstance(phases, list) else []
    if isinstance(phases, list) and len(names) == len(phases):
        return names, []
    return names, ["the trace's profiler_kit.phases is not a list of names: ranges opened with profiler_kit.phase "
                   "are taken only where it names them"]


def _ranges(annotations: pd.DataFrame, meta: dict, notes: list[str]) -> pd.DataFrame:
    """The NVTX-like ranges (`user_annotation` events: name, start_ns, end_ns, pid, tid) as a `range_frame`, and
    which of them the recorder's metadata (the trace's members besides its events) names as phases
    (`marked`)."""
    phase_names, phase_notes = _phase_names(meta)
    notes += phase_notes
    ranges = range_frame(annotations["name"].to_numpy(), annotations["start_ns"], annotations["end_ns"],
                         annotations["pid"], annotations["tid"])
    ranges["marked"] = ranges["name"].isin(phase_names)
    return ranges


def _number(value: object) -> float:
    """A time as a number: a JSON number or a numeric string; NaN for anything else."""
    if type(value) in (int, float, bool, Decimal):
        return float(value)
    if isinstance(value, str) and "_" not in value:
        try:
            return float(value)
        except ValueError:
            return math.nan
    return math.nan


def _is_id(value: object) -> bool:
    return value is None or (type(value) is int and 0 <= value < MAX_ID)


class _Kind:
    """The usable events of one kind, reduced as they are read to their name's code and the fields they keep;
    how many were skipped, and the first event whose id fields are not what torch.profiler writes."""

    def __init__(self, kind: str, names: dict[str, int]) -> None:
        _, self.times, self.fields = KINDS[kind]
        self.kind, self.names = kind, names
        self.total = self.skipped = 0
        self.wrong: dict[str, tuple[object, object, object]] = {}
        self.pending: list[tuple] = []
        self.blocks: list[np.ndarray] = []

    def add(self, event: dict) -> None:
        self.total += 1
        name = event.get("name")
        values = {field: _number(event.get(field)) for field in self.times}
        if not isinstance(name, str) or not all(0 <= v < MAX_US for v in values.values()):
            self.skipped += 1  # NaN fails the comparison too
            return
        args = event.get("args")
        found = {"pid": event.get("pid"), "tid": event.get("tid"), "args": args}
        for field in ("correlation", "stream"):
            found[f"args.{field}"] = args.get(field) if isinstance(args, dict) else None
        for field in ID_FIELDS:
            ok = (args is None or isinstance(args, dict)) if field == "args" else _is_id(found[field])
            if not ok and field not in self.wrong:
                self.wrong[field] = (name, event.get("ts"), found[field])
        code = self.names.setdefault(name, len(self.names))
        self.pending.append((code, *(values[f] if f in values else found[f] for f in self.fields)))
        if len(self.pending) >= BLOCK_EVENTS:
            self._flush()

    def _flush(self) -> None:
        if self.pending:
            rows = [tuple(MISSING.get(f, 0) if v is None or isinstance(v, dict) else v
                          for f, v in zip(("name", *self.fields), row, strict=True)) for row in self.pending]
            self.blocks.append(np.array(rows, dtype=np.float64 if "ts" in self.fields or "dur" in self.fields
                                        else np.int64).reshape(-1, 1 + len(self.fields)))
            self.pending = []

    def usable(self, notes: list[str]) -> int:
        """How many are usable; the first wrong id is an error, none usable of some is an error, skipped ones
        a note."""
        for field in ID_FIELDS:
            if field in self.wrong:
                name, ts, value = self.wrong[field]
                raise ProfilerKitError(
                    f"the {self.kind} event {str(name)[:60]!r} at ts {ts} has {field} {str(value)[:40]!r}; "
                    f"torch.profiler writes {'a dict' if field == 'args' else 'an integer from 0 to 2^53'} there")
        if self.total and self.skipped == self.total:
            raise ProfilerKitError(f"none of the {self.total:,} {self.kind} events has a name and a finite, "
                                   f"non-negative {'/'.join(self.times)}")
        if self.skipped:
            notes.append(f"skipped {self.skipped:,} of {self.total:,} {self.kind} events without a name or a "
                         f"finite, non-negative {'/'.join(self.times)}")
        return self.total - self.skipped

    def frame(self) -> pd.DataFrame:
        """One row per usable event: `name`, then its kept fields; times in integer nanoseconds (`start_ns`,
        `end_ns`, `dur_ns`), ids as integers."""
        self._flush()
        width = 1 + len(self.fields)
        table = np.concatenate(self.blocks) if self.blocks else np.empty((0, width))
        self.blocks = []
        names = np.array(list(self.names), dtype=object)
        columns: dict[str, object] = {"name": names[table[:, 0].astype(np.int64)]}
        ns = {field: np.rint(table[:, 1 + i] * NS_PER_US).astype(np.int64) for i, field in enumerate(self.fields)
              if field in ("ts", "dur")}
        if "ts" in ns:
            columns["start_ns"] = ns["ts"]
            if "dur" in ns:
                columns["end_ns"] = ns["ts"] + ns["dur"]
        if "dur" in ns:
            columns["dur_ns"] = ns["dur"]
        for i, field in enumerate(self.fields):
            if field not in ("ts", "dur"):
                columns[field.removeprefix("args.")] = table[:, 1 + i].astype(np.int64)
        return pd.DataFrame(columns)


class _Events:
    """Every event of a trace, as it is read: the usable events of each kind in `_Kind`s."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.kinds = {kind: _Kind(kind, self.names) for kind in KINDS}

    def add(self, event: object) -> None:
        if isinstance(event, dict) and event.get("ph") == "X":
            kind = KIND_OF.get(event.get("cat"))  # type: ignore[arg-type]
            if kind is not None:
                self.kinds[kind].add(event)

    def trace(self, path: Path, meta: dict) -> KernelTrace:
        notes: list[str] = []
        counts = {kind: events.usable(notes) for kind, events in self.kinds.items()}
        kernels, launches = self.kinds["kernel"].frame(), self.kinds["launch"].frame()
        # GPU events carry the device as their pid: the launch's pid is the process.
        matcher = LaunchMatcher(kernels["correlation"].to_numpy())
        matcher.add(launches["correlation"].to_numpy(), launches["start_ns"].to_numpy(), launches["pid"].to_numpy())
        kernel_rows = kernel_frame(
            kernels["name"].to_numpy(), kernels["dur_ns"].to_numpy(), matcher.launch_ns, matcher.process,
            start_ns=kernels["start_ns"].to_numpy(), stream=kernels["stream"].to_numpy(),
        )
        annotations = self.kinds["range"].frame()
        ranges = _ranges(annotations, meta, notes)
        memory = self.kinds["memory"].frame()
        # A trace with no CUDA activity at all (a CPU run) cannot say whether memory was copied.
        cuda_traced = counts["kernel"] or counts["launch"] or counts["memory"]
        memory_ops = memory_frame(memory["name"].to_numpy(), memory["dur_ns"].to_numpy()) if cuda_traced else None
        cpu_ops = cpu_operators(self.kinds["CPU operator"].frame(), annotations)
        return KernelTrace(SOURCE, path, kernel_rows, ranges, memory_ops, notes, cpu_ops)
