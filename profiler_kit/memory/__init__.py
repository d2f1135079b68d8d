"""Memory profiling: record CUDA memory history around the workload (`recorder`), load any snapshot safely
(`snapshot`), rebuild its timeline (`analyze`), place its phases (`phases`), say what each allocation holds
(`roles`), explain its peak (`tables`, `report`), and render it as a PNG (`plot`), a self-contained HTML page
(`html`) or beside another snapshot (`compare`)."""

from profiler_kit.memory.analyze import Reconstruction, reconstruct
from profiler_kit.memory.compare import MemoryComparison, compare
from profiler_kit.memory.html import report_html, write_html
from profiler_kit.memory.plot import plot_timeline
from profiler_kit.memory.recorder import DEFAULT_MAX_ENTRIES, DEFAULT_OUTPUT_DIR, RecordResult, record
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
    "RecordResult",
    "analyze",
    "analyze_file",
    "assign_roles",
    "compare",
    "load_sidecar",
    "load_snapshot",
    "plot_timeline",
    "reconstruct",
    "record",
    "report_html",
    "write_html",
]
