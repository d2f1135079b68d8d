"""Kernel report charts (`kernels.charts`) as one PNG: a panel per chart, one above the other.

matplotlib is imported only when a picture is drawn, so the report commands start without it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from profiler_kit.files import replaced_when_complete
from profiler_kit.kernels.charts import IDLE_COLOR, BarChart

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

WIDTH_IN = 10
PANEL_HEIGHT_IN = 3.4
DPI = 100


def figure(charts: list[BarChart], title: str) -> Figure:
    """A matplotlib Figure (Agg canvas) with one panel per chart."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_IN, 0.5 + PANEL_HEIGHT_IN * len(charts)), dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(charts), 1, squeeze=False)[:, 0]
    for ax, chart in zip(axes, charts, strict=True):
        draw(ax, chart)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def draw(ax: Axes, chart: BarChart) -> None:
    """One chart on `ax`: its bars (stacked segments bottom-up in segment order), labels, legend, idle line."""
    x = chart.bar_positions()
    width = chart.bar_width()
    for b, bar in enumerate(chart.bars):
        bottom = np.zeros(len(chart.groups))
        for s, segment in enumerate(chart.segments):
            heights = chart.values[:, b, s]
            label = segment if chart.stacked and b == 0 else (bar if not chart.stacked else None)
            ax.bar(x[:, b], heights, width, bottom=bottom, color=chart.bar_color(b, s), label=label or None,
                   gid=f"{bar}|{segment}", linewidth=0)
            bottom = bottom + heights
    _x_labels(ax, chart, x)
    ax.set_ylabel(chart.y_label, fontsize=9)
    ax.set_xlabel(chart.x_label, fontsize=9)
    ax.set_title(chart.title, fontsize=10, loc="left")
    ax.set_xlim(-0.6, len(chart.groups) - 0.4)
    ax.grid(axis="y", color="0.9", linewidth=0.8)
    ax.set_axisbelow(True)
    handles, labels = ax.get_legend_handles_labels()
    if chart.line is not None:
        twin = ax.twinx()
        twin.plot(np.arange(len(chart.groups)), chart.line, color=IDLE_COLOR, marker="o", markersize=3,
                  linewidth=1, label=chart.line_label)
        twin.set_ylim(0, 100)
        twin.set_ylabel("GPU idle (%)", fontsize=9, color=IDLE_COLOR)
        more_handles, more_labels = twin.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    if len(labels) > 1 or chart.line is not None:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.06 if chart.line is not None else 1.01, 1),
                  fontsize=8, frameon=False)


def _x_labels(ax: Axes, chart: BarChart, x: np.ndarray) -> None:
    """Group names under the groups (every k-th when there are many, turned when long); in a stacked chart
    with several bars a group, each bar's name under it as well."""
    shown, turned = chart.labelled_groups(), chart.labels_turned()
    if chart.bars_named():
        ax.set_xticks(x.ravel(), [bar for _ in chart.groups for bar in chart.bars], fontsize=7, rotation=30,
                      ha="right")
        for g in shown:
            ax.annotate(chart.groups[g], (g, 0), xycoords=("data", "axes fraction"), xytext=(0, -44),
                        textcoords="offset points", ha="center", va="top", fontsize=9)
        return
    ax.set_xticks(shown, [chart.groups[g] for g in shown], fontsize=8, rotation=30 if turned else 0,
                  ha="right" if turned else "center")


def write_png(charts: list[BarChart], title: str, path: str | Path) -> Path:
    """Draw `charts` into the PNG `path`, replacing what is there only once it is complete."""
    fig = figure(charts, title)
    path = Path(path)
    with replaced_when_complete(path) as partial:
        fig.savefig(partial, format="png")
    return path
