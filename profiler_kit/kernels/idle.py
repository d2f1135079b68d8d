"""Where the GPU idles inside each phase, whether a phase is launch-bound, and how much of its communication
compute hides.

For each range of a phase, the kernels launched inside it (on any thread of its process, as for the phase
totals) run on the GPU over a span from the first one's start to the last one's end. Within that span the GPU
is busy for the union of those kernels' intervals (overlapping streams count once) and idle for the rest. A
phase whose GPU is idle for most of its span waits for the CPU to launch work: it is launch-bound, and
larger batches, fewer and larger kernels (torch.compile) or CUDA graphs help; a busy one is bound by the
kernels themselves.

Communication is the `communication` category: NCCL kernels on GPUs, the collectives' own time on CPUs (gloo's
`gloo:all_reduce` spans on the process group's thread). Per phase, the part of it that runs while compute runs
elsewhere (kernels of other categories on other streams; on a CPU, outermost operators on other threads) is
overlapped; the rest is exposed: the step waits for it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiler_kit.kernels.attribution import RangeIndex
from profiler_kit.kernels.trace import NO_LAUNCH

COMMUNICATION = "communication"
# Above this share of idle time in a phase's GPU span, the phase is launch-bound.
LAUNCH_BOUND_PCT = 50.0
LARGEST_GAPS = 3
COLUMNS = ("phase", "ranges", "wall_ns", "gpu_span_ns", "busy_ns", "idle_ns", "idle_pct", "largest_gaps_ns",
           "verdict")


def busy_and_gaps(starts: np.ndarray, ends: np.ndarray) -> tuple[int, np.ndarray]:
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
            piece_busy, piece_gaps = busy_and_gaps(starts_all[mine], ends_all[mine])
            span += int(ends_all[mine].max() - starts_all[mine].min())
            busy += piece_busy
            gaps.append(piece_gaps)
        all_gaps = np.sort(np.concatenate(gaps))[::-1] if gaps else np.empty(0, dtype=np.int64)
        idle_pct = (span - busy) * 100.0 / span if span else float("nan")
        verdict = "" if not span else "launch-bound" if idle_pct > LAUNCH_BOUND_PCT else "gpu-bound"
        rows.append((phase, len(ids), wall, span, busy, span - busy, idle_pct,
                     [int(g) for g in all_gaps[:LARGEST_GAPS]], verdict))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def covered_ns(starts: np.ndarray, ends: np.ndarray, q_starts: np.ndarray, q_ends: np.ndarray) -> np.ndarray:
    """How much of each query interval the union of the intervals `starts`/`ends` covers."""
    if not len(starts):
        return np.zeros(len(q_starts), dtype=np.int64)
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], np.maximum.accumulate(ends[order])
    # Merge into disjoint pieces: a piece starts where an interval starts after all earlier ones ended.
    first = np.r_[True, starts[1:] > ends[:-1]]
    piece_starts = starts[first]
    piece_ends = ends[np.r_[np.flatnonzero(first)[1:] - 1, len(ends) - 1]]
    cumulative = np.r_[0, np.cumsum(piece_ends - piece_starts)]

    def covered_until(t: np.ndarray) -> np.ndarray:
        i = np.searchsorted(piece_starts, t, side="right")
        return cumulative[i] - np.maximum(piece_ends[np.maximum(i - 1, 0)] - t, 0) * (i > 0)

    return covered_until(q_ends) - covered_until(q_starts)


def communication(kernels: pd.DataFrame, index: RangeIndex | None, phases: list[str]) -> pd.DataFrame:
    """phase, comm_ns, overlapped_ns, exposed_ns, overlap_pct of one report's `phases` (`kernels` as
    summarized, with `category`, `start_ns`, `stream` and, for CPU operators, `end_ns` and `outermost`)."""
    rows = []
    if index is None or "start_ns" not in kernels.columns:
        return pd.DataFrame(columns=["phase", "comm_ns", "overlapped_ns", "exposed_ns", "overlap_pct"])
    starts = kernels["start_ns"].to_numpy()
    # A collective's own time (a kernel's duration, an operator's self time) is what counts as communication;
    # compute elsewhere covers it for as long as its outermost calls run.
    comm_ends = starts + kernels["total_ns"].to_numpy()
    ends = kernels["end_ns"].to_numpy() if "end_ns" in kernels.columns else comm_ends
    is_comm = (kernels["category"] == COMMUNICATION).to_numpy()
    compute = ~is_comm & (kernels["outermost"].to_numpy() if "outermost" in kernels.columns else True)
    streams, processes = kernels["stream"].to_numpy(), kernels["process"].to_numpy()
    names = index.names().to_numpy()
    for phase in phases:
        members, _ = launches_in(kernels, index, np.flatnonzero(names == phase))
        comm = np.unique(members[is_comm[members]])
        overlapped = 0
        for proc, stream in {(processes[i], streams[i]) for i in comm}:
            mine = comm[(processes[comm] == proc) & (streams[comm] == stream)]
            elsewhere = compute & (processes == proc) & (streams != stream)
            overlapped += int(covered_ns(starts[elsewhere], ends[elsewhere], starts[mine], comm_ends[mine]).sum())
        total = int((comm_ends[comm] - starts[comm]).sum())
        rows.append((phase, total, overlapped, total - overlapped, overlapped * 100.0 / total if total else np.nan))
    return pd.DataFrame(rows, columns=["phase", "comm_ns", "overlapped_ns", "exposed_ns", "overlap_pct"])


def phase_wall(index: RangeIndex | None, phases: list[str]) -> dict[str, int]:
    """CPU wall time of each phase: the total length of its ranges."""
    if index is None:
        return {p: 0 for p in phases}
    lengths = index.ranges["end_ns"] - index.ranges["start_ns"]
    return {p: int(lengths[(index.names() == p).to_numpy()].sum()) for p in phases}
