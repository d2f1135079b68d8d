"""A kernel report (one report, several ranks or a comparison) as one self-contained HTML file: its charts
(`kernels.charts`) as inline SVG, then every table of the report and its notes. It loads nothing and runs no
script (`webpage`), so it opens on a machine without network access.

Each bar is a `<rect class="bar">` whose `data-ms` holds its value as the chart has it, and each point of the
idle line a `<circle class="idle">` with `data-pct`, so what the page draws can be checked against the tables."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from profiler_kit.kernels.charts import IDLE_COLOR, BarChart
from profiler_kit.render import Report
from profiler_kit.webpage import document, esc, nice_ticks, notes_html, tables_html, tick_text, write_page

WIDTH = 960
PLOT_HEIGHT = 240
LEFT, LEGEND = 72, 230
TOP = 34
# Room under the plot for the group names: flat, turned, or under each bar's own name.
BOTTOM = {"flat": 34, "turned": 70, "named": 66}
X_LABEL_PX = 16  # more room under the group names for the x axis's own label
# Width of one character of an 11 px sans-serif label, a little above the average.
CHAR_PX = 6.6


def chart_svg(chart: BarChart) -> str:
    """One chart as an SVG element: bars, axes with units, group names, legend, and the idle line."""
    layout = "named" if chart.bars_named() else ("turned" if chart.labels_turned() else "flat")
    height = TOP + PLOT_HEIGHT + BOTTOM[layout] + (X_LABEL_PX if chart.x_label else 0)
    left, right, y0, y1 = LEFT, WIDTH - LEGEND, TOP + PLOT_HEIGHT, TOP
    ticks = nice_ticks(float(chart.totals().max(initial=0.0)) * 1.05)
    top = ticks[-1]

    def px(x: float) -> float:
        return left + (x + 0.6) / (len(chart.groups) + 0.2) * (right - left)

    def py(value: float) -> float:
        return y0 - value / top * (y0 - y1)

    parts = [f'<svg class="chart" width="{WIDTH}" height="{height}" role="img" aria-label="{esc(chart.title)}" '
             f'data-title="{esc(chart.title)}"><text x="{left}" y="{TOP - 14}" font-weight="bold">'
             f'{esc(chart.title)}</text>']
    for tick in ticks:
        parts.append(f'<line x1="{left}" x2="{right}" y1="{py(tick):.1f}" y2="{py(tick):.1f}" stroke="#e6e6e6"/>'
                     f'<text x="{left - 6}" y="{py(tick) + 4:.1f}" text-anchor="end">{tick_text(tick)}</text>')
    positions, half = chart.bar_positions(), chart.bar_width() / 2
    for g, group in enumerate(chart.groups):
        for b, bar in enumerate(chart.bars):
            bottom = 0.0
            for s, segment in enumerate(chart.segments):
                value = float(chart.values[g, b, s])
                what = " · ".join(p for p in (group, bar, segment) if p)
                x_a, x_b = px(positions[g, b] - half), px(positions[g, b] + half)
                parts.append(f'<rect class="bar" x="{x_a:.1f}" y="{py(bottom + value):.1f}" width="{x_b - x_a:.1f}" '
                             f'height="{py(bottom) - py(bottom + value):.1f}" fill="{chart.bar_color(b, s)}" '
                             f'data-group="{esc(group)}" data-bar="{esc(bar)}" data-segment="{esc(segment)}" '
                             f'data-ms="{value!r}"><title>{esc(what)}: {value:,.4g} {chart.unit}</title></rect>')
                bottom += value
    parts.append(_x_labels(chart, px, y0, layout))
    parts.append(f'<line x1="{left}" x2="{left}" y1="{y0}" y2="{y1}" stroke="#444"/>'
                 f'<line x1="{left}" x2="{right}" y1="{y0}" y2="{y0}" stroke="#444"/>'
                 f'<text x="16" y="{(y0 + y1) / 2}" transform="rotate(-90 16 {(y0 + y1) / 2})" '
                 f'text-anchor="middle">{esc(chart.y_label)}</text>')
    if chart.x_label:
        parts.append(f'<text x="{(left + right) / 2}" y="{height - 6}" text-anchor="middle">'
                     f'{esc(chart.x_label)}</text>')
    legend = chart.legend()
    if chart.line is not None:
        parts.append(_idle_line(chart, px, y0, y1, right))
    x_legend = right + (56 if chart.line is not None else 14)
    for k, (label, color) in enumerate(legend):
        y = y1 + 16 * k
        parts.append(f'<rect x="{x_legend}" y="{y}" width="12" height="10" fill="{color}"/>'
                     f'<text x="{x_legend + 18}" y="{y + 9}">{esc(label)}</text>')
    if chart.line is not None:
        y = y1 + 16 * len(legend)
        parts.append(f'<line x1="{x_legend}" x2="{x_legend + 12}" y1="{y + 5}" y2="{y + 5}" stroke="{IDLE_COLOR}"/>'
                     f'<text x="{x_legend + 18}" y="{y + 9}">GPU idle (%)</text>')
    parts.append("</svg>")
    return "".join(parts)


def _x_labels(chart: BarChart, px: Callable[[float], float], y0: float, layout: str) -> str:
    """Group names under the plot (turned when long); each bar's name too when the bars are named."""
    parts = []
    if layout == "named":
        positions = chart.bar_positions()
        for g in range(len(chart.groups)):
            for b, bar in enumerate(chart.bars):
                x = px(positions[g, b])
                parts.append(f'<text x="{x:.1f}" y="{y0 + 12}" text-anchor="end" font-size="10" '
                             f'transform="rotate(-35 {x:.1f} {y0 + 12})">{esc(bar)}</text>')
    for g in chart.labelled_groups():
        x, name = px(g), esc(chart.groups[g])
        if layout == "named":
            parts.append(f'<text x="{x:.1f}" y="{y0 + BOTTOM["named"] - 8}" text-anchor="middle">{name}</text>')
        elif layout == "turned":
            parts.append(f'<text x="{x:.1f}" y="{y0 + 14}" text-anchor="end" '
                         f'transform="rotate(-30 {x:.1f} {y0 + 14})">{name}</text>')
        else:
            parts.append(f'<text x="{x:.1f}" y="{y0 + 16}" text-anchor="middle">{name}</text>')
    return "".join(parts)


