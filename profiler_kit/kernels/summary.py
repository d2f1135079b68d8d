"""Where GPU time goes: kernel time by category, top kernels, per phase, and inside one NVTX range.

`summarize(path)` loads any supported source and returns a `KernelSummary`: DataFrames for people and
`to_json()`, the machine contract:

    {"schema_version", "environment", "source", "time_basis", "kernel_count", "total_ns", "mfu",
     "categories": {category: ns}, "memory_ops_ns", "phases": {phase: {"total_ns", "categories"}},
     "phase_rule", "steps": [{"step", "state", "wall_ms", "kernel_ms", "idle_pct", "<phase>_ms"}],
     "idle": {phase: {"ranges", "wall_ns", "gpu_span_ns", "busy_ns", "idle_ns", "idle_pct", "largest_gaps_ns",
     "verdict", "dominant_gap"}}, "top_kernels": [{"name", "category", "instances", "total_ns"}],
     "profiler_overhead": {"total_ns", "share_pct", "cpu_ops_ns", "operators": {name: ns}} | null}

All times are integer nanoseconds (the per-step table's are milliseconds, as its names say), `categories`
lists every category and sums exactly to `total_ns` (kernel time only; memory operations are apart), and
`phases` is empty when the source has no NVTX ranges. `phase_rule` says which rule of `phase_rule` chose
the phases; `steps` is empty without a repeating outer range (`kernels.steps`: `step` is the program's own
number of the step, from 0, and `state` is there only when a warm-up step was seen).
`time_basis` is `gpu_kernels`, or `cpu_ops` for a trace without kernels (a CPU run), whose tables then hold
CPU operator self time. `idle` (GPU span, busy and idle time of each phase's kernels) is empty without kernel
timestamps; `mfu` is null unless FLOPs per step were given. `profiler_overhead` is the CPU operator self time
of the profiler's own module hooks (`kernels.cpu_ops.profiler_overhead`), left out of every table, against all of
the trace's CPU operator self time; null for a source without CPU operators. With
`nvtx=RANGE`, everything covers only the kernels launched inside that range, and the object gains an `nvtx`
entry with the split by the range's direct sub-ranges.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiler_kit.defaults import KERNELS_TOP
from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels.attribution import RangeIndex, membership
from profiler_kit.kernels.categories import CATEGORIES
from profiler_kit.kernels.cpu_ops import profiler_overhead, threads_note
from profiler_kit.kernels.idle import phase_idle
from profiler_kit.kernels.labels import NUMBERED_HERE, OUTSIDE_PHASES, Labelled, label, left_out
from profiler_kit.kernels.phase_metrics import (
    FlopRate,
    categories,
    flops,
    idle,
    phase_table,
    share,
    split_table,
    step_rate,
    with_ms,
)
from profiler_kit.kernels.runs import side_of
from profiler_kit.kernels.sources import load
from profiler_kit.kernels.steps import left_out_note, steady_rows, step_table, step_title
from profiler_kit.kernels.trace import KernelTrace, blocks, summed
from profiler_kit.render import Shown, Title, format_count, shorten_middle

# What the times are: GPU kernel durations, or (a trace without kernels) CPU operator self times.
GPU_KERNELS, CPU_OPS = "gpu_kernels", "cpu_ops"
DEFAULT_TOP = KERNELS_TOP
NS_PER_MS = 1_000_000
NS_PER_US = 1_000
# Kernel names are C++ signatures hundreds of characters long; a note names one in at most this many characters.
DISPLAY_NAME_CHARS = 96
# Spelled out in every ATen kernel name, telling nothing apart: namespaces and nsys's `(int)4` casts.
_NAME_NOISE = re.compile(r"at::native::|<unnamed>::|\(anonymous namespace\)::|\((?:int|unsigned long|bool)\)")
# The parameter list a template kernel's name ends with: `(T1, T2, T3...)`, `(int, T3)`, the same for most kernels.
_PARAMETERS = re.compile(r"(?<=>)\([^()]*\)$")
# How many range names an error message lists before it stops.
LISTED_RANGES = 20


@dataclass
class Overhead:
    """The profiler's own CPU operator calls (`kernels.cpu_ops.profiler_overhead`): by name (name, instances,
    total_ns of self time), and all CPU operator self time of the trace, theirs included."""

    operators: pd.DataFrame
    cpu_ops_ns: int

    @property
    def total_ns(self) -> int:
        return int(self.operators["total_ns"].sum())

    @property
    def share_pct(self) -> float:
        return self.total_ns * 100.0 / self.cpu_ops_ns if self.cpu_ops_ns else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"total_ns": self.total_ns, "share_pct": self.share_pct, "cpu_ops_ns": self.cpu_ops_ns,
                "operators": {str(r.name): int(r.total_ns) for r in self.operators.itertuples(index=False)}}

    def line(self) -> str:
        calls = format_count(int(self.operators["instances"].sum()))
        return (f"profiler overhead, left out of the tables: {self.total_ns / NS_PER_MS:.3f} ms of CPU operator self "
                f"time ({self.share_pct:.1f}% of {self.cpu_ops_ns / NS_PER_MS:.3f} ms), {calls} operator calls in the "
                "module hooks profiler_kit.instrument placed (BackwardHookFunction and what it calls)")


@dataclass
class KernelSummary:
    """The summary of one source; DataFrames hold integer nanoseconds, `tables()` converts for display."""

    source: str
    path: Path
    kernels: pd.DataFrame  # one row per kernel name: name, category, instances, total_ns; largest first
    phases: pd.DataFrame | None  # phase, category, instances, total_ns; None without NVTX ranges
    phase_names: list[str]  # the phases reported, in order (OUTSIDE_PHASES is not one)
    memory_ops: pd.DataFrame | None
    ranges: pd.DataFrame | None  # NVTX range names: name, instances, total_ns (wall time of the ranges)
    top: int = DEFAULT_TOP
    nvtx: str | None = None
    sub_ranges: pd.DataFrame | None = None  # sub_range, category, instances, total_ns
    notes: list[str] = field(default_factory=list)
    basis: str = GPU_KERNELS
    idle: pd.DataFrame | None = None  # per phase: where the GPU idles (kernels.idle.phase_idle)
    attributed: pd.DataFrame | None = None  # one row per execution, with its category (what `kernels` sums)
    index: RangeIndex | None = None  # the report's NVTX ranges, nested
    labelled: Labelled | None = None  # the kernels' labels (kernels.labels), before --nvtx picks some
    phase_rule: str = "none"  # which rule chose the phases (phase_rule.choose_phases)
    steps: pd.DataFrame | None = None  # one row per step (kernels.steps.step_table); None without steps
    overhead: Overhead | None = None  # the profiler's own CPU operators, left out (None without CPU operators)
    steady_ranges: np.ndarray | None = None  # the ranges inside the steady steps (None: every range counts)
    flops: FlopRate | None = None  # the FLOPs given, for the FLOP rate and MFU (`with_flops`)

    def with_flops(self, rate: FlopRate) -> KernelSummary:
        """This summary with the TFLOP/s and MFU that `rate` gives (`phase_metrics.flops`, `step_rate`): over the
        GPU span of each phase and of all phases together; a note where there is no span to rate."""
        notes = self.notes if self.idle is not None else [*self.notes, "no FLOP rate: it needs kernel timestamps "
                                                                        "and phases"]
        return replace(self, flops=rate, notes=notes)

    @property
    def step_mfu(self) -> dict[str, float | None] | None:
        """TFLOP/s and MFU over all phases, from the FLOPs of one step (None unless given)."""
        return step_rate(self)

    @property
    def timed(self) -> str:
        """What the tables time, within a sentence."""
        return "kernel time" if self.basis == GPU_KERNELS else "CPU operator self time"

    @property
    def counted(self) -> str:
        """What the tables count: kernels, or (a trace without kernels) CPU operators."""
        return "kernels" if self.basis == GPU_KERNELS else "operators"

    @property
    def kernel_count(self) -> int:
        return int(self.kernels["instances"].sum())

    @property
    def total_ns(self) -> int:
        return int(self.kernels["total_ns"].sum())

    @property
    def memory_ops_ns(self) -> int | None:
        return None if self.memory_ops is None else int(self.memory_ops["total_ns"].sum())

    def category_ns(self) -> dict[str, int]:
        return _category_ns(self.kernels)

    def phase_ns(self) -> dict[str, dict[str, Any]]:
        """phase → {"total_ns", "categories"}, in the order the phases were asked for."""
        if self.phases is None:
            return {}
        wide = self.phases.pivot_table(index="phase", columns="category", values="total_ns", aggfunc="sum",
                                       fill_value=0, observed=False)
        wide = wide.reindex(index=self.phase_names, columns=list(CATEGORIES), fill_value=0).astype(np.int64)
        return {phase: {"total_ns": sum(row), "categories": dict(zip(CATEGORIES, row, strict=True))}
                for phase, row in zip(self.phase_names, wide.to_numpy().tolist(), strict=True)}

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "source": self.source,
            "time_basis": self.basis,
            "kernel_count": self.kernel_count,
            "total_ns": self.total_ns,
            "categories": self.category_ns(),
            "memory_ops_ns": self.memory_ops_ns,
            "phases": self.phase_ns(),
            "phase_rule": self.phase_rule,
            "steps": [] if self.steps is None else self.steps.to_dict("records"),
            "mfu": self.step_mfu,
            "profiler_overhead": self.overhead.to_json() if self.overhead is not None else None,
            "idle": {} if self.idle is None else {
                r["phase"]: {k: v for k, v in r.items() if k != "phase"} for r in self._idle_records()
            },
            "top_kernels": [
                {
                    "name": r.name,
                    "category": r.category,
                    "instances": int(r.instances),
                    "total_ns": int(r.total_ns),
                }
                for r in self.kernels.head(self.top).itertuples(index=False)
            ],
        }
        # The report as one side of a comparison (`kernels compare --baseline`): its runs and its kernels.
        obj["runs"] = side_of([self], "A").to_json()
        if self.nvtx is not None:
            obj["nvtx"] = {
                "range": self.nvtx,
                "sub_ranges": {
                    name: {"total_ns": int(rows["total_ns"].sum()), "categories": _category_ns(rows)}
                    for name, rows in self.sub_ranges.groupby("sub_range", sort=False)
                },
            }
        return obj

    def _idle_records(self) -> list[dict[str, Any]]:
        """The idle figures of each phase in ns, with the FLOP rate when FLOPs were given."""
        rate = flops(self)
        raw = self.idle if rate is None else self.idle.assign(**{c: rate[c].to_numpy() for c in rate.columns})
        return raw.to_dict("records")

    def category_table(self) -> pd.DataFrame:
        grouped = self.kernels.groupby("category").agg(
            **{self.counted: ("instances", "sum")}, total_ns=("total_ns", "sum")
        )
        table = grouped.reindex([c for c in CATEGORIES if c in grouped.index]).reset_index()
        return with_ms(table, self.total_ns)

    def top_table(self, display: bool = False) -> pd.DataFrame:
        top = self.kernels.head(self.top)
        table = pd.DataFrame(
            {
                "name": top["name"].map(display_name) if display else top["name"],
                "category": top["category"],
                "instances": top["instances"],
                "total_ms": top["total_ns"] / NS_PER_MS,
                "avg_us": top["total_ns"] / top["instances"].clip(lower=1) / NS_PER_US,
                "share_pct": share(top["total_ns"], self.total_ns),
            }
        )
        return table.reset_index(drop=True)

    def phase_table(self) -> pd.DataFrame:
        """The phases' categories (`phase_metrics.categories`), one row per phase."""
        return categories(self).reset_index()

    def idle_table(self) -> pd.DataFrame:
        """Where the GPU idles per phase, with the FLOP rate when FLOPs were given (`phase_metrics`)."""
        table = idle(self)
        rate = flops(self)
        return (table if rate is None else table.join(rate)).reset_index()

    def phase_metrics(self) -> pd.DataFrame:
        """Every per-phase metric side by side (`phase_metrics.phase_table`)."""
        return phase_table(self)

    def sub_range_table(self) -> pd.DataFrame:
        order = list(dict.fromkeys(self.sub_ranges["sub_range"]))
        return split_table(self.sub_ranges, "sub_range", self.total_ns, order, self.counted)

    def tables(self, display: bool = False) -> list[tuple[str, pd.DataFrame]]:
        """The titled tables; each title is a `Title` with the table's name, the same for GPU and CPU traces and
        whatever `top` (`categories`, `top_kernels`, `phases`, `steps`, `idle`, `sub_ranges`, `memory_ops`;
        `nvtx_ranges` for a report without kernels), and the key columns a narrow table keeps."""
        where = f" inside `{self.nvtx}`" if self.nvtx else ""
        shares = ("total_ms", "share_pct")
        by_category = (
            Title(f"{self.timed[0].upper()}{self.timed[1:]} by category{where} ({self.source}: {self.path.name})",
                  "categories", shares),
            self.category_table(),
        )
        if self.kernel_count == 0:
            # Nothing to break down; what the report does hold tells whether the recording worked.
            if self.ranges is None:
                return [by_category]
            ranges = self.ranges.assign(total_ms=self.ranges["total_ns"] / NS_PER_MS).drop(columns="total_ns")
            return [(Title("NVTX ranges (no kernels in this report)", "nvtx_ranges", ("total_ms",)), ranges)]
        items = "kernels" if self.basis == GPU_KERNELS else "CPU operators"
        tables = [by_category, (Title(f"Top {self.top} {items}{where}", "top_kernels", ("category", *shares)),
                                self.top_table(display))]
        if self.phase_names:
            phases = self.phase_table()
            every = self.phase_metrics().set_index("phase").drop(columns=list(phases.columns[1:]))
            tables.append((Title(f"Per phase{where}: share of each phase's {self.timed}", "phases", shares),
                           Shown(phases, list(phases.columns), every.reindex(phases["phase"]).reset_index(drop=True))))
        if self.steps is not None:
            tables.append((Title(f"Per step{where}: {step_title(self.steps)}", "steps",
                                 ("state", "wall_ms", "kernel_ms", "operator_ms", "idle_pct")), self.steps))
        if self.idle is not None:
            tables.append((Title(f"Where the GPU idles, per phase{where} (launch-bound: idle above half the GPU "
                                 "span)", "idle", ("idle_pct", "verdict", "mfu_pct")), self.idle_table()))
        if self.sub_ranges is not None:
            tables.append((Title(f"`{self.nvtx}` split by its sub-ranges: {self.timed}", "sub_ranges", shares),
                           self.sub_range_table()))
        if self.memory_ops is not None and len(self.memory_ops):
            memory = self.memory_ops.assign(total_ms=self.memory_ops["total_ns"] / NS_PER_MS)
            scope = "whole report, " if self.nvtx else ""
            tables.append((Title(f"Memory operations ({scope}not in kernel time)", "memory_ops", ("total_ms",)),
                           memory.drop(columns="total_ns")))
        return tables

    def caption(self) -> str:
        memory = "unknown" if self.memory_ops_ns is None else f"{self.memory_ops_ns / NS_PER_MS:.3f} ms"
        if self.step_mfu is not None and self.step_mfu["tflops"] is not None:
            mfu = self.step_mfu["mfu_pct"]
            lines_mfu = [f"{self.step_mfu['tflops']:.1f} TFLOP/s over the phases' GPU span"
                         + (f", MFU {mfu:.1f}%" if mfu is not None else "")]
        else:
            lines_mfu = []
        lines = [
            f"{format_count(self.kernel_count)} {'kernels' if self.basis == GPU_KERNELS else 'CPU operator calls'}, "
            f"{self.total_ns / NS_PER_MS:.3f} ms of {self.timed}; memory operations: {memory}"
        ]
        if self.overhead is not None and self.overhead.total_ns:
            lines.append(self.overhead.line())
        return "\n".join(lines + lines_mfu + [f"note: {n}" for n in self.notes])


