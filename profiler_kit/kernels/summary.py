"""Where GPU time goes: kernel time by category, top kernels, per phase, and inside one NVTX range.

`summarize(path)` loads any supported source and returns a `KernelSummary`: DataFrames for people and
`to_json()`, the machine contract:

    {"schema_version", "environment", "source", "time_basis", "kernel_count", "total_ns", "mfu",
     "categories": {category: ns}, "memory_ops_ns", "phases": {phase: {"total_ns", "categories"}},
     "idle": {phase: {"ranges", "wall_ns", "gpu_span_ns", "busy_ns", "idle_ns", "idle_pct", "largest_gaps_ns",
     "verdict"}}, "top_kernels": [{"name", "category", "instances", "total_ns"}]}

All times are integer nanoseconds, `categories` lists every category and sums exactly to `total_ns` (kernel
time only; memory operations are apart), and `phases` is empty when the source has no NVTX ranges.
`time_basis` is `gpu_kernels`, or `cpu_ops` for a trace without kernels (a CPU run), whose tables then hold
CPU operator self time. `idle` (GPU span, busy and idle time of each phase's kernels) is empty without kernel
timestamps; `mfu` is null unless FLOPs per step were given. With
`nvtx=RANGE`, everything covers only the kernels launched inside that range, and the object gains an `nvtx`
entry with the split by the range's direct sub-ranges.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels.attribution import RangeIndex
from profiler_kit.kernels.categories import CATEGORIES, categorize
from profiler_kit.kernels.idle import phase_idle
from profiler_kit.kernels.sources import load
from profiler_kit.kernels.trace import NO_LAUNCH, KernelTrace

DEFAULT_PHASES = ("forward", "backward", "optimizer_step")
# Top-level ranges that hold no step of the program, left out when phases are found in a report.
NOT_PHASES = ("warmup",)
# What the times are: GPU kernel durations, or (a trace without kernels) CPU operator self times.
GPU_KERNELS, CPU_OPS = "gpu_kernels", "cpu_ops"
DEFAULT_TOP = 10
NS_PER_MS = 1_000_000
NS_PER_US = 1_000
OUTSIDE_PHASES = "(outside phases)"
# Kernel names are C++ signatures hundreds of characters long; the people-facing table shows their start.
DISPLAY_NAME_CHARS = 96
# Spelled out in every ATen kernel name, telling nothing apart: namespaces and nsys's `(int)4` casts.
_NAME_NOISE = re.compile(r"at::native::|<unnamed>::|\(anonymous namespace\)::|\((?:int|unsigned long|bool)\)")
# How many range names an error message lists before it stops.
LISTED_RANGES = 20


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
    step_mfu: dict[str, float | None] | None = None  # over all phases, from FLOPs per step (`add_flops`)
    attributed: pd.DataFrame | None = None  # one row per execution, with its category (what `kernels` sums)
    index: RangeIndex | None = None  # the report's NVTX ranges, nested

    def add_flops(self, per_phase: dict[str, float] | None = None, per_step: float | None = None,
                  peak_tflops: float | None = None) -> None:
        """Achieved TFLOP/s and MFU over the GPU span of each phase whose FLOPs (per range) are in
        `per_phase`, and over all phases together from `per_step`; MFU needs the GPU's `peak_tflops`."""
        if self.idle is None:
            self.notes.append("no FLOP rate: it needs kernel timestamps and phases")
            return
        flops = self.idle["phase"].map(per_phase or {}).astype(float) * self.idle["ranges"]
        tflops = flops / self.idle["gpu_span_ns"].replace(0, np.nan) / 1e3
        self.idle["tflops"] = tflops
        self.idle["mfu_pct"] = tflops * 100.0 / peak_tflops if peak_tflops else np.nan
        if per_step is not None:
            span = int(self.idle["gpu_span_ns"].sum())
            achieved = per_step * int(self.idle["ranges"].max()) / span / 1e3 if span else None
            mfu = achieved * 100.0 / peak_tflops if achieved is not None and peak_tflops else None
            self.step_mfu = {"flops_per_step": per_step, "tflops": achieved, "mfu_pct": mfu,
                             "peak_tflops": peak_tflops}

    @property
    def timed(self) -> str:
        """What the tables time, for titles."""
        return "Kernel time" if self.basis == GPU_KERNELS else "CPU operator self time"

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
        out = {}
        for phase in self.phase_names:
            rows = self.phases[self.phases["phase"] == phase]
            out[phase] = {"total_ns": int(rows["total_ns"].sum()), "categories": _category_ns(rows)}
        return out

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "source": self.source,
            "time_basis": self.basis,
            "kernel_count": self.kernel_count,
            "total_ns": self.total_ns,
            "categories": self.category_ns(),
            "memory_ops_ns": self.memory_ops_ns,
            "phases": self.phase_ns(),
            "mfu": self.step_mfu,
            "idle": {} if self.idle is None else {
                r["phase"]: {k: v for k, v in r.items() if k != "phase"} for r in self.idle.to_dict("records")
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
        if self.nvtx is not None:
            obj["nvtx"] = {
                "range": self.nvtx,
                "sub_ranges": {
                    name: {"total_ns": int(rows["total_ns"].sum()), "categories": _category_ns(rows)}
                    for name, rows in self.sub_ranges.groupby("sub_range", sort=False)
                },
            }
        return obj

    def category_table(self) -> pd.DataFrame:
        grouped = self.kernels.groupby("category").agg(
            kernels=("instances", "sum"), total_ns=("total_ns", "sum")
        )
        table = grouped.reindex([c for c in CATEGORIES if c in grouped.index]).reset_index()
        return _with_ms(table, self.total_ns)

    def top_table(self, display: bool = False) -> pd.DataFrame:
        top = self.kernels.head(self.top)
        table = pd.DataFrame(
            {
                "name": top["name"].map(display_name) if display else top["name"],
                "category": top["category"],
                "instances": top["instances"],
                "total_ms": top["total_ns"] / NS_PER_MS,
                "avg_us": top["total_ns"] / top["instances"].clip(lower=1) / NS_PER_US,
                "share_pct": _share(top["total_ns"], self.total_ns),
            }
        )
        return table.reset_index(drop=True)

    def phase_table(self) -> pd.DataFrame:
        outside = [OUTSIDE_PHASES] if (self.phases["phase"] == OUTSIDE_PHASES).any() else []
        return _split_table(self.phases, "phase", self.total_ns, [*self.phase_names, *outside])

    def idle_table(self) -> pd.DataFrame:
        table = self.idle.copy()
        for column in ("wall", "gpu_span", "busy", "idle"):
            table[f"{column}_ms"] = table.pop(f"{column}_ns") / NS_PER_MS
        gaps = table.pop("largest_gaps_ns").map(lambda g: ", ".join(f"{x / NS_PER_US:.1f}" for x in g))
        table["largest_gaps_us"] = gaps
        flops = [c for c in ("tflops", "mfu_pct") if c in table.columns]
        return table[["phase", "ranges", "wall_ms", "gpu_span_ms", "busy_ms", "idle_ms", "idle_pct",
                      "largest_gaps_us", "verdict", *flops]]

    def sub_range_table(self) -> pd.DataFrame:
        order = list(dict.fromkeys(self.sub_ranges["sub_range"]))
        return _split_table(self.sub_ranges, "sub_range", self.total_ns, order)

    def tables(self, display: bool = False) -> list[tuple[str, pd.DataFrame]]:
        where = f" inside `{self.nvtx}`" if self.nvtx else ""
        by_category = (
            f"{self.timed} by category{where} ({self.source}: {self.path.name})",
            self.category_table(),
        )
        if self.kernel_count == 0:
            # Nothing to break down; what the report does hold tells whether the recording worked.
            if self.ranges is None:
                return [by_category]
            ranges = self.ranges.assign(total_ms=self.ranges["total_ns"] / NS_PER_MS).drop(columns="total_ns")
            return [("NVTX ranges (no kernels in this report)", ranges)]
        items = "kernels" if self.basis == GPU_KERNELS else "CPU operators"
        tables = [by_category, (f"Top {self.top} {items}{where}", self.top_table(display))]
        if self.phase_names:
            tables.append((f"Per phase{where}: share of each phase's {self.timed[0].lower()}{self.timed[1:]}",
                           self.phase_table()))
        if self.idle is not None:
            tables.append((f"Where the GPU idles, per phase{where} (launch-bound: idle above half the GPU span)",
                           self.idle_table()))
        if self.sub_ranges is not None:
            tables.append((f"`{self.nvtx}` split by its sub-ranges: kernel time", self.sub_range_table()))
        if self.memory_ops is not None and len(self.memory_ops):
            memory = self.memory_ops.assign(total_ms=self.memory_ops["total_ns"] / NS_PER_MS)
            scope = "whole report, " if self.nvtx else ""
            tables.append((f"Memory operations ({scope}not in kernel time)", memory.drop(columns="total_ns")))
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
            f"{self.kernel_count} {'kernels' if self.basis == GPU_KERNELS else 'CPU operator calls'}, "
            f"{self.total_ns / NS_PER_MS:.3f} ms of {self.timed[0].lower()}{self.timed[1:]}; "
            f"memory operations: {memory}"
        ]
        return "\n".join(lines + lines_mfu + [f"note: {n}" for n in self.notes])


