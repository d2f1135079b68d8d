"""A distributed job's reports side by side: each rank reduced to its rows (`rank_rows`: per step, per phase, per
collective, where its report lies), the merged figures, communication per phase, the stragglers, which rank
entered each collective last (`collectives`) and who made the job wait (`waits`).

Ranks. Each process is the rank it had in its job: the `RANK` the recorder saw (`KernelTrace.process_ranks`),
else the `.rank<R>.` in its report's name (`<stem>.rank<R>.json.gz`), else its place among the reports and
processes, with a note. A report that holds several processes (nsys around torchrun) gives one per process;
the reports of several nodes (`-o` per node) together give the job's global ranks. A report that cannot be read
is named, and the others are merged.

Steady state. The per-rank tables cover the job's steady steps: the steps (`kernels.steps`, matched across ranks
by their number) that no rank spent warming up. What ran outside the steps (start-up, DDP's parameter
broadcast, a first collective waiting for a rank that started late) and the warm-up steps are apart. A job
without a repeating step range is covered whole, with a note.

Clocks. Ranks compare in time on one clock: the processes of one nsys report, or the torch.profiler traces of one
host. Across hosts the clocks disagree by more than a collective lasts; who entered a collective last is then
told from the collectives' durations (`collectives`). A phase's spread across ranks is the difference between
its slowest and fastest rank's wall time (its ranges' CPU time) over the mean.

Many ranks. The per-rank and per-node tables show the slowest, the fastest and the outliers by step time
(`outliers`); JSON and CSV hold every row. The JSON holds each rank's figures, not its whole summary, unless
asked (`RowOptions.detail`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from itertools import count
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiler_kit.engine import Engine, Failure, absolute
from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels import collectives, waits
from profiler_kit.kernels.categories import CATEGORIES, COMMUNICATION
from profiler_kit.kernels.rank_rows import Figures, RankRows, RowOptions, rank_rows, report_rows, split_processes
from profiler_kit.kernels.sources import load_many
from profiler_kit.kernels.summary import NS_PER_MS
from profiler_kit.kernels.trace import KernelTrace
from profiler_kit.outliers import pick, robust_z
from profiler_kit.render import Title, records
from profiler_kit.steady import ONE_OFF, ONE_OFF_RULE, STEADY, WARMUP, WARMUP_RULE

_RANK = re.compile(r"\.rank(\d+)\.")
# The per-rank table's columns that a narrow terminal keeps: each rank's pace and its communication.
RANK_KEY = ("wall_ms", "busy_step_ms", "total_ms", "collective_calls", "comm_ms", "exposed_comm_ms", "times_last",
            "waited_ms")
NODE_KEY = ("ranks", "busy_step_ms", "max_busy_step_ms", "slowest_rank", "z_score", "caused_wait_ms")
# Paths the caption names one by one; beyond them, the first and the last.
NAMED_PATHS = 8
# Distinct notes of the ranks the caption lists; the JSON's ranks[].notes hold all.
LISTED_NOTES = 20


def rank_of(path: Path, position: int) -> int:
    """The rank a file name carries (`<stem>.rank<R>.json.gz`), else its position among the reports."""
    match = _RANK.search(path.name)
    return int(match.group(1)) if match else position


@dataclass
class Rank:
    """One rank: its rows (the whole recording, reduced) and its figures over the job's steady steps."""

    rank: int
    rows: RankRows
    figures: Figures

    @property
    def node(self) -> int | None:
        return self.rows.node

    @property
    def process(self) -> int | None:
        return self.rows.process

    @property
    def totals(self) -> dict[str, Any]:
        return self.figures.totals

    @property
    def communication(self) -> pd.DataFrame:
        return self.figures.communication

    @property
    def walls(self) -> dict[str, int]:
        return self.figures.walls

    @property
    def collective_calls(self) -> dict[str, int]:
        return self.figures.collective_calls


