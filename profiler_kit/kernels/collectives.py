"""The collectives of a distributed job: how many each phase called, and which rank entered each one last.

Calls. How many collectives a phase called: the program's `c10d::` operators where the trace has CPU operators
(torch.profiler), else NCCL's own NVTX ranges around its calls (`ncclAllReduce`, domain NCCL, under nsys), else
the NCCL kernels (one per collective, or per group of them).

Arrivals. A rank's collectives are its communication kernels (NCCL's, on GPUs) or, in a trace without kernels,
the collectives' own spans on the process group's thread (`gloo:all_reduce`), each with the step it was
launched in. A kernel launched from inside NCCL's own range of its call starts, for this, when that range did:
NCCL connects a rank to its peers at the first collective that needs them, on the host, before it launches the
kernel, so a rank that came early waits there, not in the kernel (the range lasts microseconds otherwise). The
k-th collective of one kind (all-reduce, all-gather, ...) is the same call on every rank; the
rank whose k-th starts last entered it last, and the first one waited `wait` = last start − first start for
it. Point-to-point transfers (send, receive) involve two ranks, not all, and are not matched. Comparing starts
needs one clock: `comparable` says whether the ranks have one. Without it the durations tell the same: every rank
leaves a collective at about the same moment, when the last one's data is in, so the rank whose own took least
entered last, and each other one waited the difference between its duration and that one's.

The first collective. One that takes ONE_OFF_FACTOR times the steady collectives' median and at least
ONE_OFF_MIN_NS waited for a rank that started late (NCCL sets up its communicator there; DDP broadcasts the
parameters there): a one-off of start-up, named apart from the steady state.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profiler_kit.kernels.attribution import RangeIndex, launches_in
from profiler_kit.kernels.categories import COMMUNICATION
from profiler_kit.kernels.cpu_ops import COLLECTIVE
from profiler_kit.kernels.labels import Labelled, phase_ranges_at
from profiler_kit.kernels.trace import KernelTrace

# The ProcessGroup operators one collective call goes through, once each, whatever the backend.
COLLECTIVE_OP = r"c10d::"
# NCCL's NVTX ranges around its collective and point-to-point calls.
NCCL_RANGE = r"^nccl(?:AllReduce|AllGather|ReduceScatter|Broadcast|Bcast|Reduce|AllToAll|Gather|Scatter|Send|Recv)$"
# Kinds of collective as kernel and span names spell them (lower case, `_` dropped); a kind that contains
# another comes first.
KINDS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv", "send", "recv", "reduce",
         "gather", "scatter", "barrier")
POINT_TO_POINT = ("sendrecv", "send", "recv")
ONE_OFF_FACTOR = 10
ONE_OFF_MIN_NS = 1_000_000
OUTSIDE_STEPS = -1
NS_PER_MS = 1_000_000
EXECUTION_COLUMNS = ("kind", "name", "start_ns", "duration_ns", "step")


def kind_of(name: str) -> str:
    """The kind of collective a kernel or span name says (`ncclDevKernel_AllReduce_Sum_f32_RING_LL` and
    `gloo:all_reduce` are `allreduce`), else the name itself."""
    folded = name.lower().replace("_", "")
    return next((kind for kind in KINDS if kind in folded), name)


def executions(kernels: pd.DataFrame, index: RangeIndex | None, cpu: bool, offset_ns: int) -> pd.DataFrame:
    """One row per collective a rank ran, by start: kind, name, start_ns (plus `offset_ns`, onto its clock),
    duration_ns, and step (the number of the step it was launched in, OUTSIDE_STEPS if none). `kernels`: a
    summary's labelled kernels, or its CPU operators when `cpu`; `index`: its ranges (NCCL's own among them)."""
    if "start_ns" not in kernels.columns:
        return pd.DataFrame(columns=list(EXECUTION_COLUMNS))
    chosen = (kernels["category"] == COMMUNICATION).to_numpy().copy()
    if cpu:
        chosen &= kernels["name"].astype(str).str.contains(COLLECTIVE).to_numpy()
    step = kernels["step"].to_numpy()
    rows = np.flatnonzero(chosen)
    starts = kernels["start_ns"].to_numpy()[rows]
    ends = kernels["end_ns"].to_numpy()[rows] if "end_ns" in kernels.columns else (
        starts + kernels["total_ns"].to_numpy()[rows])
    if not cpu and index is not None and "launch_ns" in kernels.columns:
        starts = starts - _host_waits(kernels.iloc[rows], index)
    names = kernels["name"].astype(str).to_numpy()[rows]
    kinds = {name: kind_of(name) for name in set(names)}
    frame = pd.DataFrame({"kind": [kinds[n] for n in names], "name": names, "start_ns": starts + offset_ns,
                          "duration_ns": ends - starts, "step": step[rows]})
    return frame.sort_values("start_ns", kind="stable", ignore_index=True)


def _host_waits(kernels: pd.DataFrame, index: RangeIndex) -> np.ndarray:
    """Per kernel, how long the host spent in the NCCL call that launched it (the longest of NCCL's ranges
    holding its launch; 0 outside them)."""
    waits = np.zeros(len(kernels), dtype=np.int64)
    ncclish = np.flatnonzero(index.names().astype(str).str.match(NCCL_RANGE).to_numpy())
    if len(ncclish):
        rows, owners = launches_in(kernels, index, ncclish)
        spans = (index.ranges["end_ns"].to_numpy() - index.ranges["start_ns"].to_numpy())[owners]
        np.maximum.at(waits, rows, spans)
    return waits


def calls_per_phase(trace: KernelTrace, kernels: pd.DataFrame, labelled: Labelled,
                    among: np.ndarray | None = None) -> dict[str, int]:
    """How many collectives each phase called (see the module docstring for what counts), in its ranges of the
    mask `among` (all by default); empty when the trace cannot say. `kernels`: the summary's labelled ones."""
    owner = call_ranges(trace, kernels, labelled)
    if owner is None:
        return {}
    held = owner >= 0
    if among is not None:
        held[held] = among[owner[held]]
    called = Counter(labelled.index.name[owner[held]].tolist())
    return {p: called.get(p, 0) for p in labelled.phases}


