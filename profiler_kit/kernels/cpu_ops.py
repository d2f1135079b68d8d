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


def cpu_operators(operators: pd.DataFrame, annotations: pd.DataFrame) -> pd.DataFrame:
    """One row per CPU operator call (and collective) with its self time as `total_ns` and its start as
    `launch_ns`: the `kernels` frame of a trace summarized by CPU time; `start_ns`, `end_ns` and `stream` (the
    thread) place the whole call, `outermost` marks calls inside no other on their thread. `operators`: the
    trace's `cpu_op` events, `annotations` its `user_annotation` events, each with name, start_ns, end_ns, pid
    and tid."""
    collective = annotations[annotations["name"].astype(str).str.contains(COLLECTIVE).to_numpy(dtype=bool)]
    ops = pd.concat([operators, collective], ignore_index=True)
    calls = range_frame(ops["name"].to_numpy(), ops["start_ns"], ops["end_ns"], ops["pid"], ops["tid"])
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
