"""The attributed timeline as a Chrome/Perfetto trace (`kernels timeline`): what ui.perfetto.dev opens.

One process track per report (per rank when several reports are given; per process of a report that holds
several), holding one thread track per CUDA stream with each kernel as a complete (`X`) event, one `phases`
track whose events span the GPU time of the kernels launched inside each phase range, and the CPU threads'
NVTX ranges. A kernel's `args.phase` names the phase it was launched in, so kernels that PyTorch's autograd
thread launched sit under `backward`. A trace without kernels (a CPU run) shows its CPU operators instead, each
call on its thread's track under that thread's ranges, and the `phases` track spans the operators of each
phase range. Phases and steps are the kernels' labels (`labels`). Times are microseconds on each report's own clock.

A `Window` shows part of each report: its steps A to B (numbered as the per-step table numbers them, the
program's own count), or a span in milliseconds from the report's first event (kernel, launch, CPU operator or
NVTX range). A window holds the kernels launched inside it (those without a known launch: started inside it)
and the ranges and CPU operator calls that overlap it, so a report of millions of kernels gives a timeline of
the steps asked for.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiler_kit.errors import ProfilerKitError, UsageProblem
from profiler_kit.files import replaced_when_complete
from profiler_kit.kernels.labels import label, ranges_of
from profiler_kit.kernels.trace import NO_LAUNCH, KernelTrace, shared_strings

NS_PER_US = 1_000
PHASES_TID = 0
# Track ids: streams from 1, CPU threads from here (nsys's global thread ids are too large for a trace viewer).
STREAM_TID_BASE = 1
THREAD_TID_BASE = 1_000
# nsys packs the OS thread id in the low 24 bits of its global thread id.
OS_TID_MASK = 0xFFFFFF
NS_PER_MS = 1_000_000
# `A:B`, `A:` or `:B`: a range of numbers, either end left open; `A` alone is `A:A`.
_SPAN = re.compile(r"^\s*([^:]*?)\s*(?::\s*([^:]*?)\s*)?$")


@dataclass(frozen=True)
class Window:
    """Part of a report for a timeline: its steps `steps` (first, last; inclusive, None open), or the span
    `span_ms` (start, end; None open) in milliseconds from the report's first event."""

    steps: tuple[int | None, int | None] | None = None
    span_ms: tuple[float | None, float | None] | None = None

    @classmethod
    def parse(cls, steps: str | None = None, span_ms: str | None = None) -> Window | None:
        """From `--steps A:B` and `--window START:END` (at most one of them); None for neither. A malformed one
        is a usage error."""
        if steps is not None and span_ms is not None:
            raise UsageProblem("--steps and --window: give one of them")
        if steps is not None:
            return cls(steps=_span(steps, "--steps", int))
        if span_ms is not None:
            return cls(span_ms=_span(span_ms, "--window", float))
        return None

    def bounds_ns(self, trace: KernelTrace, phases: list[str] | None) -> tuple[int, int]:
        """The window on `trace`'s clock: [first, last] nanoseconds."""
        if self.steps is not None:
            return _step_bounds(trace, self.steps, phases)
        origin = _first_event_ns(trace)
        start, end = (None if ms is None else origin + round(ms * NS_PER_MS) for ms in self.span_ms)
        return (origin if start is None else start), (np.iinfo(np.int64).max if end is None else end)


def _span(text: str, option: str, kind: type) -> tuple:
    """`A:B` as (A, B) of `kind`, either None where left out (`A` alone: (A, A)); A ≤ B, neither below 0."""
    match = _SPAN.match(text)
    try:
        first, last = (None if not part else kind(part) for part in match.groups()) if match else (None, None)
        if match and match.group(2) is None:
            last = first
    except ValueError:
        first = last = None
    given = [v for v in (first, last) if v is not None]
    if not given or not all(v >= 0 for v in given) or given != sorted(given):
        raise UsageProblem(f"{option} {text!r}: give FIRST:LAST, numbers from 0 with FIRST ≤ LAST (either may be "
                           "left out)")
    return first, last


