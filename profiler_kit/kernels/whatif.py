"""What a faster kernel, category or launch path would save: the report's kernels replayed with new durations.

Each stream runs its kernels in their measured order. In the replay a kernel starts at the latest of
- its launch (the CPU start of the call that launched it, as measured) plus the launch latency,
- the end of the previous kernel on its stream plus the queue gap,
- the end of the kernel on another stream that it waited for (an event, a stream wait, a collective).
Latency and gap are measured in the report: the median over the kernels that were launched onto an idle stream
(latency) or queued behind another kernel (gap). Which constraint held a kernel back in the measurement is
known from the timestamps, and that constraint keeps the kernel's own measured offset, so a replay with
nothing changed gives the measured timeline back exactly. A kernel that started later than all three explain
waited for another stream: the kernel that ended last before it, on another stream of its process, is taken as
what it waited for. The host's launch times stay as measured: the replay does not move a launch that would
have come earlier had a synchronizing call returned sooner.

`launch_gaps=False` predicts a run whose launches never hold the GPU back (CUDA graphs with a host that keeps
ahead): every kernel is ready when the report's first one is, so each stream runs its kernels back to back, as a
graph replays them (GRAPH_QUEUE_GAP_NS apart); the host's own pauses (a synchronizing call, loading data)
vanish with the launch gaps.

A range's time is from its start until the last kernel launched in it has both been launched and finished; when
the GPU runs behind the host, it starts when the range before it (a step, or a phase) is done, so that no moment
counts twice. Steps are those of the summary's per-step table (`kernels.steps`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels.attribution import RangeIndex, launches_in
from profiler_kit.kernels.categories import CATEGORIES
from profiler_kit.kernels.idle import LAUNCH_BOUND_PCT, spans_by_owner
from profiler_kit.kernels.labels import Labelled
from profiler_kit.kernels.summary import KernelSummary
from profiler_kit.kernels.trace import NO_LAUNCH
from profiler_kit.render import Title

COLUMNS = ("phase", "ranges", "measured_ms", "predicted_ms", "saved_ms", "saved_pct", "verdict_measured",
           "verdict_predicted")
STEP_COLUMNS = ("step", "measured_ms", "predicted_ms", "saved_ms", "saved_pct")
# The queue gap of a report in which no kernel ever waited behind another on its stream (docs/compare.md).
UNMEASURED_QUEUE_GAP_NS = 1_000
# Without launch gaps (a CUDA graph replay), kernels follow each other on a stream after this long: the median
# on an H100 (docs/compare.md), where kernels launched one by one queue 1.6-4.3 µs apart.
GRAPH_QUEUE_GAP_NS = 420
# A kernel that starts this much later than its launch and its stream explain waited for another stream.
WAIT_SLACK_NS = 2_000


RANGE_PREFIX = "range:"


@dataclass(frozen=True)
class Speedup:
    """Kernels of a category, launched inside NVTX ranges named `range:NAME`, or whose name contains `target`,
    run `factor` times faster."""

    target: str
    factor: float

    @classmethod
    def parse(cls, text: str) -> Speedup:
        target, sep, factor = text.rpartition("=")
        try:
            value = float(factor)
        except ValueError:
            value = float("nan")
        if not sep or not target or target == RANGE_PREFIX or not np.isfinite(value) or value <= 0:
            raise ProfilerKitError(f"--speedup {text!r}: expected CATEGORY, range:NAME or a kernel name, then "
                                   "=FACTOR with a factor > 0, e.g. attention=1.5")
        return cls(target, value)

    def matches(self, kernels: pd.DataFrame, index: RangeIndex | None) -> np.ndarray:
        if self.target.startswith(RANGE_PREFIX):
            hit = np.zeros(len(kernels), dtype=bool)
            if index is not None:
                ids = np.flatnonzero((index.names() == self.target[len(RANGE_PREFIX):]).to_numpy())
                hit[launches_in(kernels, index, ids)[0]] = True
            return hit
        if self.target in CATEGORIES:
            return (kernels["category"].astype(str) == self.target).to_numpy()
        return kernels["name"].astype(str).str.contains(self.target, regex=False).to_numpy()


@dataclass
class Timing:
    """The measured parameters of the replay, in ns."""

    launch_latency_ns: int
    queue_gap_ns: int
    gap_measured: bool  # False: no kernel was queued behind another, the gap is UNMEASURED_QUEUE_GAP_NS
    waits: int  # kernels that waited for another stream


def scaled_durations(kernels: pd.DataFrame, index: RangeIndex | None, speedups: list[Speedup]) -> np.ndarray:
    """Each kernel's duration after the speedups (the last one that matches a kernel wins); float ns."""
    durations = kernels["total_ns"].to_numpy().astype(np.float64)
    for speedup in speedups:
        hit = speedup.matches(kernels, index)
        if not hit.any():
            raise ProfilerKitError(f"--speedup {speedup.target}: no kernel of that category, range or name in "
                                   "the report")
        durations[hit] = kernels["total_ns"].to_numpy()[hit] / speedup.factor
    return durations


