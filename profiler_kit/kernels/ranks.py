"""A distributed job's reports side by side: one summary per rank, the merged figures, communication per phase
(`idle.communication`), the stragglers and which rank entered each collective last (`collectives`).

Ranks. Each process is the rank it had in its job: the `RANK` the recorder saw (`KernelTrace.process_ranks`),
else the `.rank<R>.` in its report's name (`<stem>.rank<R>.json.gz`), else its place among the reports and
processes, with a note. A report that holds several processes (nsys around torchrun) gives one per process;
the reports of several nodes (`-o` per node) together give the job's global ranks.

Steady state. The per-rank tables cover the job's steady steps: the steps (`kernels.steps`, matched across ranks
by their number) that no rank spent warming up. What ran outside the steps (start-up, DDP's parameter
broadcast, a first collective waiting for a rank that started late) and the warm-up steps are apart. A job
without a repeating step range is covered whole, with a note.

Clocks. Ranks compare in time only on one clock: the processes of one nsys report, or the torch.profiler traces
of one host. Across hosts the clocks disagree by more than a collective lasts, so who entered a collective last
is not said; everything else is per rank and stands. A phase's spread across ranks is the difference between
its slowest and fastest rank's wall time (its ranges' CPU time) over the mean.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels import collectives
from profiler_kit.kernels.categories import CATEGORIES, COMMUNICATION
from profiler_kit.kernels.idle import communication, phase_wall
from profiler_kit.kernels.labels import OUTSIDE_PHASES
from profiler_kit.kernels.sources import load_many
from profiler_kit.kernels.summary import CPU_OPS, NS_PER_MS, KernelSummary, label_totals, summarize_trace
from profiler_kit.kernels.trace import NO_LAUNCH, KernelTrace
from profiler_kit.render import Title, records
from profiler_kit.steady import ONE_OFF, ONE_OFF_RULE, STEADY, WARMUP, WARMUP_RULE

_RANK = re.compile(r"\.rank(\d+)\.")


def rank_of(path: Path, position: int) -> int:
    """The rank a file name carries (`<stem>.rank<R>.json.gz`), else its position among the reports."""
    match = _RANK.search(path.name)
    return int(match.group(1)) if match else position


# The per-rank table's columns that a narrow terminal keeps: each rank's time and its communication.
RANK_KEY = ("wall_ms", "total_ms", "collective_calls", "comm_ms", "exposed_comm_ms", "times_last", "waited_ms")

@dataclass
class Rank:
    """One rank: its summary (the whole recording) and its figures over the job's steady steps (`steady`: their
    range ids in the summary's index; None when the figures cover the whole recording)."""

    rank: int
    node: int | None
    process: int | None
    summary: KernelSummary
    steady: np.ndarray | None
    totals: dict[str, Any]
    communication: pd.DataFrame
    walls: dict[str, int]
    collective_calls: dict[str, int]
    runs: pd.DataFrame  # the collectives it ran (`collectives.executions`)
    by_phase: pd.DataFrame  # the phase table (phase, category, instances, total_ns) over the same steps