def call_ranges(trace: KernelTrace, kernels: pd.DataFrame, labelled: Labelled) -> np.ndarray | None:
    """The phase range of each collective call (see the module docstring for what counts; -1: in none), None
    when the trace has no ranges. The calls that are no kernels are placed in the phases by
    `labels.phase_ranges_at`."""
    index = labelled.index
    if index is None:
        return None
    if trace.cpu_ops is not None:
        calls = trace.cpu_ops[trace.cpu_ops["name"].astype(str).str.match(COLLECTIVE_OP)]
    else:
        ranges = index.ranges[index.names().astype(str).str.match(NCCL_RANGE).to_numpy()]
        calls = pd.DataFrame({"launch_ns": ranges["start_ns"], "process": ranges["process"]})
        if not len(calls) and "launch_ns" in kernels.columns:
            calls = kernels[(kernels["category"] == COMMUNICATION).to_numpy()]
    if not len(calls):
        return np.empty(0, dtype=np.int64)
    if "phase_range" in calls.columns:
        return calls["phase_range"].to_numpy().astype(np.int64)
    return phase_ranges_at(labelled, calls["launch_ns"].to_numpy(), calls["process"].to_numpy())


@dataclass
class Arrivals:
    """The collectives every rank ran, matched: `table` has one row per matched collective (kind, k, step: the
    lowest rank's, last_rank, wait_ns: see `entered`), in the order the lowest rank ran them; `starts`
    and `durations` hold each rank's (columns in `ranks` order)."""

    ranks: list[int]
    table: pd.DataFrame
    starts: np.ndarray
    durations: np.ndarray
    comparable: bool
    notes: list[str] = field(default_factory=list)

    @property
    def entered(self) -> np.ndarray:
        """When each rank entered each collective, on a scale common to the ranks: its start on their one clock,
        else its duration before their common end (see the module docstring)."""
        return self.starts if self.comparable else -self.durations