def replay(kernels: pd.DataFrame, durations: np.ndarray, ready_floor: np.ndarray | None = None,
           queue_gap_ns: float | None = None) -> tuple[np.ndarray, Timing]:
    """Predicted start of every kernel (float ns) when kernel i lasts `durations[i]`. `ready_floor`, when
    given, replaces each kernel's launch constraint (launch + latency) by that time; `queue_gap_ns`, when given,
    is every kernel's gap behind the one before it on its stream."""
    start = kernels["start_ns"].to_numpy().astype(np.float64)
    end = start + kernels["total_ns"].to_numpy()
    launch = kernels["launch_ns"].to_numpy()
    known = launch != NO_LAUNCH
    order = np.lexsort((start, kernels["stream"].to_numpy(), kernels["process"].to_numpy()))
    keys = kernels["process"].to_numpy()[order] * (1 << 20) + kernels["stream"].to_numpy()[order]
    prev = np.full(len(start), -1)
    same = np.r_[False, keys[1:] == keys[:-1]]
    prev[order[same]] = order[np.flatnonzero(same) - 1]

    prev_end = np.where(prev >= 0, end[np.maximum(prev, 0)], -np.inf)
    launch_at = np.where(known, launch, -np.inf).astype(np.float64)
    idle_launch = known & (prev_end <= launch_at)
    queued = (prev >= 0) & ~idle_launch
    latency = _median(start[idle_launch] - launch_at[idle_launch])
    positive_gaps = start - prev_end
    gap = _median(positive_gaps[queued]) if queued.any() else UNMEASURED_QUEUE_GAP_NS
    explained = np.maximum(launch_at + latency, prev_end + gap)
    waited = _waited_for(kernels, start, end, explained, order)

    # Each kernel keeps its own measured offset from the constraint that held it back; the others get the
    # report's latency and gap, never more than the kernel's own, so that nothing changed replays exactly.
    own_latency = np.where(known, start - launch_at, np.inf)
    own_gap = np.where(prev >= 0, start - prev_end, np.inf)
    dep_end = np.where(waited >= 0, end[np.maximum(waited, 0)], -np.inf)
    own_wait = start - dep_end
    by_wait = waited >= 0
    by_launch = ~by_wait & known & (launch_at + latency >= prev_end + gap)
    latency_of = np.where(by_launch, own_latency, np.minimum(latency, own_latency))
    gap_of = np.where(~by_wait & ~by_launch, own_gap, np.minimum(gap, own_gap))
    if queue_gap_ns is not None:
        gap, gap_of = queue_gap_ns, np.full(len(start), float(queue_gap_ns))
    ready = launch_at + latency_of if ready_floor is None else ready_floor
    if ready_floor is None:
        ready = np.where(known, ready, start)  # a kernel of unknown launch keeps its measured start as floor

    predicted = np.empty(len(start))
    predicted_end = np.empty(len(start))
    # Measured starts are a valid order: what a kernel waits for (stream predecessor, dependency) started first.
    prev_l, wait_l, ready_l = prev.tolist(), waited.tolist(), ready.tolist()
    gap_l, own_wait_l, dur_l = gap_of.tolist(), own_wait.tolist(), durations.tolist()
    for i in np.argsort(start, kind="stable").tolist():
        t = ready_l[i]
        p = prev_l[i]
        if p >= 0:
            t = max(t, predicted_end[p] + gap_l[i])
        w = wait_l[i]
        if w >= 0:
            t = max(t, predicted_end[w] + own_wait_l[i])
        predicted[i] = t
        predicted_end[i] = t + dur_l[i]
    return predicted, Timing(int(round(latency)), int(round(gap)), bool(queued.any()), int(by_wait.sum()))