def display_name(name: str, width: int | None = None) -> str:
    """A kernel name for people: no return type, ATen namespaces, integer casts or a template kernel's parameter
    list; cut once (`render.shorten_middle`) to `width` characters when given (in a note; a table cuts its names
    once, to what its width leaves)."""
    short = _PARAMETERS.sub("", _NAME_NOISE.sub("", name.removeprefix("void ")))
    return short if width is None else shorten_middle(short, width)


def summarize(
    path: str | Path,
    top: int = DEFAULT_TOP,
    phases: list[str] | tuple[str, ...] | None = None,
    nvtx: str | None = None,
) -> KernelSummary:
    """Summarize any supported kernel report. `phases` None means the default phases, those present."""
    return summarize_trace(load(path), top=top, phases=phases, nvtx=nvtx)


def summarize_trace(
    trace: KernelTrace,
    top: int = DEFAULT_TOP,
    phases: list[str] | tuple[str, ...] | None = None,
    nvtx: str | None = None,
    rank: int | None = None,
) -> KernelSummary:
    """Summarize a loaded report; `rank`: the job's rank of its events (`kernels.ranks`), else as recorded."""
    if top < 1:
        raise ProfilerKitError(f"--top must be at least 1, got {top}")
    notes = list(trace.notes)
    timed, kind, basis = trace.kernels, "kernel", GPU_KERNELS
    overhead = None
    if trace.cpu_ops is not None:
        own = profiler_overhead(trace.cpu_ops, trace.ranges)
        theirs = by_name(trace.cpu_ops[own].assign(category="other"))
        overhead = Overhead(theirs, int(trace.cpu_ops["total_ns"].sum()))
        cpu_ops = trace.cpu_ops[~own]
        if not len(trace.kernels) and len(cpu_ops):
            timed, kind, basis = cpu_ops, "cpu_op", CPU_OPS
            notes.append("no GPU kernels in this trace: the tables show CPU operator self time instead")
    labelled = label(trace, timed, kind, phases, rank)
    notes += labelled.notes
    kernels, index = labelled.kernels, labelled.index
    sub_ranges = None
    if nvtx is not None:
        kernels, sub_ranges = _inside(kernels, index, trace, nvtx)
    summary = KernelSummary(
        source=trace.source, path=trace.path, kernels=by_name(kernels), phases=None, phase_names=labelled.phases,
        memory_ops=trace.memory_ops, ranges=_range_list(trace.ranges) if trace.ranges is not None else None,
        top=top, nvtx=nvtx, sub_ranges=sub_ranges, notes=notes, basis=basis, attributed=kernels, index=index,
        phase_rule=labelled.choice.rule, overhead=overhead, labelled=labelled,
    )
    if index is not None:
        _add_phases(summary, asked=phases is not None)
    return summary


