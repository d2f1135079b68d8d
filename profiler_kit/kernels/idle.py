"""Where the GPU idles inside each phase, whether a phase is launch-bound, and how much of its communication
compute hides.

For each range of a phase, the kernels launched inside it (on any thread of its process, as for the phase
totals) run on the GPU over a span from the first one's start to the last one's end. Within that span the GPU
is busy for the union of those kernels' intervals (overlapping streams count once) and idle for the rest. A
phase whose GPU is idle for most of its span waits for the CPU to launch work: it is launch-bound, and
larger batches, fewer and larger kernels (torch.compile) or CUDA graphs help; a busy one is bound by the
kernels themselves. A phase whose idle time is mostly one gap waited once (start-up, compilation, autotuning):
that gap is named with its size and place, and the verdict is made on the rest of the span.

Communication is the `communication` category: NCCL kernels on GPUs, the collectives' own time on CPUs (gloo's
`gloo:all_reduce` spans on the process group's thread). Per phase, the part of it that runs while compute runs
elsewhere (kernels of other categories on other streams; on a CPU, outermost operators on other threads) is
overlapped; the rest is exposed: the step waits for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from profiler_kit.kernels.attribution import RangeIndex
from profiler_kit.kernels.categories import COMMUNICATION
from profiler_kit.kernels.labels import Labelled, grouped

# Above this share of idle time in a phase's GPU span, the phase is launch-bound.
LAUNCH_BOUND_PCT = 50.0
LARGEST_GAPS = 3
# One gap that holds at least this share of a phase's idle time, is this many times the next largest gap and
# lasts at least DOMINANT_GAP_MIN_NS is one pause (start-up, compilation, autotuning), not launch overhead.
DOMINANT_GAP_SHARE = 0.5
DOMINANT_GAP_FACTOR = 10
DOMINANT_GAP_MIN_NS = 1_000_000
ONE_GAP = "one long gap"
COLUMNS = ("phase", "ranges", "wall_ns", "gpu_span_ns", "busy_ns", "idle_ns", "idle_pct", "largest_gaps_ns",
           "verdict", "dominant_gap")


def _gaps_before(starts: np.ndarray, ends: np.ndarray, owners: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The order that sorts the kernels by owner, then start, and in that order the idle time before each
    kernel: how far its start lies past the end of every earlier kernel of its owner (0 for an owner's first)."""
    order = np.lexsort((starts, owners))
    owner, start = owners[order], starts[order]
    reach = pd.Series(ends[order]).groupby(owner).cummax().to_numpy()
    later = np.r_[False, owner[1:] == owner[:-1]] if len(owner) else np.empty(0, dtype=bool)
    gap = np.zeros(len(order), dtype=np.int64)
    gap[later] = np.maximum(start[later] - reach[np.flatnonzero(later) - 1], 0)
    return order, gap


def spans_by_owner(starts: np.ndarray, ends: np.ndarray, owners: np.ndarray) -> pd.DataFrame:
    """Per owner (a range holding kernels, all at once): `span_ns` from its first kernel's start to its last
    one's end, `busy_ns` the union of its kernels (streams that overlap count once), its largest idle gap
    `gap_ns` with `gap_before`, the position (in the inputs) of the kernel that ends it, and `first_ns`."""
    order, gap = _gaps_before(starts, ends, owners)
    owner = owners[order]
    heads = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]]) if len(owner) else np.empty(0, dtype=np.int64)
    if not len(heads):
        return pd.DataFrame(columns=["owner", "span_ns", "busy_ns", "gap_ns", "gap_before", "first_ns"], dtype=np.int64)
    first = starts[order][heads]
    span = np.maximum.reduceat(ends[order], heads) - first
    largest = np.lexsort((-gap, owner))[heads]
    return pd.DataFrame({"owner": owner[heads], "span_ns": span, "busy_ns": span - np.add.reduceat(gap, heads),
                         "gap_ns": gap[largest], "gap_before": order[largest], "first_ns": first})


def _largest_gaps(gap: np.ndarray, labels: np.ndarray) -> dict[int, list[int]]:
    """The LARGEST_GAPS largest gaps of each label, largest first."""
    gaps = pd.DataFrame({"label": labels, "gap": gap})
    gaps = gaps[gaps["gap"] > 0].sort_values(["label", "gap"], ascending=[True, False])
    top = gaps[gaps.groupby("label").cumcount() < LARGEST_GAPS]
    return {int(label): [int(g) for g in group] for label, group in top.groupby("label")["gap"]}


