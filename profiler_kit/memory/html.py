"""A memory report as one self-contained HTML file: inline style, the timeline stacked by role as inline SVG, the
report's tables, the largest allocations at the peak with their stacks, and the notes. It loads nothing (no
script, style sheet, font or image from anywhere), so it opens on a machine without network access."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
import pandas as pd

from profiler_kit.files import replaced_when_complete
from profiler_kit.memory.plot import ROLE_COLORS, unit_for
from profiler_kit.memory.report import MemoryReport
from profiler_kit.memory.roles import ROLES, timeline
from profiler_kit.render import format_cell

MEMORY_VIZ_URL = "https://pytorch.org/memory_viz"
SVG_WIDTH, SVG_HEIGHT = 960, 380
MARGIN = {"left": 64, "right": 170, "top": 24, "bottom": 40}
MAX_POINTS = 800
NUM_CLASS = ' class="num"'
STACK_FRAMES = 40  # frames listed per allocation; C++ stacks run to hundreds
STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; }
th { background: #f0f0f0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.peak { font-size: 1.3em; margin: 0.5em 0 1em; } .note { color: #8a5a00; }
details { margin: 2px 0; font-size: 13px; } pre { margin: 2px 0 6px 1.5em; font-size: 12px; }
svg text { font-size: 11px; }
"""


