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

Fields are checked once as they are read: events without a name or usable times are skipped with a note
(`_usable`); ids that are not what torch.profiler writes (`_check_ids`) make the trace an error naming the event
and the field.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels.cpu_ops import CPU_OP_CATEGORY, cpu_operators, event_ranges, us_to_ns
from profiler_kit.kernels.trace import (
    MAX_TOTAL_NS,
    NO_LAUNCH,
    KernelTrace,
    auto_names,
    kernel_frame,
    match_launches,
    memory_frame,
    range_frame,
)
from profiler_kit.names import KIND_AUTO, KIND_PHASE, KIND_PROGRAM

LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
MEMORY_CATEGORIES = ("gpu_memcpy", "gpu_memset")
RANGE_CATEGORY = "user_annotation"
NS_PER_US = 1_000
# Microsecond times at or above this would overflow int64 nanoseconds once summed.
MAX_US = 2.0**62 / NS_PER_US
SOURCE = "torch-trace"
# Ids (pid, tid, args.correlation, args.stream) are integers within [0, MAX_ID): exact as floats too, which
# pandas may turn them into.
MAX_ID = 2**53
ID_FIELDS = ("pid", "tid")
ARG_IDS = ("correlation", "stream")


def load_torch_trace(obj: object, path: Path) -> KernelTrace:
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise ProfilerKitError(f"{path}: JSON, but not a Chrome trace (no traceEvents list)")
    events = pd.DataFrame.from_records(
        [e for e in obj["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"],
        columns=["cat", "name", "pid", "tid", "ts", "dur", "args"],
    )
    try:
        trace = _load(events, path, *_phase_names(obj), _recording(obj))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfilerKitError(f"{path}: a Chrome trace with malformed events ({exc!r})") from None
    trace.clock, trace.clock_offset_ns = _clock(obj)
    return trace


def _clock(obj: dict) -> tuple[str | None, int]:
    """The host whose clock the trace's times are on (`host_name`), and the offset that puts them on it
    (`baseTimeNanoseconds`: an event's time is that plus its `ts`); no host when the trace does not name it."""
    host, base = obj.get("host_name"), obj.get("baseTimeNanoseconds", 0)
    usable = isinstance(host, str) and host and type(base) is int and 0 <= base < MAX_TOTAL_NS
    return (f"host {host}", base) if usable else (None, 0)


def _usable(events: pd.DataFrame, what: str, times: tuple[str, ...], notes: list[str]) -> pd.DataFrame:
    """The events with a string name and finite, non-negative `times`; how many others were skipped goes into
    `notes`, so no summary adds up a time the trace does not give. None usable out of some is an error."""
    ok = np.array([isinstance(name, str) for name in events["name"]], dtype=bool)
    for column in times:
        values = pd.to_numeric(events[column], errors="coerce").to_numpy(dtype=float)
        with np.errstate(invalid="ignore"):
            ok &= np.isfinite(values) & (values >= 0) & (values < MAX_US)
    _check_ids(events[ok], what)
    if len(ok) and not ok.any():
        raise ProfilerKitError(f"none of the {len(ok):,} {what} events has a name and a finite, non-negative "
                               f"{'/'.join(times)}")
    if not ok.all():
        notes.append(f"skipped {int((~ok).sum()):,} of {len(ok):,} {what} events without a name or a finite, "
                     f"non-negative {'/'.join(times)}")
    return events[ok]


def _phase_names(obj: dict) -> tuple[list[str], list[str]]:
    """The names the recorder listed as opened with `profiler_kit.phase` (none when the trace has no list), and
    a note when the list is there but not a list of names."""
    meta = obj.get("profiler_kit")
    if meta is None:
        return [], []
    phases = meta.get("phases") if isinstance(meta, dict) else None
    names = [p for p in phases if isinstance(p, str)] if isinstance(phases, list) else []
    if isinstance(phases, list) and len(names) == len(phases):
        return names, []
    return names, ["the trace's profiler_kit.phases is not a list of names: ranges opened with profiler_kit.phase "
                   "are taken only where it names them"]


def _recording(obj: dict) -> dict:
    """The recorder's notes and the process's rank and node, those of the right types."""
    meta = obj.get("profiler_kit")
    meta = meta if isinstance(meta, dict) else {}
    said = {key: meta[key] for key in ("rank", "node") if type(meta.get(key)) is int}
    notes = meta.get("notes")
    said["notes"] = [line for line in notes if isinstance(line, str)] if isinstance(notes, list) else []
    return said


def _ranges(annotations: pd.DataFrame, phase_names: list[str]) -> pd.DataFrame:
    """The `ranges` frame of the `user_annotation` events, each with its kind (see the module docstring)."""
    calls = event_ranges(annotations)
    names, auto, numbers = auto_names(calls["name"])
    kinds = np.where(auto, KIND_AUTO, np.where(calls["name"].isin(phase_names), KIND_PHASE, KIND_PROGRAM))
    return range_frame(names, calls["start_ns"], calls["end_ns"], calls["process"], calls["thread"], kinds, numbers)


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def _is_id(value: object) -> bool:
    return _missing(value) or (type(value) is int and 0 <= value < MAX_ID)


def _check_ids(events: pd.DataFrame, what: str) -> None:
    """Refuse the first event whose pid, tid, args, args.correlation or args.stream is present but not what
    torch.profiler writes: integers from 0 to 2^53, args a dict."""
    args_ok = events["args"].map(lambda a: _missing(a) or isinstance(a, dict)).to_numpy(dtype=bool)
    checks = [(field, events[field].map(_is_id).to_numpy(dtype=bool)) for field in ID_FIELDS]
    checks.append(("args", args_ok))
    for field in ARG_IDS:
        values = events["args"].map(lambda a, f=field: a.get(f) if isinstance(a, dict) else None)
        checks.append((f"args.{field}", values.map(_is_id).to_numpy(dtype=bool)))
    for field, ok in checks:
        if not ok.all():
            event = events.iloc[int(np.argmin(ok))]
            value = event["args"] if field == "args" else (
                event["args"].get(field[5:]) if field.startswith("args.") else event[field])
            raise ProfilerKitError(f"the {what} event {str(event['name'])[:60]!r} at ts {event['ts']} has {field} "
                                   f"{str(value)[:40]!r}; torch.profiler writes "
                                   f"{'a dict' if field == 'args' else 'an integer from 0 to 2^53'} there")


def _ids(values: pd.Series, missing: int) -> np.ndarray:
    """Checked ids (`_check_ids`) as int64, `missing` where an event has none."""
    return np.array([missing if _missing(v) else v for v in values], dtype=np.int64)


def _arg(events: pd.DataFrame, field: str, missing: int) -> np.ndarray:
    return _ids(events["args"].map(lambda a: a.get(field) if isinstance(a, dict) else None), missing)


def _load(events: pd.DataFrame, path: Path, phase_names: list[str], notes: list[str], said: dict) -> KernelTrace:
    kernels = _usable(events[events["cat"] == "kernel"], "kernel", ("ts", "dur"), notes)
    launches = _usable(events[events["cat"].isin(LAUNCH_CATEGORIES)], "launch", ("ts",), notes)
    # GPU events carry the device as their pid: the launch's pid is the process.
    launch_ns, process = match_launches(
        _arg(kernels, "correlation", NO_LAUNCH),
        _arg(launches, "correlation", NO_LAUNCH),
        us_to_ns(launches["ts"]),
        _ids(launches["pid"], 0),
    )
    kernel_rows = kernel_frame(
        kernels["name"].astype(str).to_numpy(), us_to_ns(kernels["dur"]), launch_ns, process,
        start_ns=us_to_ns(kernels["ts"]), stream=_arg(kernels, "stream", 0),
    )
    annotations = _usable(events[events["cat"] == RANGE_CATEGORY], "range", ("ts", "dur"), notes)
    ranges = _ranges(annotations, phase_names)
    memory = _usable(events[events["cat"].isin(MEMORY_CATEGORIES)], "memory", ("dur",), notes)
    # A trace with no CUDA activity at all (a CPU run) cannot say whether memory was copied.
    cuda_traced = len(kernels) or len(launches) or len(memory)
    memory_ops = (
        memory_frame(memory["name"].astype(str).to_numpy(), us_to_ns(memory["dur"])) if cuda_traced else None
    )
    operators = _usable(events[events["cat"] == CPU_OP_CATEGORY], "CPU operator", ("ts", "dur"), notes)
    cpu_ops = cpu_operators(pd.concat([operators, annotations]))
    notes += [f"the recorder: {line}" for line in said["notes"]]
    processes = set(ranges["process"]) | set(_ids(launches["pid"], 0)) | set(_ids(operators["pid"], 0))
    ranks = {int(p): said["rank"] for p in processes} if "rank" in said else {}
    nodes = {int(p): said["node"] for p in processes} if "node" in said else {}
    return KernelTrace(SOURCE, path, kernel_rows, ranges, memory_ops, notes, cpu_ops, ranks, nodes)