def phase_idle(kernels: pd.DataFrame, labelled: Labelled, among: np.ndarray | None = None) -> pd.DataFrame:
    """One row per phase: its ranges, their CPU wall time, the GPU span of their kernels, busy and idle time,
    idle share, the largest idle gaps and the verdict (`launch-bound`, `gpu-bound`, or `one long gap` when one
    gap holds most of the idle time and the rest of the span is busy; empty without kernels). `dominant_gap`
    describes that one gap of a phase idle above LAUNCH_BOUND_PCT (else None). `among`: a mask of the ranges to
    consider (those of the steady steps), all by default. `kernels`: labelled ones (`labels`), grouped by their
    phase range, a group of ranges at a time (`labels.grouped`): no loop over ranges."""
    index, phases = labelled.index, labelled.phases
    label_of = pd.Index(phases).get_indexer(index.names())
    chosen = labelled.phase_mask if among is None else labelled.phase_mask & among
    ids = np.flatnonzero(chosen)
    owner_of = _owners(kernels, chosen)
    parts, largest = [], {}
    # A group of ranges at a time (all the kernels of a range are in its group): per range its span, busy
    # time and largest gap (`gap_before` turned into the row of the kernel after it), per phase its largest gaps.
    for members in grouped(owner_of):
        owners = owner_of[members]
        starts = kernels["start_ns"].to_numpy()[members]
        ends = starts + kernels["total_ns"].to_numpy()[members]
        part = spans_by_owner(starts, ends, owners)
        parts.append(part.assign(gap_before=members[part["gap_before"].to_numpy(dtype=np.int64)]))
        order, gap = _gaps_before(starts, ends, owners)
        for label, gaps in _largest_gaps(gap, label_of[owners[order]]).items():
            largest[label] = sorted([*largest.get(label, []), *gaps], reverse=True)[:LARGEST_GAPS]
    pieces = pd.concat(parts).sort_values("owner", kind="stable", ignore_index=True)
    pieces["label"] = label_of[pieces["owner"].to_numpy(dtype=np.int64)]
    lengths = (index.ranges["end_ns"] - index.ranges["start_ns"]).to_numpy()
    count = len(phases)
    wall, span, busy = (np.zeros(count, dtype=np.int64) for _ in range(3))
    np.add.at(wall, label_of[ids], lengths[ids])
    np.add.at(span, pieces["label"].to_numpy(dtype=np.int64), pieces["span_ns"].to_numpy(dtype=np.int64))
    np.add.at(busy, pieces["label"].to_numpy(dtype=np.int64), pieces["busy_ns"].to_numpy(dtype=np.int64))
    idle_pct = np.divide((span - busy) * 100.0, span, out=np.full(count, np.nan), where=span > 0)
    verdict = np.where(span == 0, "", np.where(idle_pct > LAUNCH_BOUND_PCT, "launch-bound", "gpu-bound"))
    verdict = verdict.astype(object)
    gaps = [largest.get(label, []) for label in range(count)]
    dominant: list[dict[str, Any] | None] = [None] * count
    for label in np.flatnonzero(verdict == "launch-bound"):
        found = _dominant_gap(pieces[pieces["label"] == label], int(span[label]), int(span[label] - busy[label]),
                              gaps[label], index)
        if found is not None:
            after = found.pop("gap_before")
            found["offset_ns"] = int(kernels["start_ns"].iloc[after]) - found["gap_ns"] - found.pop("first_ns")
            found["next_kernel"] = str(kernels["name"].iloc[after])
            if found["rest_idle_pct"] <= LAUNCH_BOUND_PCT:
                verdict[label] = ONE_GAP
            dominant[label] = found
    return pd.DataFrame({"phase": list(phases), "ranges": np.bincount(label_of[ids], minlength=count),
                         "wall_ns": wall, "gpu_span_ns": span, "busy_ns": busy, "idle_ns": span - busy,
                         "idle_pct": idle_pct, "largest_gaps_ns": gaps, "verdict": verdict,
                         "dominant_gap": dominant}, columns=list(COLUMNS))


def _owners(kernels: pd.DataFrame, chosen: np.ndarray) -> np.ndarray:
    """Each kernel's phase range where it is one of the mask `chosen`, else -1."""
    owner = kernels["phase_range"].to_numpy().copy()
    held = owner >= 0
    held[held] = chosen[owner[held]]
    owner[~held] = -1
    return owner