def _median(values: np.ndarray) -> float:
    values = values[np.isfinite(values)]
    return float(np.median(values)) if len(values) else 0.0


def _waited_for(kernels: pd.DataFrame, start: np.ndarray, end: np.ndarray, explained: np.ndarray,
                order: np.ndarray) -> np.ndarray:
    """For each kernel that started later than its launch and stream explain, the kernel on another stream of
    its process that ended last at or before its start (-1 for the others)."""
    late = np.flatnonzero(start > explained + WAIT_SLACK_NS)
    waited = np.full(len(start), -1)
    if not len(late):
        return waited
    process = kernels["process"].to_numpy()
    stream = kernels["stream"].to_numpy()
    for proc in np.unique(process[late]):
        mine = np.flatnonzero(process == proc)
        by_end = mine[np.argsort(end[mine], kind="stable")]
        ends = end[by_end]
        for i in late[process[late] == proc].tolist():
            pos = int(np.searchsorted(ends, start[i], side="right")) - 1
            # Walk back past kernels of the same stream (at most a few) to the last one of another stream.
            while pos >= 0 and stream[by_end[pos]] == stream[i]:
                pos -= 1
            if pos >= 0 and ends[pos] > explained[i]:
                waited[i] = by_end[pos]
    return waited


@dataclass
class WhatIf:
    """Measured and predicted time per phase and per step."""

    summary: KernelSummary
    speedups: list[Speedup]
    launch_gaps: bool
    timing: Timing
    phases: pd.DataFrame
    steps: pd.DataFrame
    notes: list[str] = field(default_factory=list)

    def tables(self, display: bool = False) -> list[tuple[str, pd.DataFrame]]:
        key = ("measured_ms", "predicted_ms", "saved_pct")
        out = [(Title("what if: per phase", "phases", key), self.phases)]
        if len(self.steps):
            out.append((Title("what if: per step", "steps", key), self.steps))
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.summary.path),
            "speedups": [{"target": s.target, "factor": s.factor} for s in self.speedups],
            "launch_gaps": self.launch_gaps,
            "launch_latency_ns": self.timing.launch_latency_ns,
            "queue_gap_ns": self.timing.queue_gap_ns,
            "kernels_waiting_on_other_streams": self.timing.waits,
            "phases": self.phases.to_dict(orient="records"),
            "steps": self.steps.to_dict(orient="records"),
        }

    def caption(self) -> str:
        changes = ", ".join(f"{s.target} ×{s.factor:g}" for s in self.speedups) or "no kernel change"
        gaps = "" if self.launch_gaps else f"; no launch gaps (kernels {GRAPH_QUEUE_GAP_NS / 1e3:g} µs apart)"
        return (f"{self.summary.path}: {changes}{gaps}; launch latency {self.timing.launch_latency_ns / 1e3:.1f} µs, "
                f"queue gap {self.timing.queue_gap_ns / 1e3:.1f} µs (measured)")