@dataclass
class RankedSummary:
    """One job's ranks (rank order), its steady steps (None: no repeating step range on some rank), the
    collectives matched across ranks, the one-off first collective when there is one, and notes on the job."""

    members: list[Rank]
    steady_steps: list[int] | None
    warmup_steps: list[int]
    arrivals: collectives.Arrivals
    one_off: dict[str, Any] | None
    job_notes: list[str] = field(default_factory=list)

    @property
    def ranks(self) -> list[int]:
        return [m.rank for m in self.members]

    @property
    def summaries(self) -> list[KernelSummary]:
        return [m.summary for m in self.members]

    @property
    def phase_names(self) -> list[str]:
        return list(dict.fromkeys(p for s in self.summaries for p in s.phase_names))

    @property
    def compared(self) -> bool:
        """Whether the ranks' collectives are compared in time: several ranks on one clock."""
        return self.arrivals.comparable and len(self.members) > 1

    def _steady_arrivals(self) -> np.ndarray:
        steps = self.arrivals.table["step"].to_numpy()
        return np.isin(steps, self.steady_steps) if self.steady_steps is not None else np.ones(len(steps), bool)

    def rank_table(self) -> pd.DataFrame:
        """rank (node), steps, wall_ms, total_ms, collective_calls, comm_ms, exposed_comm_ms, times_last and
        waited_ms (with one clock), then each phase's wall time, all over the steady steps."""
        last, waited = collectives.rank_waits(self.arrivals, self._steady_arrivals())
        rows = []
        for position, m in enumerate(self.members):
            row: dict[str, Any] = {"rank": m.rank}
            if any(r.node is not None for r in self.members):
                row["node"] = m.node
            wall = m.totals["wall_ns"]
            row.update(steps=m.totals["steps"], wall_ms=np.nan if wall is None else wall / NS_PER_MS,
                       total_ms=m.totals["total_ns"] / NS_PER_MS, collective_calls=sum(m.collective_calls.values()),
                       comm_ms=m.totals["categories"][COMMUNICATION] / NS_PER_MS,
                       exposed_comm_ms=m.communication["exposed_ns"].sum() / NS_PER_MS)
            if self.compared:
                row.update(times_last=int(last[position]), waited_ms=waited[position] / NS_PER_MS)
            row.update({f"{p}_wall_ms": m.walls.get(p, 0) / NS_PER_MS for p in self.phase_names})
            rows.append(row)
        return pd.DataFrame(rows)

    def merged_categories(self) -> dict[str, int]:
        return {c: sum(int(m.totals["categories"][c]) for m in self.members) for c in CATEGORIES}

    def merged_communication(self) -> pd.DataFrame:
        frame = pd.concat([m.communication for m in self.members]).groupby("phase", sort=False)[
            ["comm_ns", "overlapped_ns", "exposed_ns"]].sum().reindex(self.phase_names, fill_value=0)
        comm = frame["comm_ns"].replace(0, np.nan)
        return frame.assign(overlap_pct=frame["overlapped_ns"] * 100.0 / comm).reset_index()

    def stragglers(self) -> pd.DataFrame:
        """phase, mean_wall_ms, min_wall_ms, max_wall_ms, spread_pct, slowest_rank."""
        rows = []
        for phase in self.phase_names:
            walls = np.array([m.walls.get(phase, 0) for m in self.members], dtype=float)
            mean = walls.mean()
            rows.append((phase, mean / NS_PER_MS, walls.min() / NS_PER_MS, walls.max() / NS_PER_MS,
                         (walls.max() - walls.min()) * 100.0 / mean if mean else np.nan,
                         self.ranks[int(walls.argmax())]))
        return pd.DataFrame(rows, columns=["phase", "mean_wall_ms", "min_wall_ms", "max_wall_ms", "spread_pct",
                                           "slowest_rank"])

    def arrival_table(self) -> pd.DataFrame:
        """Per step: which rank entered its collectives last, and how long the first ones waited."""
        states = None
        if self.warmup_steps and self.steady_steps is not None:
            states = {**{s: WARMUP for s in self.warmup_steps}, **{s: STEADY for s in self.steady_steps}}
        return collectives.per_step(self.arrivals, states)

    def scope(self) -> str:
        """What the per-rank tables cover, within a title."""
        if self.steady_steps is None:
            return "the whole recording"
        return f"{len(self.steady_steps)} steady {steps_named(self.steady_steps)}"

    def tables(self, display: bool = False) -> list[tuple[str, pd.DataFrame]]:
        first = self.summaries[0]
        merged = pd.DataFrame({"category": list(CATEGORIES), "total_ms": [
            v / NS_PER_MS for v in self.merged_categories().values()]})
        comm = self.merged_communication()
        for column in ("comm", "overlapped", "exposed"):
            comm[f"{column}_ms"] = comm.pop(f"{column}_ns") / NS_PER_MS
        tables = [
            (Title(f"Per rank ({len(self.ranks)} ranks, over {self.scope()}; {first.timed})", "ranks",
                   RANK_KEY), self.rank_table()),
            (Title("All ranks merged: time by category", "categories"), merged[merged["total_ms"] > 0]),
            (Title("Communication per phase, all ranks: overlapped by compute elsewhere, and exposed",
                   "communication", ("exposed_ms", "overlap_pct")), comm),
            (Title("Stragglers: each phase's wall time across ranks", "stragglers", ("spread_pct", "slowest_rank")),
             self.stragglers()),
        ]
        if self.compared and len(self.arrivals.table):
            tables.append((Title("Collective arrivals per step: the rank that entered last, and how long the first "
                                 "waited for it", "arrivals"), self.arrival_table()))
        return tables

    def to_json(self) -> dict[str, Any]:
        ranks = []
        for m in self.members:
            doc = m.summary.to_json()
            doc.update(rank=m.rank, node=m.node, process=m.process, path=str(m.summary.path))
            doc["steady"] = dict(m.totals)
            doc["communication"] = {r.pop("phase"): r for r in records(m.communication)}
            doc["phase_wall_ns"] = m.walls
            doc["collective_calls"] = m.collective_calls
            ranks.append(doc)
        merged_comm = records(self.merged_communication())
        return {
            "ranks": ranks,
            "steady_steps": self.steady_steps,
            "warmup_steps": self.warmup_steps,
            "merged": {
                "total_ns": sum(int(m.totals["total_ns"]) for m in self.members),
                "categories": self.merged_categories(),
                "phases": {p: sum(m.totals["phase_ns"].get(p, 0) for m in self.members) for p in self.phase_names},
                "communication": {r.pop("phase"): r for r in merged_comm},
                "collective_calls": {p: sum(m.collective_calls.get(p, 0) for m in self.members)
                                     for p in self.phase_names},
            },
            "stragglers": {r.pop("phase"): r for r in records(self.stragglers())},
            "clocks_comparable": self.arrivals.comparable,
            "arrivals": records(self.arrival_table()) if self.compared else [],
            "one_off": self.one_off,
        }

    @property
    def notes(self) -> list[str]:
        return list(dict.fromkeys([*self.job_notes, *(n for s in self.summaries for n in s.notes)]))

    def caption(self) -> str:
        paths = ", ".join(f"rank {r}: {s.path.name}" for r, s in zip(self.ranks, self.summaries, strict=True))
        return "\n".join([paths] + [f"note: {n}" for n in self.notes])