def _esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def table_html(df: pd.DataFrame) -> str:
    numeric = {c for c in df.columns if pd.api.types.is_numeric_dtype(df[c])}
    head = "".join(f"<th>{_esc(c)}</th>" for c in df.columns)
    body = []
    for row in df.itertuples(index=False):
        cells = "".join(
            f"<td{NUM_CLASS if c in numeric else ''}>{_esc(format_cell(v, str(c)))}</td>"
            for v, c in zip(row, df.columns, strict=True)
        )
        body.append(f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _step_path(xs: np.ndarray, ys: np.ndarray) -> list[tuple[float, float]]:
    """Points of a post-step line through (xs, ys), the last level held to the right edge."""
    points = []
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        points.append((x, y))
        points.append((xs[i + 1] if i + 1 < len(xs) else x, y))
    return points


def timeline_svg(report: MemoryReport) -> str:
    """Allocated bytes stacked by role over the trace, reserved as a dashed line, phases as bands."""
    recon = report.recon
    if recon.n_entries == 0:
        return "<p>No timeline: the snapshot has no trace (memory history was off).</p>"
    events, by_role, reserved = timeline(recon, report.roles, MAX_POINTS)
    scale, unit = unit_for(recon.peak_reserved_bytes)
    top = max(int(reserved.max()), recon.peak_allocated_bytes, 1) * 1.1
    left, right = MARGIN["left"], SVG_WIDTH - MARGIN["right"]
    y0, y1 = SVG_HEIGHT - MARGIN["bottom"], MARGIN["top"]
    span_x = max(recon.n_entries, 1)

    def px(event: float) -> float:
        return left + (event + 1) / span_x * (right - left)

    def py(value: float) -> float:
        return y0 - value / top * (y0 - y1)

    xs = np.array([px(e) for e in events])
    parts = [f'<svg width="{SVG_WIDTH}" height="{SVG_HEIGHT}" '
             f'role="img" aria-label="memory timeline by role">']
    for i, span in enumerate(report.spans):
        if span.end > span.start:
            x_a, x_b = px(span.start - 0.5), px(span.end - 0.5)
            shade = "#e8e8e8" if i % 2 else "#f4f4f4"
            parts.append(f'<rect x="{x_a:.1f}" y="{y1}" width="{x_b - x_a:.1f}" height="{y0 - y1}" '
                         f'fill="{shade}"><title>{_esc(span.label)}</title></rect>')
            parts.append(f'<text x="{(x_a + x_b) / 2:.1f}" y="{y1 - 6}" text-anchor="middle">'
                         f'{_esc(span.label)}</text>')
    lower = np.zeros(len(xs))
    legend = []
    for role in ROLES:
        values = by_role[role].astype(float)
        if not values.any():
            continue
        upper = lower + values
        outline = _step_path(xs, [py(v) for v in upper]) + _step_path(xs, [py(v) for v in lower])[::-1]
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in outline)
        parts.append(f'<polygon points="{points}" fill="{ROLE_COLORS[role]}" stroke="none">'
                     f'<title>{_esc(role)}</title></polygon>')
        legend.append(role)
        lower = upper
    reserved_line = " ".join(f"{x:.1f},{y:.1f}" for x, y in _step_path(xs, [py(v) for v in reserved]))
    parts.append(f'<polyline points="{reserved_line}" fill="none" stroke="#444" stroke-dasharray="4 3"/>')
    peak_x, peak_y = px(recon.peak_index), py(recon.peak_allocated_bytes)
    peak_label = f"peak {recon.peak_allocated_bytes / scale:,.2f} {unit}"
    parts.append(f'<path d="M{peak_x - 5:.1f},{peak_y - 9:.1f} h10 l-5,8 z" fill="black">'
                 f'<title>{_esc(peak_label)}</title></path>')
    for k in range(6):
        value = top / 1.1 * k / 5
        parts.append(f'<line x1="{left - 4}" x2="{left}" y1="{py(value):.1f}" y2="{py(value):.1f}" '
                     f'stroke="#444"/><text x="{left - 6}" y="{py(value) + 4:.1f}" text-anchor="end">'
                     f'{value / scale:,.2f}</text>')
    parts.append(f'<line x1="{left}" x2="{left}" y1="{y0}" y2="{y1}" stroke="#444"/>'
                 f'<line x1="{left}" x2="{right}" y1="{y0}" y2="{y0}" stroke="#444"/>'
                 f'<text x="{(left + right) / 2}" y="{SVG_HEIGHT - 8}" text-anchor="middle">allocator event '
                 f'(trace entry, 0 to {recon.n_entries - 1:,})</text>'
                 f'<text x="14" y="{(y0 + y1) / 2}" transform="rotate(-90 14 {(y0 + y1) / 2})" '
                 f'text-anchor="middle">memory ({unit})</text>')
    entries = [(ROLE_COLORS[r], r, "rect") for r in legend] + [("#444", "reserved", "line"),
                                                              ("black", peak_label, "rect")]
    for k, (color, label, shape) in enumerate(entries):
        y = y1 + 16 * k
        mark = (f'<rect x="{right + 12}" y="{y}" width="12" height="10" fill="{color}"/>' if shape == "rect"
                else f'<line x1="{right + 12}" x2="{right + 24}" y1="{y + 5}" y2="{y + 5}" stroke="{color}" '
                     'stroke-dasharray="4 3"/>')
        parts.append(f'{mark}<text x="{right + 30}" y="{y + 9}">{_esc(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _stacks_html(report: MemoryReport) -> str:
    """Each of the largest allocations at the peak with its full stack (innermost frame first)."""
    out = []
    frames_of = report.recon.allocations["frames"]
    for idx, row in report.top.iterrows():
        frames = frames_of[idx]
        summary = (f"#{row['rank']}: {format_cell(row['size_mib'])} MiB, {row['role']} ({row['evidence']}), "
                   "allocated in "
                   f"{row['allocated_in'] or 'unknown phase'}, at {row['where'] or 'no Python frame'}")
        if not frames:
            out.append(f"<details><summary>{_esc(summary)}</summary><pre>(no stack recorded)</pre></details>")
            continue
        lines = [f"{f.get('filename')}:{f.get('line')} {f.get('name')}" for f in frames[:STACK_FRAMES]]
        if len(frames) > STACK_FRAMES:
            lines.append(f"… {len(frames) - STACK_FRAMES} more frames")
        out.append(f"<details><summary>{_esc(summary)}</summary><pre>{_esc(chr(10).join(lines))}</pre></details>")
    return "".join(out)


def report_html(report: MemoryReport) -> str:
    """The whole report as one HTML document."""
    recon = report.recon
    scale, unit = unit_for(recon.peak_reserved_bytes)
    peak_phase = report.summary.loc[0, "peak_phase"]
    sections = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_esc('memory: ' + report.title())}</title><style>{STYLE}</style></head><body>",
        f"<h1>{_esc(report.title())}</h1>",
        f"<p>{_esc(report.source)}: device {recon.device}, {recon.n_entries:,} trace entries; "
        f"MiB = 2<sup>20</sup> bytes. For an interactive view, open the pickle at {_esc(MEMORY_VIZ_URL)} "
        "(needs a browser with internet access).</p>",
        f'<p class="peak">Peak allocated <b>{recon.peak_allocated_bytes / scale:,.2f} {unit}</b> '
        f"({recon.peak_allocated_bytes:,} bytes) at event {recon.peak_index:,}"
        + (f" in <b>{_esc(peak_phase)}</b>" if peak_phase else "")
        + f"; peak reserved {recon.peak_reserved_bytes / scale:,.2f} {unit}.</p>",
        "<h2>Memory over time, by role</h2>",
        timeline_svg(report),
    ]
    for title, df in report.tables():
        sections.append(f"<h2>{_esc(title)}</h2>{table_html(df)}")
    sections.append("<h2>Stacks of the largest allocations at the peak</h2>" + _stacks_html(report))
    if report.notes:
        items = "".join(f'<li class="note">{_esc(n)}</li>' for n in report.notes)
        sections.append(f"<h2>Notes</h2><ul>{items}</ul>")
    sections.append("</body></html>")
    return "\n".join(sections) + "\n"


def write_html(report: MemoryReport, path: str | Path) -> Path:
    path = Path(path)
    with replaced_when_complete(path) as partial:
        partial.write_text(report_html(report), encoding="utf-8")
    return path
