"""The device a command runs on: `--device` resolved, waiting for it, its name in a row, its cached memory given
back; shared by the workload, the benchmarks (the model's and attention's) and the recorders."""

from __future__ import annotations

import gc

import torch

from profiler_kit.errors import ProfilerKitError


def resolve_device(name: str = "auto") -> torch.device:
    """`auto` → cuda when available, else cpu; `cuda` without a GPU is a user error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ProfilerKitError(
            "--device cuda asked for, but torch sees no CUDA device (use --device cpu or auto)"
        )
    if name not in ("cpu",) and not name.startswith("cuda"):
        raise ProfilerKitError(f"unknown device {name!r}; choose auto, cuda or cpu")
    return torch.device(name)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_label(device: torch.device) -> str:
    """What a row's `device` column says: the GPU's name, or cpu."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def free_memory() -> None:
    """Collect garbage and give cached GPU memory back (after an OOM, before the next config)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
