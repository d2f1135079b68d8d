"""Kernels, launches and ranges from a torch.profiler Chrome trace (`export_chrome_trace`, `.json[.gz]`).

Complete events (`"ph": "X"`) carry microsecond `ts`/`dur` with nanosecond decimals. GPU work is `kernel`,
`gpu_memcpy` and `gpu_memset`; the CPU calls that launched it are `cuda_runtime` (cudaLaunchKernel) and
`cuda_driver` (cuLaunchKernel, used by Triton) events, linked to the GPU events by `args.correlation`.
`record_function` ranges (our NVTX ranges under the torch backend) are `user_annotation` events on the CPU
thread that opened them; those named in the trace's metadata `"profiler_kit": {"phases": [...]}` were opened
with `profiler_kit.phase` (column `marked`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels.cpu_ops import CPU_OP_CATEGORY, cpu_operators, event_ranges, us_to_ns
from profiler_kit.kernels.trace import NO_LAUNCH, KernelTrace, kernel_frame, match_launches, memory_frame

LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
MEMORY_CATEGORIES = ("gpu_memcpy", "gpu_memset")
RANGE_CATEGORY = "user_annotation"
NS_PER_US = 1_000
# Microsecond times at or above this would overflow int64 nanoseconds once summed.
MAX_US = 2.0**62 / NS_PER_US
SOURCE = "torch-trace"


def load_torch_trace(obj: object, path: Path) -> KernelTrace:
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise ProfilerKitError(f"{path}: JSON, but not a Chrome trace (no traceEvents list)")
    events = pd.DataFrame.from_records(
        [e for e in obj["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"],
        columns=["cat", "name", "pid", "tid", "ts", "dur", "args"],
    )
    try:
        return _load(events, path, _phase_names(obj))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfilerKitError(f"{path}: a Chrome trace with malformed events ({exc!r})") from None


def _usable(events: pd.DataFrame, what: str, times: tuple[str, ...], notes: list[str]) -> pd.DataFrame:
    """The events with a string name and finite, non-negative `times`; how many others were skipped goes into
    `notes`, so no summary adds up a time the trace does not give. None usable out of some is an error."""
    ok = np.array([isinstance(name, str) for name in events["name"]], dtype=bool)
    for column in times:
        values = pd.to_numeric(events[column], errors="coerce").to_numpy(dtype=float)
        with np.errstate(invalid="ignore"):
            ok &= np.isfinite(values) & (values >= 0) & (values < MAX_US)
    if len(ok) and not ok.any():
        raise ProfilerKitError(f"none of the {len(ok):,} {what} events has a name and a finite, non-negative "
                               f"{'/'.join(times)}")
    if not ok.all():
        notes.append(f"skipped {int((~ok).sum()):,} of {len(ok):,} {what} events without a name or a finite, "
                     f"non-negative {'/'.join(times)}")
    return events[ok]


def _phase_names(obj: dict) -> list[str]:
    """The names the recorder listed as opened with `profiler_kit.phase`; none when the trace has no list."""
    meta = obj.get("profiler_kit")
    phases = meta.get("phases") if isinstance(meta, dict) else None
    return [p for p in phases if isinstance(p, str)] if isinstance(phases, list) else []


def _correlation(args: pd.Series) -> np.ndarray:
    """`args.correlation` of each event; NO_LAUNCH where an event has none."""
    ids = args.map(lambda a: a.get("correlation") if isinstance(a, dict) else None)
    return pd.to_numeric(ids, errors="coerce").fillna(NO_LAUNCH).to_numpy(dtype=np.int64)


def _load(events: pd.DataFrame, path: Path, phase_names: list[str]) -> KernelTrace:
    notes: list[str] = []
    kernels = _usable(events[events["cat"] == "kernel"], "kernel", ("ts", "dur"), notes)
    launches = _usable(events[events["cat"].isin(LAUNCH_CATEGORIES)], "launch", ("ts",), notes)
    # GPU events carry the device as their pid: the launch's pid is the process.
    launch_ns, process = match_launches(
        _correlation(kernels["args"]),
        _correlation(launches["args"]),
        us_to_ns(launches["ts"]),
        pd.to_numeric(launches["pid"], errors="coerce").fillna(0).to_numpy(dtype=np.int64),
    )
    stream = kernels["args"].map(lambda a: a.get("stream", 0) if isinstance(a, dict) else 0)
    kernel_rows = kernel_frame(
        kernels["name"].astype(str).to_numpy(), us_to_ns(kernels["dur"]), launch_ns, process,
        start_ns=us_to_ns(kernels["ts"]), stream=pd.to_numeric(stream, errors="coerce").fillna(0).to_numpy(),
    )
    annotations = _usable(events[events["cat"] == RANGE_CATEGORY], "range", ("ts", "dur"), notes)
    ranges = event_ranges(annotations)
    ranges["marked"] = ranges["name"].isin(phase_names)
    memory = _usable(events[events["cat"].isin(MEMORY_CATEGORIES)], "memory", ("dur",), notes)
    # A trace with no CUDA activity at all (a CPU run) cannot say whether memory was copied.
    cuda_traced = len(kernels) or len(launches) or len(memory)
    memory_ops = (
        memory_frame(memory["name"].astype(str).to_numpy(), us_to_ns(memory["dur"])) if cuda_traced else None
    )
    operators = _usable(events[events["cat"] == CPU_OP_CATEGORY], "CPU operator", ("ts", "dur"), notes)
    cpu_ops = cpu_operators(pd.concat([operators, annotations]))
    return KernelTrace(SOURCE, path, kernel_rows, ranges, memory_ops, notes, cpu_ops)