def match(ranks: list[int], runs: list[pd.DataFrame], comparable: bool) -> Arrivals:
    """The k-th collective of each kind on every rank matched (`runs`: each rank's `executions`); point-to-point
    transfers are left out, and a kind that ranks ran a different number of times is matched up to the fewest."""
    notes = []
    keyed = []
    for rank, run in zip(ranks, runs, strict=True):
        run = run[~run["kind"].isin(POINT_TO_POINT)]
        keyed.append(run.assign(k=run.groupby("kind").cumcount().to_numpy(), rank=rank))
    every = pd.concat(keyed, ignore_index=True) if keyed else pd.DataFrame(columns=[*EXECUTION_COLUMNS, "k", "rank"])
    counts = every.groupby(["kind", "rank"]).size().unstack(fill_value=0).reindex(columns=ranks, fill_value=0)
    for kind, row in counts.iterrows():
        if row.min() != row.max():
            ran = ", ".join(f"rank {r}: {n}" for r, n in row.items())
            notes.append(f"the ranks ran different numbers of {kind} collectives ({ran}): the first {row.min()} "
                         "of each are matched")
    common = counts.min(axis=1)
    every = every[every["k"] < every["kind"].map(common).fillna(0).to_numpy()]
    wide = every.pivot(index=["kind", "k"], columns="rank")
    starts = wide["start_ns"].reindex(columns=ranks).to_numpy(dtype=np.int64) if len(wide) else np.empty(
        (0, len(ranks)), dtype=np.int64)
    durations = wide["duration_ns"].reindex(columns=ranks).to_numpy(dtype=np.int64) if len(wide) else starts.copy()
    steps = wide["step"].reindex(columns=ranks).to_numpy(dtype=np.int64) if len(wide) else starts.copy()
    order = np.argsort(starts[:, 0], kind="stable") if len(wide) else np.empty(0, dtype=np.int64)
    starts, durations, steps = starts[order], durations[order], steps[order]
    keys = wide.index.to_frame(index=False).iloc[order].reset_index(drop=True) if len(wide) else pd.DataFrame(
        columns=["kind", "k"])
    found = Arrivals(ranks, keys, starts, durations, comparable, notes)
    entered = found.entered
    last = np.asarray(ranks)[np.argmax(entered, axis=1)] if len(entered) else np.empty(0, dtype=np.int64)
    wait = (entered.max(axis=1) - entered.min(axis=1)).astype(float) if len(entered) else np.empty(0)
    found.table = keys.assign(step=steps[:, 0] if len(steps) else np.empty(0, dtype=np.int64), last_rank=last,
                              wait_ns=wait)
    return found


def per_step(arrivals: Arrivals, states: dict[int, str] | None) -> pd.DataFrame:
    """One row per step with matched collectives: step, state (from `states`, when given), collectives,
    last_rank (the rank that entered most of them last; ties to the one that held the others longest),
    times_last, wait_ms (summed over the step's collectives) and max_wait_ms."""
    table = arrivals.table
    rows = []
    for step, group in table[table["step"] != OUTSIDE_STEPS].groupby("step", sort=True):
        waits = group["wait_ns"].to_numpy()
        held = pd.Series(waits).groupby(group["last_rank"].to_numpy()).agg(["size", "sum"])
        last = held.sort_values(["size", "sum"], ascending=False).index[0]
        row: dict[str, Any] = {"step": int(step)}
        if states is not None:
            row["state"] = states.get(int(step), "")
        row.update(collectives=len(group), last_rank=int(last), times_last=int(held.loc[last, "size"]),
                   wait_ms=waits.sum() / NS_PER_MS, max_wait_ms=waits.max() / NS_PER_MS)
        rows.append(row)
    columns = ["step", *(["state"] if states is not None else []), "collectives", "last_rank", "times_last",
               "wait_ms", "max_wait_ms"]
    return pd.DataFrame(rows, columns=columns)


