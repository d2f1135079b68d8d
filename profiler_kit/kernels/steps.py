"""The steps of a report: its repeating outer range, one row per step, warm-up told apart from the steady state.

The steps are the ranges that directly hold the phases (the recorder's step marks for its automatic marks, the
program's `step`, `ProfilerStep#N` when nothing of the program's lies between), when they all have one name and
repeat; else the recorder's step marks (kind `auto`, named `step`: the steps of `profiler_kit.capture`, else one
per optimizer step of the program); else torch.profiler's `ProfilerStep#N` ranges. Only the outermost of these
count: a range of the step's name nested inside a step is part of that step.

Steps are numbered as the program counted them, from 0 (what `profiler_kit.capture(warmup=2, steps=2)` calls
steps 2 and 3): the number the recorder gave each step range (the ranges' `number` column), else the number of
the recorder's step mark inside each of the program's own step ranges, else torch.profiler's `ProfilerStep#N`; a
report that says none of these is numbered from 0 at its first recorded step, with a note.

The first steps of a run are slower (CUDA and allocator start-up, `torch.compile`, autotuning): leading steps
whose wall time is more than WARMUP_FACTOR times the median of the later half are warm-up (`profiler_kit.steady`),
the rest steady, and where the GPU idles is judged on the steady ones. The table has a `state` column only where
a warm-up step was seen.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profiler_kit.kernels.attribution import RangeIndex, launches_by_group
from profiler_kit.kernels.idle import spans_by_owner
from profiler_kit.names import KIND_AUTO, STEP
from profiler_kit.steady import WARMUP_FACTOR, warmup_steps

PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
WARMUP, STEADY = "warm-up", "steady"
NS_PER_MS = 1_000_000
# The ranges frame's column of step numbers the recorder gave (nullable; NA on other ranges).
NUMBER = "number"
NUMBERED_HERE = ("steps are numbered from 0 at the first one recorded: the report does not say which of the "
                 "program's steps they were")


def _step_key(names: pd.Series) -> pd.Series:
    """Range names with torch.profiler's step numbers dropped (`ProfilerStep#7` → `ProfilerStep#`)."""
    return names.where(~names.str.match(PROFILER_STEP, na=False), "ProfilerStep#")


def find_steps(index: RangeIndex, phases: list[str]) -> np.ndarray:
    """Range ids of the report's steps, by process and start: the outermost ranges of the steps' name (one
    nested in a step of that name is part of it); empty unless at least two."""
    names = index.names()
    keys = _step_key(names).to_numpy()
    ranges = index.ranges
    is_phase = names.isin(phases).to_numpy()
    holders = index.nearest_in(~is_phase)[is_phase]
    holders = holders[holders >= 0]
    recorded = (ranges["kind"] == KIND_AUTO).to_numpy() & (names == STEP).to_numpy() if "kind" in ranges else None
    if len(holders) and len(set(keys[holders])) == 1:
        threads = pd.MultiIndex.from_frame(ranges[["process", "thread"]])
        chosen = (keys == keys[holders[0]]) & threads.isin(threads[holders])
    elif recorded is not None and recorded.any():  # the recorder's step marks: the program's steps
        chosen = recorded
    else:
        chosen = names.str.match(PROFILER_STEP, na=False).to_numpy(dtype=bool)
    chosen = chosen & (index.nearest_in(chosen) < 0)
    ids = np.flatnonzero(chosen)
    ids = ids[np.lexsort((ranges["start_ns"].to_numpy()[ids], ranges["process"].to_numpy()[ids]))]
    return ids if len(ids) >= 2 else ids[:0]


def step_numbers(index: RangeIndex, steps: np.ndarray) -> tuple[np.ndarray, bool]:
    """The number of each step (range ids `steps`, as `find_steps` orders them) as the program counted it, from
    0: the recorder's `number`, else that of the recorder's step mark inside each step, else torch.profiler's
    `ProfilerStep#N`; else counted from 0 at each process's first step here. True when the numbers are the
    program's own."""
    ranges = index.ranges.iloc[steps]
    if NUMBER in ranges.columns and ranges[NUMBER].notna().all():
        return ranges[NUMBER].to_numpy(dtype=np.int64), True
    marked = _numbers_of_marks_inside(index.ranges, ranges) if NUMBER in ranges.columns else None
    if marked is not None:
        return marked, True
    profiler = ranges["name"].str.extract(PROFILER_STEP, expand=False)
    if profiler.notna().all():
        return profiler.to_numpy(dtype=np.int64), True
    processes = ranges["process"].to_numpy()
    return pd.Series(processes).groupby(processes).cumcount().to_numpy(dtype=np.int64), False