def what_if(summary: KernelSummary, speedups: list[Speedup], launch_gaps: bool = True) -> WhatIf:
    """Replay the kernels of a summarized report with `speedups` (and without launch gaps if asked)."""
    kernels = summary.attributed
    if summary.basis != "gpu_kernels":
        # CPU operators run on their calling thread, nested and in turn: no stream, launch or queue to replay;
        # what a faster operator saves there is at most its share of the time, which the summary gives.
        raise ProfilerKitError(f"{summary.path}: a CPU trace (no GPU kernels); what-if replays GPU kernels on "
                               "their streams and takes GPU reports only (an nsys report or export, or a "
                               "torch.profiler trace of a GPU run); `kernels summarize` gives each CPU operator "
                               "category's share of the time, the most a speedup of it could save")
    if kernels is None or "start_ns" not in kernels.columns:
        raise ProfilerKitError(f"{summary.path}: what-if needs GPU kernel timestamps and launch times "
                               "(an nsys report or export, or a torch.profiler trace of a GPU run)")
    if not (kernels["launch_ns"] != NO_LAUNCH).any():
        raise ProfilerKitError(f"{summary.path}: no kernel has a known launch; what-if needs the runtime calls")
    durations = scaled_durations(kernels, summary.index, speedups)
    measured_start = kernels["start_ns"].to_numpy().astype(np.float64)
    _, timing = replay(kernels, kernels["total_ns"].to_numpy().astype(np.float64))
    floor = None
    if not launch_gaps:  # every kernel ready when the report's first one is: the host never holds the GPU back
        first = kernels["launch_ns"].to_numpy()[kernels["launch_ns"].to_numpy() != NO_LAUNCH].min()
        floor = np.full(len(kernels), min(first + timing.launch_latency_ns, measured_start.min()), dtype=np.float64)
    # The report's timing is what the first replay measured; the second one's would show a graph's queue gap.
    predicted_start, _ = replay(kernels, durations, floor, None if launch_gaps else GRAPH_QUEUE_GAP_NS)
    measured = (measured_start.astype(np.int64), (measured_start + kernels["total_ns"].to_numpy()).astype(np.int64))
    predicted = (np.rint(predicted_start).astype(np.int64), np.rint(predicted_start + durations).astype(np.int64))
    phases = _range_table(kernels, summary.labelled, measured, predicted, launch_gaps)
    step_rows = _step_table(kernels, summary.labelled, measured, predicted, launch_gaps)
    notes = list(summary.notes)
    if not timing.gap_measured:
        notes.append(f"no kernel queued behind another on its stream: the gap between queued kernels is taken "
                     f"as {UNMEASURED_QUEUE_GAP_NS / 1e3:g} µs")
    return WhatIf(summary, speedups, launch_gaps, timing, phases, step_rows, notes)


def _range_times(kernels: pd.DataFrame, index: RangeIndex, owner: np.ndarray,
                 timeline: tuple[np.ndarray, np.ndarray], launch_gaps: bool) -> pd.DataFrame:
    """Per range with kernels (`owner`: each kernel's range, a step's or a phase's, -1 for none): its time, from
    its start (or its first kernel's, if earlier, and never before the ranges before it in its process are done)
    until its last kernel was launched (when launches count) and done; and the GPU's busy time over its kernels'
    span. Ranges of one process never count the same moment twice, so when the GPU runs behind the host a step's
    time starts when the step before it is done."""
    rows = np.flatnonzero(owner >= 0)
    owners = owner[rows]
    starts, ends = timeline[0][rows], timeline[1][rows]
    spans = spans_by_owner(starts, ends, owners).set_index("owner")
    done = ends if not launch_gaps else np.maximum(ends, kernels["launch_ns"].to_numpy()[rows])
    frame = pd.DataFrame({
        "range_id": spans.index,
        "process": index.ranges["process"].to_numpy()[spans.index],
        "begin": np.minimum(index.ranges["start_ns"].to_numpy()[spans.index], spans["first_ns"].to_numpy()),
        "done": pd.Series(done).groupby(owners).max().reindex(spans.index).to_numpy(),
        "busy_ns": spans["busy_ns"].to_numpy(), "span_ns": spans["span_ns"].to_numpy(),
    }).sort_values(["process", "begin"], kind="stable")
    before = frame.groupby("process")["done"].transform(lambda d: d.cummax().shift(fill_value=np.iinfo(np.int64).min))
    frame["time_ns"] = np.maximum(frame["done"] - np.maximum(frame["begin"], before), 0)
    return frame.sort_values("range_id")[["range_id", "time_ns", "busy_ns", "span_ns"]].reset_index(drop=True)


