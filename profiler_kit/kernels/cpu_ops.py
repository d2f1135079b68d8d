"""CPU operator self time from a torch.profiler trace: what the kernel summary shows when a trace holds no GPU
kernel (a run on a CPU).

Operators nest (`aten::linear` calls `aten::addmm`), so their durations overlap; each operator's self time, its
duration less that of the operators directly inside it on the same thread, adds up to the time the thread
spent in operators without counting any of it twice. The nesting comes from the same layer index that
attributes kernels to NVTX ranges.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiler_kit.kernels.attribution import RangeIndex
from profiler_kit.kernels.trace import kernel_frame, range_frame

CPU_OP_CATEGORY = "cpu_op"
# torch.profiler marks the work of a collective on the process group's own thread as a `user_annotation`
# named by the backend (`gloo:all_reduce`, `nccl:all_reduce`): that is the collective's time.
COLLECTIVE = r"^(?:gloo|nccl):"
NS_PER_US = 1_000


def us_to_ns(values: pd.Series) -> np.ndarray:
    """Trace times in microseconds as integer nanoseconds."""
    return np.rint(pd.to_numeric(values).to_numpy(dtype=float) * NS_PER_US).astype(np.int64)


def event_ranges(events: pd.DataFrame) -> pd.DataFrame:
    """The `range_frame` of complete (`X`) trace events with name, ts, dur (microseconds), pid and tid."""
    starts = us_to_ns(events["ts"])
    return range_frame(
        events["name"].astype(str).to_numpy(),
        starts,
        starts + us_to_ns(events["dur"]),
        pd.to_numeric(events["pid"], errors="coerce").fillna(0).to_numpy(),
        pd.to_numeric(events["tid"], errors="coerce").fillna(0).to_numpy(),
    )


def cpu_operators(events: pd.DataFrame) -> pd.DataFrame:
    """One row per CPU operator call (and collective) with its self time as `total_ns` and its start as
    `launch_ns`: the `kernels` frame of a trace summarized by CPU time; `start_ns`, `end_ns` and `stream` (the
    thread) place the whole call, `outermost` marks calls inside no other on their thread. `events`: the
    trace's complete (`X`) events with cat, name, pid, tid, ts, dur."""
    collective = (events["cat"] == "user_annotation") & events["name"].astype(str).str.contains(COLLECTIVE)
    ops = events[(events["cat"] == CPU_OP_CATEGORY) | collective]
    calls = event_ranges(ops)
    index = RangeIndex(calls)
    nested = index.ranges
    duration = (nested["end_ns"] - nested["start_ns"]).to_numpy()
    inner = index.parent >= 0
    children = np.bincount(index.parent[inner], weights=duration[inner], minlength=len(nested))
    self_ns = np.maximum(duration - children.astype(np.int64), 0)
    frame = kernel_frame(nested["name"].to_numpy(), self_ns, nested["start_ns"].to_numpy(),
                         nested["process"].to_numpy(), start_ns=nested["start_ns"].to_numpy(),
                         stream=nested["thread"].to_numpy())
    return frame.assign(end_ns=nested["end_ns"].to_numpy(), outermost=index.parent < 0)
