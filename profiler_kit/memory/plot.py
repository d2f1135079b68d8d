"""Timeline PNG: allocated memory over the recorded allocator events stacked by role (what torch.profiler's
memory timeline drew), reserved memory as a line, a band per phase and the peak marked.

Phase labels never overlap: each sits centred over its band in the first of LABEL_ROWS rows along the top where
it clears the labels already placed (the widest phases are placed first); a phase whose label fits in no row
keeps its band without a label, and the report's phase table names it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.files import replaced_when_complete
from profiler_kit.memory.analyze import MIB, Reconstruction
from profiler_kit.memory.phases import PhaseSpan
from profiler_kit.memory.roles import ROLES, timeline

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# A 10×4.5 in figure at 110 dpi: readable in a Markdown page, tens of KB as a PNG.
FIGSIZE_IN = (10, 4.5)
DPI = 110
# More points than the figure has pixels across adds nothing but file size.
MAX_POINTS = 2000
ROLE_COLORS = {
    "parameter": "#4c72b0", "unsharded parameter": "#8fb3de", "gradient": "#dd8452", "gradient bucket": "#f2b88f",
    "optimizer state": "#55a868", "activation": "#c44e52", "autocast weight copy": "#8172b3", "temporary": "#937860",
    "unknown": "#b0b0b0",
}
BAND_ALPHA = 0.08
# Rows of phase labels along the top of the plot, and the room above the highest curve that holds them.
LABEL_ROWS = 2
HEADROOM = 1.25
LABEL_FONT_PT = 7
# Free space kept between two labels of a row, in the unit of the positions given.
LABEL_GAP = 4.0
UNIT = "MiB"


def span_label(span: PhaseSpan) -> str:
    """The label drawn for a phase: the phase table's name, marked when an out-of-memory error ended it."""
    return span.label if span.completed else f"{span.label} (OOM)"


def drawn_spans(spans: Sequence[PhaseSpan]) -> list[PhaseSpan]:
    """The phases that cover at least one trace entry (a band of no width is not drawn)."""
    return [s for s in spans if s.end > s.start]


def place_labels(extents: Sequence[tuple[float, float]], widths: Sequence[float], left: float, right: float,
                 rows: int = LABEL_ROWS, gap: float = LABEL_GAP) -> list[int | None]:
    """The row (0 = top) of each label centred over its span `extents[i]` = (x0, x1), kept inside [left, right],
    or None when it overlaps a label already placed in every row. Wider spans are placed first, so the thin
    ones are those left without a label. Positions and widths share one unit (pixels)."""
    taken: list[list[tuple[float, float]]] = [[] for _ in range(rows)]
    placed: list[int | None] = [None] * len(extents)
    for i in sorted(range(len(extents)), key=lambda k: (extents[k][0] - extents[k][1], k)):
        a, b = label_box(extents[i], widths[i], left, right)
        for row in range(rows):
            if all(b + gap <= c or d + gap <= a for c, d in taken[row]):
                taken[row].append((a, b))
                placed[i] = row
                break
    return placed


def label_box(extent: tuple[float, float], width: float, left: float, right: float) -> tuple[float, float]:
    """Where a label of `width` centred over `extent` lies, shifted to stay within [left, right]."""
    centre = (extent[0] + extent[1]) / 2
    a = min(max(centre - width / 2, left), max(right - width, left))
    return a, a + width


def plot_timeline(recon: Reconstruction, roles: pd.Series, spans: list[PhaseSpan], path: str | Path,
                  title: str) -> Path:
    """Write the timeline PNG to `path` and return it."""
    fig = timeline_figure(recon, roles, spans, title)
    path = Path(path)
    with replaced_when_complete(path) as partial:
        fig.savefig(partial, format="png")
    return path


def timeline_figure(recon: Reconstruction, roles: pd.Series, spans: list[PhaseSpan], title: str) -> Figure:
    """The timeline as a matplotlib Figure (Agg canvas), drawn and laid out."""
    if recon.n_entries == 0:
        raise ProfilerKitError("no timeline to plot: the snapshot has no trace (memory history was off)")
    # The object-oriented API with an Agg canvas draws off-screen without touching pyplot's global backend;
    # imported here so that commands which never plot do not pay for matplotlib at start-up.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    x, by_role, reserved = timeline(recon, roles, MAX_POINTS)
    present = [r for r in ROLES if by_role[r].any()]
    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.stackplot(x, [by_role[r] / MIB for r in present], labels=present, step="post",
                 colors=[ROLE_COLORS[r] for r in present], linewidth=0)
    ax.step(x, reserved / MIB, where="post", color="0.3", linewidth=1, linestyle="--", label="reserved")
    peak_value = recon.peak_allocated_bytes / MIB
    ax.plot([recon.peak_index], [peak_value], marker="v", color="black", markersize=7, linestyle="none",
            label=f"peak {peak_value:,.1f} {UNIT}")
    ax.set_ylim(0, max(reserved.max(), recon.peak_allocated_bytes) / MIB * HEADROOM)
    ax.set_xlim(-1, max(recon.n_entries - 1, 0))
    ax.set_xlabel("allocator event (trace entry)")
    ax.set_ylabel(f"memory ({UNIT})")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    _phase_bands(ax, drawn_spans(spans))
    return fig


def _phase_bands(ax: Axes, spans: list[PhaseSpan]) -> None:
    """A shaded band per phase and its label where one fits (`place_labels`), measured in display pixels."""
    for i, span in enumerate(spans):
        ax.axvspan(span.start - 0.5, span.end - 0.5, color="0.2" if i % 2 else "0.6", alpha=BAND_ALPHA, lw=0)
    texts = [ax.text((s.start + s.end - 1) / 2, 0.99, span_label(s), transform=ax.get_xaxis_transform(),
                     ha="center", va="top", fontsize=LABEL_FONT_PT) for s in spans]
    if not texts:
        return
    renderer = ax.figure.canvas.get_renderer()
    to_px = ax.transData.transform
    extents = [(to_px((s.start - 0.5, 0))[0], to_px((s.end - 0.5, 0))[0]) for s in spans]
    widths = [t.get_window_extent(renderer).width for t in texts]
    box = ax.get_window_extent(renderer)
    line_height = texts[0].get_window_extent(renderer).height * 1.15 / box.height
    from_px = ax.transData.inverted().transform
    for text, extent, width, row in zip(texts, extents, widths, place_labels(extents, widths, box.x0, box.x1),
                                        strict=True):
        if row is None:
            text.remove()
            continue
        a, b = label_box(extent, width, box.x0, box.x1)
        text.set_x(from_px(((a + b) / 2, 0))[0])
        text.set_y(0.99 - row * line_height)