@dataclass
class RankedSummary:
    """One job's ranks (rank order), its steady steps (None: no repeating step range on some rank), the
    collectives matched across ranks, the one-off first collective when there is one, notes on the job, the
    reports that failed (`failed`: rank when its name says it, path, error), and whether tables for people show
    every rank (`every_rank`, --wide) or the slowest, fastest and outliers."""

    members: list[Rank]
    steady_steps: list[int] | None
    warmup_steps: list[int]
    arrivals: collectives.Arrivals
    one_off: dict[str, Any] | None
    job_notes: list[str] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    every_rank: bool = False

    @property
    def ranks(self) -> list[int]:
        return [m.rank for m in self.members]

    @property
    def timed(self) -> str:
        return self.members[0].rows.timed

    @property
    def phase_names(self) -> list[str]:
        return list(dict.fromkeys(p for m in self.members for p in m.rows.phase_names))

    @property
    def compared(self) -> bool:
        """Whether the ranks' collectives are compared: several ranks ran matched collectives."""
        return len(self.members) > 1 and len(self.arrivals.table) > 0

    @property
    def nodes(self) -> dict[int, int | None]:
        return {m.rank: m.node for m in self.members}

    def _steady_arrivals(self) -> np.ndarray:
        steps = self.arrivals.table["step"].to_numpy()
        return np.isin(steps, self.steady_steps) if self.steady_steps is not None else np.ones(len(steps), bool)

    @cached_property
    def blame(self) -> pd.DataFrame:
        """Per rank (rank order), the collectives it entered last and the waits it caused (`waits.blame`)."""
        return waits.blame(self.arrivals, self._steady_arrivals())

    @cached_property
    def _rank_table(self) -> pd.DataFrame:
        last, waited = collectives.rank_waits(self.arrivals, self._steady_arrivals())
        rows = []
        for position, m in enumerate(self.members):
            row: dict[str, Any] = {"rank": m.rank}
            if any(r.node is not None for r in self.members):
                row["node"] = m.node
            wall, steps = m.totals["wall_ns"], m.totals["steps"]
            step_ms = wall / steps / NS_PER_MS if wall is not None and steps else np.nan
            row.update(steps=steps, step_ms=step_ms, busy_step_ms=step_ms, z_score=np.nan,
                       wall_ms=np.nan if wall is None else wall / NS_PER_MS,
                       total_ms=m.totals["total_ns"] / NS_PER_MS, collective_calls=sum(m.collective_calls.values()),
                       comm_ms=m.totals["categories"][COMMUNICATION] / NS_PER_MS,
                       exposed_comm_ms=m.communication["exposed_ns"].sum() / NS_PER_MS)
            if self.compared:
                row["busy_step_ms"] = step_ms - waited[position] / NS_PER_MS / steps if steps else np.nan
                row.update(times_last=int(last[position]), waited_ms=waited[position] / NS_PER_MS,
                           caused_wait_ms=self.blame["caused_wait_ns"].iloc[position] / NS_PER_MS)
            row.update({f"{p}_wall_ms": m.walls.get(p, 0) / NS_PER_MS for p in self.phase_names})
            rows.append(row)
        table = pd.DataFrame(rows)
        table["z_score"] = robust_z(_pace(table))
        return table

    def rank_table(self) -> pd.DataFrame:
        """rank (node), steps, step_ms (their mean wall time), busy_step_ms (step_ms less the time the rank waited
        in collectives for a later one, per step: in a job whose ranks wait for each other every step takes as
        long on every rank, and a straggler is the rank that waited least), z_score (robust, of busy_step_ms; of
        total_ms when the tables cover whole recordings), wall_ms, total_ms, collective_calls, comm_ms,
        exposed_comm_ms, and with matched collectives times_last, waited_ms and caused_wait_ms, then each phase's
        wall time, all over the steady steps."""
        return self._rank_table.copy()

    def node_table(self) -> pd.DataFrame | None:
        """Per node, when the ranks ran on two or more: node, ranks, busy_step_ms (the mean of its ranks'),
        max_busy_step_ms, slowest_rank, z_score (of busy_step_ms among the nodes), comm_ms and exposed_comm_ms (means),
        times_last and caused_wait_ms (sums); None otherwise."""
        table = self._rank_table
        if "node" not in table.columns or table["node"].nunique(dropna=True) < 2:
            return None
        table = table.assign(pace=_pace(table))
        groups = table.groupby("node", sort=True, dropna=True)
        out = pd.DataFrame({"ranks": groups.size(), "busy_step_ms": groups["pace"].mean(),
                            "max_busy_step_ms": groups["pace"].max(),
                            "slowest_rank": groups.apply(lambda g: int(g["rank"].iloc[int(np.nanargmax(g["pace"]))])
                                                         if g["pace"].notna().any() else -1, include_groups=False),
                            "comm_ms": groups["comm_ms"].mean(), "exposed_comm_ms": groups["exposed_comm_ms"].mean()})
        if self.compared:
            out["times_last"] = groups["times_last"].sum()
            out["caused_wait_ms"] = groups["caused_wait_ms"].sum()
        out.insert(4, "z_score", robust_z(out["busy_step_ms"].to_numpy()))
        return out.reset_index().astype({"node": int})

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

    def made_wait(self) -> pd.DataFrame:
        """The ranks that made the others wait longest (`waits.made_wait`)."""
        return waits.made_wait(self.blame, self.nodes)

    def scope(self) -> str:
        """What the per-rank tables cover, within a title."""
        if self.steady_steps is None:
            return "the whole recording"
        return f"{len(self.steady_steps)} steady {steps_named(self.steady_steps)}"

    def picked_ranks(self) -> np.ndarray:
        """The positions of the ranks tables and charts for people show (every one with `every_rank`)."""
        if self.every_rank:
            return np.arange(len(self.members))
        return pick(_pace(self._rank_table)).rows

    def tables(self, display: bool = False) -> list[tuple[str, pd.DataFrame]]:
        per_rank, per_node = self.rank_table(), self.node_table()
        rank_title = f"Per rank ({len(self.ranks):,} ranks, over {self.scope()}; {self.timed})"
        node_title = f"Per node ({0 if per_node is None else len(per_node):,} nodes, over {self.scope()})"
        if display and not self.every_rank:
            picked = pick(_pace(per_rank))
            per_rank = per_rank.iloc[picked.rows].reset_index(drop=True)
            rank_title += f": {picked.said('ranks')}" if picked.left_out else ""
            if per_node is not None:
                nodes = pick(per_node["busy_step_ms"].to_numpy())
                per_node = per_node.iloc[nodes.rows].reset_index(drop=True)
                node_title += f": {nodes.said('nodes')}" if nodes.left_out else ""
        merged = pd.DataFrame({"category": list(CATEGORIES), "total_ms": [
            v / NS_PER_MS for v in self.merged_categories().values()]})
        comm = self.merged_communication()
        for column in ("comm", "overlapped", "exposed"):
            comm[f"{column}_ms"] = comm.pop(f"{column}_ns") / NS_PER_MS
        tables = [(Title(rank_title, "ranks", RANK_KEY), per_rank)]
        if per_node is not None:
            tables.append((Title(node_title, "nodes", NODE_KEY), per_node))
        tables += [
            (Title("All ranks merged: time by category", "categories"), merged[merged["total_ms"] > 0]),
            (Title("Communication per phase, all ranks: overlapped by compute elsewhere, and exposed",
                   "communication", ("exposed_ms", "overlap_pct")), comm),
            (Title("Stragglers: each phase's wall time across ranks", "stragglers", ("spread_pct", "slowest_rank")),
             self.stragglers()),
        ]
        if self.compared:
            tables.append((Title("Collective arrivals per step: the rank that entered last, and how long the first "
                                 "waited for it", "arrivals"), self.arrival_table()))
            tables.append((Title(f"Who made the job wait: the {waits.TOP} ranks the others waited for longest in the "
                                 "steady steps (caused_wait_ms: the others' waiting summed), and at start-up",
                                 "made_wait", ("lateness", "times_last", "caused_wait_ms")), self.made_wait()))
        if self.failed:
            tables.append((Title("Reports that failed: the other ranks are merged", "failed", ("path", "error"),
                                 prose=("error",)), pd.DataFrame(self.failed, columns=["rank", "path", "error"])))
        return tables

    def to_json(self) -> dict[str, Any]:
        table = self._rank_table
        ranks = []
        for position, m in enumerate(self.members):
            doc: dict[str, Any] = dict(m.rows.detail) if m.rows.detail is not None else {
                "time_basis": m.rows.basis, "kernel_count": m.rows.kernel_count, "total_ns": m.rows.total_ns,
                "categories": m.rows.figures(None).totals["categories"]}
            doc.update(rank=m.rank, node=m.node, process=m.process, path=m.rows.path)
            doc["steady"] = dict(m.totals)
            doc["z_score"] = table["z_score"].iloc[position]
            doc["communication"] = {r.pop("phase"): r for r in records(m.communication)}
            doc["phase_wall_ns"] = m.walls
            doc["collective_calls"] = m.collective_calls
            if self.compared:
                doc.update({c: int(self.blame[c].iloc[position]) for c in waits.BLAME_COLUMNS[1:]})
            doc["notes"] = m.rows.notes
            ranks.append(doc)
        merged_comm = records(self.merged_communication())
        nodes = self.node_table()
        return {
            "ranks": ranks,
            "nodes": [] if nodes is None else records(nodes),
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
            "made_wait": records(self.made_wait()) if self.compared else [],
            "one_off": self.one_off,
            "failed": self.failed,
        }

    @property
    def notes(self) -> list[str]:
        return list(dict.fromkeys([*self.job_notes, *(n for m in self.members for n in m.rows.notes)]))

    def paths_named(self, ranks: bool = False) -> str:
        """The ranks' report names (with their `ranks`), the first and the last beyond NAMED_PATHS."""
        named = [f"rank {m.rank}: {Path(m.rows.path).name}" if ranks else Path(m.rows.path).name
                 for m in self.members]
        if len(named) > NAMED_PATHS:
            return f"{named[0]} … {named[-1]} (every path in the JSON)"
        return ", ".join(named)

    def caption(self) -> str:
        named = [self.paths_named(ranks=True)]
        notes = self.notes
        if len(notes) > LISTED_NOTES:
            notes = [*notes[:LISTED_NOTES], f"{len(notes) - LISTED_NOTES:,} more notes of single ranks: the JSON's "
                                            "ranks[].notes hold them"]
        return "\n".join(named + [f"note: {n}" for n in notes])