def _add_phases(summary: KernelSummary, asked: bool) -> None:
    """The phase totals, the per-step table, where the GPU idles (on the steady steps) and the notes about
    them, into `summary` (whose `attributed` kernels and `labelled` are set)."""
    kernels, labelled, notes, names = summary.attributed, summary.labelled, summary.notes, summary.phase_names
    summary.phases = _phases(kernels, labelled, asked, notes)
    timestamped = summary.basis == GPU_KERNELS and "start_ns" in kernels.columns
    steps = labelled.steps
    steady = None
    if len(steps):
        if not labelled.own_numbers:
            notes.append(NUMBERED_HERE)
        summary.steps = step_table(kernels, labelled, timestamped)
        if summary.basis == CPU_OPS:  # operators' time, and no GPU to idle
            summary.steps = summary.steps.rename(columns={"kernel_ms": "operator_ms"}).drop(columns="idle_pct")
            threads = threads_note(kernels, labelled.step_rows(kernels), summary.steps)
            if threads:
                notes.append(threads)
        note = left_out_note(summary.steps, "where the GPU idles")
        if timestamped and note:
            steady = labelled.within_steps(np.flatnonzero(steady_rows(summary.steps)))
            summary.steady_ranges = steady
            notes.append(note)
    if timestamped and names:
        summary.idle = phase_idle(kernels, labelled, steady)
        gaps = summary.idle[summary.idle["dominant_gap"].notna()]
        notes += [_gap_note(phase, gap) for phase, gap in zip(gaps["phase"], gaps["dominant_gap"], strict=True)]
    if summary.nvtx is not None:
        empty = [p for p in names if p not in set(summary.phases.loc[summary.phases["total_ns"] > 0, "phase"])]
        if empty:
            notes.append(
                f"no kernel inside {summary.nvtx!r} falls in {', '.join(empty)}: kernels are attributed to the "
                "ranges open when they were launched, and e.g. PyTorch's autograd thread runs a layer's backward "
                "outside the forward's per-layer ranges"
            )
    notes += left_out(labelled, kernels, int(kernels["total_ns"].sum()), summary.timed)