def _dominant_gap(pieces: pd.DataFrame, span: int, idle: int, gaps: list[int],
                  index: RangeIndex) -> dict[str, Any] | None:
    """The largest gap of one phase (`gaps`: its largest, largest first) when it is one pause (DOMINANT_GAP_*):
    its size, share, the range it lies in (`range` of `ranges` of that name, by start), the idle share of the
    phase's span without it, and (for the caller) the kernel after it and the start of that range's span."""
    if not gaps or gaps[0] < max(DOMINANT_GAP_SHARE * idle, DOMINANT_GAP_MIN_NS):
        return None
    if len(gaps) > 1 and gaps[0] < DOMINANT_GAP_FACTOR * gaps[1]:
        return None
    top = pieces.loc[pieces["gap_ns"].idxmax()]
    gap = int(top["gap_ns"])
    owner = int(top["owner"])
    names, starts = index.names().to_numpy(), index.ranges["start_ns"].to_numpy()
    same_name = names == names[owner]
    return {
        "gap_ns": gap,
        "share_of_idle_pct": gap * 100.0 / idle,
        "range": int(np.sum(starts[same_name] <= starts[owner])),
        "ranges": int(same_name.sum()),
        "rest_idle_pct": (idle - gap) * 100.0 / (span - gap) if span > gap else 0.0,
        "gap_before": int(top["gap_before"]),
        "first_ns": int(top["first_ns"]),
    }


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


COMM_COLUMNS = ["phase", "comm_ns", "overlapped_ns", "exposed_ns", "overlap_pct"]


def communication(kernels: pd.DataFrame, labelled: Labelled, among: np.ndarray | None = None) -> pd.DataFrame:
    """phase, comm_ns, overlapped_ns, exposed_ns, overlap_pct of one report's phases (`kernels`: labelled, with
    `category`, `start_ns`, `stream` and, for CPU operators, `end_ns` and `outermost`). `among`: a mask of the
    phase ranges to consider (those of the steady steps), all by default."""
    pieces = comm_overlap(kernels, labelled, among)
    if pieces is None:
        return pd.DataFrame(columns=COMM_COLUMNS)
    sums = pieces.groupby("phase")[["comm_ns", "overlapped_ns"]].sum()
    total = sums["comm_ns"].reindex(range(len(labelled.phases)), fill_value=0).to_numpy()
    overlapped = sums["overlapped_ns"].reindex(range(len(labelled.phases)), fill_value=0).to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        pct = np.where(total > 0, overlapped * 100.0 / total, np.nan)
    return pd.DataFrame({"phase": labelled.phases, "comm_ns": total.astype(np.int64),
                         "overlapped_ns": overlapped.astype(np.int64),
                         "exposed_ns": (total - overlapped).astype(np.int64), "overlap_pct": pct},
                        columns=COMM_COLUMNS)


def comm_overlap(kernels: pd.DataFrame, labelled: Labelled, among: np.ndarray | None = None) -> pd.DataFrame | None:
    """One row per communication kernel (or operator) inside a phase range of the mask `among` (all by default):
    `phase_range`, `phase` (its position in the phases), `comm_ns` and `overlapped_ns` (covered by compute on
    another stream of its process); None without ranges or timestamps."""
    if labelled.index is None or "start_ns" not in kernels.columns:
        return None
    starts = kernels["start_ns"].to_numpy()
    # A collective's own time (a kernel's duration, an operator's self time) is what counts as communication;
    # compute elsewhere covers it for as long as its outermost calls run.
    comm_ends = starts + kernels["total_ns"].to_numpy()
    ends = kernels["end_ns"].to_numpy() if "end_ns" in kernels.columns else comm_ends
    is_comm = (kernels["category"] == COMMUNICATION).to_numpy()
    compute = ~is_comm & (kernels["outermost"].to_numpy() if "outermost" in kernels.columns else True)
    streams, processes = kernels["stream"].to_numpy(), kernels["process"].to_numpy()
    chosen = labelled.phase_mask if among is None else labelled.phase_mask & among
    owners = _owners(kernels, chosen)
    codes = labelled.phase_codes(kernels)
    comm = np.flatnonzero((owners >= 0) & is_comm & (codes >= 0) & (codes < len(labelled.phases)))
    overlapped = np.zeros(len(comm), dtype=np.int64)
    for proc, stream in {(processes[i], streams[i]) for i in comm}:
        mine = np.flatnonzero((processes[comm] == proc) & (streams[comm] == stream))
        elsewhere = compute & (processes == proc) & (streams != stream)
        overlapped[mine] = covered_ns(starts[elsewhere], ends[elsewhere], starts[comm[mine]], comm_ends[comm[mine]])
    return pd.DataFrame({"phase_range": owners[comm], "phase": codes[comm].astype(np.int64),
                         "comm_ns": (comm_ends[comm] - starts[comm]).astype(np.int64), "overlapped_ns": overlapped})


def phase_wall(labelled: Labelled, among: np.ndarray | None = None) -> dict[str, int]:
    """CPU wall time of each phase: the total length of its ranges (those of the mask `among`, else all)."""
    index, phases = labelled.index, labelled.phases
    if index is None:
        return {p: 0 for p in phases}
    chosen = labelled.phase_mask if among is None else labelled.phase_mask & among
    walls = pd.Series(np.where(chosen, index.end - index.start, 0)).groupby(index.name).sum()
    return {p: int(walls.get(p, 0)) for p in phases}
