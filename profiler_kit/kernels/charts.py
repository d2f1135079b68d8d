"""The pictures of kernel reports as data: bar charts taken from the tables the analyses return, which
`kernels.plot` draws as a PNG and `kernels.html` as inline SVG, so both show the same numbers.

- one report: per phase, its time stacked by category (each bar sums to the phase's total); per step, wall
  time beside kernel time (operator time for a CPU trace), and the GPU's idle share of the step's kernel span;
- several ranks: one bar group per rank, a bar per phase stacked by category; each phase's wall time per rank;
  both over the steps the per-rank table covers (the job's steady steps);
- a comparison: A beside B per category and per phase (medians over each side's runs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from profiler_kit.kernels.categories import CATEGORIES
from profiler_kit.kernels.compare import TOTAL, Comparison
from profiler_kit.kernels.ranks import RankedSummary
from profiler_kit.kernels.summary import NS_PER_MS, OUTSIDE_PHASES, KernelSummary

# One colour per category, in CATEGORIES order (colour-blind-safe hues first, for the largest categories).
CATEGORY_COLORS = dict(zip(CATEGORIES, (
    "#4c72b0", "#8172b3", "#dd8452", "#55a868", "#64b5cd", "#ccb974", "#c44e52", "#937860", "#da8bc3", "#b0b0b0",
), strict=True))
SIDE_COLORS = {"A": "#8c8c8c", "B": "#4c72b0"}
SERIES_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#ccb974")
STEP_COLORS = {"wall": "#b0b0b0", "work": "#4c72b0"}
IDLE_COLOR = "#c44e52"
WHOLE_REPORT = "whole report"
BAR_SPACE = 0.8  # the share of a group's width its bars take
BAR_FILL = 0.92  # the share of its slot a bar fills
# Above this many groups only every k-th group is labelled, so labels never run into each other.
MAX_GROUP_LABELS = 30
# Characters of axis labels that fit side by side along the x axis; longer labels are turned.
AXIS_CHARS = 100


@dataclass
class BarChart:
    """Bars in groups along x, each bar optionally stacked. `values[g, b, s]` is segment s of bar b in group g,
    in `unit`; a chart of plain bars has one segment, named "". `line`, when set, is one value per group drawn
    on a second axis (`line_label`, in %)."""

    title: str
    groups: list[str]
    bars: list[str]
    segments: list[str]
    values: np.ndarray
    colors: list[str]  # one per segment of a stacked chart, else one per bar
    y_label: str
    unit: str = "ms"
    line: np.ndarray | None = None
    line_label: str = ""
    x_label: str = ""

    @property
    def stacked(self) -> bool:
        return self.segments != [""]

    def totals(self) -> np.ndarray:
        """The height of each bar, (groups, bars)."""
        return self.values.sum(axis=2)

    def legend(self) -> list[tuple[str, str]]:
        """(label, colour) of what the colours tell apart: segments of a stacked chart, else bars (when several)."""
        names = self.segments if self.stacked else (self.bars if len(self.bars) > 1 else [])
        return list(zip(names, self.colors, strict=False))

    def bar_color(self, bar: int, segment: int) -> str:
        return self.colors[segment] if self.stacked else self.colors[bar]

    def bar_positions(self) -> np.ndarray:
        """The x centre of each bar, (groups, bars), in group units: group g spans g ± BAR_SPACE / 2."""
        width = BAR_SPACE / len(self.bars)
        offsets = (np.arange(len(self.bars)) - (len(self.bars) - 1) / 2) * width
        return np.arange(len(self.groups))[:, None] + offsets[None, :]

    def bar_width(self) -> float:
        return BAR_SPACE / len(self.bars) * BAR_FILL

    def bars_named(self) -> bool:
        """Whether each bar carries its own name under it: stacked bars, several a group (the legend has the
        segments)."""
        return self.stacked and len(self.bars) > 1

    def labelled_groups(self) -> np.ndarray:
        """The groups whose name is written: all, or every k-th when there are more than MAX_GROUP_LABELS."""
        every = max(1, -(-len(self.groups) // MAX_GROUP_LABELS))
        return np.arange(0, len(self.groups), every)

    def labels_turned(self) -> bool:
        """Whether the group names are too long to stand side by side."""
        shown = self.labelled_groups()
        return max((len(self.groups[g]) + 2 for g in shown), default=0) * len(shown) > AXIS_CHARS


def _by_category(rows: pd.DataFrame, label: str, order: list[str]) -> tuple[list[str], np.ndarray]:
    """The categories that have time in `rows` (label, category, total_ns), and ms per (label, category)."""
    wide = rows.pivot_table(index=label, columns="category", values="total_ns", aggfunc="sum", fill_value=0,
                            observed=False).reindex(index=order, columns=list(CATEGORIES), fill_value=0)
    used = [c for c in CATEGORIES if wide[c].sum() > 0]
    return used, wide[used].to_numpy(dtype=float) / NS_PER_MS


def phase_chart(summary: KernelSummary) -> BarChart:
    """Each phase's time (the rows of the phase table, kernels outside the phases included) stacked by
    category; one bar for the whole report when it has no phases."""
    if summary.phase_names and summary.phases is not None:
        order = summary.phase_table()["phase"].tolist()
        used, ms = _by_category(summary.phases, "phase", order)
    else:
        order = [WHOLE_REPORT]
        used, ms = _by_category(summary.kernels.assign(whole=WHOLE_REPORT), "whole", order)
    timed = summary.timed
    none = "" if used else f" (no {summary.counted} in this report)"
    return BarChart(f"{timed[0].upper()}{timed[1:]} per phase, by category{none}", order, [""], used,
                    ms[:, None, :], [CATEGORY_COLORS[c] for c in used], f"{timed} (ms)")


def step_label(row: pd.Series) -> str:
    """A step's name on the x axis: its number, its process when the table has several (a row of numbers alone
    holds them as floats)."""
    name = f"{int(row['step'])}"
    return f"{int(row['process'])}:{name}" if "process" in row.index else name


def step_chart(summary: KernelSummary) -> BarChart | None:
    """Per step: wall time and the time of its kernels (operators) side by side, and the GPU's idle share of
    its kernels' span when the report has kernel timestamps; None without a per-step table."""
    steps = summary.steps
    if steps is None or not len(steps):
        return None
    work = "kernel_ms" if "kernel_ms" in steps.columns else "operator_ms"
    work_label = "kernel time" if work == "kernel_ms" else "operator time"
    values = np.stack([steps["wall_ms"].to_numpy(dtype=float), steps[work].to_numpy(dtype=float)], axis=1)
    idle = steps["idle_pct"].to_numpy(dtype=float) if "idle_pct" in steps.columns else None
    has_idle = idle is not None and bool(np.isfinite(idle).any())
    title = f"Per step: wall time and {work_label}" + (", GPU idle" if has_idle else "")
    return BarChart(title, [step_label(row) for _, row in steps.iterrows()], ["wall time", work_label], [""],
                    values[:, :, None], [STEP_COLORS["wall"], STEP_COLORS["work"]], "time (ms)",
                    line=idle if has_idle else None,
                    line_label="GPU idle (% of the step's kernel span)" if has_idle else "",
                    x_label="step (process:step)" if "process" in steps.columns else "step")


