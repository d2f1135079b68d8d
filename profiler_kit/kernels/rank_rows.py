"""One rank's compact result: what the merge of a job's ranks needs of it, its labelled kernels reduced per step,
per phase and per collective, never a list of kernels. A worker computes it where the rank's report lies
(`report_rows`: every process of one report) and sends it back; the client sums the rows of the job's steady
steps (`RankRows.figures`), so its memory grows with ranks × steps, not with kernels.

Rows. One row per step the rank ran (`step`: its number, `state`: steady, warm-up or one-off on this rank) and a
last one for what ran outside every step (NO_STEP). A phase range belongs to the step that holds it in time
(`Labelled.range_steps`): its wall time, the kernels launched inside it (time by category), its communication
and the part of it compute on another stream overlapped, and its collective calls go to that step's row. A
kernel launched in a step outside such a range counts in the step's `outside` time by category. The figures of a
set of steps are the sums of their rows; those of the whole recording, the sums of every row, with the kernels
of phase ranges that lie in no step under their phase (`whole_by_phase`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiler_kit.kernels import collectives
from profiler_kit.kernels.categories import CATEGORIES
from profiler_kit.kernels.idle import COMM_COLUMNS, comm_overlap
from profiler_kit.kernels.labels import NO_STEP, OUTSIDE_PHASES
from profiler_kit.kernels.sources import load
from profiler_kit.kernels.steps import step_states_of
from profiler_kit.kernels.summary import CPU_OPS, DEFAULT_TOP, KernelSummary, summarize_trace
from profiler_kit.kernels.trace import NO_LAUNCH, KernelTrace
from profiler_kit.steady import STEADY

# The columns of the collectives a rank ran that the matching uses (`collectives.executions` without names).
RUN_COLUMNS = ["kind", "start_ns", "duration_ns", "step"]


@dataclass(frozen=True)
class RowOptions:
    """What each rank's rows are made with: the summary's `top` and `phases`, and `detail`: its whole summary
    (`KernelSummary.to_json`) as well."""

    top: int = DEFAULT_TOP
    phases: tuple[str, ...] | None = None
    detail: bool = False


@dataclass
class RankRows:
    """One process of one report, reduced (see the module docstring). Arrays of figures have one row per entry of
    `step_numbers` (the last: NO_STEP), then a column per phase (`phase_names`) and, for kernel time, a last axis
    per category of `categories` (those the rank ran)."""

    path: str
    process: int | None
    recorded_rank: int | None  # the RANK the report says this process had
    node: int | None
    clock: str
    basis: str
    timed: str
    phase_names: list[str]
    categories: list[str]
    kernel_count: int
    total_ns: int
    step_numbers: np.ndarray
    states: np.ndarray  # each step's state (`steady.step_states`), "" for the last row
    wall_ns: np.ndarray
    in_phases: np.ndarray  # (steps, phases, categories)
    outside: np.ndarray  # (steps, categories)
    whole_by_phase: np.ndarray  # (phases + OUTSIDE_PHASES, categories), over the whole recording
    phase_wall_ns: np.ndarray
    comm_ns: np.ndarray
    overlapped_ns: np.ndarray
    calls: np.ndarray | None  # None: the trace cannot say
    runs: pd.DataFrame  # the collectives it ran: RUN_COLUMNS, by start
    notes: list[str] = field(default_factory=list)
    detail: dict[str, Any] | None = None

    @property
    def has_steps(self) -> bool:
        return len(self.step_numbers) > 1

    def steps_of(self, state: str) -> set[int]:
        """The numbers of its steps in `state` (steady, warm-up or one-off)."""
        numbers = self.step_numbers[:-1]
        return set(numbers[self.states[:-1] == state].tolist())

    def figures(self, steady: list[int] | None) -> Figures:
        """Its figures over the steps numbered `steady` (None: the whole recording)."""
        rows = np.ones(len(self.step_numbers), dtype=bool) if steady is None else np.isin(self.step_numbers, steady)
        inside = self.in_phases[rows].sum(axis=0)
        by_category = inside.sum(axis=0) + self.outside[rows].sum(axis=0)
        if steady is None:
            cube = self.whole_by_phase
        else:
            cube = np.vstack([inside, self.outside[rows].sum(axis=0, keepdims=True)])
        by_phase = pd.DataFrame(cube, index=[*self.phase_names, OUTSIDE_PHASES], columns=self.categories)
        categories = dict(zip(self.categories, by_category.tolist(), strict=True))
        phase_ns = cube[:-1].sum(axis=1)
        totals = {"steps": 0 if steady is None else int(rows.sum()),
                  "wall_ns": None if steady is None else int(self.wall_ns[rows].sum()),
                  "total_ns": int(by_category.sum()),
                  "categories": {c: int(categories.get(c, 0)) for c in CATEGORIES},
                  "phase_ns": dict(zip(self.phase_names, map(int, phase_ns), strict=True))}
        comm, overlapped = self.comm_ns[rows].sum(axis=0), self.overlapped_ns[rows].sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            pct = np.where(comm > 0, overlapped * 100.0 / comm, np.nan)
        communication = pd.DataFrame({"phase": self.phase_names, "comm_ns": comm, "overlapped_ns": overlapped,
                                      "exposed_ns": comm - overlapped, "overlap_pct": pct}, columns=COMM_COLUMNS)
        walls = dict(zip(self.phase_names, map(int, self.phase_wall_ns[rows].sum(axis=0)), strict=True))
        calls = {} if self.calls is None else dict(zip(self.phase_names, map(int, self.calls[rows].sum(axis=0)),
                                                       strict=True))
        return Figures(totals, communication, walls, calls, by_phase)


@dataclass
class Figures:
    """A rank's figures over some steps: `totals` (steps, wall_ns, total_ns, categories, phase_ns), communication
    per phase, each phase's wall time and collective calls, and kernel time per phase (OUTSIDE_PHASES last) and
    category (`by_phase`, ns)."""

    totals: dict[str, Any]
    communication: pd.DataFrame
    walls: dict[str, int]
    collective_calls: dict[str, int]
    by_phase: pd.DataFrame


def report_rows(path: str | Path, options: RowOptions) -> list[RankRows]:
    """The rows of every process of one report (one per process that ran kernels), read where it lies."""
    trace = load(path)
    return [rank_rows(part, options) for _, part in split_processes(trace)]


def rank_rows(trace: KernelTrace, options: RowOptions = RowOptions()) -> RankRows:
    """One process's trace (`split_processes`) summarized and reduced to its rows."""
    summary = summarize_trace(trace, top=options.top, phases=list(options.phases) if options.phases else None)
    kernels, labelled, names = summary.attributed, summary.labelled, summary.phase_names
    category_codes = kernels["category"].cat.codes.to_numpy() if len(kernels) else np.empty(0, dtype=np.int64)
    used = sorted(set(category_codes.tolist()))
    categories = [str(kernels["category"].cat.categories[c]) for c in used]
    slot = np.searchsorted(np.asarray(used, dtype=np.int64), category_codes)
    steps = labelled.steps if labelled is not None else pd.DataFrame(columns=["range", "step"])
    count, width, ns = len(steps), len(names), kernels["total_ns"].to_numpy()
    # A kernel's step row: its phase range's step where that lies in a step, else its launch's (-1: none, the
    # last row).
    codes = labelled.phase_codes(kernels) if labelled is not None else np.full(len(kernels), -1)
    in_phase = (codes >= 0) & (codes < width)
    owner = kernels["phase_range"].to_numpy() if "phase_range" in kernels.columns else np.full(len(kernels), -1)
    range_steps = labelled.range_steps if labelled is not None and labelled.index is not None else None
    owner_step = np.full(len(kernels), -1, dtype=np.int64)
    if range_steps is not None:
        held = in_phase & (owner >= 0)
        owner_step[held] = range_steps[owner[held]]
    in_step_phase = owner_step >= 0
    launch_step = labelled.step_rows(kernels).astype(np.int64) if count else np.full(len(kernels), -1)
    in_phases = np.zeros((count + 1, width, len(used)), dtype=np.int64)
    np.add.at(in_phases, (owner_step[in_step_phase], codes[in_step_phase], slot[in_step_phase]), ns[in_step_phase])
    rest = ~in_step_phase
    outside = np.zeros((count + 1, len(used)), dtype=np.int64)
    np.add.at(outside, (np.where(launch_step[rest] >= 0, launch_step[rest], count), slot[rest]), ns[rest])
    whole = np.zeros((width + 1, len(used)), dtype=np.int64)
    np.add.at(whole, (np.where(in_phase, codes, width), slot), ns)
    walls, comm, overlapped, calls = _per_phase_range(summary, trace, count)
    numbers = np.r_[steps["step"].to_numpy(dtype=np.int64), NO_STEP]
    states = np.r_[step_states_of(summary.steps) if summary.steps is not None else np.full(count, STEADY, dtype=object),
                   np.array([""], dtype=object)]
    wall = np.r_[(steps["end_ns"] - steps["start_ns"]).to_numpy(dtype=np.int64) if count else [], 0]
    runs = collectives.executions(kernels, summary.index, summary.basis == CPU_OPS, trace.clock_offset_ns)
    node = next(iter(trace.process_nodes.values())) if len(trace.process_nodes) == 1 else None
    processes = processes_of(trace)
    process = int(processes[0]) if processes is not None and len(processes) == 1 else None
    return RankRows(
        path=str(trace.path), process=process,
        recorded_rank=trace.process_ranks.get(process) if process is not None else None, node=node,
        clock=trace.clock or f"report {trace.path}", basis=summary.basis, timed=summary.timed, phase_names=names,
        categories=categories, kernel_count=summary.kernel_count, total_ns=summary.total_ns,
        step_numbers=numbers, states=states, wall_ns=wall.astype(np.int64), in_phases=in_phases,
        outside=outside, whole_by_phase=whole, phase_wall_ns=walls, comm_ns=comm, overlapped_ns=overlapped,
        calls=calls, runs=runs[RUN_COLUMNS].reset_index(drop=True), notes=list(summary.notes),
        detail=summary.to_json() if options.detail else None)


