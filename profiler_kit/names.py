"""The names and defaults the command line offers, importable without torch, pandas or numpy (every `--help` reads
them): the workload's modes, phases and optimizers, the attention implementations, the recorders and
data-parallel modes, the memory recorder's defaults, the kernel and memory reports' defaults and the phase rule.
`workload`, `attention.registry`, `memory.recorder`, `recording.runner`, `kernels` and `benchmark` build on
them."""

from __future__ import annotations

from pathlib import Path

from profiler_kit.errors import ProfilerKitError

MODES = ("forward", "forward-backward", "train")
PHASES = ("forward", "backward", "optimizer_step")
# The name of a step range: what the recorder's automatic marks and `profiler_kit.capture` open around each step.
STEP = "step"
# torch's AdamW implementations: one fused kernel chain, multi-tensor (foreach) kernels, or a loop over the
# parameters; then AdamW on fp32 master weights of a model held in bf16 (`master_weights`).
OPTIMIZER_KWARGS = {"adamw-fused": {"fused": True}, "adamw-foreach": {"foreach": True}, "adamw": {"foreach": False}}
MASTER_WEIGHTS = "adamw-master"
OPTIMIZERS = (*OPTIMIZER_KWARGS, MASTER_WEIGHTS)
ATTENTION_IMPLS = ("naive", "compiled", "sdpa", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "flash",
                   "flash-torch", "flash-triton", "flash-op")

# One train step of xl at ctx 512 logs a few tens of thousands of events; this keeps a couple of steps.
DEFAULT_MAX_ENTRIES = 100_000
DEFAULT_OUTPUT_DIR = Path("memory_snapshots")
# Rows of the largest allocations a memory report lists, and of the kernels a kernel summary lists.
MEMORY_TOP = 10
KERNELS_TOP = 10

# The recorders of `profiler-kit nsys` and the data-parallel modes of the built-in workload.
RECORDING_BACKENDS = ("nsys", "torch")
PARALLEL_MODES = ("none", "ddp", "fsdp")
# Warm-up settles when the median of this many steps is within --stable-pct of the median of as many before.
STABLE_WINDOW = 5

# What `kernels compare --fail-above` checks; a check fails only when B is also this share of A's total above A.
GATES = ("total", "phases", "categories", "kernels")
DEFAULT_GATES = ("total", "phases")
DEFAULT_MIN_DELTA_SHARE = 0.01

PHASE_RULE = (
    "Phases: the --phase ranges when given; else the ranges opened with profiler_kit.phase; else forward, "
    "backward, optimizer_step (the built-in workload) with the ranges beside them; else the program's own "
    "ranges on each process's main thread: the outermost ones, or, when those all have one name (a `step`), "
    "the ranges directly inside them. PyTorch's own ranges (Optimizer.step#…, Optimizer.zero_grad#…, "
    "ProfilerStep#…, aten::…) are never phases while the program has ranges of its own; Optimizer.step#… "
    "stands in for the optimizer phase when no phase holds it; `warmup` is never a phase."
)


def phases_for(mode: str) -> tuple[str, ...]:
    """The phases a step of `mode` runs, in order."""
    if mode not in MODES:
        raise ProfilerKitError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    return PHASES[: MODES.index(mode) + 1]
