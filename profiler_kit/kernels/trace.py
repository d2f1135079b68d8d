"""The common form every source is loaded into before it is summarized.

Sources differ in what they know: an nsys export or a torch.profiler trace has every kernel execution with the
CPU time of the call that launched it, and the NVTX ranges of every thread; an `nsys stats` table only has
per-name totals. `KernelTrace` holds whatever the source knows, with `None` for what it cannot know.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.names import AUTO_PREFIX, KIND_AUTO, KIND_PHASE, KIND_PROGRAM

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
    frame = pd.DataFrame(
        {
            "name": names
            if isinstance(names, pd.Categorical)
            else pd.Categorical(np.asarray(names, dtype=object)),
            "instances": np.ones(len(durations), dtype=np.int64)
            if instances is None
            else np.asarray(instances, dtype=np.int64),
            "total_ns": durations,
        }
    )
    if launch_ns is not None:
        frame["launch_ns"] = np.asarray(launch_ns, dtype=np.int64)
        frame["process"] = np.asarray(process, dtype=np.int64)
    if start_ns is not None:
        frame["start_ns"] = np.asarray(start_ns, dtype=np.int64)
        frame["stream"] = np.asarray(stream, dtype=np.int64)
    return frame


def match_launches(
    kernel_corr: np.ndarray,
    launch_corr: np.ndarray,
    launch_ns: np.ndarray,
    launch_process: np.ndarray,
    kernel_process: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Launch time and process of each kernel, matched by correlation id (and process, when kernels carry
    theirs): a sort and a binary search instead of a join. Ids are non-negative; a negative one (an event
    without an id) matches nothing. Unmatched kernels get NO_LAUNCH."""
    kernel_key = np.asarray(kernel_corr, dtype=np.int64)
    with_id = np.asarray(launch_corr, dtype=np.int64) >= 0
    launch_key = np.asarray(launch_corr, dtype=np.int64)[with_id]
    launch_ns = np.asarray(launch_ns, dtype=np.int64)[with_id]
    launch_process = np.asarray(launch_process, dtype=np.int64)[with_id]
    known = kernel_key >= 0
    if len(launch_key) == 0 or len(kernel_key) == 0:
        return np.full(len(kernel_key), NO_LAUNCH, dtype=np.int64), np.zeros(len(kernel_key), dtype=np.int64)
    if kernel_process is not None:
        # Correlation ids are unique within a process: (process, id) becomes one integer key, from the ids'
        # ranks among all ids (not the ids themselves, which may be as large as int64 allows).
        kernel_process = np.asarray(kernel_process, dtype=np.int64)
        processes, launch_pidx = np.unique(launch_process, return_inverse=True)
        kernel_pidx = np.minimum(np.searchsorted(processes, kernel_process), len(processes) - 1)
        known &= processes[kernel_pidx] == kernel_process
        ids, ranks = np.unique(np.concatenate([launch_key, kernel_key]), return_inverse=True)
        stride = len(ids)
        launch_key = launch_pidx * stride + ranks[: len(launch_key)]
        kernel_key = kernel_pidx * stride + ranks[len(launch_key):]
    order = np.argsort(launch_key, kind="stable")
    sorted_keys = launch_key[order]
    pos = np.minimum(np.searchsorted(sorted_keys, kernel_key), len(sorted_keys) - 1)
    hit = known & (sorted_keys[pos] == kernel_key)
    launch = np.where(hit, launch_ns[order][pos], NO_LAUNCH)
    return launch, np.where(hit, launch_process[order][pos], 0)


def checked_total(durations_ns: Iterable[int] | np.ndarray, what: str) -> np.ndarray:
    """Durations as int64, refused when negative or when their sum reaches MAX_TOTAL_NS: a sum that wrapped
    at 2^63 would be a wrong number, not an error. The float sum decides (its rounding is far below the
    margin MAX_TOTAL_NS leaves)."""
    durations = np.asarray(durations_ns, dtype=np.int64)
    if len(durations) and (durations.min() < 0 or durations.astype(float).sum() >= MAX_TOTAL_NS):
        raise ProfilerKitError(f"the {what} durations are negative or add up to more than 2^62 ns (146 years); "
                               "no recording holds that much")
    return durations


def range_frame(
    names: Iterable, start_ns: Iterable, end_ns: Iterable, process: Iterable, thread: Iterable,
    kind: Iterable | None = None, number: Iterable | None = None,
) -> pd.DataFrame:
    """A `ranges` frame: one row per NVTX range, times in integer nanoseconds; `kind` (`names.RANGE_KINDS`:
    `phase`, `auto` or `program`, the default) with `marked` equal to `kind == "phase"`, and `number`, the
    program's step number of a `step` range the recorder placed (nullable Int64, NA elsewhere). The recorder's
    automatic marks lie on a lane of their own beside the thread that opened them (`auto_lane`): they open in
    one hook and close in another, so they need not nest with the thread's push/pop ranges."""
    frame = pd.DataFrame(
        {
            "name": pd.Series(np.asarray(names, dtype=object), dtype=object),
            "start_ns": np.asarray(start_ns, dtype=np.int64),
            "end_ns": np.asarray(end_ns, dtype=np.int64),
            "process": np.asarray(process, dtype=np.int64),
            "thread": np.asarray(thread, dtype=np.int64),
        }
    )
    kinds = np.full(len(frame), KIND_PROGRAM, dtype=object) if kind is None else np.asarray(kind, dtype=object)
    frame["kind"] = kinds
    frame["marked"] = kinds == KIND_PHASE
    frame["number"] = pd.array([pd.NA] * len(frame) if number is None else list(number), dtype="Int64")
    auto = kinds == KIND_AUTO
    frame.loc[auto, "thread"] = auto_lane(frame["thread"].to_numpy()[auto])
    return frame


def auto_names(names: pd.Series) -> tuple[pd.Series, np.ndarray, list]:
    """Names of the recorder's automatic marks where they carry its prefix (`profiler_kit::forward`,
    `profiler_kit::step#3`): the names without it, which are marks, and each one's step number (None
    elsewhere)."""
    parts = names.astype(str).str.extract(_AUTO_NAME)
    auto = parts[0].notna().to_numpy()
    numbers = [None if pd.isna(n) else int(n) for n in parts[1]]
    return names.where(~auto, parts[0]), auto, numbers


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
