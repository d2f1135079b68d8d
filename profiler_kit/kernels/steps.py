"""The steps of a report (the step rule: `phase_rule`), one row per step, warm-up told apart from the steady
state. Steps are numbered as the program counted them, from 0 (what `profiler_kit.capture(warmup=2, steps=2)`
calls steps 2 and 3); a report that does not say is numbered from 0 at its first recorded step, with a note.

The first steps of a run are slower (CUDA and allocator start-up, `torch.compile`, autotuning): leading steps
whose wall time is more than WARMUP_FACTOR times the median of the later half are warm-up (`profiler_kit.steady`),
the rest steady, and where the GPU idles is judged on the steady ones. The table has a `state` column only where
a warm-up step was seen.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiler_kit.kernels.idle import spans_by_owner
from profiler_kit.kernels.labels import Labelled, grouped
from profiler_kit.steady import WARMUP_FACTOR, warmup_steps

WARMUP, STEADY = "warm-up", "steady"
NS_PER_MS = 1_000_000


def warm_rows(table: pd.DataFrame) -> np.ndarray:
    """Which rows of a step table are warm-up steps (none when it has no `state` column)."""
    if "state" not in table.columns:
        return np.zeros(len(table), dtype=bool)
    return (table["state"] == WARMUP).to_numpy()


def step_title(table: pd.DataFrame) -> str:
    """What a step table shows, after `Per step`: warm-up against the steady state, or that none was seen."""
    if warm_rows(table).any():
        return "warm-up against the steady state"
    return f"no warm-up seen (no leading step over {WARMUP_FACTOR:g}× the later steps' median)"


def step_table(kernels: pd.DataFrame, labelled: Labelled, timestamped: bool) -> pd.DataFrame:
    """One row per step of `labelled.steps`: `step` (its number), `state` (warm-up or steady, only when some step
    was warm-up), `wall_ms`, `kernel_ms` (time of the kernels launched inside it), `idle_pct` (of its kernels'
    GPU span; NaN without timestamps) and each phase's `<phase>_ms` within it; `process` first when the report
    holds several. `kernels`: labelled ones (all of them, or those --nvtx picked)."""
    steps, phases = labelled.steps, labelled.phases
    processes = steps["process"].to_numpy()
    durations = kernels["total_ns"].to_numpy()
    step_of = labelled.step_rows(kernels)
    inside = step_of >= 0
    kernel_ns = np.bincount(step_of[inside], weights=durations[inside], minlength=len(steps))
    spans = []
    if timestamped:
        for rows in grouped(step_of):  # a group of steps at a time
            starts = kernels["start_ns"].to_numpy()[rows]
            spans.append(spans_by_owner(starts, starts + durations[rows], step_of[rows]))
    table = pd.DataFrame({
        "process": processes,
        "step": steps["step"].to_numpy(),
        "state": STEADY,
        "wall_ms": (steps["end_ns"] - steps["start_ns"]).to_numpy() / NS_PER_MS,
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
    codes = labelled.phase_codes(kernels)
    in_phase = inside & (codes >= 0) & (codes < len(phases))
    per_phase = np.zeros((len(steps), len(phases)))
    np.add.at(per_phase, (step_of[in_phase], codes[in_phase]), durations[in_phase])
    for position, phase in enumerate(phases):
        table[f"{phase}_ms"] = per_phase[:, position] / NS_PER_MS
    return table if len(np.unique(processes)) > 1 else table.drop(columns="process")