def display_name(name: str) -> str:
    """A kernel name shortened for a table: no return type, ATen namespaces or integer casts, then cut."""
    short = _NAME_NOISE.sub("", name.removeprefix("void "))
    return short if len(short) <= DISPLAY_NAME_CHARS else short[: DISPLAY_NAME_CHARS - 1] + "…"


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
) -> KernelSummary:
    if top < 1:
        raise ProfilerKitError(f"--top must be at least 1, got {top}")
    notes = list(trace.notes)
    timed, kind, basis = trace.kernels, "kernel", GPU_KERNELS
    if not len(trace.kernels) and trace.cpu_ops is not None and len(trace.cpu_ops):
        timed, kind, basis = trace.cpu_ops, "cpu_op", CPU_OPS
        notes.append("no GPU kernels in this trace: the tables show CPU operator self time instead")
    kernels = timed.assign(category=categorize(timed["name"], kind))
    has_ranges = trace.ranges is not None and len(trace.ranges) > 0
    index = RangeIndex(trace.ranges) if has_ranges and "launch_ns" in kernels.columns else None
    if index is not None and index.overlapping:
        notes.append("some NVTX ranges of one thread overlap without nesting; kernels in them may be missed")
    sub_ranges = None
    if nvtx is not None:
        kernels, sub_ranges = _inside(kernels, index, trace, nvtx)
    phase_rows, phase_names = _phases(kernels, index, phases, notes) if index is not None else (None, [])
    timestamped = basis == GPU_KERNELS and "start_ns" in kernels.columns
    idle = phase_idle(kernels, index, phase_names) if timestamped and phase_names else None
    if nvtx is not None and phase_rows is not None:
        empty = [p for p in phase_names if p not in set(phase_rows.loc[phase_rows["total_ns"] > 0, "phase"])]
        if empty:
            notes.append(
                f"no kernel inside {nvtx!r} falls in {', '.join(empty)}: kernels are attributed to the ranges open "
                "when they were launched, and e.g. PyTorch's autograd thread runs a layer's backward outside the "
                "forward's per-layer ranges"
            )
    return KernelSummary(
        source=trace.source,
        path=trace.path,
        kernels=by_name(kernels),
        phases=phase_rows,
        phase_names=phase_names,
        memory_ops=trace.memory_ops,
        ranges=_range_list(trace.ranges) if trace.ranges is not None else None,
        top=top,
        nvtx=nvtx,
        sub_ranges=sub_ranges,
        notes=notes,
        basis=basis,
        idle=idle,
        attributed=kernels,
        index=index,
    )


