"""Timeline PNG: allocated memory over the recorded allocator events stacked by role (what torch.profiler's
memory timeline drew), reserved memory as a line, a band per phase and the peak marked."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.files import replaced_when_complete
from profiler_kit.memory.analyze import Reconstruction
from profiler_kit.memory.phases import PhaseSpan
from profiler_kit.memory.roles import ROLES, timeline

GIB = 1024**3
MIB = 1024**2
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


def unit_for(peak_bytes: int) -> tuple[float, str]:
    return (GIB, "GiB") if peak_bytes >= GIB else (MIB, "MiB")


def plot_timeline(recon: Reconstruction, roles: pd.Series, spans: list[PhaseSpan], path: str | Path,
                  title: str) -> Path:
    """Write the timeline PNG to `path` and return it."""
    if recon.n_entries == 0:
        raise ProfilerKitError("no timeline to plot: the snapshot has no trace (memory history was off)")
    # The object-oriented API with an Agg canvas draws off-screen without touching pyplot's global backend;
    # imported here so that commands which never plot do not pay for matplotlib at start-up.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    scale, unit = unit_for(recon.peak_reserved_bytes)
    x, by_role, reserved = timeline(recon, roles, MAX_POINTS)
    present = [r for r in ROLES if by_role[r].any()]
    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.stackplot(x, [by_role[r] / scale for r in present], labels=present, step="post",
                 colors=[ROLE_COLORS[r] for r in present], linewidth=0)
    ax.step(x, reserved / scale, where="post", color="0.3", linewidth=1, linestyle="--", label="reserved")
    for i, span in enumerate(spans):
        if span.end <= span.start:
            continue
        ax.axvspan(span.start - 0.5, span.end - 0.5, color="0.2" if i % 2 else "0.6", alpha=BAND_ALPHA, lw=0)
        label = span.label if span.completed else f"{span.label} (OOM)"
        # Labels sit along the top of each band (x in events, y in axes units), clear of the stacked areas.
        ax.text((span.start + span.end) / 2, 0.98, label, transform=ax.get_xaxis_transform(), ha="center",
                va="top", fontsize=7)
    peak_value = recon.peak_allocated_bytes / scale
    ax.plot([recon.peak_index], [peak_value], marker="v", color="black", markersize=7, linestyle="none",
            label=f"peak {peak_value:,.2f} {unit}")
    ax.set_ylim(0, max(reserved.max(), recon.peak_allocated_bytes) / scale * 1.15)
    ax.set_xlim(-1, max(recon.n_entries - 1, 0))
    ax.set_xlabel("allocator event (trace entry)")
    ax.set_ylabel(f"memory ({unit})")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    path = Path(path)
    with replaced_when_complete(path) as partial:
        fig.savefig(partial, format="png")
    return path
