"""What an allocation's stacks say about it: the marks that roles and inferred phases are decided from.

A mark is one fact read from a stack: autocast's cast cache made it (`autocast`), the autograd engine's thread
made or freed it (`engine`: a C++ frame of `autograd::Engine`, or, when the snapshot records Python stacks, a
stack without any Python frame, which only threads that run no Python have), the `backward()` call made it
(`backward_call`), the optimizer's code (`optimizer`), a module's constructor or its move to the GPU
(`module_init`: `__init__`, `reset_parameters`, `Module._apply` under `.cuda()`/`.to()`), `nn.Linear`
(`linear`), `zero_grad` freed it (`zero_grad`), Python code made it (`python`), code that runs inside a backward
made or freed it (`in_backward`: activation checkpointing's recomputation, FSDP's backward hooks), DDP's reducer
made it (`ddp_bucket`: its gradient buckets, made by `Reducer::initialize_buckets` when DDP is built and when it
rebuilds them before the second forward), FSDP2 all-gathered it (`unsharded`: the all-gather's output and each
parameter's unsharded storage), gradient clipping made it (`clip_grad`: between a step's last backward and its
optimizer step).
"""

from __future__ import annotations

import re
from functools import lru_cache

import pandas as pd

AUTOCAST = "autocast"
ENGINE = "engine"
BACKWARD_CALL = "backward_call"
OPTIMIZER = "optimizer"
MODULE_INIT = "module_init"
LINEAR = "linear"
ZERO_GRAD = "zero_grad"
PYTHON = "python"
IN_BACKWARD = "in_backward"
DDP_BUCKET = "ddp_bucket"
UNSHARDED = "unsharded"
CLIP_GRAD = "clip_grad"
# Per allocation: the marks of the stack that made it and of the stack that freed it.
Marks = tuple[list[frozenset[str]], list[frozenset[str]]]
_OPTIM_FILE = re.compile(r"(^|[/\\])torch[/\\]optim[/\\]")
_MODULES_FILE = re.compile(r"(^|[/\\])torch[/\\]nn[/\\](modules[/\\]|parameter\.py)")
_LINEAR_FILE = re.compile(r"(^|[/\\])torch[/\\]nn[/\\]modules[/\\]linear\.py$")
# `Tensor.backward` and `torch.autograd.backward` run here on the calling thread before the engine takes over.
_AUTOGRAD_CALL_FILE = re.compile(r"(^|[/\\])torch[/\\]autograd[/\\](__init__|graph)\.py$")
_TENSOR_FILE = re.compile(r"(^|[/\\])torch[/\\]_tensor\.py$")
_ZERO_GRAD_FILE = re.compile(r"(^|[/\\])torch[/\\](optim[/\\]optimizer|nn[/\\]modules[/\\]module)\.py$")
# Activation checkpointing recomputes a forward inside the backward from these functions (non-reentrant: the
# saved-tensor unpack hook; reentrant: the checkpoint Function's backward).
_CHECKPOINT_FILE = re.compile(r"(^|[/\\])torch[/\\]utils[/\\]checkpoint\.py$")
_RECOMPUTE = frozenset({"unpack_hook", "unpack_hook_with_error_cb", "recompute_fn", "backward"})
_FSDP_FILE = re.compile(r"(^|[/\\])torch[/\\]distributed[/\\]fsdp[/\\]")
# FSDP2 makes the unsharded parameters in these: each parameter's all-gather output (first made, then regrown
# with `alloc_storage`), while copying the all-gather's flat output out, which `foreach_all_gather` makes.
_UNSHARD = frozenset({"foreach_all_gather_copy_out", "init_all_gather_outputs", "alloc_storage"})
_ALL_GATHER, _ALL_GATHER_INPUTS = "foreach_all_gather", "_get_param_all_gather_inputs"
_CLIP_GRAD_FILE = re.compile(r"(^|[/\\])torch[/\\]nn[/\\]utils[/\\]clip_grad\.py$")
_DDP_FILE = re.compile(r"(^|[/\\])torch[/\\]nn[/\\]parallel[/\\]distributed\.py$")
# Where DDP's Python code builds its reducer (and its buckets) and asks it to rebuild them.
_DDP_BUCKETS = frozenset({"_ddp_init_helper", "_pre_forward"})


