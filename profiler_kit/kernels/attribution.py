"""Which NVTX ranges contain which kernel launches, without a Python loop over kernels or ranges.

A kernel belongs to every range that contains the CPU start of the call that launched it, on any thread of
the same process: PyTorch launches backward kernels from the autograd engine's own thread while the main
thread sits inside `backward`, so matching launches to ranges of their own thread only (what nsys's
`nvtx_kern_sum` does) leaves `backward` nearly empty.

Push/pop ranges of one thread nest (`range_tree`), so the ranges of one thread at one nesting depth never
overlap. Sorted by start, each such (thread, depth) layer answers "which range contains time t" for all launches
at once with one binary search. A report has a handful of threads and depths, so the only Python loop is over layers.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd

from profiler_kit.kernels import trace
from profiler_kit.kernels.trace import NO_LAUNCH, blocks, joined
from profiler_kit.names import KIND_PHASE, KIND_PROGRAM
from profiler_kit.range_tree import NO_NUMBER, RangeTree, locate


class RangeIndex(RangeTree):
    """NVTX ranges (a `trace.range_frame`) nested (`range_tree.RangeTree`), answering containment queries layer
    by layer."""

    def __init__(self, ranges: pd.DataFrame) -> None:
        # A zero-length range contains no launch, and would break the depth arithmetic.
        self.ranges = ranges[ranges["end_ns"] > ranges["start_ns"]].reset_index(drop=True)
        frame = self.ranges
        kind = frame["kind"].to_numpy(dtype=object) if "kind" in frame.columns else np.where(
            self.marked(), KIND_PHASE, KIND_PROGRAM)
        number = frame["number"].to_numpy(dtype=np.int64, na_value=NO_NUMBER) if "number" in frame.columns else None
        super().__init__(frame["name"].to_numpy(dtype=object), frame["start_ns"].to_numpy(), frame["end_ns"].to_numpy(),
                         frame["process"].to_numpy(), frame["thread"].to_numpy(), kind, number)

    def names(self) -> pd.Series:
        return self.ranges["name"]

    def marked(self) -> np.ndarray:
        """Which ranges `profiler_kit.phase` opened (the readers' `marked` column; none without it)."""
        if "marked" not in self.ranges.columns:
            return np.zeros(len(self.ranges), dtype=bool)
        return self.ranges["marked"].to_numpy(dtype=bool)

    def containing(
        self, times_ns: np.ndarray, process: np.ndarray, range_ids: np.ndarray, among: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(point, range) index pairs where range `range_ids[...]` contains time `times_ns[point]` and belongs
        to the point's process (on any thread), layer by layer and, within a layer, by point. `among`: a mask
        of the points to consider (all by default)."""
        per_layer: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        for layer, points, ids in self._pairs(times_ns, process, range_ids, among):
            per_layer.setdefault(layer, []).append((points, ids))
        pairs = [pair for layer in sorted(per_layer) for pair in per_layer[layer]]
        del per_layer
        points, ids = [p for p, _ in pairs], [i for _, i in pairs]
        del pairs
        return joined(points), joined(ids)

    def _pairs(
        self, times_ns: np.ndarray, process: np.ndarray, range_ids: np.ndarray, among: np.ndarray | None,
        block_rows: int | None = None,
    ) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(layer, points, range ids) of `containing`, a block of points at a time (`trace.blocks`, of
        `block_rows`; block by block, then layer by layer): what is held at once grows with a block, not with the
        points. Layers are numbered in the order of their first range among `range_ids`."""
        chosen = self.ranges.iloc[range_ids].assign(range_id=range_ids, depth=self.depth[range_ids])
        layers = []
        for (proc, _thread, _depth), layer in chosen.groupby(["process", "thread", "depth"], sort=False):
            layer = layer.sort_values("start_ns")
            starts, ends = layer["start_ns"].to_numpy(), layer["end_ns"].to_numpy()
            layers.append((proc, starts, ends, layer["range_id"].to_numpy(), starts[0], ends.max()))
        for block in blocks(len(times_ns), block_rows) if layers else ():
            times, procs = times_ns[block], process[block]
            first, last = (times.min(), times.max()) if len(times) else (0, -1)
            for number, (proc, starts, ends, ids, lo, hi) in enumerate(layers):
                # Points outside the layer's extent cannot fall in it: only the others are searched.
                if hi < first or lo > last:
                    continue
                mine = (procs == proc) & (times >= lo) & (times <= hi)
                if among is not None:
                    mine &= among[block]
                points = np.flatnonzero(mine)
                found = locate(starts, ends, times[points])
                hit = found >= 0
                yield number, points[hit] + block.start, ids[found[hit]]


def launches_in(kernels: pd.DataFrame, index: RangeIndex, range_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(kernel row, range id) pairs: each kernel launched inside each of `range_ids` (any thread of its
    process)."""
    launch = kernels["launch_ns"].to_numpy()
    return index.containing(launch, kernels["process"].to_numpy(), range_ids, among=launch != NO_LAUNCH)


def membership(
    kernels: pd.DataFrame, index: RangeIndex, range_ids: np.ndarray, labels: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """(kernel row, label) pairs, each once, sorted, for every range of `range_ids` containing a kernel's
    launch; a range's label is the position of its name in `labels`. Rows are int32 where they fit: there is
    a pair for about every kernel."""
    rows: list[np.ndarray] = []
    label: list[np.ndarray] = []
    for block_rows, block_labels in membership_blocks(kernels, index, range_ids, labels):
        rows.append(block_rows)
        label.append(block_labels)
    return joined(rows, np.int32 if len(kernels) < 2**31 else np.int64), joined(label, np.int32)


def membership_blocks(
    kernels: pd.DataFrame, index: RangeIndex, range_ids: np.ndarray, labels: list[str]
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """`membership`'s pairs a block of kernels at a time (rows int64, labels int32), blocks in order."""
    range_label = pd.Index(labels).get_indexer(index.names())
    launch = kernels["launch_ns"].to_numpy()
    keys: list[np.ndarray] = []
    current = None
    for _layer, rows, ids in index._pairs(launch, kernels["process"].to_numpy(), range_ids, launch != NO_LAUNCH):
        if not len(rows):
            continue
        block = rows[0] // trace.BLOCK_ROWS
        if block != current and keys:
            yield _distinct(keys, len(labels))
            keys = []
        current = block
        keys.append(rows * len(labels) + range_label[ids])
    if keys:
        yield _distinct(keys, len(labels))


def _distinct(keys: list[np.ndarray], width: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (row, label) pairs of keys row × width + label, sorted. Nested ranges of one name, or
    ranges of several threads, can hold a launch more than once."""
    out = np.sort(np.concatenate(keys))
    out = out[np.r_[True, out[1:] != out[:-1]]]
    return out // width, (out % width).astype(np.int32)