def by_name(kernels: pd.DataFrame) -> pd.DataFrame:
    """One row per kernel name, largest total first (ties by name, so the order is stable)."""
    grouped = kernels.groupby(["name", "category"], observed=True, as_index=False).agg(
        instances=("instances", "sum"), total_ns=("total_ns", "sum")
    )
    grouped = grouped.astype({"name": str, "category": str})
    return grouped.sort_values(["total_ns", "name"], ascending=[False, True], ignore_index=True)


def _launched(kernels: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Row positions, launch times and processes of the kernels whose launch is known."""
    rows = np.flatnonzero(kernels["launch_ns"].to_numpy() != NO_LAUNCH)
    return rows, kernels["launch_ns"].to_numpy()[rows], kernels["process"].to_numpy()[rows]


def _membership(
    kernels: pd.DataFrame, index: RangeIndex, range_ids: np.ndarray, labels: list[str]
) -> tuple[np.ndarray, np.ndarray]:
    """(kernel row, label) pairs, each once, for every range of `range_ids` containing a kernel's launch; a
    range's label is the position of its name in `labels`."""
    rows, launches, processes = _launched(kernels)
    points, ids = index.containing(launches, processes, range_ids)
    range_label = pd.Index(labels).get_indexer(index.names())
    # Nested ranges of one name, or ranges of several threads, can hold a launch more than once.
    keys = np.sort(rows[points] * len(labels) + range_label[ids])
    keys = keys[np.r_[True, keys[1:] != keys[:-1]]] if len(keys) else keys
    return keys // len(labels), keys % len(labels)


def _ids_named(index: RangeIndex, names: list[str]) -> np.ndarray:
    return np.flatnonzero(index.names().isin(names).to_numpy())


def _totals(
    kernels: pd.DataFrame, rows: np.ndarray, label_codes: np.ndarray, labels: list[str], column: str
) -> pd.DataFrame:
    """`column`, category, instances, total_ns of the kernels at `rows` under their labels, labels in order
    and the larger categories first."""
    frame = pd.DataFrame(
        {
            "label": label_codes,
            "category": kernels["category"].cat.codes.to_numpy()[rows],
            "instances": kernels["instances"].to_numpy()[rows],
            "total_ns": kernels["total_ns"].to_numpy()[rows],
        }
    )
    grouped = frame.groupby(["label", "category"], as_index=False).agg(
        instances=("instances", "sum"), total_ns=("total_ns", "sum")
    )
    grouped = grouped.sort_values(["label", "total_ns"], ascending=[True, False], ignore_index=True)
    return pd.DataFrame(
        {
            column: np.asarray(labels, dtype=object)[grouped["label"].to_numpy()],
            "category": np.asarray(CATEGORIES, dtype=object)[grouped["category"].to_numpy()],
            "instances": grouped["instances"],
            "total_ns": grouped["total_ns"],
        }
    )


def _phases(
    kernels: pd.DataFrame, index: RangeIndex, phases: list[str] | tuple[str, ...] | None, notes: list[str]
) -> tuple[pd.DataFrame, list[str]]:
    """Kernel totals per phase and category (kernels in no phase under OUTSIDE_PHASES), and the phases:
    those asked for, else those `found_phases` finds."""
    present = set(index.names())
    if phases is None:
        wanted = found_phases(index)
    else:
        wanted = list(dict.fromkeys(phases))
        missing = [p for p in wanted if p not in present]
        if missing:
            notes.append(f"no NVTX range named {', '.join(missing)} in this report")
    labels = [*wanted, OUTSIDE_PHASES]
    rows, codes = _membership(kernels, index, _ids_named(index, wanted), labels)
    if wanted:
        launched = _launched(kernels)[0]
        in_phase = np.zeros(len(kernels), dtype=bool)
        in_phase[rows] = True
        outside = launched[~in_phase[launched]]
        rows = np.concatenate([rows, outside])
        codes = np.concatenate([codes, np.full(len(outside), len(wanted))])
    return _totals(kernels, rows, codes, labels, "phase"), wanted


def found_phases(index: RangeIndex) -> list[str]:
    """The phases of a report that names none: the built-in DEFAULT_PHASES when it has any of them; else, on
    each process's main thread (the one whose outermost ranges last longest), the ranges directly inside the
    outermost ones (`step` ⊃ `fwd`, `bwd`, `opt` gives fwd, bwd, opt), or the outermost ones when nothing is
    inside them; `warmup` is never a phase. Names in the order they first start."""
    present = set(index.names())
    builtin = [p for p in DEFAULT_PHASES if p in present]
    if builtin:
        return builtin
    ranges = index.ranges
    top = index.depth == 0
    span = (ranges["end_ns"] - ranges["start_ns"]).where(top, 0)
    per_thread = span.groupby([ranges["process"], ranges["thread"]]).sum()
    main = per_thread.groupby(level=0).idxmax().to_list()
    on_main = pd.MultiIndex.from_frame(ranges[["process", "thread"]]).isin(main)
    outer = top & on_main & ~ranges["name"].isin(NOT_PHASES).to_numpy()
    inner = on_main & np.isin(index.parent, np.flatnonzero(outer))
    chosen = inner if inner.any() else outer
    return list(dict.fromkeys(ranges.loc[chosen].sort_values("start_ns", kind="stable")["name"]))


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
    inside = _membership(kernels, index, targets, [nvtx])[0]
    children = index.children_of(targets)
    labels = [*dict.fromkeys(index.names().to_numpy()[children]), f"(rest of {nvtx})"]
    child_rows, child_codes = _membership(kernels, index, children, labels)
    # Sub-ranges of one range never overlap; across threads a launch may fall in two, the first one counts.
    label_of = np.full(len(kernels), len(labels) - 1)
    label_of[child_rows[::-1]] = child_codes[::-1]
    split = _totals(kernels, inside, label_of[inside], labels, "sub_range")
    return kernels.iloc[inside].reset_index(drop=True), split


def _range_list(ranges: pd.DataFrame) -> pd.DataFrame:
    grouped = ranges.assign(total_ns=ranges["end_ns"] - ranges["start_ns"]).groupby("name", sort=False)
    return grouped.agg(instances=("total_ns", "size"), total_ns=("total_ns", "sum")).reset_index()


def _category_ns(rows: pd.DataFrame) -> dict[str, int]:
    sums = rows.groupby("category")["total_ns"].sum()
    return {c: int(sums.get(c, 0)) for c in CATEGORIES}


def _share(values: pd.Series, total: int) -> pd.Series:
    return values * 100.0 / total if total else values * 0.0


def _with_ms(table: pd.DataFrame, total_ns: int) -> pd.DataFrame:
    table = table.assign(
        total_ms=table["total_ns"] / NS_PER_MS, share_pct=_share(table["total_ns"], total_ns)
    )
    return table.drop(columns="total_ns")


def _split_table(rows: pd.DataFrame, label: str, total_ns: int, order: list[str]) -> pd.DataFrame:
    """One row per label of `order`: kernels, total_ms, share of all kernel time, then each category's share
    of the row."""
    per_label = rows.groupby(label).agg(kernels=("instances", "sum"), total_ns=("total_ns", "sum"))
    per_label = per_label.reindex(order, fill_value=0)
    per_label.index.name = label
    wide = rows.pivot_table(index=label, columns="category", values="total_ns", aggfunc="sum", fill_value=0)
    wide = wide.reindex(order, fill_value=0)
    table = _with_ms(per_label.reset_index(), total_ns)
    row_total = per_label["total_ns"].replace(0, np.nan)
    for category in [c for c in CATEGORIES if c in wide.columns and wide[c].sum() > 0]:
        table[f"{category}_pct"] = (wide[category] * 100.0 / row_total).fillna(0.0).to_numpy()
    return table