def _idle_line(chart: BarChart, px: Callable[[float], float], y0: float, y1: float, right: float) -> str:
    """The idle share per group on a right-hand axis from 0 to 100%."""

    def py(pct: float) -> float:
        return y0 - pct / 100 * (y0 - y1)

    points = [(px(g), py(v), v) for g, v in enumerate(chart.line) if math.isfinite(v)]
    parts = [f'<polyline points="{" ".join(f"{x:.1f},{y:.1f}" for x, y, _ in points)}" fill="none" '
             f'stroke="{IDLE_COLOR}"/>']
    for (x, y, value), group in zip(points, [g for g, v in zip(chart.groups, chart.line, strict=True)
                                              if math.isfinite(v)], strict=True):
        parts.append(f'<circle class="idle" cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{IDLE_COLOR}" '
                     f'data-group="{esc(group)}" data-pct="{float(value)!r}"><title>{esc(group)}: '
                     f'{value:.1f}% idle</title></circle>')
    for pct in range(0, 101, 20):
        parts.append(f'<text x="{right + 6}" y="{py(pct) + 4:.1f}" fill="{IDLE_COLOR}">{pct}</text>')
    parts.append(f'<line x1="{right}" x2="{right}" y1="{y0}" y2="{y1}" stroke="{IDLE_COLOR}"/>'
                 f'<text x="{right + 34}" y="{(y0 + y1) / 2}" transform="rotate(90 {right + 34} {(y0 + y1) / 2})" '
                 f'text-anchor="middle" fill="{IDLE_COLOR}">{esc(chart.line_label)}</text>')
    return "".join(parts)


def report_html(report: Report, charts: list[BarChart], title: str) -> str:
    """The report as one HTML document: the charts, the tables (full names), the caption and the notes."""
    caption = [line for line in report.caption().split("\n") if line and not line.startswith("note: ")]
    sections = [f"<h1>{esc(title)}</h1>", *(f"<p>{esc(line)}</p>" for line in caption),
                *(chart_svg(chart) for chart in charts), *tables_html(report.tables()), *notes_html(report.notes)]
    return document(title, sections)


def write_html(report: Report, charts: list[BarChart], title: str, path: str | Path) -> Path:
    return write_page(report_html(report, charts, title), path)