def _gap_note(phase: str, gap: dict[str, Any]) -> str:
    """What one gap that holds most of a phase's idle time is, where it is, and the idle share without it."""
    return (
        f"{phase}: one idle gap of {gap['gap_ns'] / NS_PER_MS:.1f} ms holds {gap['share_of_idle_pct']:.0f}% of "
        f"its idle time (range {gap['range']} of {gap['ranges']}, {gap['offset_ns'] / NS_PER_MS:.1f} ms into "
        f"its GPU span, before {display_name(gap['next_kernel'], DISPLAY_NAME_CHARS)}): start-up, compilation or "
        f"autotuning, not launch overhead; without it the GPU idles {gap['rest_idle_pct']:.0f}% of the span"
    )


def by_name(kernels: pd.DataFrame) -> pd.DataFrame:
    """One row per kernel name, largest total first (ties by name, so the order is stable)."""
    names = kernels["name"].astype("category")
    sums = _label_sums(kernels, (None, names.cat.codes.to_numpy()))
    grouped = pd.DataFrame({"name": names.cat.categories.to_numpy(dtype=object)[sums["label"].to_numpy()],
                            "category": np.asarray(CATEGORIES, dtype=object)[sums["category"].to_numpy()],
                            "instances": sums["instances"], "total_ns": sums["total_ns"]})
    grouped = grouped.astype({"name": str, "category": str})
    return grouped.sort_values(["total_ns", "name"], ascending=[False, True], ignore_index=True)


