"""The kernel-summary engine: where GPU time goes, from any kernel report (nsys .nsys-rep/.sqlite,
`nsys stats` CSV or text, torch.profiler Chrome traces), by category, per phase and inside one NVTX range."""

from profiler_kit.kernels.categories import CATEGORIES, categorize, category_of
from profiler_kit.kernels.compare import Comparison, compare
from profiler_kit.kernels.sources import load
from profiler_kit.kernels.summary import (
    DEFAULT_TOP,
    KernelSummary,
    summarize,
    summarize_trace,
)

__all__ = [
    "CATEGORIES",
    "DEFAULT_TOP",
    "Comparison",
    "KernelSummary",
    "categorize",
    "category_of",
    "compare",
    "load",
    "summarize",
    "summarize_trace",
]
