"""The list of parameter, gradient and optimizer-state storages that a recorder stores in a snapshot.

Format (inside the recorder's metadata: the snapshot's `profiler_kit` entry and the JSON sidecar), key
`storages`, a list of captures, each taken at one moment of the recording:

    {"label": "window start" | "optimizer step 3" | "snapshot" | ...,
     "time_us": 1795492124194752,          # the trace's clock (CLOCK_REALTIME in µs); absent: at the snapshot
     "parameter": [[address, nbytes], ...],
     "unsharded_parameter": [[address, nbytes], ...],   # FSDP2's all-gathered parameters, where they exist
     "gradient_bucket": [[address, nbytes], ...],       # DDP's buckets, where the gradients are views of them
     "gradient": [[address, nbytes], ...],
     "optimizer_state": [[address, nbytes], ...],
     "note": "2 tensors or objects could not be read ..."}   # only when some could not be read

`address` is the storage's `untyped_storage().data_ptr()` (the allocation's address in the trace), `nbytes` its
`untyped_storage().nbytes()` (the allocation's requested size); for a sharded tensor (a DTensor, as FSDP2's
parameters, gradients and optimizer state are), those of its local shard. An allocation alive at a capture's
moment whose address and size are listed in it has that role. Older recordings store one capture at the
snapshot as `tensor_roles`: {"parameter": [address, ...], "gradient": [...], "adamw_state": [...]}, read the
same way.

A recorder takes captures with `capture_storages(model.parameters(), [optimizer], label, trace_clock_us(),
modules)` (at the start of its window, and at each optimizer step: its gradients exist then, and lazily made
optimizer state after it) and stores them in the snapshot before pickling it:
`snapshot["profiler_kit"] = {"format": SIDECAR_FORMAT, "version": SIDECAR_VERSION, "storages": captures}`
(`snapshot.py`), beside whatever other metadata it writes. This module imports no torch: `capture_storages`
reads the tensors it is given, and never raises.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

STORAGES_KEY = "storages"
LEGACY_KEY = "tensor_roles"
STORAGE_KINDS = ("parameter", "unsharded_parameter", "gradient_bucket", "gradient", "optimizer_state")
_LEGACY_KINDS = {"parameter": "parameter", "gradient": "gradient", "adamw_state": "optimizer_state"}
# The tensors a capture could not read are named in its note by their errors, this many at most.
_MOST_ERRORS = 3


def _plain(tensor: Any) -> list[Any]:
    """The plain tensors that hold a tensor's data: itself, or the inner tensors of a wrapper subclass (a
    DTensor's local shard, and so on down), which own the storages the allocator saw."""
    if getattr(type(tensor), "__tensor_flatten__", None) is None:
        return [tensor]
    names, _ = tensor.__tensor_flatten__()
    inners = [getattr(tensor, name) for name in names]  # tensors, and opaque objects (a DTensor's device mesh)
    return [plain for inner in inners if _is_tensor(inner) for plain in _plain(inner)]


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "untyped_storage")


def trace_clock_us() -> int:
    """Now on the clock of the trace's `time_us` (CLOCK_REALTIME in µs), to place a moment on the trace."""
    return time.time_ns() // 1000


def _fsdp_unsharded(module: Any) -> list[Any]:
    """FSDP2's unsharded parameter storages of a `fully_shard`ed module: each parameter's all-gather outputs
    (freed, i.e. of no size, while the module is resharded)."""
    get_state = getattr(module, "_get_fsdp_state", None)
    if get_state is None:
        return []
    state = get_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:  # torch releases with one parameter group per module
        groups = [g for g in [getattr(state, "_fsdp_param_group", None)] if g is not None]
    return [t for group in groups for p in group.fsdp_params
            for t in [*p.all_gather_outputs, *getattr(p, "_unsharded_inner_tensors", [])]]


def _ddp_buckets(module: Any) -> list[Any]:
    """The gradients of a DDP module built with `gradient_as_bucket_view`: views into its reducer's buckets
    (without it the buckets are the reducer's own, out of Python's reach)."""
    if getattr(module, "reducer", None) is None or not getattr(module, "gradient_as_bucket_view", False):
        return []
    return [p.grad for p in module.parameters() if p.grad is not None]


class _Lister:
    """Lists storages once each, and the errors of what it could not read."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.errors: Counter[str] = Counter()

    def failed(self, exc: Exception) -> None:
        self.errors[f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"] += 1

    def each(self, make: Callable[[], Iterable[Any]]) -> list[Any]:
        """What `make` yields; nothing (and the error noted) when reading it fails."""
        try:
            return list(make())
        except Exception as exc:  # a program's object in an unexpected state: the rest is still listed
            self.failed(exc)
            return []

    def each_of(self, items: list[Any], tensors: Callable[[Any], Iterable[Any]]) -> list[Any]:
        """The tensors of each item, those of an item that cannot be read left out."""
        return [t for item in items for t in self.each(lambda item=item: tensors(item))]

    def storages(self, tensors: list[Any]) -> list[list[int]]:
        """[address, nbytes] of each storage of `tensors` not listed before; freed ones (no address) left out."""
        out = []
        for tensor in tensors:
            try:
                found = [(s.data_ptr(), s.nbytes()) for s in (t.untyped_storage() for t in _plain(tensor))]
            except Exception as exc:
                self.failed(exc)
                continue
            for address, nbytes in found:
                if address and nbytes and address not in self.seen:
                    self.seen.add(address)
                    out.append([address, nbytes])
        return out


def capture_storages(parameters: Iterable[Any], optimizers: Iterable[Any] = (), label: str = "",
                     time_us: int | None = None, modules: Iterable[Any] = ()) -> dict:
    """One capture: the storages of `parameters` and of the parameters each optimizer holds, of their gradients,
    and of every tensor in each optimizer's `state` (AdamW's exp_avg and exp_avg_sq, SGD's momentum buffer,
    step counters kept as tensors), each storage listed once; of a sharded (DTensor) tensor, its local shard's.
    `modules` (the program's DDP and `fully_shard` modules) add FSDP2's unsharded parameters where they exist
    and DDP's buckets where the gradients are views of them. `time_us` (from `trace_clock_us()`) places it on
    the trace; without it, the capture stands for the moment the snapshot was taken. It never raises: what it
    could not read is left out and named in the capture's `note`."""
    lister = _Lister()
    optimizer_list, module_list = lister.each(lambda: optimizers), lister.each(lambda: modules)
    params = lister.each(lambda: parameters) + lister.each_of(
        optimizer_list, lambda opt: [p for group in opt.param_groups for p in group["params"]])
    capture: dict[str, Any] = {"label": label} if time_us is None else {"label": label, "time_us": time_us}
    # FSDP2 swaps a module's parameters for the unsharded ones while they exist: those are listed as such first.
    unsharded = lister.storages(lister.each_of(module_list, _fsdp_unsharded))
    capture["parameter"] = lister.storages(params)
    capture["unsharded_parameter"] = unsharded
    capture["gradient_bucket"] = lister.storages(lister.each_of(module_list, _ddp_buckets))
    capture["gradient"] = lister.storages(lister.each_of(params, lambda p: [] if p.grad is None else [p.grad]))
    capture["optimizer_state"] = lister.storages(lister.each_of(optimizer_list, lambda opt: [
        value for state in opt.state.values() for value in state.values() if _is_tensor(value)]))
    if lister.errors:
        capture["note"] = (f"{sum(lister.errors.values())} tensors or objects could not be read and are not "
                           "listed: " + "; ".join(e for e, _ in lister.errors.most_common(_MOST_ERRORS)))
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