def rank_waits(arrivals: Arrivals, chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per rank (in `arrivals.ranks` order), over the matched collectives of the mask `chosen`: how many it
    entered last, and how long it waited in them for the last rank, in ns."""
    entered = arrivals.entered[chosen]
    if not len(entered):
        return np.zeros(len(arrivals.ranks), dtype=np.int64), np.zeros(len(arrivals.ranks), dtype=np.int64)
    last = np.bincount(np.argmax(entered, axis=1), minlength=len(arrivals.ranks))
    return last, (entered.max(axis=1, keepdims=True) - entered).sum(axis=0)


def one_off(arrivals: Arrivals, steady: np.ndarray | None, warm_steps: set[int]) -> dict[str, Any] | None:
    """The first matched collective when it waited for a late rank (see the module docstring): the rank that
    waited, how long, the steady median, the rank it waited for and how much later that one entered (None
    without one clock), and where it ran; None when the first collective is like the others. `steady`: the
    mask of the matched collectives in the steady steps (the reference; all the others when none is), None
    when the tables cover the whole recording."""
    if len(arrivals.table) < 2:
        return None
    rest = arrivals.durations[1:]
    against_steady = steady is not None and bool(steady[1:].any())
    if against_steady:
        rest = rest[steady[1:]]
    median = float(np.median(rest))
    first = arrivals.durations[0]
    waited = int(np.argmax(first))
    if first[waited] < max(ONE_OFF_MIN_NS, ONE_OFF_FACTOR * median):
        return None
    ranks = arrivals.ranks
    # The rank it waited for: the one that entered last (one clock), or the one whose own took the least; none
    # when that one's lateness (or shortness) explains under half of the wait: the collective's own set-up.
    late = int(np.argmax(arrivals.starts[0])) if arrivals.comparable else int(np.argmin(first))
    late_by = int(arrivals.starts[0, late] - arrivals.starts[0, waited]) if arrivals.comparable else None
    explained = late_by if late_by is not None else int(first[waited] - first[late])
    step = int(arrivals.table["step"].iloc[0])
    return {
        "kind": str(arrivals.table["kind"].iloc[0]),
        "rank": ranks[waited],
        "duration_ns": int(first[waited]),
        "median_ns": median,
        "median_of": "steady" if against_steady else "others",
        "late_rank": ranks[late] if 2 * explained >= first[waited] else None,
        "late_by_ns": late_by,
        "late_rank_duration_ns": int(first[late]),
        "step": None if step == OUTSIDE_STEPS else step,
        "in_warmup_step": step in warm_steps,
        "in_tables": steady is None or bool(steady[0]),
    }


def one_off_note(found: dict[str, Any]) -> str:
    """The sentence that names a one-off first collective."""
    if found["step"] is None:
        where = "outside the steps"
    else:
        where = f"in {'warm-up ' if found['in_warmup_step'] else ''}step {found['step']}"
    if found["late_rank"] is None:
        why = "every rank's took about as long: the set-up of the first collective (connections, communicators)"
    elif found["late_by_ns"] is not None:
        why = (f"it waited for rank {found['late_rank']}, which entered it {found['late_by_ns'] / NS_PER_MS:.1f} ms "
               "later: a rank that started late")
    else:
        why = (f"it waited for rank {found['late_rank']}, whose own took "
               f"{found['late_rank_duration_ns'] / NS_PER_MS:.1f} ms: a rank that started late")
    apart = "which the tables include" if found["in_tables"] else "outside the steady tables"
    return (f"rank {found['rank']}'s first collective ({found['kind']}, {where}) took "
            f"{found['duration_ns'] / NS_PER_MS:.1f} ms against a median of {found['median_ns'] / NS_PER_MS:.2f} ms "
            f"for the {'steady ones' if found['median_of'] == 'steady' else 'others'}: {why}; a one-off of start-up, "
            f"{apart}")