def steps_named(numbers: list[int]) -> str:
    """Step numbers as words: `step 3`, `steps 2–5, 7`."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    listed = ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
    return f"step{'s' * (len(numbers) > 1)} {listed}"


def split_processes(trace: KernelTrace) -> list[tuple[int | None, KernelTrace]]:
    """(process id, its trace) for each process that ran kernels (or, without kernels, CPU operators), in
    process-id order: an nsys report of a torchrun job holds every rank's process. The id is None when the
    source has none. Memory operations are not split (None)."""
    processes = processes_of(trace)
    if processes is None:
        return [(None, trace)]
    if len(processes) <= 1:
        return [(int(processes[0]) if len(processes) else None, trace)]

    def only(frame: pd.DataFrame | None, proc: int) -> pd.DataFrame | None:
        return None if frame is None else frame[frame["process"] == proc].reset_index(drop=True)

    def mine(known: dict[int, int], proc: int) -> dict[int, int]:
        return {proc: known[proc]} if proc in known else {}

    return [(int(proc), replace(trace, kernels=only(trace.kernels, proc), ranges=only(trace.ranges, proc),
                                cpu_ops=only(trace.cpu_ops, proc), memory_ops=None,
                                notes=[*trace.notes, f"process {proc} of {trace.path.name}"],
                                process_ranks=mine(trace.process_ranks, proc),
                                process_nodes=mine(trace.process_nodes, proc)))
            for proc in processes]


def processes_of(trace: KernelTrace) -> np.ndarray | None:
    """The ids of the processes that ran kernels (or, without kernels, CPU operators); None when the source
    has no process ids."""
    timed = trace.kernels if len(trace.kernels) or trace.cpu_ops is None else trace.cpu_ops
    if "launch_ns" not in timed.columns:
        return None
    return np.unique(timed["process"].to_numpy()[timed["launch_ns"].to_numpy() != NO_LAUNCH])


def rank_traces(paths: list[Path], jobs: int = 1) -> list[tuple[int, KernelTrace]]:
    """(rank, trace) of a job's reports, one per process, in rank order (`assign_ranks`); read `jobs` at a time."""
    traces = load_many(paths, jobs)
    return assign_ranks(list(zip(paths, traces, strict=True)))


