"""The common form every source is loaded into before it is summarized.

Sources differ in what they know: an nsys export or a torch.profiler trace has every kernel execution with the
CPU time of the call that launched it, and the NVTX ranges of every thread; an `nsys stats` table only has
per-name totals. `KernelTrace` holds whatever the source knows, with `None` for what it cannot know.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.names import AUTO_PREFIX, KIND_AUTO, KIND_PHASE, KIND_PROGRAM

# Kernels a pass over every kernel of a report takes at a time (`blocks`).
BLOCK_ROWS = 1 << 20
# `launch_ns` of a kernel whose launching call is not in the source (no runtime table, unmatched id).
NO_LAUNCH = -1
# Durations of one trace must add up to less than this: every sum a summary takes (per category, phase, range,
# rank) is then exact in int64. 2^62 ns is 146 years.
MAX_TOTAL_NS = 2**62

MEMORY_COLUMNS = ("operation", "instances", "total_ns")
_AUTO_NAME = "^" + re.escape(AUTO_PREFIX) + r"(.+?)(?:#(\d+))?$"


@dataclass
class KernelTrace:
    """Kernels, NVTX ranges and memory operations of one source file.

    kernels: one row per kernel execution (`instances` 1) with `launch_ns`/`process` when the source has
        launch times (and `start_ns`, `stream` when it has GPU timestamps), else one row per kernel name with
        totals. Durations are integer nanoseconds.
    ranges: NVTX push/pop (or record_function) ranges with the process and thread that pushed them (`range_frame`:
        their kind and step number too); None when the source cannot hold ranges, empty when it could but has
        none.
    memory_ops: memcpy/memset totals by operation; None when the source does not say.
    notes: caveats about the source to show beside the summary (rounded times, truncated names).
    cpu_ops: CPU operator calls as a `kernels` frame of self times (torch.profiler traces); None elsewhere.
    process_ranks, process_nodes: the `RANK` (and node rank, GROUP_RANK) each process (`process` id) had in its
        job, as its recorder wrote it; empty where the source does not say.
    clock: the clock the times are on, where the source says (`host NAME` for a torch.profiler trace): traces of
        one clock compare in time; `clock_offset_ns` is added to their times to put them on it.
    """

    source: str
    path: Path
    kernels: pd.DataFrame
    ranges: pd.DataFrame | None = None
    memory_ops: pd.DataFrame | None = None
    notes: list[str] = field(default_factory=list)
    cpu_ops: pd.DataFrame | None = None
    process_ranks: dict[int, int] = field(default_factory=dict)
    process_nodes: dict[int, int] = field(default_factory=dict)
    clock: str | None = None
    clock_offset_ns: int = 0

    @property
    def has_launches(self) -> bool:
        return "launch_ns" in self.kernels.columns


def kernel_frame(
    names: pd.Categorical | pd.Series | np.ndarray,
    durations_ns: np.ndarray,
    launch_ns: np.ndarray | None = None,
    process: np.ndarray | None = None,
    instances: np.ndarray | None = None,
    start_ns: np.ndarray | None = None,
    stream: np.ndarray | None = None,
) -> pd.DataFrame:
    """A `kernels` frame with the right dtypes; per-execution when launch times are given, with the GPU start
    and stream of each execution when those are given."""
    durations = checked_total(durations_ns, "kernel")
    columns = {
        "name": names if isinstance(names, pd.Categorical) else pd.Categorical(np.asarray(names, dtype=object)),
        "instances": np.ones(len(durations), dtype=np.int64) if instances is None
        else np.asarray(instances, dtype=np.int64),
        "total_ns": durations,
    }
    if launch_ns is not None:
        columns["launch_ns"] = np.asarray(launch_ns, dtype=np.int64)
        columns["process"] = np.asarray(process, dtype=np.int64)
    if start_ns is not None:
        columns["start_ns"] = np.asarray(start_ns, dtype=np.int64)
        columns["stream"] = np.asarray(stream, dtype=np.int64)
    # copy=False: the columns are the arrays given, not copies of them (a report's kernels can be millions).
    frame = pd.DataFrame(columns, copy=False)
    return frame


class LaunchMatcher:
    """Launch time and process of each kernel, matched by correlation id (and process, when kernels carry
    theirs) against launch calls given in blocks (`add`), in the order the source lists them: the kernels'
    ids are sorted once and each block finds its kernels by binary search, so no more than one block of
    launches is held. Ids are non-negative; a negative one (an event without an id) matches nothing. Where one
    process lists an id twice, its first launch counts. Kernels without a match keep NO_LAUNCH."""

    def __init__(self, kernel_corr: np.ndarray, kernel_process: np.ndarray | None = None) -> None:
        kernel_corr = np.asarray(kernel_corr, dtype=np.int64)
        self._count = len(kernel_corr)
        # Kernels without an id sort first and match nothing: launches with one are searched for only.
        order = np.argsort(kernel_corr, kind="stable")
        self._ids = kernel_corr[order]
        self._order = order.astype(np.int32) if self._count < 2**31 else order
        del order
        self._kernel_process: np.ndarray | int | None = None
        if kernel_process is not None and len(kernel_process):
            kernel_process = np.asarray(kernel_process, dtype=np.int64)
            # One process (the usual report) is one number, not one per kernel.
            single = kernel_process.min() == kernel_process.max()
            self._kernel_process = int(kernel_process[0]) if single else kernel_process[self._order]
        self._launch_ns: np.ndarray | None = None
        self._process: np.ndarray | None = None

    @property
    def launch_ns(self) -> np.ndarray:
        """The launch time of each kernel, NO_LAUNCH where none matched."""
        self._outputs()
        return self._launch_ns

    @property
    def process(self) -> np.ndarray:
        """The process of each kernel's launch, 0 where none matched."""
        self._outputs()
        return self._process

    def _outputs(self) -> None:
        # Made at the first launch block, once the caller has let go of what it read to build the matcher.
        if self._launch_ns is None:
            self._launch_ns = np.full(self._count, NO_LAUNCH, dtype=np.int64)
            self._process = np.zeros(self._count, dtype=np.int64)

    def add(self, corr: np.ndarray, launch_ns: np.ndarray, process: np.ndarray) -> None:
        """One block of launch calls: correlation id, CPU start and process of each."""
        self._outputs()
        corr = np.asarray(corr, dtype=np.int64)
        first = np.searchsorted(self._ids, corr, side="left")
        count = np.searchsorted(self._ids, corr, side="right") - first
        count[corr < 0] = 0
        launch = np.repeat(np.arange(len(corr)), count)
        # Sorted positions of every kernel each launch may have launched (a graph launch has several).
        at = np.repeat(first - np.cumsum(count) + count, count) + np.arange(len(launch))
        process = np.asarray(process, dtype=np.int64)[launch]
        if self._kernel_process is not None:
            kernel_process = (self._kernel_process if isinstance(self._kernel_process, int)
                              else self._kernel_process[at])
            same = kernel_process == process
            launch, at, process = launch[same], at[same], process[same]
        rows = self._order[at]
        free = self._launch_ns[rows] == NO_LAUNCH
        # Reversed, so that of two launches of one kernel in this block the first is written last.
        rows, launch, process = rows[free][::-1], launch[free][::-1], process[free][::-1]
        self._launch_ns[rows] = np.asarray(launch_ns, dtype=np.int64)[launch]
        self._process[rows] = process


