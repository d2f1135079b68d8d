"""Timeline PNG: allocated (and reserved) memory over the recorded allocator events, with a band per phase and
the peak marked."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from profiler_kit.errors import ProfilerKitError
from profiler_kit.files import replaced_when_complete
from profiler_kit.memory.analyze import PhaseSpan, Reconstruction

GIB = 1024**3
MIB = 1024**2
# A 10×4 in figure at 110 dpi: readable in a Markdown page, tens of KB as a PNG.
FIGSIZE_IN = (10, 4)
DPI = 110
BAND_COLORS = {"forward": "tab:blue", "backward": "tab:orange", "optimizer_step": "tab:green"}
BAND_ALPHA = 0.12


def _unit(peak_bytes: int) -> tuple[float, str]:
    return (GIB, "GiB") if peak_bytes >= GIB else (MIB, "MiB")


def plot_timeline(recon: Reconstruction, spans: list[PhaseSpan], path: str | Path, title: str) -> Path:
    """Write the timeline PNG to `path` and return it."""
    if recon.n_entries == 0:
        raise ProfilerKitError("no timeline to plot: the snapshot has no trace (memory history was off)")
    # The object-oriented API with an Agg canvas draws off-screen without touching pyplot's global backend;
    # imported here so that commands which never plot do not pay for matplotlib at start-up.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    scale, unit = _unit(recon.peak_reserved_bytes)
    x = np.arange(-1, recon.n_entries)
    allocated = np.concatenate(([recon.initial_allocated_bytes], recon.allocated_bytes)) / scale
    reserved = np.concatenate(([recon.initial_reserved_bytes], recon.reserved_bytes)) / scale
    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.step(x, reserved, where="post", color="0.55", linewidth=1, linestyle="--", label="reserved")
    ax.step(x, allocated, where="post", color="tab:purple", linewidth=1.2, label="allocated")
    top = max(reserved.max(), allocated.max()) * 1.12
    for span in spans:
        if span.end <= span.start:
            continue
        color = BAND_COLORS.get(span.label.split(" (step")[0], "0.5")
        ax.axvspan(span.start - 0.5, span.end - 0.5, color=color, alpha=BAND_ALPHA, lw=0)
        label = span.label if span.completed else f"{span.label} (OOM)"
        # Labels sit along the bottom of each band (x in events, y in axes units), clear of the legend.
        ax.text((span.start + span.end) / 2, 0.02, label, transform=ax.get_xaxis_transform(), ha="center",
                va="bottom", fontsize=8)
    peak = recon.peak_index
    peak_value = recon.peak_allocated_bytes / scale
    ax.plot([peak], [peak_value], marker="v", color="tab:red", markersize=8, linestyle="none",
            label=f"peak {peak_value:,.2f} {unit}")
    ax.set_ylim(0, top)
    ax.set_xlim(-1, max(recon.n_entries - 1, 0))
    ax.set_xlabel("allocator event (trace entry)")
    ax.set_ylabel(f"memory ({unit})")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    with replaced_when_complete(path) as partial:
        fig.savefig(partial, format="png")
    return path
