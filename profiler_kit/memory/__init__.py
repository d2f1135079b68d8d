"""Memory profiling: record CUDA memory history around the workload (`recorder`), load any snapshot safely
(`snapshot`), rebuild and explain its peak (`analyze`, `report`), and draw its timeline (`plot`)."""

from profiler_kit.memory.analyze import Reconstruction, reconstruct
from profiler_kit.memory.plot import plot_timeline
from profiler_kit.memory.recorder import DEFAULT_MAX_ENTRIES, DEFAULT_OUTPUT_DIR, RecordResult, record
from profiler_kit.memory.report import DEFAULT_TOP, MemoryReport, analyze, analyze_file
from profiler_kit.memory.snapshot import load_sidecar, load_snapshot

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_OUTPUT_DIR",
    "DEFAULT_TOP",
    "MemoryReport",
    "Reconstruction",
    "RecordResult",
    "analyze",
    "analyze_file",
    "load_sidecar",
    "load_snapshot",
    "plot_timeline",
    "reconstruct",
    "record",
]
