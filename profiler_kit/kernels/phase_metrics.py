"""Per-phase metrics of a summarized report: each a function that returns a DataFrame indexed by phase (None when the
report cannot say), all joined into the one phase table (`phase_table`). The report's per-phase tables show column
groups of it (`phases`: the categories; `idle`: where the GPU idles, with the FLOP rate when FLOPs were given),
and `--columns` picks from all of it. A new per-phase column is one function here, in METRICS, and its test.

- `categories`: how many kernels (or operators), `total_ms`, `share_pct` of all the time, then each category's
  share of the phase (`<category>_pct`); kernels launched in no phase in a row OUTSIDE_PHASES;
- `idle`: `ranges`, `wall_ms`, `gpu_span_ms`, `busy_ms`, `idle_ms`, `idle_pct`, `largest_gaps_us`, `verdict`
  (`kernels.idle.phase_idle`, over the steady steps);
- `flops`: `tflops`, `mfu_pct` over each phase's GPU span, from the FLOPs of its ranges (`FlopRate`);
- `communication`: `comm_ms`, `overlapped_ms`, `exposed_ms`, `overlap_pct` (`kernels.idle.communication`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd

from profiler_kit.kernels.categories import CATEGORIES
from profiler_kit.kernels.idle import communication as phase_communication
from profiler_kit.kernels.labels import OUTSIDE_PHASES, Labelled

NS_PER_MS = 1_000_000
NS_PER_US = 1_000
IDLE_COLUMNS = ("ranges", "wall_ms", "gpu_span_ms", "busy_ms", "idle_ms", "idle_pct", "largest_gaps_us", "verdict")


@dataclass(frozen=True)
class FlopRate:
    """The FLOPs of a report's work, for the achieved TFLOP/s and MFU: of one range of each phase (`per_phase`)
    and of one step, all phases together (`per_step`); MFU needs the GPU's `peak_tflops` at the run's
    precision."""

    per_phase: dict[str, float] | None = None
    per_step: float | None = None
    peak_tflops: float | None = None


class PhaseReport(Protocol):
    """What the metrics read of a summarized report (`summary.KernelSummary`)."""

    phases: pd.DataFrame | None  # phase, category, instances, total_ns
    phase_names: list[str]
    idle: pd.DataFrame | None  # kernels.idle.phase_idle
    flops: FlopRate | None
    attributed: pd.DataFrame | None
    labelled: Labelled | None
    steady_ranges: np.ndarray | None
    total_ns: int
    counted: str


def categories(report: PhaseReport) -> pd.DataFrame | None:
    """How many kernels, their time and share of all the time, and each category's share of the phase."""
    if report.phases is None or not report.phase_names:
        return None
    outside = [OUTSIDE_PHASES] if (report.phases["phase"] == OUTSIDE_PHASES).any() else []
    table = split_table(report.phases, "phase", report.total_ns, [*report.phase_names, *outside], report.counted)
    return table.set_index("phase")


def idle(report: PhaseReport) -> pd.DataFrame | None:
    """Where the GPU idles in each phase, in ms (µs for the largest gaps)."""
    if report.idle is None:
        return None
    table = report.idle.copy()
    for column in ("wall", "gpu_span", "busy", "idle"):
        table[f"{column}_ms"] = table.pop(f"{column}_ns") / NS_PER_MS
    table["largest_gaps_us"] = table.pop("largest_gaps_ns").map(lambda g: ", ".join(f"{x / NS_PER_US:.1f}" for x in g))
    return table.set_index("phase")[list(IDLE_COLUMNS)]


def flops(report: PhaseReport) -> pd.DataFrame | None:
    """Achieved TFLOP/s over the GPU span of each phase whose FLOPs (per range) were given, and MFU."""
    if report.flops is None or report.idle is None:
        return None
    raw, rate = report.idle, report.flops
    done = raw["phase"].map(rate.per_phase or {}).astype(float) * raw["ranges"]
    tflops = (done / raw["gpu_span_ns"].replace(0, np.nan) / 1e3).to_numpy()
    mfu = tflops * 100.0 / rate.peak_tflops if rate.peak_tflops else np.full(len(raw), np.nan)
    return pd.DataFrame({"tflops": tflops, "mfu_pct": mfu}, index=pd.Index(raw["phase"], name="phase"))


def communication(report: PhaseReport) -> pd.DataFrame | None:
    """Each phase's communication time, the part compute elsewhere overlapped and the exposed rest."""
    kernels, labelled = report.attributed, report.labelled
    if labelled is None or labelled.index is None or not report.phase_names or "start_ns" not in kernels.columns:
        return None
    table = phase_communication(kernels, labelled, report.steady_ranges)
    for column in ("comm", "overlapped", "exposed"):
        table[f"{column}_ms"] = table.pop(f"{column}_ns") / NS_PER_MS
    return table.set_index("phase")[["comm_ms", "overlapped_ms", "exposed_ms", "overlap_pct"]]


METRICS: tuple[Callable[[PhaseReport], pd.DataFrame | None], ...] = (categories, idle, flops, communication)


def phase_table(report: PhaseReport) -> pd.DataFrame:
    """Every metric of METRICS side by side, one row per phase (the categories' rows, OUTSIDE_PHASES included),
    `phase` first; empty without phases."""
    frames = [frame for metric in METRICS if (frame := metric(report)) is not None]
    if not frames or report.phase_names is None:
        return pd.DataFrame({"phase": pd.Series(dtype=object)})
    return frames[0].join(frames[1:], how="left").rename_axis("phase").reset_index()


def step_rate(report: PhaseReport) -> dict[str, Any] | None:
    """TFLOP/s and MFU over all phases together, from the FLOPs of one step (None unless they were given)."""
    rate, raw = report.flops, report.idle
    if rate is None or rate.per_step is None or raw is None:
        return None
    span = int(raw["gpu_span_ns"].sum())
    achieved = rate.per_step * int(raw["ranges"].max()) / span / 1e3 if span else None
    mfu = achieved * 100.0 / rate.peak_tflops if achieved is not None and rate.peak_tflops else None
    return {"flops_per_step": rate.per_step, "tflops": achieved, "mfu_pct": mfu, "peak_tflops": rate.peak_tflops}


def share(values: pd.Series, total: int) -> pd.Series:
    return values * 100.0 / total if total else values * 0.0


def with_ms(table: pd.DataFrame, total_ns: int) -> pd.DataFrame:
    """`total_ns` as `total_ms` and its `share_pct` of `total_ns`."""
    table = table.assign(total_ms=table["total_ns"] / NS_PER_MS, share_pct=share(table["total_ns"], total_ns))
    return table.drop(columns="total_ns")


def split_table(rows: pd.DataFrame, label: str, total_ns: int, order: list[str], counted: str) -> pd.DataFrame:
    """One row per label of `order`: how many kernels (`counted`), total_ms, share of all the time, then each
    category's share of the row."""
    per_label = rows.groupby(label).agg(**{counted: ("instances", "sum")}, total_ns=("total_ns", "sum"))
    per_label = per_label.reindex(order, fill_value=0)
    per_label.index.name = label
    wide = rows.pivot_table(index=label, columns="category", values="total_ns", aggfunc="sum", fill_value=0)
    wide = wide.reindex(order, fill_value=0)
    table = with_ms(per_label.reset_index(), total_ns)
    row_total = per_label["total_ns"].replace(0, np.nan)
    for category in [c for c in CATEGORIES if c in wide.columns and wide[c].sum() > 0]:
        table[f"{category}_pct"] = (wide[category] * 100.0 / row_total).fillna(0.0).to_numpy()
    return table