def assign_ranks(reports: list[tuple[Path, KernelTrace]]) -> list[tuple[int, KernelTrace]]:
    """(rank, trace) of a job's reports as read, one per process, in rank order (see the module docstring for
    where a rank comes from). Each trace's `clock` is set: its source's, else its report's own."""
    parts = [(path, proc, replace(part, clock=trace.clock or f"report {path}"))
             for path, trace in reports for proc, part in split_processes(trace)]
    per_path = Counter(path for path, _, _ in parts)
    given: list[int | None] = []
    for path, proc, part in parts:
        rank = part.process_ranks.get(proc) if proc is not None else None
        if rank is None and per_path[path] == 1 and (match := _RANK.search(path.name)):
            rank = int(match.group(1))
        given.append(rank)
    taken = set(given)
    free = (r for r in count() if r not in taken)
    ranks = [r if r is not None else next(free) for r in given]
    if len(parts) > 1:
        for (path, proc, part), rank, said in zip(parts, ranks, given, strict=True):
            if said is None:
                part.notes.append(f"rank {rank} is {_label(path, proc, per_path)} by its place among the reports "
                                  "and processes: the report says no RANK")
    ordered = sorted(zip(ranks, parts, strict=True), key=lambda item: item[0])
    for (rank, (path, proc, _)), (other, (path2, proc2, _)) in zip(ordered, ordered[1:], strict=False):
        if rank == other:
            raise ProfilerKitError(f"{_label(path, proc, per_path)} and {_label(path2, proc2, per_path)} are both "
                                   f"rank {rank} (from the RANK recorded, `.rank<R>.` in a name, else the position "
                                   "among the reports): give each rank's report once")
    return [(rank, part) for rank, (_, _, part) in ordered]


def _label(path: Path, proc: int | None, per_path: Counter) -> str:
    return f"{path} process {proc}" if per_path[path] > 1 else str(path)


def summarize_ranks(ranked: list[tuple[int, KernelTrace]], top: int = 10,
                    phases: list[str] | None = None) -> RankedSummary:
    """Summaries of one job's traces, rank by rank (`rank_traces` reads them), with the steady-state figures."""
    summaries = [summarize_trace(trace, top=top, phases=phases, rank=rank) for rank, trace in ranked]
    steps = [_numbered_steps(s) for s in summaries]
    notes: list[str] = []
    steady, warm = _job_steps([rank for rank, _ in ranked], steps, notes)
    members = []
    for (rank, trace), summary, (ids, numbers, _) in zip(ranked, summaries, steps, strict=True):
        chosen = ids[np.isin(numbers, steady)] if steady is not None else None
        runs = collectives.executions(summary.attributed, summary.index, summary.basis == CPU_OPS,
                                      trace.clock_offset_ns)
        members.append(_rank(rank, trace, summary, chosen, runs))
    clocks = {trace.clock for _, trace in ranked}
    comparable = len(clocks) == 1
    if not comparable and len(ranked) > 1:
        notes.append(f"the ranks were recorded on {len(clocks)} clocks ({', '.join(sorted(map(str, clocks)))}): "
                     "which rank entered each collective last is not compared across them")
    arrivals = collectives.match([m.rank for m in members], [m.runs for m in members], comparable)
    notes += arrivals.notes
    mask = np.isin(arrivals.table["step"].to_numpy(), steady) if steady is not None else None
    first = collectives.one_off(arrivals, mask, set(warm)) if len(ranked) > 1 else None
    if first is not None:
        notes.append(collectives.one_off_note(first))
    return RankedSummary(members, steady, warm, arrivals, first, notes)


def _numbered_steps(summary: KernelSummary) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A summary's step range ids, their numbers and their states (`steady`; empty without steps)."""
    if summary.steps is None or summary.index is None:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, np.empty(0, dtype=object)
    steps = summary.labelled.steps
    states = summary.steps["state"].to_numpy() if "state" in summary.steps.columns else \
        np.full(len(steps), STEADY, dtype=object)
    return steps["range"].to_numpy(), steps["step"].to_numpy(dtype=np.int64), states


