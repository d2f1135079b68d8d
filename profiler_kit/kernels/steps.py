"""The steps of a report (the step rule: `phase_rule`), one row per step, warm-up and one-off steps told apart from
the steady state. Steps are numbered as the program counted them, from 0 (what `profiler_kit.capture(warmup=2,
steps=2)` calls steps 2 and 3); a report that does not say is numbered from 0 at its first recorded step, with a
note.

Each step's state follows `profiler_kit.steady` on its wall time: `warm-up` (the program's first step, and the
leading steps after it over WARMUP_FACTOR times the later steps' median), `one-off` (a later step of
ONE_OFF_FACTOR times the steady median or more), else `steady`; where the GPU idles, the per-rank tables and
`compare` take the steady ones. The table has a `state` column only where some step is not steady, and a `cause`
column where the recording shows what made such a step long (the first that explains at least half of its time
over the steady median):
- `compiling`: torch.compile's own events inside it (a torch.profiler trace: `names.COMPILE_EVENT`), their union;
- `autotuning`: launches of kernels that no steady step runs (candidates benchmarked and dropped), their count;
- `no kernel ran`: the longest stretch of the step in which none of its kernels ran (the host busy elsewhere:
  compiling under nsys, loading, a pause).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from profiler_kit.kernels.idle import spans_by_owner
from profiler_kit.kernels.labels import Labelled, grouped
from profiler_kit.names import COMPILE_EVENT, EVAL
from profiler_kit.steady import ONE_OFF, ONE_OFF_RULE, STEADY, WARMUP, WARMUP_RULE, step_states

NS_PER_MS = 1_000_000
# A cause is named when what it shows covers at least this share of the step's time over the steady median.
EXPLAINS = 0.5


def step_states_of(table: pd.DataFrame) -> np.ndarray:
    """Each row's state of a step table (`steady` for all when it has no `state` column: every step was)."""
    if "state" not in table.columns:
        return np.full(len(table), STEADY, dtype=object)
    return table["state"].to_numpy(dtype=object)


def steady_rows(table: pd.DataFrame) -> np.ndarray:
    """Which rows of a step table are steady steps."""
    return step_states_of(table) == STEADY


def step_title(table: pd.DataFrame) -> str:
    """What a step table shows, after `Per step`: warm-up and one-offs against the steady state, or that none
    was seen."""
    if not steady_rows(table).all():
        seen = set(table["state"])
        return " and ".join(shown for state, shown in ((WARMUP, "warm-up"), (ONE_OFF, "one-offs"))
                            if state in seen) + " against the steady state"
    return f"no warm-up or one-off seen ({WARMUP_RULE}; {ONE_OFF_RULE})"


def left_out_note(table: pd.DataFrame, what: str) -> str | None:
    """The note that `what` (e.g. where the GPU idles) covers the steady steps only, naming the rules; None when
    every step is steady or none is."""
    steady = steady_rows(table)
    if steady.all() or not steady.any():
        return None
    parts = [f"{int(count)} {state}" for state, count in table["state"].value_counts(sort=False).items()
             if state != STEADY]
    return (f"{what} is judged on the steady steps, {int(steady.sum())} of {len(table)} ({', '.join(parts)} left "
            f"out; {WARMUP_RULE}; {ONE_OFF_RULE})")


def step_table(kernels: pd.DataFrame, labelled: Labelled, timestamped: bool) -> pd.DataFrame:
    """One row per step of `labelled.steps`: `step` (its number), `state` (only when some step is not steady),
    `wall_ms`, `kernel_ms` (time of the kernels launched inside it), `idle_pct` (of its kernels' GPU span; NaN
    without timestamps), each phase's `<phase>_ms` within it and `cause` (only where some is known); `process`
    first when the report holds several. `kernels`: labelled ones (all of them, or those --nvtx picked)."""
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
    numbers = table["step"].to_numpy()
    for process in np.unique(processes):
        mine = np.flatnonzero(processes == process)
        first = labelled.own_numbers and numbers[mine[0]] == 0
        table.loc[mine, "state"] = step_states(table["wall_ms"].to_numpy()[mine], first)
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
        if phase != EVAL:  # an evaluation pass lies outside the steps
            table[f"{phase}_ms"] = per_phase[:, position] / NS_PER_MS
    causes = step_causes(kernels, labelled, table, step_of, timestamped)
    if causes.any():
        table["cause"] = causes
    if (table["state"] == STEADY).all():
        table = table.drop(columns="state")
    return table if len(np.unique(processes)) > 1 else table.drop(columns="process")


