"""Phases and steps of a snapshot placed on its trace, each phase labelled by its step, and their peaks.

Phases and steps are the ranges that the step and phase rule (`phase_rule`, the same as for kernel reports)
chooses among the first of these that the snapshot has:
1. The recorder's metadata (`phases` in the snapshot's `profiler_kit` entry or its sidecar): every range closed
   while it recorded, with its kind (`phase`: opened with `profiler_kit.phase`; `program`: the program's own
   ranges; `auto`: the recorder's own marks `forward`, `backward`, `optimizer_step`, `step`), the program's step
   (0-based) and its start and end on the trace's clock. A recording without kinds or start times (the built-in
   workload's) has each phase start where the previous one ended.
2. The snapshot's `external_annotations`: every `record_function` range open while history was recorded has a
   START and an END entry there, all of them the program's.
3. Inferred from the stacks (`inferred.py`), only where neither names a phase.
One step range is a step here (a snapshot often holds one step). `Optimizer.step#…` ranges that no phase holds
stand in for the optimizer step (`optimizer_step`). Without step ranges, each step ends with an optimizer step: a
phase named like one or holding PyTorch's `Optimizer.step#…` (with gradient accumulation, several forwards and
backwards run in one step).

Labels name the step, numbered as the program counted it (from 0, as the kernel summaries do), and the phase:
`step 2, backward`; a phase that runs more than once in a step is numbered (`step 2, forward #2`), as are the
repeated phases of a snapshot without steps.
Recomputation inside a backward (activation checkpointing) is part of that backward: the recorder's marks say so,
and so do the stacks the inference reads.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from profiler_kit.memory.analyze import BEFORE_TRACE, MIB, Reconstruction
from profiler_kit.memory.evidence import Marks, phase_kind
from profiler_kit.memory.inferred import inferred_runs
from profiler_kit.names import EVAL, KIND_AUTO, KIND_PROGRAM, PHASES, STEP
from profiler_kit.phase_rule import (
    PROFILER_STEP,
    RULE_KINDS,
    choose_phases,
    evaluation,
    find_steps,
    phase_ranges,
    step_numbers,
    steps_ending_with,
)
from profiler_kit.range_tree import NO_NUMBER, RangeTree

BEFORE_TRACE_LABEL = "before trace"
BEFORE_STEPS_LABEL = "before the steps"
AFTER_STEPS_LABEL = "after the steps"
OUTSIDE_LABEL = "outside phases"
ANNOTATION_SOURCE = "annotation"
RECORDER_SOURCE = "recorder"
PYTORCH_SOURCE = "pytorch"
INFERRED_SOURCE = "inferred"
OPTIMIZER_STEP = PHASES[2]
# The thread a range is placed on for the rule: the recorder's automatic marks lie on a lane of their own, as in
# kernel reports (they open in one hook and close in another, so they need not nest with the program's ranges).
_PROGRAM_LANE, _AUTO_LANE = 0, -1
NS_PER_US = 1_000
_OPTIMIZER_RANGE = re.compile(r"^Optimizer\.step#")
PHASE_COLUMNS = [
    "phase", "step", "peak_allocated_mib", "peak_reserved_mib", "source", "start_event", "end_event",
    "counter_peak_allocated_mib", "completed",
]
STEP_PEAK = "step_peak_mib"
RECORDER_STEPS = "the recorder's step numbers"


@dataclass(frozen=True)
class PhaseSpan:
    """Trace entries [start, end) recorded during one phase: its `label` (`step 2, backward`), its own name
    (`phase`), its `step` (0-based; None outside steps), and `counter_peak_bytes`, the allocator's own peak
    counter read at its end (only the built-in workload's recorder reads it)."""

    label: str
    start: int
    end: int
    completed: bool = True
    source: str = ANNOTATION_SOURCE
    counter_peak_bytes: int | None = None
    phase: str = ""
    step: int | None = None
    holds_optimizer_step: bool = False  # holds one of PyTorch's `Optimizer.step#…` ranges

    def __post_init__(self) -> None:
        if not self.phase:
            object.__setattr__(self, "phase", self.label)


@dataclass(frozen=True)
class StepSpan:
    """Trace entries [start, end) of one step (0-based)."""

    step: int
    start: int
    end: int


@dataclass
class Phases:
    """A snapshot's phases and steps on its trace, and how the steps were found (None without steps)."""

    spans: list[PhaseSpan]
    steps: list[StepSpan]
    steps_from: str | None = None


@dataclass(frozen=True)
class _Range:
    """A closed range on the trace's clock (µs), with what the recorder said about it."""

    name: str
    start_us: float
    end_us: float
    step: int | None = None
    completed: bool = True
    counter: int | None = None
    kind: str = KIND_PROGRAM


def step_label(step: int) -> str:
    """How a step is shown: its number as the program counted it (from 0), as the kernel summaries show it."""
    return f"step {step}"


def _monotone_times(recon: Reconstruction) -> np.ndarray | None:
    # Trace times come from a calibrated cycle counter and may step back by a few µs; search a monotone copy.
    return None if recon.time_us is None else np.maximum.accumulate(recon.time_us)


def _entries(times: np.ndarray, start_us: float, end_us: float) -> tuple[int, int]:
    """The trace entries [start, end) recorded from `start_us` through `end_us`."""
    start = int(np.searchsorted(times, start_us, side="left"))
    return start, max(start, int(np.searchsorted(times, end_us, side="right")))


def _outermost(ranges: list[_Range]) -> list[_Range]:
    """The ranges that start after the previous outer one ended (`ranges` in start order)."""
    out: list[_Range] = []
    for r in ranges:
        if not out or r.start_us >= out[-1].end_us:
            out.append(r)
    return out


@dataclass
class _Chosen:
    """What the rule chose among a snapshot's ranges: the phases' ranges and the steps' ranges (by start), the
    rule, and whether the step ranges are named as steps (`step`, `ProfilerStep#N`) or hold the phases."""

    phases: list[_Range]
    steps: list[_Range]
    rule: str
    named_steps: bool


def _choose(ranges: list[_Range]) -> _Chosen:
    """The phases and steps among `ranges` by the step and phase rule; a step range numbered by the recorder
    (`step`) keeps its number, the others are numbered by the rule."""
    ranges = [r for r in ranges if r.end_us > r.start_us]  # nothing happens in a range of no length
    tree = _tree(ranges)
    passes = evaluation(tree)
    if passes.any():
        ranges = [replace(r, name=EVAL, step=None) if passed else r for r, passed in zip(ranges, passes, strict=True)]
        tree = _tree(ranges)
    choice = choose_phases(tree)
    phases = [ranges[i] for i in np.flatnonzero(phase_ranges(tree, choice))]
    ids = find_steps(tree, choice.names, minimum=1)
    numbers = step_numbers(tree, ids).numbers
    steps = [replace(ranges[i], step=int(n)) for i, n in zip(ids, numbers, strict=True)]
    named = bool(len(ids)) and (tree.name[ids[0]] == STEP or bool(PROFILER_STEP.match(str(tree.name[ids[0]]))))
    return _Chosen(sorted(phases, key=lambda r: r.start_us), sorted(steps, key=lambda r: r.start_us), choice.rule,
                   named)


def _tree(ranges: list[_Range]) -> RangeTree:
    return RangeTree([r.name for r in ranges], _ns([r.start_us for r in ranges]), _ns([r.end_us for r in ranges]),
                     np.zeros(len(ranges), dtype=np.int64),
                     [_AUTO_LANE if r.kind == KIND_AUTO else _PROGRAM_LANE for r in ranges],
                     [r.kind for r in ranges], [NO_NUMBER if r.step is None else r.step for r in ranges])


def _ns(times_us: list[float]) -> np.ndarray:
    return np.rint(np.asarray(times_us, dtype=np.float64) * NS_PER_US).astype(np.int64)


def annotation_ranges(snapshot: dict, device: int) -> list[tuple[str, int, int, int]]:
    """(name, start_time_us, end_time_us, depth) of every closed range of one device, in start order; a START
    pairs with the latest open START of the same name."""
    open_ranges: dict[str, list[tuple[int, int]]] = {}
    depth = 0
    ranges = []
    for entry in snapshot.get("external_annotations") or []:
        if not isinstance(entry, dict) or entry.get("device", device) != device:
            continue
        name, stage, time_us = entry.get("name"), entry.get("stage"), entry.get("time_us")
        if not isinstance(name, str) or not isinstance(time_us, int):
            continue
        if stage == "START":
            open_ranges.setdefault(name, []).append((time_us, depth))
            depth += 1
        elif stage == "END" and open_ranges.get(name):
            start, start_depth = open_ranges[name].pop()
            depth = max(depth - 1, 0)
            ranges.append((name, start, time_us, start_depth))
    return sorted(ranges, key=lambda r: (r[1], r[3]))


def _spans(times: np.ndarray, ranges: list[_Range], source: str) -> list[PhaseSpan]:
    out = []
    for r in ranges:
        start, end = _entries(times, r.start_us, r.end_us)
        out.append(PhaseSpan(r.name, start, end, r.completed, source, r.counter, step=r.step))
    return out


def _step_spans(times: np.ndarray, ranges: list[_Range]) -> list[StepSpan]:
    """Steps from step ranges (`_choose`: numbered)."""
    return [StepSpan(r.step, *_entries(times, r.start_us, r.end_us)) for r in ranges]


def _index(lo: np.ndarray, hi: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Per value of `at`, which range [lo, hi) holds it (the last one, where ranges overlap); -1 for none."""
    if (np.diff(lo) >= 0).all() and (hi[:-1] <= lo[1:]).all():  # ordered, disjoint: one binary search
        k = np.searchsorted(lo, at, side="right") - 1
        inside = (k >= 0) & (at < hi[np.maximum(k, 0)]) if len(lo) else np.zeros(len(at), dtype=bool)
        return np.where(inside, k, -1)
    out = np.full(len(at), -1, dtype=np.int64)
    for k, (a, b) in enumerate(zip(lo, hi, strict=True)):
        out[(at >= a) & (at < b)] = k
    return out


def span_index(spans: list[PhaseSpan] | list[StepSpan], indices: np.ndarray | list[int]) -> np.ndarray:
    """Per entry index, which span holds it (the last one, where spans overlap); -1 for none."""
    return _index(np.array([s.start for s in spans], dtype=np.int64), np.array([s.end for s in spans],
                  dtype=np.int64), np.asarray(indices, dtype=np.int64))


def _held(ranges: list[_Range], inner: list[_Range]) -> np.ndarray:
    """Per range of `inner`, which of `ranges` holds its start, by time; -1 for none."""
    return _index(np.array([r.start_us for r in ranges], dtype=np.float64),
                  np.array([r.end_us for r in ranges], dtype=np.float64),
                  np.array([r.start_us for r in inner], dtype=np.float64))


def _from_metadata(times: np.ndarray, entries: list[dict]) -> tuple[list[PhaseSpan], list[StepSpan]]:
    """The recorder's ranges as the rule chooses its phases and steps; the source of a phase is the kind of range
    the rule took (RECORDER_SOURCE where the recorder wrote no kinds)."""
    chosen = _choose([_Range(p["phase"], p["start_time_us"], p["end_time_us"], p["step"], p.get("completed", True),
                             p.get("peak_allocated_bytes"), p.get("kind") or KIND_PROGRAM) for p in entries])
    kinds = any(p.get("kind") for p in entries)
    source = RULE_KINDS.get(chosen.rule, RECORDER_SOURCE) if kinds else RECORDER_SOURCE
    return _spans(times, chosen.phases, source), _step_spans(times, chosen.steps)


def _from_recorder_order(times: np.ndarray, entries: list[dict]) -> list[PhaseSpan]:
    """Phases of a recording that gives only each phase's end: each starts where the previous one ended."""
    spans, start = [], 0
    for p in entries:
        end = max(start, int(np.searchsorted(times, p["end_time_us"], side="right")))
        spans.append(PhaseSpan(p["phase"], start, end, p.get("completed", True), RECORDER_SOURCE,
                               p.get("peak_allocated_bytes"), step=p["step"]))
        start = end
    return spans


def _from_annotations(times: np.ndarray, snapshot: dict, device: int
                      ) -> tuple[list[PhaseSpan], list[StepSpan], str | None]:
    """The annotated phases with PyTorch's stand-ins, the step ranges, and what the steps are."""
    ranges = [_Range(name, start, end) for name, start, end, _ in annotation_ranges(snapshot, device)]
    chosen = _choose(ranges)
    phases = chosen.phases
    optimizer = _outermost(sorted((r for r in ranges if _OPTIMIZER_RANGE.match(r.name)),
                                  key=lambda r: (r.start_us, -r.end_us)))
    held = _held(phases, optimizer)
    holders = set(held[held >= 0].tolist())
    # PyTorch's optimizer steps that no phase holds stand in for the optimizer phase.
    stand_ins = [replace(r, name=OPTIMIZER_STEP) for r, k in zip(optimizer, held, strict=True) if k < 0]
    step_ranges = chosen.steps
    if step_ranges:  # each phase in the step whose time holds its start
        phases, stand_ins = ([replace(r, step=step_ranges[k].step if k >= 0 else None) for r, k in
                              zip(group, _held(step_ranges, group), strict=True)] for group in (phases, stand_ins))
    spans = [replace(span, holds_optimizer_step=k in holders)
             for k, span in enumerate(_spans(times, phases, ANNOTATION_SOURCE))]
    spans += _spans(times, stand_ins, PYTORCH_SOURCE)
    name = step_ranges[0].name if step_ranges else None
    steps_from = (None if name is None else f"the {name.split('#')[0]!r} ranges" if chosen.named_steps else
                  f"the {name!r} ranges, which hold the phases")
    return sorted(spans, key=lambda s: s.start), _step_spans(times, step_ranges), steps_from


def _in_steps(spans: list[PhaseSpan], steps: list[StepSpan]) -> list[PhaseSpan]:
    """The inferred spans with the step whose entries hold their start (None outside all); the others keep the
    step their times gave them."""
    held = span_index(steps, [s.start for s in spans])
    return [replace(span, step=steps[k].step if k >= 0 else None) if span.source == INFERRED_SOURCE else span
            for span, k in zip(spans, held, strict=True)]


def _by_optimizer_steps(spans: list[PhaseSpan]) -> list[PhaseSpan] | None:
    """Steps that each end with an optimizer step (a phase named like one, or holding PyTorch's
    `Optimizer.step#…`); None when no phase is one."""
    steps = steps_ending_with([s.holds_optimizer_step or phase_kind(s.phase) == "optimizer" for s in spans])
    return None if steps is None else [replace(span, step=step) for span, step in zip(spans, steps, strict=True)]


def _extents(spans: list[PhaseSpan]) -> list[StepSpan]:
    """Each step's entries: from the previous step's end (the first step: its first phase) to the end of its
    last phase, so that what runs between two steps (e.g. `zero_grad`) belongs to the next one."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for s in spans:
        if s.step is not None:
            first[s.step] = min(first.get(s.step, s.start), s.start)
            last[s.step] = max(last.get(s.step, s.end), s.end)
    out: list[StepSpan] = []
    for n in sorted(first):
        start = min(out[-1].end, first[n]) if out else first[n]
        out.append(StepSpan(n, start, max(start, last[n])))
    return out


def _labelled(spans: list[PhaseSpan]) -> list[PhaseSpan]:
    """Spans labelled by step and phase, repeats within a step (or, without steps, overall) numbered."""
    counts = Counter((s.step, s.phase) for s in spans)
    seen: Counter = Counter()
    out = []
    for s in spans:
        key = (s.step, s.phase)
        seen[key] += 1
        label = s.phase if s.step is None else f"{step_label(s.step)}, {s.phase}"
        out.append(replace(s, label=f"{label} #{seen[key]}" if counts[key] > 1 else label))
    return out


def place_phases(recon: Reconstruction, snapshot: dict, meta: dict | None, marks: Marks) -> Phases:
    """The snapshot's phases and steps by the rules of the module docstring (`marks`: each allocation's, from
    `evidence.allocation_marks`, for the inference)."""
    times = _monotone_times(recon)
    entries = [p for p in (meta or {}).get("phases") or [] if isinstance(p, dict)]
    spans: list[PhaseSpan] = []
    steps: list[StepSpan] = []
    steps_from = None
    if entries and times is not None:
        if all(p.get("start_time_us") is not None for p in entries):
            spans, steps = _from_metadata(times, entries)
        else:
            spans = _from_recorder_order(times, entries)
        steps_from = RECORDER_STEPS
    elif times is not None:
        spans, steps, steps_from = _from_annotations(times, snapshot, recon.device)
    if all(s.source == PYTORCH_SOURCE for s in spans):  # nothing names a phase: infer them
        runs = inferred_runs(recon, [(s.start, s.end) for s in spans], *marks)
        spans = sorted(spans + [PhaseSpan(n, a, b, source=INFERRED_SOURCE) for n, a, b in runs],
                       key=lambda s: s.start)
    if steps:
        spans = _in_steps(spans, steps)
    elif not any(s.step is not None for s in spans):
        grouped = _by_optimizer_steps(spans)
        spans, steps_from = (grouped, "optimizer steps: each step ends with one") if grouped else (spans, None)
    if not steps:
        steps = _extents(spans)
    return Phases(_labelled(spans), steps, steps_from if steps else None)


def phase_at(phases: Phases, index: int) -> str | None:
    """The phase an entry index falls in (the step, when it falls between phases); None when phases are
    unknown."""
    if index == BEFORE_TRACE:
        return BEFORE_TRACE_LABEL
    for span in phases.spans:
        if span.start <= index < span.end:
            return span.label
    if not phases.spans:
        return None
    for step in phases.steps:
        if step.start <= index < step.end:
            return f"{step_label(step.step)}, {OUTSIDE_LABEL}"
    if phases.steps:
        return BEFORE_STEPS_LABEL if index < phases.steps[0].start else AFTER_STEPS_LABEL
    return OUTSIDE_LABEL


def peak_within(series: np.ndarray, initial: int, start: int, end: int) -> int:
    """Highest value from just before `start` (what the range inherits) through entry end-1."""
    entering = initial if start == 0 else int(series[start - 1])
    inside = int(series[start:end].max()) if end > start else entering
    return max(entering, inside)


def phase_peaks(recon: Reconstruction, spans: list[PhaseSpan]) -> pd.DataFrame | None:
    """Per phase: its step (as the program counted it), the trace entries it covers and its peak allocated and reserved
    bytes replayed from the trace, beside the allocator counter's peak when the recorder read it."""
    if not spans:
        return None
    rows = []
    for span in spans:
        allocated = peak_within(recon.allocated_bytes, recon.initial_allocated_bytes, span.start, span.end)
        reserved = peak_within(recon.reserved_bytes, recon.initial_reserved_bytes, span.start, span.end)
        rows.append({
            "phase": span.label,
            "step": pd.NA if span.step is None else span.step,
            "source": span.source,
            "start_event": span.start,
            "end_event": span.end,
            "peak_allocated_mib": allocated / MIB,
            "peak_reserved_mib": reserved / MIB,
            "counter_peak_allocated_mib": float("nan") if span.counter_peak_bytes is None
            else span.counter_peak_bytes / MIB,
            "completed": span.completed,
            "peak_allocated_bytes": allocated,
        })
    out = pd.DataFrame(rows, columns=PHASE_COLUMNS + ["peak_allocated_bytes"])
    out["step"] = out["step"].astype("Int64")
    return out


def step_phase_peaks(recon: Reconstruction, phases: Phases) -> pd.DataFrame | None:
    """Per step (numbered as the program counted, from 0): the peak allocated MiB of each phase (the highest of
    its runs in the step; NaN where the step has none), in the order phases first appear, and the step's own
    peak, which also counts what happens between its phases."""
    if not phases.steps:
        return None
    names = list(dict.fromkeys(s.phase for s in phases.spans if s.step is not None))
    peaks: dict[tuple[int, str], int] = {}
    for s in phases.spans:
        if s.step is not None:
            peak = peak_within(recon.allocated_bytes, recon.initial_allocated_bytes, s.start, s.end)
            peaks[s.step, s.phase] = max(peaks.get((s.step, s.phase), 0), peak)
    rows = []
    for st in phases.steps:
        row: dict = {"step": st.step}
        for name in names:
            row[f"{name}_peak_mib"] = peaks[st.step, name] / MIB if (st.step, name) in peaks else float("nan")
        row[STEP_PEAK] = peak_within(recon.allocated_bytes, recon.initial_allocated_bytes, st.start, st.end) / MIB
        rows.append(row)
    return pd.DataFrame(rows, columns=["step", *(f"{n}_peak_mib" for n in names), STEP_PEAK])