def match_launches(
    kernel_corr: np.ndarray,
    launch_corr: np.ndarray,
    launch_ns: np.ndarray,
    launch_process: np.ndarray,
    kernel_process: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Launch time and process of each kernel (`LaunchMatcher`), all launch calls given at once."""
    matcher = LaunchMatcher(kernel_corr, kernel_process)
    matcher.add(launch_corr, launch_ns, launch_process)
    return matcher.launch_ns, matcher.process


def checked_total(durations_ns: Iterable[int] | np.ndarray, what: str) -> np.ndarray:
    """Durations as int64, refused when negative or when their sum reaches MAX_TOTAL_NS: a sum that wrapped
    at 2^63 would be a wrong number, not an error. The float sum decides (its rounding is far below the
    margin MAX_TOTAL_NS leaves)."""
    durations = np.asarray(durations_ns, dtype=np.int64)
    if len(durations) and (durations.min() < 0 or durations.sum(dtype=float) >= MAX_TOTAL_NS):
        raise ProfilerKitError(f"the {what} durations are negative or add up to more than 2^62 ns (146 years); "
                               "no recording holds that much")
    return durations


def blocks(count: int, rows: int | None = None) -> Iterator[slice]:
    """Slices of `rows` (default BLOCK_ROWS) rows that cover `count` rows, in order: the passes over every kernel
    of a report hold one block's temporaries at a time."""
    rows = rows or BLOCK_ROWS
    return (slice(first, first + rows) for first in range(0, count, rows))


def joined(parts: list[np.ndarray], dtype: type = np.int64) -> np.ndarray:
    """The arrays of `parts` end to end, emptying the list as they are copied: the parts and the whole are
    not both held at once."""
    out = np.empty(sum(len(part) for part in parts), dtype=dtype)
    at = 0
    parts.reverse()
    while parts:
        part = parts.pop()
        out[at: at + len(part)] = part
        at += len(part)
    return out


def summed(parts: Iterable[tuple[np.ndarray, ...]], values: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """`group_sums` of each part's (keys, *values), `values` arrays of values each, added up over the parts."""
    done = [group_sums(*part) for part in parts]
    keys = np.concatenate([np.empty(0, dtype=np.int64), *(keys for keys, _ in done)])
    return group_sums(keys, *(np.concatenate([np.empty(0, dtype=np.int64), *(sums[i] for _, sums in done)])
                              for i in range(values)))


def group_sums(keys: np.ndarray, *values: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """The distinct non-negative integer `keys` (sorted) and, for each of `values`, its int64 sum per key:
    exact, unlike np.bincount's float sums, and without the per-row memory of a pandas groupby. Keys that are
    few for their range are summed in place (np.add.at), others after a sort."""
    keys = np.asarray(keys, dtype=np.int64)
    size = int(keys.max()) + 1 if len(keys) else 0
    if size <= 4 * len(keys) + (1 << 20):
        held = np.bincount(keys, minlength=size) > 0
        sums = []
        for value in values:
            out = np.zeros(size, dtype=np.int64)
            np.add.at(out, keys, value)
            sums.append(out[held])
        return np.flatnonzero(held), sums
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    heads = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    return ordered[heads], [np.add.reduceat(np.asarray(value, dtype=np.int64)[order], heads) for value in values]


def shared_strings(count: int, text: str) -> np.ndarray:
    """An object array of `count` references to the one string `text` (np.full makes a string object per row:
    hundreds of MB over millions of rows)."""
    out = np.empty(count, dtype=object)
    out[:] = text
    return out


def range_frame(
    names: Iterable, start_ns: Iterable, end_ns: Iterable, process: Iterable, thread: Iterable,
    kind: Iterable | None = None, number: Iterable | None = None,
) -> pd.DataFrame:
    """A `ranges` frame: one row per NVTX range, times in integer nanoseconds; `kind` (`names.RANGE_KINDS`:
    `phase`, `auto` or `program`, the default) with `marked` equal to `kind == "phase"`, and `number`, the
    program's step number of a `step` range the recorder placed (nullable Int64, NA elsewhere). The recorder's
    automatic marks lie on a lane of their own beside the thread that opened them (`auto_lane`): they open in
    one hook and close in another, so they need not nest with the thread's push/pop ranges."""
    # Every column is made before the frame, in one construction: a column added to a frame of millions of
    # rows (CPU operators) copies its other columns.
    count = len(np.asarray(start_ns))
    threads = np.array(thread, dtype=np.int64)
    if kind is None:  # all the program's, none a step the recorder numbered
        kinds = shared_strings(count, KIND_PROGRAM)
        numbers = pd.arrays.IntegerArray(np.zeros(count, np.int64), np.ones(count, bool))
    else:
        kinds = np.asarray(kind, dtype=object)
        numbers = pd.array(number if isinstance(number, pd.api.extensions.ExtensionArray) else
                           [pd.NA] * count if number is None else list(number), dtype="Int64")
        auto = kinds == KIND_AUTO
        threads[auto] = auto_lane(threads[auto])
    return pd.DataFrame(
        {
            "name": pd.Series(np.asarray(names, dtype=object), dtype=object),
            "start_ns": np.asarray(start_ns, dtype=np.int64),
            "end_ns": np.asarray(end_ns, dtype=np.int64),
            "process": np.asarray(process, dtype=np.int64),
            "thread": threads,
            "kind": kinds,
            "marked": kinds == KIND_PHASE,
            "number": numbers,
        }
    )


def auto_names(names: pd.Series) -> tuple[pd.Series, np.ndarray, pd.api.extensions.ExtensionArray]:
    """Names of the recorder's automatic marks where they carry its prefix (`profiler_kit::forward`,
    `profiler_kit::step#3`): the names without it, which are marks, and each one's step number (Int64, NA
    elsewhere). Each distinct name is parsed once: a trace repeats a few hundred names millions of times."""
    codes, distinct = pd.factorize(names, use_na_sentinel=False)
    parts = pd.Series(np.asarray(distinct, dtype=object)).astype(str).str.extract(_AUTO_NAME)
    auto = parts[0].notna().to_numpy()
    bare = np.where(auto, parts[0].to_numpy(dtype=object), np.asarray(distinct, dtype=object))
    numbers = pd.array([pd.NA if pd.isna(n) else int(n) for n in parts[1]], dtype="Int64")
    return pd.Series(bare[codes], index=names.index, dtype=object), auto[codes], numbers.take(codes)


def auto_lane(thread: np.ndarray) -> np.ndarray:
    """The lane of the automatic marks opened on `thread`: a thread id no real thread has."""
    return -np.asarray(thread, dtype=np.int64) - 1


def memory_frame(operations: Iterable[str], durations_ns: Iterable[int]) -> pd.DataFrame:
    """Memory-operation totals by operation name, from one row per operation."""
    frame = pd.DataFrame(
        {
            "operation": pd.Series(operations, dtype=object),
            "total_ns": checked_total(list(durations_ns), "memory operation"),
        }
    )
    out = frame.groupby("operation", sort=False).agg(
        instances=("total_ns", "size"), total_ns=("total_ns", "sum")
    )
    return out.reset_index().sort_values("total_ns", ascending=False, ignore_index=True)[list(MEMORY_COLUMNS)]