def _label_sums(kernels: pd.DataFrame, *parts: tuple[np.ndarray | None, np.ndarray]) -> pd.DataFrame:
    """label, category (its position in CATEGORIES), instances and total_ns summed per label and category, for
    the pairs that hold a kernel, in order. Each part is (rows, labels): the kernels at `rows` (all for None)
    with one integer label per row taken; summed a block of rows at a time."""
    width = len(CATEGORIES)
    category = pd.Categorical(kernels["category"], categories=list(CATEGORIES)).codes
    instances, total = kernels["instances"].to_numpy(), kernels["total_ns"].to_numpy()

    def cells(rows: np.ndarray | None, labels: np.ndarray, block: slice) -> tuple[np.ndarray, ...]:
        taken = block if rows is None else rows[block]
        return (np.asarray(labels[block], dtype=np.int64) * width + category[taken], instances[taken],
                total[taken])

    keys, (instances, total) = summed((cells(rows, labels, block) for rows, labels in parts
                                       for block in blocks(len(labels))), 2)
    return pd.DataFrame({"label": keys // width, "category": keys % width, "instances": instances,
                         "total_ns": total})


def _ids_named(index: RangeIndex, names: list[str]) -> np.ndarray:
    return np.flatnonzero(index.names().isin(names).to_numpy())