def _verdict(busy: float, span: float) -> str:
    if span <= 0:
        return ""
    return "launch-bound" if 100.0 * (1 - busy / span) > LAUNCH_BOUND_PCT else "gpu-bound"


def _row(label: str, measured: pd.DataFrame, predicted: pd.DataFrame) -> dict[str, Any]:
    m, p = measured["time_ns"].sum(), predicted["time_ns"].sum()
    return {
        "measured_ms": m / 1e6,
        "predicted_ms": p / 1e6,
        "saved_ms": (m - p) / 1e6,
        "saved_pct": 100.0 * (m - p) / m if m > 0 else 0.0,
        "verdict_measured": _verdict(measured["busy_ns"].sum(), measured["span_ns"].sum()),
        "verdict_predicted": _verdict(predicted["busy_ns"].sum(), predicted["span_ns"].sum()),
    }


def _range_table(kernels: pd.DataFrame, labelled: Labelled, measured: tuple[np.ndarray, np.ndarray],
                 predicted: tuple[np.ndarray, np.ndarray], launch_gaps: bool) -> pd.DataFrame:
    """One row per phase, and a last row `(all kernels)` over the whole report."""
    rows = []
    index = labelled.index
    if index is not None:
        names = index.names().to_numpy()
        owner = kernels["phase_range"].to_numpy().astype(np.int64)
        m = _range_times(kernels, index, owner, measured, True)
        p = _range_times(kernels, index, owner, predicted, launch_gaps)
        for phase in labelled.phases:
            mine = names[m["range_id"].to_numpy()] == phase
            rows.append({"phase": phase, "ranges": int(mine.sum()), **_row(phase, m[mine], p[mine])})
    # The measured run starts at its first kernel, whatever the scenario; the predicted one there too, or at its
    # own first kernel when that comes earlier (no launch gaps: every kernel ready at the first launch).
    whole = []
    origin = measured[0].min()
    for starts, ends in (measured, predicted):
        span = spans_by_owner(starts, ends, np.zeros(len(starts), dtype=np.int64))
        whole.append(span.assign(time_ns=ends.max() - min(origin, starts.min())))
    rows.append({"phase": "(all kernels)", "ranges": 1, **_row("(all kernels)", *whole)})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _step_table(kernels: pd.DataFrame, labelled: Labelled, measured: tuple[np.ndarray, np.ndarray],
                predicted: tuple[np.ndarray, np.ndarray], launch_gaps: bool) -> pd.DataFrame:
    """One row per step with kernels (`labelled.steps`)."""
    steps, index = labelled.steps, labelled.index
    if index is None or not len(steps):
        return pd.DataFrame({column: pd.Series(dtype=np.int64 if column == "step" else np.float64)
                             for column in STEP_COLUMNS})
    rows = labelled.step_rows(kernels)
    owner = np.where(rows >= 0, steps["range"].to_numpy()[np.maximum(rows, 0)], -1)
    m = _range_times(kernels, index, owner, measured, True).set_index("range_id")
    p = _range_times(kernels, index, owner, predicted, launch_gaps).set_index("range_id")
    table = pd.DataFrame({
        "step": pd.Series(steps["step"].to_numpy(), index=steps["range"].to_numpy()).reindex(m.index).to_numpy(),
        "measured_ms": m["time_ns"].to_numpy() / 1e6,
        "predicted_ms": p["time_ns"].reindex(m.index).to_numpy() / 1e6,
    })
    table["saved_ms"] = table["measured_ms"] - table["predicted_ms"]
    table["saved_pct"] = 100.0 * table["saved_ms"] / table["measured_ms"].where(table["measured_ms"] > 0)
    return table
