"""Where the GPU idles inside each phase, and whether a phase is launch-bound.

For each range of a phase, the kernels launched inside it (on any thread of its process, as for the phase
totals) run on the GPU over a span from the first one's start to the last one's end. Within that span the GPU
is busy for the union of those kernels' intervals (overlapping streams count once) and idle for the rest. A
phase whose GPU is idle for most of its span waits for the CPU to launch work: it is launch-bound, and
larger batches, fewer and larger kernels (torch.compile) or CUDA graphs help; a busy one is bound by the
kernels themselves.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiler_kit.kernels.attribution import RangeIndex
from profiler_kit.kernels.trace import NO_LAUNCH

# Above this share of idle time in a phase's GPU span, the phase is launch-bound.
LAUNCH_BOUND_PCT = 50.0
LARGEST_GAPS = 3
COLUMNS = ("phase", "ranges", "wall_ns", "gpu_span_ns", "busy_ns", "idle_ns", "idle_pct", "largest_gaps_ns",
           "verdict")


def _busy_and_gaps(starts: np.ndarray, ends: np.ndarray) -> tuple[int, np.ndarray]:
    """Length of the union of intervals, and the gaps between its pieces."""
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    gaps = starts[1:] - reach[:-1]
    gaps = gaps[gaps > 0]
    return int(reach[-1] - starts[0] - gaps.sum()), gaps


def launches_in(kernels: pd.DataFrame, index: RangeIndex, range_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(kernel row, range id) pairs: each kernel launched inside each of `range_ids` (any thread of its
    process)."""
    launch = kernels["launch_ns"].to_numpy()
    launched = np.flatnonzero(launch != NO_LAUNCH)
    points, owners = index.containing(launch[launched], kernels["process"].to_numpy()[launched], range_ids)
    return launched[points], owners


def phase_idle(kernels: pd.DataFrame, index: RangeIndex, phases: list[str]) -> pd.DataFrame:
    """One row per phase: its ranges, their CPU wall time, the GPU span of their kernels, busy and idle time,
    idle share, the largest idle gaps and the verdict (`launch-bound` or `gpu-bound`; empty without kernels)."""
    starts_all = kernels["start_ns"].to_numpy()
    ends_all = starts_all + kernels["total_ns"].to_numpy()
    names = index.names().to_numpy()
    rows = []
    for phase in phases:
        ids = np.flatnonzero(names == phase)
        members, owners = launches_in(kernels, index, ids)
        wall = int((index.ranges["end_ns"].to_numpy()[ids] - index.ranges["start_ns"].to_numpy()[ids]).sum())
        span = busy = 0
        gaps: list[np.ndarray] = []
        for owner in np.unique(owners):
            mine = members[owners == owner]
            piece_busy, piece_gaps = _busy_and_gaps(starts_all[mine], ends_all[mine])
            span += int(ends_all[mine].max() - starts_all[mine].min())
            busy += piece_busy
            gaps.append(piece_gaps)
        all_gaps = np.sort(np.concatenate(gaps))[::-1] if gaps else np.empty(0, dtype=np.int64)
        idle_pct = (span - busy) * 100.0 / span if span else float("nan")
        verdict = "" if not span else "launch-bound" if idle_pct > LAUNCH_BOUND_PCT else "gpu-bound"
        rows.append((phase, len(ids), wall, span, busy, span - busy, idle_pct,
                     [int(g) for g in all_gaps[:LARGEST_GAPS]], verdict))
    return pd.DataFrame(rows, columns=list(COLUMNS))
