"""Ranges (NVTX push/pop ranges, `record_function`s, operator calls) nested as each thread opened them.

Push/pop ranges of one thread nest: a range's depth is the number of the thread's ranges that started before it
and had not ended when it started, and its parent is the range one level up that holds its start. Every
thread (a `process`, `thread` pair) is nested on its own; the recorder's automatic marks lie on a lane of their
own (`kernels.trace.auto_lane`), so they nest among themselves. Arrays only (numpy, no pandas): the step and
phase rule (`phase_rule`) reads a `RangeTree`, and the kernel attribution extends it with containment queries.
"""

from __future__ import annotations

import numpy as np

from profiler_kit.names import KIND_PROGRAM

# `number` of a range the recorder did not number.
NO_NUMBER = -1


class RangeTree:
    """Ranges of non-zero length with their depth and parent (-1: outermost) on their thread, and what the step
    and phase rule reads: `name`, `kind` (`names.RANGE_KINDS`) and `number` (the step number the recorder gave
    a `step` range; NO_NUMBER elsewhere). `overlapping`: some ranges of one thread overlap without nesting."""

    def __init__(self, names: np.ndarray, start: np.ndarray, end: np.ndarray, process: np.ndarray,
                 thread: np.ndarray, kind: np.ndarray | None = None, number: np.ndarray | None = None) -> None:
        self.name = np.asarray(names, dtype=object)
        self.start = np.asarray(start, dtype=np.int64)
        self.end = np.asarray(end, dtype=np.int64)
        self.process = np.asarray(process, dtype=np.int64)
        self.thread = np.asarray(thread, dtype=np.int64)
        count = len(self.start)
        self.kind = np.full(count, KIND_PROGRAM, dtype=object) if kind is None else np.asarray(kind, dtype=object)
        self.number = np.full(count, NO_NUMBER, dtype=np.int64) if number is None else np.asarray(number, np.int64)
        self.depth = np.zeros(count, dtype=np.int64)
        self.parent = np.full(count, -1, dtype=np.int64)
        self.overlapping = False
        self._distinct: tuple[list, np.ndarray] | None = None
        # One sort puts each thread's ranges together, by start and, at one start, the longest first.
        order = np.lexsort((-self.end, self.start, self.thread, self.process))
        process, thread = self.process[order], self.thread[order]
        heads = np.flatnonzero(np.r_[True, (process[1:] != process[:-1]) | (thread[1:] != thread[:-1])])
        for rows in np.split(order, heads[1:]) if count else ():
            self._nest(rows)

    def __len__(self) -> int:
        return len(self.start)

    def _nest(self, rows: np.ndarray) -> None:
        """Depth and parent of one thread's ranges (`rows`, by start and longest first)."""
        starts, ends = self.start[rows], self.end[rows]
        depth = np.arange(len(rows)) - np.searchsorted(np.sort(ends), starts, side="right")
        self.depth[rows] = depth
        for level in range(1, int(depth.max(initial=0)) + 1):
            upper = depth == level - 1
            inner = np.flatnonzero(depth == level)
            found = locate(starts[upper], ends[upper], starts[inner])
            self.parent[rows[inner[found >= 0]]] = rows[upper][found[found >= 0]]
        for level in range(int(depth.max(initial=-1)) + 1):
            at = depth == level
            if np.any(starts[at][1:] < ends[at][:-1]):
                self.overlapping = True

    def _names(self) -> tuple[list, np.ndarray]:
        """The distinct names, and the position of each range's name among them."""
        if self._distinct is None:
            seen: dict = {}
            codes = np.fromiter((seen.setdefault(name, len(seen)) for name in self.name), np.int64, len(self))
            self._distinct = list(seen), codes
        return self._distinct

    def named(self, predicate) -> np.ndarray:
        """Which ranges have a name for which `predicate(name)` holds; each distinct name is asked once."""
        distinct, codes = self._names()
        answers = np.array([isinstance(name, str) and bool(predicate(name)) for name in distinct], dtype=bool)
        return answers[codes] if len(codes) else np.zeros(0, dtype=bool)

    def inside_own_name(self, among: np.ndarray) -> np.ndarray:
        """Which ranges of the mask `among` lie inside another of `among` of the same name on their thread."""
        codes = self._names()[1]
        found = np.zeros(len(self), dtype=bool)
        current = self.parent.copy()
        pending = np.flatnonzero(among & (current >= 0))
        while len(pending):
            up = current[pending]
            hit = among[up] & (codes[up] == codes[pending])
            found[pending[hit]] = True
            pending = pending[~hit]
            current[pending] = self.parent[current[pending]]
            pending = pending[current[pending] >= 0]
        return found

    def threads(self) -> np.ndarray:
        """A number per range that is the same for the ranges of one thread (`process`, `thread`) only."""
        return np.unique(np.stack([self.process, self.thread], axis=1), axis=0, return_inverse=True)[1].ravel()

    def nearest_in(self, among: np.ndarray) -> np.ndarray:
        """For every range, the innermost range of its thread that encloses it and is in the boolean mask
        `among`, or -1: one step up the parent chain per nesting level."""
        found = np.full(len(self), -1, dtype=np.int64)
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


def locate(starts: np.ndarray, ends: np.ndarray, times: np.ndarray) -> np.ndarray:
    """For sorted, non-overlapping intervals: the index of the interval containing each time (inclusive
    bounds), or -1."""
    idx = np.searchsorted(starts, times, side="right") - 1
    inside = idx >= 0
    inside[inside] = times[inside] <= ends[idx[inside]]
    return np.where(inside, idx, -1)
