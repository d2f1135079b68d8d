"""Memory analysis: load any snapshot safely (`snapshot`), rebuild its timeline (`analyze`), place its phases and
steps (`phases`, `inferred`), say what each allocation holds (`roles`), explain its peak (`tables`, `report`),
merge several ranks' snapshots (`ranks`), and render it as a PNG (`plot`), a self-contained HTML page (`html`) or
beside another snapshot (`compare`). Recording lives in `profiler_kit.recording` (`history`, the recorder inside
the program; `builtin.record_memory`, the built-in workload)."""

from profiler_kit.defaults import DEFAULT_MAX_ENTRIES, DEFAULT_OUTPUT_DIR
from profiler_kit.memory.analyze import Reconstruction, reconstruct
from profiler_kit.memory.compare import MemoryComparison, compare
from profiler_kit.memory.html import report_html, write_html
from profiler_kit.memory.plot import plot_timeline
from profiler_kit.memory.report import DEFAULT_TOP, MemoryReport, analyze, analyze_file
from profiler_kit.memory.roles import ROLES, assign_roles
from profiler_kit.memory.snapshot import load_sidecar, load_snapshot

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_OUTPUT_DIR",
    "DEFAULT_TOP",
    "ROLES",
    "MemoryComparison",
    "MemoryReport",
    "Reconstruction",
    "analyze",
    "analyze_file",
    "assign_roles",
    "compare",
    "load_sidecar",
    "load_snapshot",
    "plot_timeline",
    "reconstruct",
    "report_html",
    "write_html",
]