def _step_bounds(trace: KernelTrace, steps: tuple[int | None, int | None],
                 phases: list[str] | None) -> tuple[int, int]:
    """From the start of the first step asked for to the end of the last, over the report's processes."""
    found = ranges_of(trace, True, phases).steps
    if not len(found):
        raise ProfilerKitError(f"--steps: {trace.path} has no steps (no repeating range holds its phases); give "
                               "--window START:END in milliseconds instead")
    numbers = found["step"].to_numpy()
    first, last = steps
    chosen = (numbers >= (numbers.min() if first is None else first)) & (numbers <= (numbers.max() if last is None
                                                                                     else last))
    if not chosen.any():
        raise ProfilerKitError(f"--steps {'' if first is None else first}:{'' if last is None else last}: "
                               f"{trace.path} has steps {numbers.min()} to {numbers.max()}")
    return int(found["start_ns"].to_numpy()[chosen].min()), int(found["end_ns"].to_numpy()[chosen].max())


def _first_event_ns(trace: KernelTrace) -> int:
    """The report's first event: the earliest kernel start or launch, CPU operator call or NVTX range start."""
    times = [frame[column].to_numpy() for frame in (trace.kernels, trace.cpu_ops) if frame is not None
             for column in ("start_ns", "launch_ns") if column in frame.columns]
    if trace.ranges is not None:
        times.append(trace.ranges["start_ns"].to_numpy())
    times = [t[t != NO_LAUNCH] for t in times]
    return int(min((t.min() for t in times if len(t)), default=0))


def windowed(trace: KernelTrace, window: Window, phases: list[str] | None = None) -> KernelTrace:
    """`trace` cut to `window`: the kernels launched in it (started in it, those without a known launch), the
    ranges and CPU operator calls that overlap it."""
    first, last = window.bounds_ns(trace, phases)

    def launched(frame: pd.DataFrame | None) -> pd.DataFrame | None:
        if frame is None or "start_ns" not in frame.columns:
            return frame
        known = frame["launch_ns"].to_numpy() if "launch_ns" in frame.columns else np.full(len(frame), NO_LAUNCH)
        at = np.where(known != NO_LAUNCH, known, frame["start_ns"].to_numpy())
        return frame[(at >= first) & (at <= last)].reset_index(drop=True)

    def overlapping(frame: pd.DataFrame | None) -> pd.DataFrame | None:
        if frame is None:
            return None
        ends = frame["end_ns"].to_numpy()
        return frame[(frame["start_ns"].to_numpy() <= last) & (ends >= first)].reset_index(drop=True)

    return replace(trace, kernels=launched(trace.kernels), ranges=overlapping(trace.ranges),
                   cpu_ops=overlapping(trace.cpu_ops))


def _meta(pid: int, tid: int | None, what: str, name: str) -> dict[str, Any]:
    event: dict[str, Any] = {"ph": "M", "pid": pid, "name": what, "args": {"name": name}}
    if tid is not None:
        event["tid"] = tid
    return event


def _complete(pid: int, tid: int, name: str, start_ns: int, dur_ns: int, cat: str,
              args: dict[str, Any] | None = None) -> dict[str, Any]:
    event = {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": cat, "ts": start_ns / NS_PER_US,
             "dur": dur_ns / NS_PER_US}
    if args:
        event["args"] = args
    return event


