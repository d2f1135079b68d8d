"""Kernels, launches and ranges from a torch.profiler Chrome trace (`export_chrome_trace`, `.json[.gz]`).

Complete events (`"ph": "X"`) carry microsecond `ts`/`dur` with nanosecond decimals. GPU work is `kernel`,
`gpu_memcpy` and `gpu_memset`; the CPU calls that launched it are `cuda_runtime` (cudaLaunchKernel) and
`cuda_driver` (cuLaunchKernel, used by Triton) events, linked to the GPU events by `args.correlation`.
`record_function` ranges (our NVTX ranges under the torch backend) are `user_annotation` events on the CPU
thread that opened them. Their kind (`trace.range_frame`): the recorder's automatic marks are named
`profiler_kit::<name>` (`profiler_kit::step#<number>`, the program's step number); those named in the trace's
metadata `"profiler_kit": {"phases": [...]}` were opened with `profiler_kit.phase`; the rest are the program's.
The same metadata gives the recording's notes (what the recorder could not record) and the RANK and node
(GROUP_RANK) of the process, which every process id of the trace's CPU events had.

The events are streamed (`streamed_json`): each is reduced as it is read to the few numbers a summary uses, its
name to a code into one table of distinct names, so a trace of gigabytes is read in the memory of its numbers.
Without the `ijson` package the trace is read whole, within the input limit.

Fields are checked once as they are read: events without a name or usable times are skipped with a note;
ids that are not what torch.profiler writes make the trace an error naming the event and the field.
"""

from __future__ import annotations

import math
from decimal import Decimal
from operator import itemgetter
from pathlib import Path

import numpy as np
import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.files import InputLimits, is_gzip, parse_json, read_bytes, read_gzip
from profiler_kit.kernels.cpu_ops import CPU_OP_CATEGORY, cpu_operators
from profiler_kit.kernels.trace import (
    MAX_TOTAL_NS,
    NO_LAUNCH,
    KernelTrace,
    LaunchMatcher,
    auto_names,
    kernel_frame,
    memory_frame,
    range_frame,
)
from profiler_kit.names import KIND_AUTO, KIND_PHASE, KIND_PROGRAM
from profiler_kit.streamed_json import NotStrict, OutOfRange, StreamedObject, streamable

LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
MEMORY_CATEGORIES = ("gpu_memcpy", "gpu_memset")
RANGE_CATEGORY = "user_annotation"
EVENTS = "traceEvents"
NS_PER_US = 1_000
# Microsecond times at or above this would overflow int64 nanoseconds once summed.
MAX_US = 2.0**62 / NS_PER_US
SOURCE = "torch-trace"
# Ids (ID_FIELDS) are integers within [0, MAX_ID), and `args` a dict.
MAX_ID = 2**53
ID_FIELDS = ("pid", "tid", "args.correlation", "args.stream")
# A trace with wrong fields is refused for the first of these that some event has wrong.
CHECK_ORDER = ("pid", "tid", "args", "args.correlation", "args.stream")
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
# The fields an event is reduced to (besides its name's code), a missing id standing for NO_LAUNCH
# (correlation) or 0.
ROW = ("ts", "dur", "pid", "tid", "args.correlation", "args.stream")
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
    data = read_gzip(path, limits, reader) if is_gzip(path) else read_bytes(path, limits, reader)
    obj = parse_json(data, path)
    if not isinstance(obj, dict) or not isinstance(obj.get(EVENTS), list):
        raise ProfilerKitError(f"{path}: JSON, but not a Chrome trace (no {EVENTS} list)")
    events = _Events()
    for event in obj.pop(EVENTS):
        events.add(event)
    return events, obj


def _clock(meta: dict) -> tuple[str | None, int]:
    """The host whose clock the trace's times are on (`host_name`, else the host the recorder wrote in its
    metadata), and the offset that puts them on it (`baseTimeNanoseconds`: an event's time is that plus its
    `ts`); no host when neither names it."""
    recorder = meta.get("profiler_kit")
    host = meta.get("host_name") or (recorder.get("host") if isinstance(recorder, dict) else None)
    base = meta.get("baseTimeNanoseconds", 0)
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


def _recording(meta: dict) -> dict:
    """The recorder's notes and the process's rank and node, those of the right types."""
    recorder = meta.get("profiler_kit")
    recorder = recorder if isinstance(recorder, dict) else {}
    said = {key: recorder[key] for key in ("rank", "node") if type(recorder.get(key)) is int}
    notes = recorder.get("notes")
    said["notes"] = [line for line in notes if isinstance(line, str)] if isinstance(notes, list) else []
    return said