def summary_charts(summary: KernelSummary) -> list[BarChart]:
    """The charts of one report: per phase, then per step when it has steps."""
    steps = step_chart(summary)
    return [phase_chart(summary)] + ([steps] if steps is not None else [])


def rank_charts(ranked: RankedSummary) -> list[BarChart]:
    """One bar group per rank shown (`RankedSummary.picked_ranks`) with a bar per phase (and one for kernels
    outside the phases, when any rank has some) stacked by category; then each phase's wall time per rank; both
    over the per-rank table's steps."""
    phases = ranked.phase_names
    shown = ranked.picked_ranks()
    members = [ranked.members[i] for i in shown]
    ranks = [f"rank {m.rank}" for m in members]
    bars_of = [m.figures.by_phase.reindex([*phases, OUTSIDE_PHASES], fill_value=0) for m in members]
    outside = any(by_phase.loc[OUTSIDE_PHASES].sum() > 0 for by_phase in bars_of)
    bars = [*phases, *([OUTSIDE_PHASES] if outside or not phases else [])]
    used = [c for c in CATEGORIES if any(c in b.columns and b[c].sum() > 0 for b in bars_of)]
    values = np.stack([b.reindex(index=bars, columns=used, fill_value=0).to_numpy(dtype=float) for b in bars_of]
                      ).reshape(len(ranks), len(bars), len(used)) / NS_PER_MS
    timed = ranked.timed
    scope = ranked.scope()
    charts = [BarChart(f"{timed[0].upper()}{timed[1:]} per rank and phase, by category, over {scope}", ranks, bars,
                       used, values, [CATEGORY_COLORS[c] for c in used], f"{timed} (ms)")]
    if phases:
        table = ranked.rank_table().iloc[shown]
        walls = table[[f"{p}_wall_ms" for p in phases]].to_numpy(dtype=float)
        charts.append(BarChart(f"Wall time of each phase per rank, over {scope}", ranks, phases, [""],
                               walls[:, :, None], [SERIES_COLORS[i % len(SERIES_COLORS)] for i in range(len(phases))],
                               "wall time (ms)"))
    return charts


def _sides(table: pd.DataFrame, label: str, title: str, y_label: str) -> BarChart:
    values = table[["a_ms", "b_ms"]].to_numpy(dtype=float)
    return BarChart(title, table[label].astype(str).tolist(), ["A", "B"], [""], values[:, :, None],
                    [SIDE_COLORS["A"], SIDE_COLORS["B"]], y_label)


def compare_charts(comparison: Comparison) -> list[BarChart]:
    """A beside B per category (the category table, its total row apart) and per phase."""
    timed = (comparison.a.summaries or comparison.b.summaries)[0].timed
    per = f" (median per {comparison.a.unit})" if max(comparison.a.run_count, comparison.b.run_count) > 1 else ""
    categories = comparison.category_table()
    charts = [_sides(categories[categories["category"] != TOTAL], "category", f"A against B by category{per}",
                     f"{timed} (ms)")]
    phases = comparison.phase_table()
    if len(phases):
        charts.append(_sides(phases, "phase", f"A against B per phase{per}", f"{timed} (ms)"))
    return charts


def report_charts(report: KernelSummary | RankedSummary | Comparison) -> tuple[str, list[BarChart]]:
    """The title of a report's pictures and its charts."""
    if isinstance(report, Comparison):
        names = [", ".join(s.path.name for s in side.summaries) or Path(side.origin).name
                 for side in (report.a, report.b)]
        return f"A = {names[0]}; B = {names[1]}", compare_charts(report)
    if isinstance(report, RankedSummary):
        return f"{len(report.ranks):,} ranks: {report.paths_named()}", rank_charts(report)
    return f"{report.source}: {report.path.name}", summary_charts(report)