def _pace(table: pd.DataFrame) -> np.ndarray:
    """Each rank's pace, larger is slower: its mean busy steady step time, else (whole recordings) its total
    time."""
    steps = table["busy_step_ms"].to_numpy(dtype=float)
    return steps if not np.isnan(steps).all() else table["total_ms"].to_numpy(dtype=float)


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


def number_ranks(parts: list[tuple[str, int | None, int | None]]) -> tuple[list[int], dict[int, str]]:
    """The rank of each part of a job's reports, given as (path, process, the RANK it recorded): see the module
    docstring for where a rank comes from; and a note for each part (by position) numbered by its place."""
    per_path = Counter(path for path, _, _ in parts)
    given: list[int | None] = []
    for path, _, recorded in parts:
        rank = recorded
        if rank is None and per_path[path] == 1 and (match := _RANK.search(Path(path).name)):
            rank = int(match.group(1))
        given.append(rank)
    taken = set(given)
    free = (r for r in count() if r not in taken)
    ranks = [r if r is not None else next(free) for r in given]
    notes = {}
    if len(parts) > 1:
        for position, ((path, proc, _), rank, said) in enumerate(zip(parts, ranks, given, strict=True)):
            if said is None:
                notes[position] = (f"rank {rank} is {_label(path, proc, per_path)} by its place among the reports "
                                   "and processes: the report says no RANK")
    ordered = sorted(range(len(parts)), key=lambda i: ranks[i])
    for i, j in zip(ordered, ordered[1:], strict=False):
        if ranks[i] == ranks[j]:
            raise ProfilerKitError(f"{_label(*parts[i][:2], per_path)} and {_label(*parts[j][:2], per_path)} are "
                                   f"both rank {ranks[i]} (from the RANK recorded, `.rank<R>.` in a name, else the "
                                   "position among the reports): give each rank's report once")
    return ranks, notes


