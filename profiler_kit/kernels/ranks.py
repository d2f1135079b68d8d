"""A distributed job's reports side by side: one summary per rank, the merged figures, communication per phase
(`idle.communication`) and the stragglers. A phase's spread across ranks is the difference between its slowest
and fastest rank's wall time (its ranges' CPU time) over the mean.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels.attribution import RangeIndex
from profiler_kit.kernels.categories import CATEGORIES
from profiler_kit.kernels.idle import COMMUNICATION, communication, launches_in, phase_wall
from profiler_kit.kernels.sources import load
from profiler_kit.kernels.summary import NS_PER_MS, KernelSummary, summarize_trace
from profiler_kit.kernels.trace import NO_LAUNCH, KernelTrace
from profiler_kit.render import Title, records

_RANK = re.compile(r"\.rank(\d+)\.")
# The ProcessGroup operators one collective call goes through, once each, whatever the backend.
COLLECTIVE_OP = r"c10d::"


def rank_of(path: Path, position: int) -> int:
    """The rank a file name carries (`<stem>.rank<R>.json.gz`), else its position among the reports."""
    match = _RANK.search(path.name)
    return int(match.group(1)) if match else position


@dataclass
class RankedSummary:
    """One summary per rank (rank order), with each rank's communication per phase and phase wall times."""

    ranks: list[int]
    summaries: list[KernelSummary]
    communication: list[pd.DataFrame]
    walls: list[dict[str, int]]
    collective_calls: list[dict[str, int]]

    @property
    def phase_names(self) -> list[str]:
        return list(dict.fromkeys(p for s in self.summaries for p in s.phase_names))

    def rank_table(self) -> pd.DataFrame:
        """rank, total_ms, comm_ms, exposed_comm_ms, then each phase's wall time in ms."""
        rows = []
        for rank, summary, comm, wall in zip(self.ranks, self.summaries, self.communication, self.walls,
                                             strict=True):
            row = {"rank": rank, "total_ms": summary.total_ns / NS_PER_MS,
                   "collective_calls": sum(self.collective_calls[self.ranks.index(rank)].values()),
                   "comm_ms": summary.category_ns()[COMMUNICATION] / NS_PER_MS,
                   "exposed_comm_ms": comm["exposed_ns"].sum() / NS_PER_MS}
            row.update({f"{p}_wall_ms": wall.get(p, 0) / NS_PER_MS for p in self.phase_names})
            rows.append(row)
        return pd.DataFrame(rows)

    def merged_categories(self) -> dict[str, int]:
        return {c: sum(int(s.category_ns()[c]) for s in self.summaries) for c in CATEGORIES}

    def merged_communication(self) -> pd.DataFrame:
        frame = pd.concat(self.communication).groupby("phase", sort=False)[
            ["comm_ns", "overlapped_ns", "exposed_ns"]].sum().reindex(self.phase_names, fill_value=0)
        comm = frame["comm_ns"].replace(0, np.nan)
        return frame.assign(overlap_pct=frame["overlapped_ns"] * 100.0 / comm).reset_index()

    def stragglers(self) -> pd.DataFrame:
        """phase, mean_wall_ms, min_wall_ms, max_wall_ms, spread_pct, slowest_rank."""
        rows = []
        for phase in self.phase_names:
            walls = np.array([w.get(phase, 0) for w in self.walls], dtype=float)
            mean = walls.mean()
            rows.append((phase, mean / NS_PER_MS, walls.min() / NS_PER_MS, walls.max() / NS_PER_MS,
                         (walls.max() - walls.min()) * 100.0 / mean if mean else np.nan,
                         self.ranks[int(walls.argmax())]))
        return pd.DataFrame(rows, columns=["phase", "mean_wall_ms", "min_wall_ms", "max_wall_ms", "spread_pct",
                                           "slowest_rank"])

    def tables(self, display: bool = False) -> list[tuple[str, pd.DataFrame]]:
        first = self.summaries[0]
        merged = pd.DataFrame({"category": list(CATEGORIES), "total_ms": [
            v / NS_PER_MS for v in self.merged_categories().values()]})
        comm = self.merged_communication()
        for column in ("comm", "overlapped", "exposed"):
            comm[f"{column}_ms"] = comm.pop(f"{column}_ns") / NS_PER_MS
        return [
            (Title(f"Per rank ({len(self.ranks)} ranks; {first.timed})", "ranks", ("total_ms", "exposed_comm_ms")),
             self.rank_table()),
            (Title("All ranks merged: time by category", "categories"), merged[merged["total_ms"] > 0]),
            (Title("Communication per phase, all ranks: overlapped by compute elsewhere, and exposed",
                   "communication", ("exposed_ms", "overlap_pct")), comm),
            (Title("Stragglers: each phase's wall time across ranks", "stragglers", ("spread_pct", "slowest_rank")),
             self.stragglers()),
        ]

    def to_json(self) -> dict[str, Any]:
        ranks = []
        for rank, summary, comm, wall in zip(self.ranks, self.summaries, self.communication, self.walls,
                                             strict=True):
            doc = summary.to_json()
            doc["rank"], doc["path"] = rank, str(summary.path)
            doc["communication"] = {r.pop("phase"): r for r in records(comm)}
            doc["phase_wall_ns"] = wall
            doc["collective_calls"] = self.collective_calls[self.ranks.index(rank)]
            ranks.append(doc)
        merged_comm = records(self.merged_communication())
        return {
            "ranks": ranks,
            "merged": {
                "total_ns": sum(int(s.total_ns) for s in self.summaries),
                "categories": self.merged_categories(),
                "phases": {p: sum(s.phase_ns().get(p, {}).get("total_ns", 0) for s in self.summaries)
                           for p in self.phase_names},
                "communication": {r.pop("phase"): r for r in merged_comm},
                "collective_calls": {p: sum(c.get(p, 0) for c in self.collective_calls) for p in self.phase_names},
            },
            "stragglers": {r.pop("phase"): r for r in records(self.stragglers())},
        }

    @property
    def notes(self) -> list[str]:
        return list(dict.fromkeys(n for s in self.summaries for n in s.notes))

    def caption(self) -> str:
        paths = ", ".join(f"rank {r}: {s.path.name}" for r, s in zip(self.ranks, self.summaries, strict=True))
        return "\n".join([paths] + [f"note: {n}" for n in self.notes])


