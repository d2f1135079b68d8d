"""The list of parameter, gradient and optimizer-state storages that a recorder stores in a snapshot.

Format (inside the recorder's metadata: the snapshot's `profiler_kit` entry and the JSON sidecar), key
`storages`, a list of captures, each taken at one moment of the recording:

    {"label": "window start" | "optimizer step 3" | "snapshot" | ...,
     "time_us": 1795492124194752,          # the trace's clock (CLOCK_REALTIME in µs); absent: at the snapshot
     "parameter": [[address, nbytes], ...],
     "gradient": [[address, nbytes], ...],
     "optimizer_state": [[address, nbytes], ...]}

`address` is the storage's `untyped_storage().data_ptr()` (the allocation's address in the trace), `nbytes` its
`untyped_storage().nbytes()` (the allocation's requested size). An allocation alive at a capture's moment whose
address and size are listed in it has that role. Older recordings store one capture at the snapshot as
`tensor_roles`: {"parameter": [address, ...], "gradient": [...], "adamw_state": [...]}, read the same way.

A recorder takes captures with `capture_storages(model.parameters(), [optimizer], label, trace_clock_us())`
(at the start of its window, and at each optimizer step: its gradients exist then, and lazily made optimizer
state after it) and stores them in the snapshot before pickling it:
`snapshot["profiler_kit"] = {"format": SIDECAR_FORMAT, "version": SIDECAR_VERSION, "storages": captures}`
(`snapshot.py`), beside whatever other metadata it writes. This module imports no torch: `capture_storages`
reads the tensors it is given.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

STORAGES_KEY = "storages"
LEGACY_KEY = "tensor_roles"
STORAGE_KINDS = ("parameter", "gradient", "optimizer_state")
_LEGACY_KINDS = {"parameter": "parameter", "gradient": "gradient", "adamw_state": "optimizer_state"}


def _storage(tensor: Any) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "untyped_storage")


def trace_clock_us() -> int:
    """Now on the clock of the trace's `time_us` (CLOCK_REALTIME in µs), to place a moment on the trace."""
    return time.time_ns() // 1000


def capture_storages(parameters: Iterable[Any], optimizers: Iterable[Any] = (), label: str = "",
                     time_us: int | None = None) -> dict:
    """One capture: the storages of `parameters` and of the parameters each optimizer holds, of their gradients,
    and of every tensor in each optimizer's `state` (AdamW's exp_avg and exp_avg_sq, SGD's momentum buffer,
    step counters kept as tensors), each storage listed once. `time_us` (from `trace_clock_us()`) places it on
    the trace; without it, the capture stands for the moment the snapshot was taken."""
    optimizers = list(optimizers)
    params = list(parameters) + [p for opt in optimizers for group in opt.param_groups for p in group["params"]]
    seen: set[int] = set()

    def unique(tensors: Iterable[Any]) -> list[list[int]]:
        out = []
        for tensor in tensors:
            address, nbytes = _storage(tensor)
            if address and address not in seen:
                seen.add(address)
                out.append([address, nbytes])
        return out

    capture: dict[str, Any] = {"label": label} if time_us is None else {"label": label, "time_us": time_us}
    capture["parameter"] = unique(params)
    capture["gradient"] = unique(p.grad for p in params if p.grad is not None)
    capture["optimizer_state"] = unique(value for opt in optimizers for state in opt.state.values()
                                        for value in state.values() if _is_tensor(value))
    return capture


@dataclass(frozen=True)
class Capture:
    """One capture read back: when (None: at the snapshot) and each listed address's kind and size (None when
    the recording did not store sizes)."""

    label: str
    time_us: int | None
    storages: dict[int, tuple[str, int | None]]


def _pairs(items: Any) -> list[tuple[int, int | None]]:
    out = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, int) and not isinstance(item, bool):
            out.append((item, None))
        elif isinstance(item, list) and len(item) == 2 and all(isinstance(x, int) for x in item):
            out.append((item[0], item[1]))
    return out


def read_captures(meta: dict | None) -> list[Capture]:
    """The captures of a recorder's metadata (either format), in time order; none when it stores no list."""
    meta = meta or {}
    captures = []
    for raw in meta.get(STORAGES_KEY) or []:
        if not isinstance(raw, dict):
            continue
        storages = {addr: (kind, size) for kind in STORAGE_KINDS for addr, size in _pairs(raw.get(kind))}
        time_us = raw.get("time_us") if isinstance(raw.get("time_us"), int) else None
        captures.append(Capture(str(raw.get("label", "")), time_us, storages))
    legacy = meta.get(LEGACY_KEY)
    if isinstance(legacy, dict):
        storages = {addr: (_LEGACY_KINDS[key], None) for key in _LEGACY_KINDS
                    for addr, _ in _pairs(legacy.get(key))}
        captures.append(Capture("the snapshot", None, storages))
    return sorted(captures, key=lambda c: float("inf") if c.time_us is None else c.time_us)