def _label(path: str, proc: int | None, per_path: Counter) -> str:
    return f"{path} process {proc}" if per_path[path] > 1 else str(path)


def rank_traces(paths: list[Path]) -> list[tuple[int, KernelTrace]]:
    """(rank, trace) of a job's reports, one per process, in rank order (`assign_ranks`)."""
    traces = load_many(paths)
    return assign_ranks(list(zip(paths, traces, strict=True)))


def assign_ranks(reports: list[tuple[Path, KernelTrace]]) -> list[tuple[int, KernelTrace]]:
    """(rank, trace) of a job's reports as read, one per process, in rank order (`number_ranks`). Each trace's
    `clock` is set: its source's, else its report's own."""
    parts = [(path, proc, replace(part, clock=trace.clock or f"report {path}"))
             for path, trace in reports for proc, part in split_processes(trace)]
    ranks, notes = number_ranks([(str(path), proc, part.process_ranks.get(proc) if proc is not None else None)
                                 for path, proc, part in parts])
    for position, note in notes.items():
        parts[position][2].notes.append(note)
    return sorted(((rank, part) for rank, (_, _, part) in zip(ranks, parts, strict=True)), key=lambda x: x[0])


def summarize_ranks(ranked: list[tuple[int, KernelTrace]], options: RowOptions | None = None) -> RankedSummary:
    """The job of traces read here (`rank_traces`), rank by rank, with the steady-state figures (each rank's rows
    made with `options`, the defaults of `RowOptions` without)."""
    return merge([(rank, rank_rows(trace, options or RowOptions())) for rank, trace in ranked])