def _job_steps(ranks: list[int], steps: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
               notes: list[str]) -> tuple[list[int] | None, list[int]]:
    """The numbers of the job's steady steps (those steady on every rank; None when some rank has no steps)
    and of its warm-up steps, with a note on what the tables cover."""
    without = [rank for rank, (ids, _, _) in zip(ranks, steps, strict=True) if not len(ids)]
    if without:
        notes.append(f"no repeating step range on rank {', '.join(map(str, without))}: the per-rank tables cover "
                     "each rank's whole recording, start-up included")
        return None, []

    def numbered(state: str) -> set[int]:
        return set().union(*(set(numbers[states == state].tolist()) for _, numbers, states in steps))

    steady = sorted(set.intersection(*(set(numbers[states == STEADY].tolist()) for _, numbers, states in steps)))
    warm, once = sorted(numbered(WARMUP)), sorted(numbered(ONE_OFF) - numbered(WARMUP))
    if not steady:
        notes.append("no step is steady on every rank: the per-rank tables cover each rank's whole recording")
        return None, warm
    if warm or once:
        apart = " and ".join([f"warm-up {steps_named(warm)}"] * bool(warm)
                             + [f"one-off {steps_named(once)}"] * bool(once))
        notes.append(f"the per-rank tables cover {steps_named(steady)}, steady on every rank; {apart} (on some "
                     f"rank; {WARMUP_RULE}; {ONE_OFF_RULE}) and what ran outside the steps are apart")
    else:
        notes.append(f"the per-rank tables cover {steps_named(steady)} (no warm-up or one-off seen); what ran "
                     "outside the steps is apart")
    return steady, warm


def _rank(rank: int, trace: KernelTrace, summary: KernelSummary, steady: np.ndarray | None,
          runs: pd.DataFrame) -> Rank:
    """One rank's figures over its steady step ranges `steady` (None: the whole recording)."""
    index, kernels, names, labelled = summary.index, summary.attributed, summary.phase_names, summary.labelled
    rows = None if steady is None else np.flatnonzero(np.isin(labelled.steps["range"].to_numpy(), steady))
    among = None if rows is None else labelled.within_steps(rows)
    if steady is None:
        chosen, wall = np.ones(len(kernels), dtype=bool), None
    else:
        chosen = np.isin(labelled.step_rows(kernels), rows)
        wall = int((index.end[steady] - index.start[steady]).sum())
    categories = kernels[chosen].groupby("category", observed=False)["total_ns"].sum()
    by_phase = _by_phase(summary, among, chosen)
    inside = by_phase[by_phase["phase"] != OUTSIDE_PHASES].groupby("phase")["total_ns"].sum()
    totals = {"steps": 0 if steady is None else len(steady), "wall_ns": wall,
              "total_ns": int(kernels["total_ns"].to_numpy()[chosen].sum()),
              "categories": {c: int(categories.get(c, 0)) for c in CATEGORIES},
              "phase_ns": {p: int(inside.get(p, 0)) for p in names}}
    node = next(iter(trace.process_nodes.values())) if len(trace.process_nodes) == 1 else None
    processes = processes_of(trace)
    process = int(processes[0]) if processes is not None and len(processes) == 1 else None
    return Rank(rank, node, process, summary, steady, totals, communication(kernels, labelled, among),
                phase_wall(labelled, among), collectives.calls_per_phase(trace, kernels, labelled, among),
                runs, by_phase)


def _by_phase(summary: KernelSummary, among: np.ndarray | None, chosen: np.ndarray) -> pd.DataFrame:
    """The summary's phase table (`phase`, `category`, `instances`, `total_ns`) over the kernels of the mask
    `chosen`: each kernel under its phase where its phase range is one of the mask `among` (else any), the rest
    under OUTSIDE_PHASES."""
    kernels, labelled, names = summary.attributed, summary.labelled, summary.phase_names
    codes = labelled.phase_codes(kernels).astype(np.int64)
    held = (codes >= 0) & (codes < len(names))
    if among is not None:
        owner = kernels["phase_range"].to_numpy()
        held[held] = among[owner[held]]
    rows = np.flatnonzero(held | chosen)
    return label_totals(kernels, [*names, OUTSIDE_PHASES], "phase", (rows, np.where(held[rows], codes[rows],
                                                                                      len(names))))