def label_totals(kernels: pd.DataFrame, labels: list[str], column: str,
            *parts: tuple[np.ndarray, np.ndarray]) -> pd.DataFrame:
    """`column`, category, instances, total_ns of the kernels of `parts` ((rows, label positions) each) under
    their labels, labels in order and the larger categories first."""
    grouped = _label_sums(kernels, *parts)
    # A sort on several columns is stable: equal totals of one label stay in category order.
    grouped = grouped.sort_values(["label", "total_ns"], ascending=[True, False], ignore_index=True)
    return pd.DataFrame(
        {
            column: np.asarray(labels, dtype=object)[grouped["label"].to_numpy()],
            "category": np.asarray(CATEGORIES, dtype=object)[grouped["category"].to_numpy()],
            "instances": grouped["instances"],
            "total_ns": grouped["total_ns"],
        }
    )


def _phases(kernels: pd.DataFrame, labelled: Labelled, asked: bool, notes: list[str]) -> pd.DataFrame:
    """Kernel totals per phase and category (kernels launched in no phase under OUTSIDE_PHASES)."""
    names = labelled.phases
    if asked:
        present = set(labelled.index.names())
        missing = [p for p in names if p not in present]
        if missing:
            notes.append(f"no NVTX range named {', '.join(missing)} in this report")
    codes = labelled.phase_codes(kernels)
    rows = np.flatnonzero(codes >= 0)
    return label_totals(kernels, [*names, OUTSIDE_PHASES], "phase", (rows, codes[rows]))


