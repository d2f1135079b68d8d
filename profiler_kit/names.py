"""The names and defaults the command line offers, importable without torch: the workload's modes, phases and
optimizers, the attention implementations, the memory recorder's defaults. `workload`, `attention.registry`
and `memory.recorder` build on them."""

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


def phases_for(mode: str) -> tuple[str, ...]:
    """The phases a step of `mode` runs, in order."""
    if mode not in MODES:
        raise ProfilerKitError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    return PHASES[: MODES.index(mode) + 1]
