"""Kernels, launches and ranges from a torch.profiler Chrome trace (`export_chrome_trace`, `.json[.gz]`).

Complete events (`"ph": "X"`) carry microsecond `ts`/`dur` with nanosecond decimals. GPU work is `kernel`,
`gpu_memcpy` and `gpu_memset`; the CPU calls that launched it are `cuda_runtime` (cudaLaunchKernel) and
`cuda_driver` (cuLaunchKernel, used by Triton) events, linked to the GPU events by `args.correlation`.
`record_function` ranges (our NVTX ranges under the torch backend) are `user_annotation` events on the CPU
thread that opened them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels.cpu_ops import cpu_operators
from profiler_kit.kernels.trace import NO_LAUNCH, KernelTrace, kernel_frame, match_launches, memory_frame, range_frame

LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
MEMORY_CATEGORIES = ("gpu_memcpy", "gpu_memset")
RANGE_CATEGORY = "user_annotation"
NS_PER_US = 1_000
SOURCE = "torch-trace"


def load_torch_trace(obj: object, path: Path) -> KernelTrace:
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise ProfilerKitError(f"{path}: JSON, but not a Chrome trace (no traceEvents list)")
    events = pd.DataFrame.from_records(
        [e for e in obj["traceEvents"] if isinstance(e, dict) and e.get("ph") == "X"],
        columns=["cat", "name", "pid", "tid", "ts", "dur", "args"],
    )
    try:
        return _load(events, path)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProfilerKitError(f"{path}: a Chrome trace with malformed events ({exc!r})") from None


def _ns(values: pd.Series) -> np.ndarray:
    return np.rint(pd.to_numeric(values).to_numpy(dtype=float) * NS_PER_US).astype(np.int64)


def _correlation(args: pd.Series) -> np.ndarray:
    """`args.correlation` of each event; NO_LAUNCH where an event has none."""
    ids = args.map(lambda a: a.get("correlation") if isinstance(a, dict) else None)
    return pd.to_numeric(ids, errors="coerce").fillna(NO_LAUNCH).to_numpy(dtype=np.int64)


def _load(events: pd.DataFrame, path: Path) -> KernelTrace:
    kernels = events[events["cat"] == "kernel"]
    launches = events[events["cat"].isin(LAUNCH_CATEGORIES)]
    # GPU events carry the device as their pid: the launch's pid is the process.
    launch_ns, process = match_launches(
        _correlation(kernels["args"]),
        _correlation(launches["args"]),
        _ns(launches["ts"]),
        pd.to_numeric(launches["pid"], errors="coerce").fillna(0).to_numpy(dtype=np.int64),
    )
    stream = kernels["args"].map(lambda a: a.get("stream", 0) if isinstance(a, dict) else 0)
    kernel_rows = kernel_frame(
        kernels["name"].astype(str).to_numpy(), _ns(kernels["dur"]), launch_ns, process,
        start_ns=_ns(kernels["ts"]), stream=pd.to_numeric(stream, errors="coerce").fillna(0).to_numpy(),
    )
    annotations = events[events["cat"] == RANGE_CATEGORY]
    starts = _ns(annotations["ts"])
    ranges = range_frame(
        annotations["name"].astype(str).to_numpy(),
        starts,
        starts + _ns(annotations["dur"]),
        pd.to_numeric(annotations["pid"], errors="coerce").fillna(0).to_numpy(),
        pd.to_numeric(annotations["tid"], errors="coerce").fillna(0).to_numpy(),
    )
    memory = events[events["cat"].isin(MEMORY_CATEGORIES)]
    # A trace with no CUDA activity at all (a CPU run) cannot say whether memory was copied.
    cuda_traced = len(kernels) or len(launches) or len(memory)
    memory_ops = (
        memory_frame(memory["name"].astype(str).to_numpy(), _ns(memory["dur"])) if cuda_traced else None
    )
    return KernelTrace(SOURCE, path, kernel_rows, ranges, memory_ops, cpu_ops=cpu_operators(events))