def _one(trace: KernelTrace, whole: KernelTrace, title: str, first_pid: int,
         phases: list[str] | None) -> list[dict[str, Any]]:
    """The events of `trace` (`whole` cut to a window, or `whole` itself), its kernels labelled by `whole`'s
    ranges."""
    kernels, kind = trace.kernels, "kernel"
    if not len(kernels) and trace.cpu_ops is not None and len(trace.cpu_ops):
        kernels, kind = trace.cpu_ops, "cpu_op"
    if "start_ns" not in kernels.columns:
        raise ProfilerKitError(f"{trace.path}: {trace.source} has no kernel timestamps; a timeline needs an nsys "
                               "report/.sqlite export or a torch.profiler trace")
    labelled = label(whole, kernels, kind, phases)
    kernels, index = labelled.kernels, labelled.index
    ranges = trace.ranges if trace.ranges is not None else pd.DataFrame(columns=["name", "start_ns", "end_ns",
                                                                                  "process", "thread"])
    processes = sorted(set(kernels["process"]) | set(ranges["process"]))
    pid_of = {proc: first_pid + i for i, proc in enumerate(processes)}
    events: list[dict[str, Any]] = []
    for proc, pid in pid_of.items():
        events.append(_meta(pid, None, "process_name", title if len(processes) == 1 else f"{title} pid {proc}"))
        events.append(_meta(pid, PHASES_TID, "thread_name", "phases"))
    starts = kernels["start_ns"].to_numpy()
    # Kernels run for their duration; an operator's call lasts to its end (its self time is less).
    ends = kernels["end_ns"].to_numpy() if kind == "cpu_op" else starts + kernels["total_ns"].to_numpy()
    phase_of = shared_strings(len(kernels), "")
    category = kernels["category"].to_numpy()
    if index is not None and len(kernels):
        owners = kernels["phase_range"].to_numpy()
        members = np.flatnonzero(owners >= 0)
        owners = owners[members]
        names = index.name
        phase_of[members] = names[owners]
        # One event per phase range: the span of the work launched inside it.
        spans = pd.DataFrame({"owner": owners, "start": starts[members], "end": ends[members]}).groupby("owner")
        for owner, first, last in spans.agg(first=("start", "min"), last=("end", "max")).itertuples():
            pid = pid_of[int(index.process[owner])]
            events.append(_complete(pid, PHASES_TID, str(names[owner]), int(first), int(last - first), "phase"))
    threads = sorted(set(zip(ranges["process"], ranges["thread"], strict=True)))
    if kind == "cpu_op":
        threads = sorted(set(threads) | set(zip(kernels["process"], kernels["stream"], strict=True)))
    thread_tid = {key: THREAD_TID_BASE + i for i, key in enumerate(threads)}
    if kind == "cpu_op":
        track = [thread_tid[key] for key in zip(kernels["process"], kernels["stream"], strict=True)]
    else:
        tid_of = {stream: STREAM_TID_BASE + i for i, stream in enumerate(sorted(set(kernels["stream"])))}
        track = [tid_of[stream] for stream in kernels["stream"]]
        for pid in pid_of.values():
            for stream, tid in tid_of.items():
                events.append(_meta(pid, tid, "thread_name", f"stream {stream}"))
    for (proc, thread), tid in thread_tid.items():
        events.append(_meta(pid_of[proc], tid, "thread_name", f"thread {int(thread) & OS_TID_MASK}"))
    for row, (name, proc) in enumerate(kernels[["name", "process"]].itertuples(index=False)):
        events.append(_complete(pid_of[proc], track[row], str(name), int(starts[row]), int(ends[row] - starts[row]),
                                str(category[row]), {"phase": phase_of[row]} if phase_of[row] else None))
    for name, start, end, proc, thread in ranges[["name", "start_ns", "end_ns", "process", "thread"]].itertuples(
            index=False):
        events.append(_complete(pid_of[proc], thread_tid[(proc, thread)], str(name), int(start), int(end - start),
                                "nvtx"))
    return events


def timeline(traces: list[tuple[str, KernelTrace]], phases: list[str] | None = None,
             window: Window | None = None) -> dict[str, Any]:
    """A Chrome trace object of `(label, trace)` pairs: one process track per trace (per process of it), each
    cut to `window` (whole when None)."""
    events: list[dict[str, Any]] = []
    for title, trace in traces:
        pids = [e["pid"] for e in events]
        shown = trace if window is None else windowed(trace, window, phases)
        events += _one(shown, trace, title, max(pids, default=-1) + 1, phases)
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(trace: dict[str, Any], path: Path, overwrite: bool = False) -> None:
    """Write under a temporary name, then put in place; gzipped when `path` ends in .gz; an existing file is an
    error unless `overwrite`."""
    opener = gzip.open if path.suffix == ".gz" else open
    with replaced_when_complete(path, overwrite=overwrite) as partial, opener(partial, "wt", encoding="utf-8") as fh:
        json.dump(trace, fh)