def _inside(
    kernels: pd.DataFrame, index: RangeIndex | None, trace: KernelTrace, nvtx: str
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The kernels launched inside every range named `nvtx`, and their split by its direct sub-ranges."""
    if index is None:
        why = "has no NVTX ranges" if trace.ranges is not None else "cannot hold NVTX ranges"
        raise ProfilerKitError(
            f"--nvtx {nvtx}: {trace.path} ({trace.source}) {why}; "
            "use an nsys report/.sqlite export or a torch.profiler trace with ranges"
        )
    targets = _ids_named(index, [nvtx])
    if not len(targets):
        names = list(dict.fromkeys(index.names()))
        listed = ", ".join(names[:LISTED_RANGES]) + (", …" if len(names) > LISTED_RANGES else "")
        raise ProfilerKitError(f"--nvtx {nvtx}: no NVTX range of that name; the report has: {listed}")
    inside = membership(kernels, index, targets, [nvtx])[0]
    children = index.children_of(targets)
    labels = [*dict.fromkeys(index.names().to_numpy()[children]), f"(rest of {nvtx})"]
    child_rows, child_codes = membership(kernels, index, children, labels)
    # Sub-ranges of one range never overlap; across threads a launch may fall in two, the first one counts.
    label_of = np.full(len(kernels), len(labels) - 1)
    label_of[child_rows[::-1]] = child_codes[::-1]
    split = label_totals(kernels, labels, "sub_range", (inside, label_of[inside]))
    return kernels.iloc[inside].reset_index(drop=True), split


def _range_list(ranges: pd.DataFrame) -> pd.DataFrame:
    grouped = ranges.assign(total_ns=ranges["end_ns"] - ranges["start_ns"]).groupby("name", sort=False)
    return grouped.agg(instances=("total_ns", "size"), total_ns=("total_ns", "sum")).reset_index()


def _category_ns(rows: pd.DataFrame) -> dict[str, int]:
    sums = rows.groupby("category")["total_ns"].sum()
    return {c: int(sums.get(c, 0)) for c in CATEGORIES}