def _numbers_of_marks_inside(all_ranges: pd.DataFrame, steps: pd.DataFrame) -> np.ndarray | None:
    """The numbers of the program's own steps (`profiler_kit.phase("step")`, a `record_function("step")`) taken
    from the recorder's numbered step marks: each step must hold the middle of exactly one mark of its process;
    None where any does not."""
    numbered = all_ranges[(all_ranges["kind"] == KIND_AUTO).to_numpy() & (all_ranges["name"] == STEP).to_numpy()
                          & all_ranges[NUMBER].notna().to_numpy()]
    out = np.empty(len(steps), dtype=np.int64)
    processes = steps["process"].to_numpy()
    for process in np.unique(processes):
        marks = numbered[numbered["process"].to_numpy() == process]
        middles = (marks["start_ns"].to_numpy() + marks["end_ns"].to_numpy()) // 2
        order = np.argsort(middles, kind="stable")
        middles, numbers = middles[order], marks[NUMBER].to_numpy(dtype=np.int64)[order]
        mine = processes == process
        first = np.searchsorted(middles, steps["start_ns"].to_numpy()[mine], "left")
        last = np.searchsorted(middles, steps["end_ns"].to_numpy()[mine], "right")
        if not (last - first == 1).all():
            return None
        out[mine] = numbers[first]
    return out


def warm_rows(table: pd.DataFrame) -> np.ndarray:
    """Which rows of a step table are warm-up steps (none when it has no `state` column)."""
    if "state" not in table.columns:
        return np.zeros(len(table), dtype=bool)
    return (table["state"] == WARMUP).to_numpy()


def inside_steps(index: RangeIndex, steps: np.ndarray) -> np.ndarray:
    """Which ranges lie, in time, inside one of the step ranges `steps` of their process (the steps themselves not
    included): by time, not nesting, since the recorder's step marks are a lane apart from the program's thread."""
    ranges = index.ranges
    starts, ends = ranges["start_ns"].to_numpy(), ranges["end_ns"].to_numpy()
    processes = ranges["process"].to_numpy()
    inside = np.zeros(len(ranges), dtype=bool)
    for process in np.unique(processes[steps]):
        mine = steps[processes[steps] == process]
        mine = mine[np.argsort(starts[mine], kind="stable")]
        candidates = np.flatnonzero(processes == process)
        # The last step to start at or before each range; steps of one process do not overlap.
        at = np.searchsorted(starts[mine], starts[candidates], side="right") - 1
        ok = at >= 0
        ok[ok] = ends[candidates[ok]] <= ends[mine[at[ok]]]
        inside[candidates[ok]] = True
    inside[steps] = False
    return inside


def step_title(table: pd.DataFrame) -> str:
    """What a step table shows, after `Per step`: warm-up against the steady state, or that none was seen."""
    if warm_rows(table).any():
        return "warm-up against the steady state"
    return f"no warm-up seen (no leading step over {WARMUP_FACTOR:g}× the later steps' median)"


def step_table(kernels: pd.DataFrame, index: RangeIndex, steps: np.ndarray, numbers: np.ndarray,
               phases: list[str], phase_rows: np.ndarray, phase_labels: np.ndarray,
               timestamped: bool) -> pd.DataFrame:
    """One row per step: `step` (its number, `step_numbers`), `state` (warm-up or steady, only when some step
    was warm-up), `wall_ms`, `kernel_ms` (time of the kernels launched inside it), `idle_pct` (of its kernels'
    GPU span; NaN without timestamps) and each phase's `<phase>_ms` within it; `process` first when the report
    holds several. `phase_rows`, `phase_labels`: the (kernel row, phase position) pairs of the phase totals."""
    ranges = index.ranges.iloc[steps]
    processes = ranges["process"].to_numpy()
    durations = kernels["total_ns"].to_numpy()
    # A group of steps at a time (`launches_by_group`): each kernel's step, each step's kernel time and span.
    step_of = np.full(len(kernels), -1, dtype=np.int32)
    kernel_ns = np.zeros(len(steps))
    spans = []
    for rows, owners in launches_by_group(kernels, index, steps):
        position = pd.Index(steps).get_indexer(owners)
        step_of[rows] = position
        kernel_ns += np.bincount(position, weights=durations[rows], minlength=len(steps))
        if timestamped and len(rows):
            starts = kernels["start_ns"].to_numpy()[rows]
            spans.append(spans_by_owner(starts, starts + durations[rows], position))
    table = pd.DataFrame({
        "process": processes,
        "step": numbers,
        "state": STEADY,
        "wall_ms": (ranges["end_ns"] - ranges["start_ns"]).to_numpy() / NS_PER_MS,
        "kernel_ms": kernel_ns / NS_PER_MS,
        "idle_pct": np.nan,
    })
    for process in np.unique(processes):
        mine = np.flatnonzero(processes == process)
        table.loc[mine[:warmup_steps(table["wall_ms"].to_numpy()[mine])], "state"] = WARMUP
    if not (table["state"] == WARMUP).any():
        table = table.drop(columns="state")
    if spans:
        spans = pd.concat(spans, ignore_index=True)
        owner = spans["owner"].to_numpy(dtype=np.int64)
        span = spans["span_ns"].to_numpy(dtype=float)
        idle = np.divide((span - spans["busy_ns"].to_numpy()) * 100.0, span, out=np.full(len(span), np.nan),
                         where=span > 0)
        table.loc[owner, "idle_pct"] = idle
    in_step = step_of[phase_rows]
    keep = in_step >= 0
    per_phase = np.zeros((len(steps), len(phases)))
    np.add.at(per_phase, (in_step[keep], phase_labels[keep]), durations[phase_rows[keep]])
    for label, phase in enumerate(phases):
        table[f"{phase}_ms"] = per_phase[:, label] / NS_PER_MS
    return table if len(np.unique(processes)) > 1 else table.drop(columns="process")