def step_causes(kernels: pd.DataFrame, labelled: Labelled, table: pd.DataFrame, step_of: np.ndarray,
                timestamped: bool) -> np.ndarray:
    """What made each step that is not steady long, where the recording shows it (the module docstring's causes,
    the first that explains EXPLAINS of its time over its process's steady median); "" elsewhere."""
    causes = np.full(len(table), "", dtype=object)
    states = table["state"].to_numpy()
    unsteady = np.flatnonzero(states != STEADY)
    if not len(unsteady):
        return causes
    steps = labelled.steps
    walls = table["wall_ms"].to_numpy() * NS_PER_MS
    processes = steps["process"].to_numpy()
    compiling = _compile_events(kernels, labelled)
    new = _new_kernels(kernels, step_of, states == STEADY)
    for row in unsteady.tolist():
        process, start, end = processes[row], int(steps["start_ns"].iat[row]), int(steps["end_ns"].iat[row])
        steady = (processes == process) & (states == STEADY)
        excess = walls[row] - (float(np.median(walls[steady])) if steady.any() else 0.0)
        if excess <= 0:
            continue
        compiled = _covered(compiling[compiling[:, 0] == process, 1:], start, end)
        mine = np.flatnonzero(step_of == row)
        launches = new[mine]
        if compiled >= EXPLAINS * excess:
            causes[row] = f"compiling {compiled / NS_PER_MS:,.0f} ms"
        elif launches.sum() and _busy(kernels, mine[launches]) >= EXPLAINS * excess:
            distinct = kernels["name"].to_numpy()[mine[launches]]
            causes[row] = (f"autotuning: {int(launches.sum()):,} launches of {len(set(distinct)):,} kernels no "
                           "steady step runs")
        elif timestamped and (gap := _longest_gap(kernels, mine, start, end)) >= EXPLAINS * excess:
            causes[row] = f"no kernel ran for {gap / NS_PER_MS:,.1f} ms"
    return causes


def _compile_events(kernels: pd.DataFrame, labelled: Labelled) -> np.ndarray:
    """(process, start_ns, end_ns) of torch.compile's events: the ranges so named, and the CPU operator calls so
    named where the timed events are CPU operators."""
    parts = []
    index = labelled.index
    if index is not None:
        ids = np.flatnonzero(index.named(COMPILE_EVENT.match))
        parts.append(np.stack([index.process[ids], index.start[ids], index.end[ids]], axis=1))
    if "end_ns" in kernels.columns:
        names = kernels["name"].cat.categories
        codes = np.flatnonzero(np.asarray([bool(COMPILE_EVENT.match(str(n))) for n in names], dtype=bool))
        rows = np.flatnonzero(np.isin(kernels["name"].cat.codes.to_numpy(), codes))
        parts.append(np.stack([kernels["process"].to_numpy()[rows], kernels["start_ns"].to_numpy()[rows],
                               kernels["end_ns"].to_numpy()[rows]], axis=1))
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros((0, 3), dtype=np.int64)


def _covered(intervals: np.ndarray, start: int, end: int) -> int:
    """How much of [start, end) the (start, end) `intervals` cover, each moment once."""
    lo, hi = np.clip(intervals[:, 0], start, end), np.clip(intervals[:, 1], start, end)
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    if not len(lo):
        return 0
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], np.maximum.accumulate(hi[order])
    # A new stretch starts where an interval begins after everything before it ended.
    heads = np.r_[True, lo[1:] > hi[:-1]]
    tails = np.r_[heads[1:], True]
    return int((hi[tails] - lo[heads]).sum())


def _new_kernels(kernels: pd.DataFrame, step_of: np.ndarray, steady_row: np.ndarray) -> np.ndarray:
    """Which kernels run under a name that no steady step's kernels have (all False without steady steps)."""
    codes = kernels["name"].cat.codes.to_numpy()
    in_steady = (step_of >= 0) & steady_row[np.maximum(step_of, 0)]
    if not in_steady.any():
        return np.zeros(len(kernels), dtype=bool)
    seen = np.bincount(codes[in_steady], minlength=len(kernels["name"].cat.categories)) > 0
    return ~seen[codes]


def _busy(kernels: pd.DataFrame, rows: np.ndarray) -> int:
    """The time the kernels `rows` took (their GPU time where timestamped, each moment once)."""
    if "start_ns" not in kernels.columns:
        return int(kernels["total_ns"].to_numpy()[rows].sum())
    starts = kernels["start_ns"].to_numpy()[rows]
    ends = starts + kernels["total_ns"].to_numpy()[rows]
    return _covered(np.stack([starts, ends], axis=1), int(starts.min()), int(ends.max()))


def _longest_gap(kernels: pd.DataFrame, rows: np.ndarray, start: int, end: int) -> int:
    """The longest stretch of [start, end) in which none of the kernels `rows` ran."""
    starts = kernels["start_ns"].to_numpy()[rows]
    ends = starts + kernels["total_ns"].to_numpy()[rows]
    lo, hi = np.clip(starts, start, end), np.clip(ends, start, end)
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], np.maximum.accumulate(hi[order])
    edges = np.r_[start, hi]
    return int(np.max(np.r_[lo, end] - edges, initial=0))
