"""Phases of a snapshot placed on its trace, and the peak of each one replayed from the trace.

Phases come from the recorder's metadata when the snapshot has it (each phase's end read from the wall clock that
also stamps the trace's `time_us`), else from the snapshot's `external_annotations`: every `record_function`
range that was open while history was recorded (`profiler_kit.phase`, PyTorch's own `Optimizer.step#AdamW.step`,
any user range) has a START and an END entry there, and each outermost range becomes a phase. A range whose name
repeats gets a `#k` suffix, so each occurrence keeps its own peak. When neither names a forward or a backward
phase (a plain script's snapshot has at most PyTorch's `Optimizer.step#…` ranges), the phases between its ranges
are inferred from the stacks of what is allocated and freed (`inferred_spans`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from profiler_kit.memory.analyze import BEFORE_TRACE, MIB, Reconstruction
from profiler_kit.memory.evidence import BACKWARD_CALL, ENGINE, MODULE_INIT, OPTIMIZER, PYTHON, phase_kind

BEFORE_TRACE_LABEL = "before trace"
AFTER_STEPS_LABEL = "after the steps"
OUTSIDE_LABEL = "outside phases"
INFERRED_SOURCE = "inferred"
# Kinds of evidence an entry of the trace gives about the phase it runs in.
_FORWARD, _BACKWARD, _OPTIMIZER = 1, 2, 3
_INFERRED_LABELS = {_FORWARD: "forward", _BACKWARD: "backward", _OPTIMIZER: "optimizer step"}
PHASE_COLUMNS = [
    "phase", "source", "start_event", "end_event", "peak_allocated_mib", "peak_reserved_mib",
    "counter_peak_allocated_mib", "completed",
]


@dataclass(frozen=True)
class PhaseSpan:
    """Trace entries [start, end) recorded during one phase; `counter_peak_bytes` is the allocator's own peak
    counter read at the phase's end (only the recorder reads it)."""

    label: str
    start: int
    end: int
    completed: bool = True
    source: str = "annotation"
    counter_peak_bytes: int | None = None


def _monotone_times(recon: Reconstruction) -> np.ndarray | None:
    # Trace times come from a calibrated cycle counter and may step back by a few µs; search a monotone copy.
    return None if recon.time_us is None else np.maximum.accumulate(recon.time_us)


def metadata_spans(recon: Reconstruction, meta: dict | None) -> list[PhaseSpan]:
    """The recorder's phases, each ending at the first trace entry after its end time."""
    phases = (meta or {}).get("phases") or []
    times = _monotone_times(recon)
    if not phases or times is None:
        return []
    several_steps = len({p["step"] for p in phases}) > 1
    spans, start = [], 0
    for p in phases:
        end = max(start, int(np.searchsorted(times, p["end_time_us"], side="right")))
        label = f"{p['phase']} (step {p['step'] + 1})" if several_steps else p["phase"]
        spans.append(PhaseSpan(label, start, end, p.get("completed", True), "recorder",
                               p.get("peak_allocated_bytes")))
        start = end
    return spans


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


def annotation_spans(recon: Reconstruction, snapshot: dict) -> list[PhaseSpan]:
    """Outermost `record_function` ranges as phases (a range inside another is part of its phase)."""
    times = _monotone_times(recon)
    if times is None:
        return []
    outer, last_end = [], None
    for name, start_us, end_us, _ in annotation_ranges(snapshot, recon.device):
        if last_end is not None and start_us < last_end:
            continue
        outer.append((name, start_us, end_us))
        last_end = end_us
    counts: dict[str, int] = {}
    for name, _, _ in outer:
        counts[name] = counts.get(name, 0) + 1
    seen: dict[str, int] = {}
    spans = []
    for name, start_us, end_us in outer:
        seen[name] = seen.get(name, 0) + 1
        label = f"{name} #{seen[name]}" if counts[name] > 1 else name
        start = int(np.searchsorted(times, start_us, side="left"))
        end = int(np.searchsorted(times, end_us, side="right"))
        spans.append(PhaseSpan(label, start, max(start, end)))
    return spans


def phase_spans(recon: Reconstruction, snapshot: dict, meta: dict | None) -> list[PhaseSpan]:
    """The recorder's phases when its metadata is there, else the snapshot's annotated ranges."""
    return metadata_spans(recon, meta) or annotation_spans(recon, snapshot)