def _ranges(annotations: pd.DataFrame, meta: dict, notes: list[str]) -> pd.DataFrame:
    """The `ranges` frame of the `user_annotation` events (name, start_ns, end_ns, pid, tid), each with its kind
    (see the module docstring) as the recorder's metadata (the trace's members besides its events) tells it."""
    phase_names, phase_notes = _phase_names(meta)
    notes += phase_notes
    names, auto, numbers = auto_names(pd.Series(annotations["name"].to_numpy(), dtype=object))
    kinds = np.where(auto, KIND_AUTO, np.where(annotations["name"].isin(phase_names), KIND_PHASE, KIND_PROGRAM))
    return range_frame(names, annotations["start_ns"], annotations["end_ns"], annotations["pid"],
                       annotations["tid"], kinds, numbers)


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
        self.pick = itemgetter(0, *(1 + ROW.index(field) for field in self.fields))
        self.timed_start, self.timed_length = "ts" in self.times, "dur" in self.times
        self.total = self.skipped = 0
        self.wrong: dict[str, tuple[object, object, object]] = {}
        self.pending: list[tuple] = []
        self.blocks: list[np.ndarray] = []

    def add(self, event: dict) -> None:
        self.total += 1
        name, ts, dur = event.get("name"), event.get("ts"), event.get("dur")
        ts = ts if type(ts) is float else _number(ts)
        dur = dur if type(dur) is float else _number(dur)
        if (type(name) is not str or (self.timed_start and not 0 <= ts < MAX_US)
                or (self.timed_length and not 0 <= dur < MAX_US)):
            self.skipped += 1  # NaN fails the comparison too
            return
        args = event.get("args")
        if type(args) is dict:
            ids = (event.get("pid"), event.get("tid"), args.get("correlation"), args.get("stream"))
        else:
            ids = (event.get("pid"), event.get("tid"), None, None)
            if args is not None and "args" not in self.wrong:
                self.wrong["args"] = (name, event.get("ts"), args)
        if not (_is_id(ids[0]) and _is_id(ids[1]) and _is_id(ids[2]) and _is_id(ids[3])):
            ids = self._checked(name, event.get("ts"), ids)
        pid, tid, corr, stream = ids
        code = self.names.get(name)
        if code is None:
            code = self.names[name] = len(self.names)
        self.pending.append(self.pick((code, ts, dur, pid or 0, tid or 0, NO_LAUNCH if corr is None else corr,
                                       stream or 0)))
        if len(self.pending) >= BLOCK_EVENTS:
            self._flush()

    def _checked(self, name: str, ts: object, ids: tuple) -> tuple:
        """`ids` (ID_FIELDS) with NaN as missing (as pandas reads it, from lax JSON read whole); the first event
        with each one wrong is kept for the error."""
        out = list(ids)
        for i, value in enumerate(ids):
            if type(value) is float and value != value:
                out[i] = None
            elif not _is_id(value) and ID_FIELDS[i] not in self.wrong:
                self.wrong[ID_FIELDS[i]] = (name, ts, value)
        return tuple(out)

    def _flush(self) -> None:
        if self.pending:
            # float64 holds the ids exactly: `wrong` refuses any that is not an integer below 2^53.
            self.blocks.append(np.array(self.pending, dtype=np.float64).reshape(-1, 1 + len(self.fields)))
            self.pending = []

    def usable(self, notes: list[str]) -> int:
        """How many are usable; the first wrong id is an error, none usable of some is an error, skipped ones
        a note."""
        for field in CHECK_ORDER:
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
        `end_ns`, `dur_ns`), ids as integers. What was read is let go."""
        self._flush()
        table = np.concatenate(self.blocks) if self.blocks else np.empty((0, 1 + len(self.fields)))
        self.blocks = []
        column = {field: table[:, 1 + i] for i, field in enumerate(self.fields)}
        ns = {field: np.rint(column.pop(field) * NS_PER_US).astype(np.int64) for field in ("ts", "dur")
              if field in column}
        out: dict[str, object] = {"name": np.array(list(self.names), dtype=object)[table[:, 0].astype(np.int64)]}
        if "ts" in ns:
            out["start_ns"] = ns["ts"]
            if "dur" in ns:
                out["end_ns"] = ns["ts"] + ns["dur"]
        if "dur" in ns:
            out["dur_ns"] = ns["dur"]
        out.update({field.removeprefix("args."): values.astype(np.int64) for field, values in column.items()})
        return pd.DataFrame(out)


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
        operators = self.kinds["CPU operator"].frame()
        cpu_ops = cpu_operators(operators, annotations)
        said = _recording(meta)
        notes += [f"the recorder: {line}" for line in said["notes"]]
        processes = np.unique(np.concatenate([ranges["process"].to_numpy(), launches["pid"].to_numpy(),
                                              operators["pid"].to_numpy()]))
        ranks = {int(p): said["rank"] for p in processes} if "rank" in said else {}
        nodes = {int(p): said["node"] for p in processes} if "node" in said else {}
        return KernelTrace(SOURCE, path, kernel_rows, ranges, memory_ops, notes, cpu_ops, ranks, nodes)
