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
# The operators PyTorch runs for a module's full backward hooks (the forward side, its backward node, and the
# autograd engine's call of that node).
HOOK_OPERATORS = re.compile(r"^(?:autograd::engine::evaluate_function: )?BackwardHookFunction(?:Backward)?$")
FORWARD_SUFFIX, BACKWARD_SUFFIX = ".forward", ".backward"


def cpu_operators(operators: pd.DataFrame, annotations: pd.DataFrame) -> pd.DataFrame:
    """One row per CPU operator call (and collective) with its self time as `total_ns` and its start as
    `launch_ns`: the `kernels` frame of a trace summarized by CPU time; `start_ns`, `end_ns` and `stream` (the
    thread) place the whole call, `outermost` marks calls inside no other on their thread, `hooks` the module
    hooks' calls and those inside them. `operators`: the trace's `cpu_op` events, `annotations` its
    `user_annotation` events, each with name, start_ns, end_ns, pid and tid."""
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


def threads_note(operators: pd.DataFrame, step_of: np.ndarray, steps: pd.DataFrame) -> str | None:
    """Why a step's CPU operator self time exceeds its wall time, where one does: its operators ran on several
    threads at once (the autograd engine's, a process group's), and self time adds up over threads. `operators`:
    the labelled operator calls (`stream` is the thread), `step_of`: each call's row of the per-step table
    `steps` (-1 outside the steps), which has `step`, `wall_ms` and `operator_ms`."""
    over = np.flatnonzero((steps["operator_ms"] > steps["wall_ms"]).to_numpy())
    if not len(over):
        return None
    inside = step_of >= 0
    pairs = pd.DataFrame({"row": step_of[inside], "thread": operators["stream"].to_numpy()[inside]})
    threads = pairs.drop_duplicates().groupby("row").size().reindex(over, fill_value=0).to_numpy()
    shown = [f"step {steps['step'].iat[row]} ({steps['operator_ms'].iat[row]:.2f} against "
             f"{steps['wall_ms'].iat[row]:.2f} ms, on {count} threads)"
             for row, count in zip(over[:3], threads[:3], strict=True)]
    more = f" and {len(over) - 3} more" if len(over) > 3 else ""
    return (f"CPU operator self time exceeds the step's wall time in {', '.join(shown)}{more}: operators ran at "
            "once on several threads (the program's, the autograd engine's, a process group's) and their self "
            "times add up over the threads: thread time, not a share of the step's wall time")
