"""Which NVTX ranges contain which kernel launches, without a Python loop over kernels or ranges.

A kernel belongs to every range that contains the CPU start of the call that launched it, on any thread of
the same process: PyTorch launches backward kernels from the autograd engine's own thread while the main
thread sits inside `backward`, so matching launches to ranges of their own thread only (what nsys's
`nvtx_kern_sum` does) leaves `backward` nearly empty.

Push/pop ranges of one thread nest, so the ranges of one thread at one nesting depth never overlap. Sorted
by start, each such (thread, depth) layer answers "which range contains time t" for all launches at once with
one binary search. A report has a handful of threads and depths, so the only Python loop is over layers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiler_kit.kernels.trace import NO_LAUNCH


class RangeIndex:
    """NVTX ranges with their nesting depth and parent, answering containment queries layer by layer."""

    def __init__(self, ranges: pd.DataFrame) -> None:
        # A zero-length range contains no launch, and would break the depth arithmetic below.
        self.ranges = ranges[ranges["end_ns"] > ranges["start_ns"]].reset_index(drop=True)
        n = len(self.ranges)
        self.depth = np.zeros(n, dtype=np.int64)
        self.parent = np.full(n, -1, dtype=np.int64)
        self.overlapping = False
        for rows in self.ranges.groupby(["process", "thread"], sort=False).indices.values():
            self._nest(np.asarray(rows))

    def _nest(self, rows: np.ndarray) -> None:
        """Depth and parent of one thread's ranges: a range's depth is the number of ranges that started
        before it and have not ended when it starts."""
        starts = self.ranges["start_ns"].to_numpy()[rows]
        ends = self.ranges["end_ns"].to_numpy()[rows]
        order = np.lexsort((-ends, starts))
        rows, starts, ends = rows[order], starts[order], ends[order]
        depth = np.arange(len(rows)) - np.searchsorted(np.sort(ends), starts, side="right")
        self.depth[rows] = depth
        for level in range(1, int(depth.max(initial=0)) + 1):
            upper = depth == level - 1
            inner = np.flatnonzero(depth == level)
            found = _locate(starts[upper], ends[upper], starts[inner])
            self.parent[rows[inner[found >= 0]]] = rows[upper][found[found >= 0]]
        for level in range(int(depth.max(initial=-1)) + 1):
            at = depth == level
            if np.any(starts[at][1:] < ends[at][:-1]):
                self.overlapping = True

    def names(self) -> pd.Series:
        return self.ranges["name"]

    def marked(self) -> np.ndarray:
        """Which ranges `profiler_kit.phase` opened (the readers' `marked` column; none without it)."""
        if "marked" not in self.ranges.columns:
            return np.zeros(len(self.ranges), dtype=bool)
        return self.ranges["marked"].to_numpy(dtype=bool)

    def nearest_in(self, among: np.ndarray) -> np.ndarray:
        """For every range, the innermost range of its thread that encloses it and is in the boolean mask
        `among`, or -1: one step up the parent chain per nesting level."""
        found = np.full(len(self.ranges), -1, dtype=np.int64)
        current = self.parent.copy()
        pending = np.flatnonzero(current >= 0)
        while len(pending):
            hit = among[current[pending]]
            found[pending[hit]] = current[pending[hit]]
            pending = pending[~hit]
            current[pending] = self.parent[current[pending]]
            pending = pending[current[pending] >= 0]
        return found

    def children_of(self, range_ids: np.ndarray) -> np.ndarray:
        """Ranges whose parent is one of `range_ids`."""
        return np.flatnonzero(np.isin(self.parent, range_ids))

    def containing(
        self, times_ns: np.ndarray, process: np.ndarray, range_ids: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(point, range) index pairs where range `range_ids[...]` contains time `times_ns[point]` and belongs
        to the point's process (on any thread)."""
        chosen = self.ranges.iloc[range_ids].assign(range_id=range_ids, depth=self.depth[range_ids])
        points_out, ranges_out = [], []
        by_process = pd.Series(np.arange(len(times_ns))).groupby(process).indices
        for (proc, _thread, _depth), layer in chosen.groupby(["process", "thread", "depth"], sort=False):
            points = by_process.get(proc)
            if points is None:
                continue
            layer = layer.sort_values("start_ns")
            found = _locate(layer["start_ns"].to_numpy(), layer["end_ns"].to_numpy(), times_ns[points])
            hit = found >= 0
            points_out.append(points[hit])
            ranges_out.append(layer["range_id"].to_numpy()[found[hit]])
        if not points_out:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        return np.concatenate(points_out), np.concatenate(ranges_out)


def _locate(starts: np.ndarray, ends: np.ndarray, times: np.ndarray) -> np.ndarray:
    """For sorted, non-overlapping intervals: the index of the interval containing each time (inclusive
    bounds), or -1."""
    idx = np.searchsorted(starts, times, side="right") - 1
    inside = idx >= 0
    inside[inside] = times[inside] <= ends[idx[inside]]
    return np.where(inside, idx, -1)


def launched(kernels: pd.DataFrame) -> np.ndarray:
    """Row positions of the kernels whose launch is known."""
    return np.flatnonzero(kernels["launch_ns"].to_numpy() != NO_LAUNCH)


def launches_in(kernels: pd.DataFrame, index: RangeIndex, range_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(kernel row, range id) pairs: each kernel launched inside each of `range_ids` (any thread of its
    process)."""
    rows = launched(kernels)
    points, owners = index.containing(kernels["launch_ns"].to_numpy()[rows], kernels["process"].to_numpy()[rows],
                                      range_ids)
    return rows[points], owners


def membership(
    kernels: pd.DataFrame, index: RangeIndex, range_ids: np.ndarray, labels: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """(kernel row, label) pairs, each once, for every range of `range_ids` containing a kernel's launch; a
    range's label is the position of its name in `labels`."""
    rows, ids = launches_in(kernels, index, range_ids)
    range_label = pd.Index(labels).get_indexer(index.names())
    # Nested ranges of one name, or ranges of several threads, can hold a launch more than once.
    keys = np.unique(rows * len(labels) + range_label[ids])
    return keys // len(labels), keys % len(labels)
