"""A memory report as one self-contained HTML file: inline style, the timeline stacked by role as inline SVG, the
report's tables, the largest allocations at the peak with their stacks, and the notes. It loads nothing (no
script, style sheet, font or image from anywhere), so it opens on a machine without network access."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from profiler_kit.memory.analyze import MIB
from profiler_kit.memory.plot import ROLE_COLORS, UNIT, drawn_spans, label_box, place_labels, span_label
from profiler_kit.memory.report import MemoryReport
from profiler_kit.memory.roles import ROLES, timeline
from profiler_kit.render import format_cell
from profiler_kit.webpage import document, esc, nice_ticks, notes_html, tables_html, tick_text, write_page

MEMORY_VIZ_URL = "https://pytorch.org/memory_viz"
SVG_WIDTH, SVG_HEIGHT = 960, 392
MARGIN = {"left": 64, "right": 170, "top": 36, "bottom": 40}
MAX_POINTS = 800
STACK_FRAMES = 40  # frames listed per allocation; C++ stacks run to hundreds
# Width of one character of an 11 px sans-serif label, a little above the average, so estimates never fall short.
CHAR_PX = 6.6
LABEL_LINE_PX = 13


def _step_path(xs: np.ndarray, ys: np.ndarray) -> list[tuple[float, float]]:
    """Points of a post-step line through (xs, ys), the last level held to the right edge."""
    points = []
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        points.append((x, y))
        points.append((xs[i + 1] if i + 1 < len(xs) else x, y))
    return points


def timeline_svg(report: MemoryReport) -> str:
    """Allocated bytes stacked by role over the trace, reserved as a dashed line, phases as bands with their
    labels staggered over the plot (`place_labels`)."""
    recon = report.recon
    if recon.n_entries == 0:
        return "<p>No timeline: the snapshot has no trace (memory history was off).</p>"
    events, by_role, reserved = timeline(recon, report.roles, MAX_POINTS)
    ticks_mib = nice_ticks(max(int(reserved.max()), recon.peak_allocated_bytes, 1) / MIB * 1.05)
    top = ticks_mib[-1] * MIB
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
    spans = drawn_spans(report.spans)
    extents = [(px(s.start - 0.5), px(s.end - 0.5)) for s in spans]
    labels = [span_label(s) for s in spans]
    widths = [len(label) * CHAR_PX for label in labels]
    rows = place_labels(extents, widths, left, right)
    for i, ((x_a, x_b), label, width, row) in enumerate(zip(extents, labels, widths, rows, strict=True)):
        shade = "#e8e8e8" if i % 2 else "#f4f4f4"
        parts.append(f'<rect class="phase" x="{x_a:.1f}" y="{y1}" width="{x_b - x_a:.1f}" height="{y0 - y1}" '
                     f'fill="{shade}"><title>{esc(label)}</title></rect>')
        if row is not None:
            a, b = label_box((x_a, x_b), width, left, right)
            y = y1 - 6 - row * LABEL_LINE_PX  # row 0 just above the plot
            parts.append(f'<text class="phase-label" x="{(a + b) / 2:.1f}" y="{y}" text-anchor="middle">'
                         f'{esc(label)}</text>')
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
                     f'<title>{esc(role)}</title></polygon>')
        legend.append(role)
        lower = upper
    reserved_line = " ".join(f"{x:.1f},{y:.1f}" for x, y in _step_path(xs, [py(v) for v in reserved]))
    parts.append(f'<polyline points="{reserved_line}" fill="none" stroke="#444" stroke-dasharray="4 3"/>')
    peak_x, peak_y = px(recon.peak_index), py(recon.peak_allocated_bytes)
    peak_label = f"peak {format_cell(recon.peak_allocated_bytes / MIB)} {UNIT}"
    parts.append(f'<path d="M{peak_x - 5:.1f},{peak_y - 9:.1f} h10 l-5,8 z" fill="black">'
                 f'<title>{esc(peak_label)}</title></path>')
    for tick in ticks_mib:
        y = py(tick * MIB)
        parts.append(f'<line x1="{left - 4}" x2="{left}" y1="{y:.1f}" y2="{y:.1f}" stroke="#444"/>'
                     f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{tick_text(tick)}</text>')
    parts.append(f'<line x1="{left}" x2="{left}" y1="{y0}" y2="{y1}" stroke="#444"/>'
                 f'<line x1="{left}" x2="{right}" y1="{y0}" y2="{y0}" stroke="#444"/>'
                 f'<text x="{(left + right) / 2}" y="{SVG_HEIGHT - 8}" text-anchor="middle">allocator event '
                 f'(trace entry, 0 to {recon.n_entries - 1:,})</text>'
                 f'<text x="14" y="{(y0 + y1) / 2}" transform="rotate(-90 14 {(y0 + y1) / 2})" '
                 f'text-anchor="middle">memory ({UNIT})</text>')
    entries = [(ROLE_COLORS[r], r, "rect") for r in legend] + [("#444", "reserved", "line"),
                                                              ("black", peak_label, "rect")]
    for k, (color, label, shape) in enumerate(entries):
        y = y1 + 16 * k
        mark = (f'<rect x="{right + 12}" y="{y}" width="12" height="10" fill="{color}"/>' if shape == "rect"
                else f'<line x1="{right + 12}" x2="{right + 24}" y1="{y + 5}" y2="{y + 5}" stroke="{color}" '
                     'stroke-dasharray="4 3"/>')
        parts.append(f'{mark}<text x="{right + 30}" y="{y + 9}">{esc(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _stacks_html(report: MemoryReport) -> str:
    """Each of the largest allocations at the peak with its full stack (innermost frame first)."""
    out = []
    frames_of = report.recon.allocations["frames"]
    for idx, row in report.top.iterrows():
        frames = frames_of[idx]
        summary = (f"#{row['position']}: {format_cell(row['size_mib'])} MiB, {row['role']} ({row['evidence']}), "
                   "allocated in "
                   f"{row['allocated_in'] or 'unknown phase'}, at {row['where'] or 'no Python frame'}")
        if not frames:
            out.append(f"<details><summary>{esc(summary)}</summary><pre>(no stack recorded)</pre></details>")
            continue
        lines = [f"{f.get('filename')}:{f.get('line')} {f.get('name')}" for f in frames[:STACK_FRAMES]]
        if len(frames) > STACK_FRAMES:
            lines.append(f"… {len(frames) - STACK_FRAMES} more frames")
        out.append(f"<details><summary>{esc(summary)}</summary><pre>{esc(chr(10).join(lines))}</pre></details>")
    return "".join(out)


def report_html(report: MemoryReport) -> str:
    """The whole report as one HTML document."""
    recon = report.recon
    peak_phase = report.summary.loc[0, "peak_phase"]
    sections = [
        f"<h1>{esc(report.title())}</h1>",
        f"<p>{esc(report.source)}: device {recon.device}, {recon.n_entries:,} trace entries; "
        f"MiB = 2<sup>20</sup> bytes. For an interactive view, open the pickle at {esc(MEMORY_VIZ_URL)} "
        "(needs a browser with internet access).</p>",
        f'<p class="peak">Peak allocated <b>{format_cell(recon.peak_allocated_bytes / MIB)} {UNIT}</b> '
        f"({recon.peak_allocated_bytes:,} bytes) at event {recon.peak_index:,}"
        + (f" in <b>{esc(peak_phase)}</b>" if peak_phase else "")
        + f"; peak reserved {format_cell(recon.peak_reserved_bytes / MIB)} {UNIT}.</p>",
        "<h2>Memory over time, by role</h2>",
        timeline_svg(report),
        *tables_html(report.tables()),
        "<h2>Stacks of the largest allocations at the peak</h2>" + _stacks_html(report),
        *notes_html(report.notes),
    ]
    return document("memory: " + report.title(), sections)


def write_html(report: MemoryReport, path: str | Path) -> Path:
    return write_page(report_html(report), path)