def _per_phase_range(summary: KernelSummary, trace: KernelTrace,
                     count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """Per step row (the last: no step) and phase: the phase ranges' wall time, communication, the part of it
    overlapped, and collective calls (None when the trace cannot say), each under the step of its phase range."""
    labelled, width = summary.labelled, len(summary.phase_names)
    shape = (count + 1, width)
    walls, comm, overlapped = (np.zeros(shape, dtype=np.int64) for _ in range(3))
    if labelled is None or labelled.index is None:
        return walls, comm, overlapped, None
    index = labelled.index
    step_of = np.where(labelled.range_steps >= 0, labelled.range_steps, count)
    phase_of = pd.Index(summary.phase_names).get_indexer(index.name)
    ranges = np.flatnonzero(labelled.phase_mask & (phase_of >= 0))
    np.add.at(walls, (step_of[ranges], phase_of[ranges]), (index.end - index.start)[ranges])
    pieces = comm_overlap(summary.attributed, labelled)
    if pieces is not None and len(pieces):
        at = (step_of[pieces["phase_range"].to_numpy()], pieces["phase"].to_numpy())
        np.add.at(comm, at, pieces["comm_ns"].to_numpy())
        np.add.at(overlapped, at, pieces["overlapped_ns"].to_numpy())
    calls = np.zeros(shape, dtype=np.int64)
    owners = collectives.call_ranges(trace, summary.attributed, labelled)
    owners = owners[owners >= 0]
    held = owners[phase_of[owners] >= 0]
    np.add.at(calls, (step_of[held], phase_of[held]), 1)
    return walls, comm, overlapped, calls


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
