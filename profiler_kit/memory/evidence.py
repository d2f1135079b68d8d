"""What an allocation's stacks say about it: the marks that roles and inferred phases are decided from.

A mark is one fact read from a stack: autocast's cast cache made it (`autocast`), the autograd engine's thread
made or freed it (`engine`: a C++ frame of `autograd::Engine`, or, when the snapshot records Python stacks, a
stack without any Python frame, which only threads that run no Python have), the `backward()` call made it
(`backward_call`), the optimizer's code (`optimizer`), a module's constructor or its move to the GPU
(`module_init`: `__init__`, `reset_parameters`, `Module._apply` under `.cuda()`/`.to()`), `nn.Linear`
(`linear`), `zero_grad` freed it (`zero_grad`), Python code made it (`python`).
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
# Per allocation: the marks of the stack that made it and of the stack that freed it.
Marks = tuple[list[frozenset[str]], list[frozenset[str]]]
_OPTIM_FILE = re.compile(r"(^|[/\\])torch[/\\]optim[/\\]")
_MODULES_FILE = re.compile(r"(^|[/\\])torch[/\\]nn[/\\](modules[/\\]|parameter\.py)")
_LINEAR_FILE = re.compile(r"(^|[/\\])torch[/\\]nn[/\\]modules[/\\]linear\.py$")
# `Tensor.backward` and `torch.autograd.backward` run here on the calling thread before the engine takes over.
_AUTOGRAD_CALL_FILE = re.compile(r"(^|[/\\])torch[/\\]autograd[/\\](__init__|graph)\.py$")
_TENSOR_FILE = re.compile(r"(^|[/\\])torch[/\\]_tensor\.py$")
_ZERO_GRAD_FILE = re.compile(r"(^|[/\\])torch[/\\](optim[/\\]optimizer|nn[/\\]modules[/\\]module)\.py$")


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
    for frame in frames:
        name, filename = str(frame.get("name", "")), str(frame.get("filename", ""))
        if "cached_cast" in name:
            found.add(AUTOCAST)
        elif "autograd::Engine::" in name:
            found.add(ENGINE)
        elif _AUTOGRAD_CALL_FILE.search(filename) or (name == "backward" and _TENSOR_FILE.search(filename)):
            found.add(BACKWARD_CALL)
        elif _OPTIM_FILE.search(filename) and name != "zero_grad":
            found.add(OPTIMIZER)
        elif _MODULES_FILE.search(filename) and name in ("__init__", "reset_parameters", "__new__", "_apply"):
            found.add(MODULE_INIT)
        if name == "zero_grad" and _ZERO_GRAD_FILE.search(filename):
            found.add(ZERO_GRAD)
    innermost = next((f for f in frames if _is_python(f)), None)
    if innermost is not None:
        found.add(PYTHON)
        if _LINEAR_FILE.search(str(innermost["filename"])):
            found.add(LINEAR)
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