@lru_cache(maxsize=4096)  # asked once per allocation about a few phase labels
def phase_kind(label: str | None) -> str | None:
    """forward, backward or optimizer for a phase named like one (`backward #2`, `Optimizer.step#…`)."""
    if not label:
        return None
    name = label.lower()
    for kind, words in (("optimizer", ("optimizer",)), ("backward", ("backward",)), ("forward", ("forward",))):
        if any(w in name for w in words):
            return kind
    return None


def _is_python(frame: dict) -> bool:
    return str(frame.get("filename", "")).endswith(".py")


def frame_marks(frames: list[dict], stackless_is_engine: bool) -> frozenset[str]:
    """The marks of one stack (innermost frame first); `stackless_is_engine` when the snapshot records Python
    stacks, so that a stack without a Python frame was taken on a thread that runs no Python."""
    found = set()
    fsdp_names = set()
    for frame in frames:
        name, filename = str(frame.get("name", "")), str(frame.get("filename", ""))
        if _FSDP_FILE.search(filename):
            fsdp_names.add(name)
            if "backward" in name:
                found.add(IN_BACKWARD)
        if "cached_cast" in name:
            found.add(AUTOCAST)
        elif "Reducer::initialize_buckets" in name:
            found.add(DDP_BUCKET)
        elif "autograd::Engine::" in name:
            found.add(ENGINE)
        elif name in _RECOMPUTE and _CHECKPOINT_FILE.search(filename):
            found.add(IN_BACKWARD)
        elif _CLIP_GRAD_FILE.search(filename):
            found.add(CLIP_GRAD)
        elif _AUTOGRAD_CALL_FILE.search(filename) or (name == "backward" and _TENSOR_FILE.search(filename)):
            found.add(BACKWARD_CALL)
        elif _OPTIM_FILE.search(filename) and name != "zero_grad":
            found.add(OPTIMIZER)
        elif _MODULES_FILE.search(filename) and name in ("__init__", "reset_parameters", "__new__", "_apply"):
            found.add(MODULE_INIT)
        if name == "zero_grad" and _ZERO_GRAD_FILE.search(filename):
            found.add(ZERO_GRAD)
    if fsdp_names & _UNSHARD or (_ALL_GATHER in fsdp_names and _ALL_GATHER_INPUTS not in fsdp_names):
        found.add(UNSHARDED)
    innermost = next((f for f in frames if _is_python(f)), None)
    if innermost is not None:
        found.add(PYTHON)
        if _LINEAR_FILE.search(str(innermost["filename"])):
            found.add(LINEAR)
        if innermost.get("name") in _DDP_BUCKETS and _DDP_FILE.search(str(innermost["filename"])):
            found.add(DDP_BUCKET)
    elif stackless_is_engine:
        found.add(ENGINE)
    return frozenset(found)


def _has_python_frame(stacks: pd.Series) -> bool:
    return any(_is_python(f) for frames in stacks for f in frames)


def allocation_marks(allocations: pd.DataFrame) -> Marks:
    """The marks of each allocation's allocating stack and of its freeing stack. A stack without a Python frame
    counts as the engine's only where the snapshot records Python stacks for that kind of event (allocations
    made in the trace; frees, which only `context="all"` records) and the event was recorded."""
    in_trace = allocations["start"] >= 0
    python_allocs = _has_python_frame(allocations.loc[in_trace, "frames"])
    python_frees = _has_python_frame(allocations["free_frames"])
    # A training step repeats a few hundred stacks over and over, and a snapshot shares each frame between the
    # stacks that hold it: each stack is read once, keyed by its frames (alive, so their ids stay theirs).
    seen: dict[tuple, frozenset[str]] = {}

    def marks(frames: list[dict], stackless_is_engine: bool) -> frozenset[str]:
        key = (stackless_is_engine, *map(id, frames))
        found = seen.get(key)
        if found is None:
            found = seen[key] = frame_marks(frames, stackless_is_engine)
        return found

    made = [marks(frames, python_allocs and recorded) for frames, recorded in
            zip(allocations["frames"], in_trace, strict=True)]
    freed = [marks(frames, python_frees and bool(recorded)) for frames, recorded in
             zip(allocations["free_frames"], ~allocations["alive_at_end"], strict=True)]
    return made, freed
