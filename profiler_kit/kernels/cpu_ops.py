"""CPU operator self time from a torch.profiler trace: what the kernel summary shows when a trace holds no GPU
kernel (a run on a CPU).

Operators nest (`aten::linear` calls `aten::addmm`), so their durations overlap; each operator's self time, its
duration less that of the operators directly inside it on the same thread, adds up to the time the thread
spent in operators without counting any of it twice. The nesting comes from the same layer index that
attributes kernels to NVTX ranges.

The profiler's own operators are told apart: `profiler_kit.instrument` puts module backward hooks on the
program's modules, which PyTorch runs as `BackwardHookFunction` operators (and their backward, and what they call);
in a trace that holds instrument's `<module>.forward`/`<module>.backward` ranges those are the profiler's overhead,
not the program's work.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profiler_kit.kernels.attribution import RangeIndex
from profiler_kit.kernels.trace import kernel_frame, range_frame

CPU_OP_CATEGORY = "cpu_op"
# torch.profiler marks the work of a collective on the process group's own thread as a `user_annotation`
# named by the backend (`gloo:all_reduce`, `nccl:all_reduce`): that is the collective's time.
COLLECTIVE = r"^(?:gloo|nccl):"
NS_PER_US = 1_000
# The operators PyTorch runs for a module's full backward hooks (the forward side, its backward node, and the
# autograd engine's call of that node).
HOOK_OPERATORS = re.compile(r"^(?:autograd::engine::evaluate_function: )?BackwardHookFunction(?:Backward)?$")
FORWARD_SUFFIX, BACKWARD_SUFFIX = ".forward", ".backward"


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
    thread) place the whole call, `outermost` marks calls inside no other on their thread, `hooks` the module
    hooks' calls and those inside them. `events`: the trace's complete (`X`) events with cat, name, pid, tid,
    ts, dur."""
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
    return frame.assign(end_ns=nested["end_ns"].to_numpy(), outermost=index.parent < 0,
                        hooks=_in_hooks(nested["name"], index.parent, index.depth))


def _in_hooks(names: pd.Series, parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Which calls are hook operators (HOOK_OPERATORS) or run inside one, level by level from the outermost."""
    hooks = np.array(names.astype(str).str.match(HOOK_OPERATORS), dtype=bool)
    for level in range(1, int(depth.max(initial=0)) + 1):
        inner = np.flatnonzero((depth == level) & (parent >= 0))
        hooks[inner] |= hooks[parent[inner]]
    return hooks


def instrumented(ranges: pd.DataFrame | None) -> bool:
    """Whether the trace holds `profiler_kit.instrument`'s ranges: a `<module>.backward` range beside the same
    module's `<module>.forward`."""
    if ranges is None or not len(ranges):
        return False
    names = pd.Series(ranges["name"].astype(str).unique())
    forward = set(names[names.str.endswith(FORWARD_SUFFIX)].str.removesuffix(FORWARD_SUFFIX))
    backward = set(names[names.str.endswith(BACKWARD_SUFFIX)].str.removesuffix(BACKWARD_SUFFIX))
    return bool(forward & backward)


def profiler_overhead(cpu_ops: pd.DataFrame, ranges: pd.DataFrame | None) -> np.ndarray:
    """Which CPU operator calls are the profiler's own: the module hooks' calls, in a trace of a program that
    `profiler_kit.instrument` hooked (else none: the hooks were the program's own)."""
    if "hooks" not in cpu_ops.columns or not instrumented(ranges):
        return np.zeros(len(cpu_ops), dtype=bool)
    return cpu_ops["hooks"].to_numpy(dtype=bool)