def _entry_kinds(recon: Reconstruction, made: list[frozenset[str]], freed: list[frozenset[str]]
                 ) -> np.ndarray:
    """Per trace entry: backward where the autograd engine or the `backward()` call allocates or frees, optimizer
    where `torch/optim` allocates, forward where other Python code allocates (not a module's constructor or its
    move to the device); 0 elsewhere."""
    n = recon.n_entries
    kinds = np.zeros(n, dtype=np.int8)
    a = recon.allocations
    for start, end, m, f in zip(a["start"], a["end"], made, freed, strict=True):
        if start >= 0:
            if ENGINE in m or BACKWARD_CALL in m:
                kinds[start] = _BACKWARD
            elif OPTIMIZER in m:
                kinds[start] = _OPTIMIZER
            elif PYTHON in m and MODULE_INIT not in m:  # building or moving the model is not its forward
                kinds[start] = _FORWARD
        if end < n and (ENGINE in f or BACKWARD_CALL in f):
            kinds[end] = _BACKWARD
    return kinds


def inferred_spans(recon: Reconstruction, spans: list[PhaseSpan], made: list[frozenset[str]],
                   freed: list[frozenset[str]]) -> list[PhaseSpan]:
    """`spans` plus the forward, backward and optimizer steps inferred between them, when no span names a forward
    or a backward and the stacks show a backward (`made`/`freed`: each allocation's marks, from
    `evidence.allocation_marks`). A forward runs from the first entry that Python code allocates in to the
    backward's first entry; a backward (an optimizer step) from its first to its last entry of autograd
    (optimizer) work, so that what is kept after it (gradients, optimizer state) outlives it."""
    if any(phase_kind(s.label) in ("forward", "backward") for s in spans) or recon.n_entries == 0:
        return spans
    kinds = _entry_kinds(recon, made, freed)
    covered = np.zeros(recon.n_entries + 1, dtype=bool)
    for span in spans:
        covered[span.start:span.end] = True
    kinds[covered[:-1]] = 0
    if not (kinds == _BACKWARD).any():
        return spans
    covered_before = np.concatenate(([0], np.cumsum(covered)))  # covered entries before each index
    runs: list[list[int]] = []  # [kind, first entry, last entry]
    for i in np.flatnonzero(kinds):
        if runs and runs[-1][0] == kinds[i] and covered_before[i] == covered_before[runs[-1][2]]:
            runs[-1][2] = int(i)
        else:
            runs.append([int(kinds[i]), int(i), int(i)])
    ends = []
    for k, (kind, first, last) in enumerate(runs):
        if kind != _FORWARD:
            ends.append(last + 1)
            continue
        stop = runs[k + 1][1] if k + 1 < len(runs) else recon.n_entries
        inside = np.flatnonzero(covered[first:stop])
        ends.append(first + int(inside[0]) if len(inside) else stop)
    counts: dict[int, int] = {}
    for kind, _, _ in runs:
        counts[kind] = counts.get(kind, 0) + 1
    seen: dict[int, int] = {}
    inferred = []
    for (kind, first, _), end in zip(runs, ends, strict=True):
        seen[kind] = seen.get(kind, 0) + 1
        name = _INFERRED_LABELS[kind]
        label = f"{name} #{seen[kind]}" if counts[kind] > 1 else name
        inferred.append(PhaseSpan(label, first, end, source=INFERRED_SOURCE))
    return sorted(spans + inferred, key=lambda s: s.start)


def phase_at(spans: list[PhaseSpan], index: int) -> str | None:
    """The phase an entry index falls in; None when phases are unknown."""
    if index == BEFORE_TRACE:
        return BEFORE_TRACE_LABEL
    for span in spans:
        if span.start <= index < span.end:
            return span.label
    if not spans:
        return None
    recorder = spans[0].source == "recorder"
    return AFTER_STEPS_LABEL if recorder and index >= spans[-1].end else OUTSIDE_LABEL


def _peak_within(series: np.ndarray, initial: int, start: int, end: int) -> int:
    """Highest value from just before `start` (what the phase inherits) through entry end-1."""
    entering = initial if start == 0 else int(series[start - 1])
    inside = int(series[start:end].max()) if end > start else entering
    return max(entering, inside)


def phase_peaks(recon: Reconstruction, spans: list[PhaseSpan]) -> pd.DataFrame | None:
    """Per phase: the trace entries it covers and its peak allocated and reserved bytes replayed from the trace,
    beside the allocator counter's peak when the recorder read it."""
    if not spans:
        return None
    rows = []
    for span in spans:
        allocated = _peak_within(recon.allocated_bytes, recon.initial_allocated_bytes, span.start, span.end)
        reserved = _peak_within(recon.reserved_bytes, recon.initial_reserved_bytes, span.start, span.end)
        rows.append({
            "phase": span.label,
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
    return pd.DataFrame(rows, columns=PHASE_COLUMNS + ["peak_allocated_bytes"])
