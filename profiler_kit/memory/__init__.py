"""Memory profiling: record CUDA memory history around the workload (`recorder`), load any snapshot safely
(`snapshot`), rebuild its timeline (`analyze`), place its phases and steps (`phases`, `inferred`), say what each
allocation holds (`roles`), explain its peak (`tables`, `report`), merge several ranks' snapshots (`ranks`), and
render it as a PNG (`plot`), a self-contained HTML page (`html`) or beside another snapshot (`compare`). `record`
and `RecordResult` load torch on first use, so that reading snapshots does not."""

from typing import Any

from profiler_kit.memory.analyze import Reconstruction, reconstruct
from profiler_kit.memory.compare import MemoryComparison, compare
from profiler_kit.memory.html import report_html, write_html
from profiler_kit.memory.plot import plot_timeline
from profiler_kit.memory.report import DEFAULT_TOP, MemoryReport, analyze, analyze_file
from profiler_kit.memory.roles import ROLES, assign_roles
from profiler_kit.memory.snapshot import load_sidecar, load_snapshot
from profiler_kit.names import DEFAULT_MAX_ENTRIES, DEFAULT_OUTPUT_DIR

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


def __getattr__(name: str) -> Any:
    if name in ("record", "RecordResult"):
        from profiler_kit.memory import recorder

        return getattr(recorder, name)
    raise AttributeError(f"module 'profiler_kit.memory' has no attribute {name!r}")
