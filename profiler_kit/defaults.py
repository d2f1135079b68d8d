"""The defaults the command line shows and the library falls back on, importable without torch, pandas or numpy
(every `--help` reads them): the memory recorder's, the reports', the benchmark's warm-up rule and the module
marks' depth."""

from __future__ import annotations

from pathlib import Path

# One train step of xl at ctx 512 logs a few tens of thousands of events; this keeps a couple of steps.
DEFAULT_MAX_ENTRIES = 100_000
DEFAULT_OUTPUT_DIR = Path("memory_snapshots")
# Rows of the largest allocations a memory report lists, and of the kernels a kernel summary lists.
MEMORY_TOP = 10
KERNELS_TOP = 10

# Warm-up settles when the median of this many steps is within --stable-pct of the median of as many before.
STABLE_WINDOW = 5

# What `kernels compare --fail-above` checks unless told; a check fails only when B is also this share of A's
# total above A.
DEFAULT_GATES = ("total", "phases")
DEFAULT_MIN_DELTA_SHARE = 0.01

# The module marks' depth (`--modules`): off unless asked, since they cost an eager step more than the recording's
# own budget (docs/nsys.md has the measured figures).
DEFAULT_MODULES = "none"