def summarize_reports(paths: list[Path], engine: Engine, options: RowOptions) -> RankedSummary:
    """The job of reports read where they lie, each in a task of `engine` that returns its ranks' rows; a report
    that fails is named (`RankedSummary.failed`) and the others merged. Every report failing is an error."""
    results = engine.map(partial(report_rows, options=options), [absolute(p) for p in paths], keep_going=True)
    parts: list[RankRows] = []
    failed = []
    for path, result in zip(paths, results, strict=True):
        if isinstance(result, Failure):
            match = _RANK.search(Path(path).name)
            failed.append({"rank": int(match.group(1)) if match else None, "path": str(path), "error": result.error})
        else:
            parts += [replace(rows, path=str(path)) for rows in result]
    if not parts:
        first = failed[0]
        raise ProfilerKitError(f"{first['path']}: {first['error']}" if len(failed) == 1 else
                               f"every report failed; {first['path']}: {first['error']}")
    ranks, notes = number_ranks([(rows.path, rows.process, rows.recorded_rank) for rows in parts])
    for position, note in notes.items():
        parts[position].notes.append(note)
    ranked = sorted(zip(ranks, parts, strict=True), key=lambda item: item[0])
    summary = merge(ranked, failed)
    if failed:
        listed = ", ".join(f["path"] for f in failed[:3]) + (" …" if len(failed) > 3 else "")
        summary.job_notes.append(f"{len(failed)} of {len(paths)} reports failed ({listed}): the other ranks are "
                                 "merged")
    return summary


def merge(ranked: list[tuple[int, RankRows]], failed: list[dict[str, Any]] | None = None) -> RankedSummary:
    """The merged view of a job's ranks' rows, in rank order."""
    notes: list[str] = []
    steady, warm = _job_steps([(rank, rows) for rank, rows in ranked], notes)
    members = [Rank(rank, rows, rows.figures(steady)) for rank, rows in ranked]
    clocks = {rows.clock for _, rows in ranked}
    comparable = len(clocks) == 1
    if not comparable and len(ranked) > 1:
        listed = ", ".join(sorted(map(str, clocks))[:3]) + (" …" if len(clocks) > 3 else "")
        notes.append(f"the ranks were recorded on {len(clocks)} clocks ({listed}): which rank entered each "
                     "collective last is told from the collectives' durations (every rank leaves one at about the "
                     "same moment; the last to enter waits least)")
    arrivals = collectives.match([m.rank for m in members], [m.rows.runs for m in members], comparable)
    notes += arrivals.notes
    mask = np.isin(arrivals.table["step"].to_numpy(), steady) if steady is not None else None
    first = collectives.one_off(arrivals, mask, set(warm)) if len(ranked) > 1 else None
    if first is not None:
        notes.append(collectives.one_off_note(first))
    return RankedSummary(members, steady, warm, arrivals, first, notes, list(failed or []))


def _job_steps(ranked: list[tuple[int, RankRows]], notes: list[str]) -> tuple[list[int] | None, list[int]]:
    """The numbers of the job's steady steps (those steady on every rank; None when some rank has no steps)
    and of its warm-up steps, with a note on what the tables cover."""
    without = [rank for rank, rows in ranked if not rows.has_steps]
    if without:
        listed = ", ".join(map(str, without[:10])) + (f" and {len(without) - 10:,} more" if len(without) > 10 else "")
        notes.append(f"no repeating step range on rank {listed}: the per-rank tables cover each rank's whole "
                     "recording, start-up included")
        return None, []
    steady = sorted(set.intersection(*(rows.steps_of(STEADY) for _, rows in ranked)))
    warm = sorted(set().union(*(rows.steps_of(WARMUP) for _, rows in ranked)))
    once = sorted(set().union(*(rows.steps_of(ONE_OFF) for _, rows in ranked)) - set(warm))
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