def split_processes(trace: KernelTrace) -> list[KernelTrace]:
    """One trace per process that ran kernels (or, without kernels, CPU operators), in process-id order: an
    nsys report of a torchrun job holds every rank's process. Memory operations are not split (None)."""
    timed = trace.kernels if len(trace.kernels) or trace.cpu_ops is None else trace.cpu_ops
    if "launch_ns" not in timed.columns:
        return [trace]
    processes = np.unique(timed["process"].to_numpy()[timed["launch_ns"].to_numpy() != NO_LAUNCH])
    if len(processes) <= 1:
        return [trace]

    def only(frame: pd.DataFrame | None, proc: int) -> pd.DataFrame | None:
        return None if frame is None else frame[frame["process"] == proc].reset_index(drop=True)

    return [replace(trace, kernels=only(trace.kernels, proc) if "process" in trace.kernels else trace.kernels,
                    ranges=only(trace.ranges, proc), cpu_ops=only(trace.cpu_ops, proc), memory_ops=None,
                    notes=[*trace.notes, f"process {proc} of {trace.path.name}"])
            for proc in processes]


def rank_traces(paths: list[Path]) -> list[tuple[int, KernelTrace]]:
    """(rank, trace) of a job's reports in rank order: from `.rank<R>.` in the names, else as given; a single
    report that holds several processes gives one per process."""
    if len(paths) == 1:
        return list(enumerate(split_processes(load(paths[0]))))
    ordered = sorted(enumerate(paths), key=lambda item: rank_of(item[1], item[0]))
    ranks = [rank_of(path, position) for position, path in ordered]
    for k in range(1, len(ranks)):
        if ranks[k] == ranks[k - 1]:
            raise ProfilerKitError(f"{ordered[k - 1][1]} and {ordered[k][1]} are both rank {ranks[k]} (from "
                                   "`.rank<R>.` in a name, else the position among the reports): give each "
                                   "rank's report once")
    return [(rank, load(path)) for rank, (_, path) in zip(ranks, ordered, strict=True)]


def summarize_ranks(ranked: list[tuple[int, KernelTrace]], top: int = 10,
                    phases: list[str] | None = None) -> RankedSummary:
    """Summaries of one job's traces, rank by rank (`rank_traces` reads them)."""
    ranks, summaries, comms, walls, calls = [], [], [], [], []
    for rank, trace in ranked:
        summary = summarize_trace(trace, top=top, phases=phases)
        ranks.append(rank)
        summaries.append(summary)
        comms.append(communication(summary.attributed, summary.index, summary.phase_names))
        walls.append(phase_wall(summary.index, summary.phase_names))
        calls.append(collective_calls(trace, summary.index, summary.phase_names))
    return RankedSummary(ranks, summaries, comms, walls, calls)


def collective_calls(trace: KernelTrace, index: RangeIndex | None, phases: list[str]) -> dict[str, int]:
    """How many collectives (`c10d::` operators: all-reduce, broadcast, ...) each phase called, from a trace
    with CPU operators; on one GPU NCCL runs them as copies without a kernel, and this still counts them."""
    if trace.cpu_ops is None or index is None:
        return {}
    calls = trace.cpu_ops[trace.cpu_ops["name"].astype(str).str.match(COLLECTIVE_OP)].reset_index(drop=True)
    names = index.names().to_numpy()
    return {p: len(np.unique(launches_in(calls, index, np.flatnonzero(names == p))[0])) for p in phases}
