"""What each allocation of a snapshot holds, decided from evidence about it, never from its size alone.

Evidence, strongest first:
- the recorder's own list of storages (parameters, gradients, optimizer moments) alive when it took the snapshot;
- the allocation's stack: PyTorch's autocast cast cache (`cached_cast`), the autograd engine's thread, the
  optimizer's code (`torch/optim`), a module's `__init__`;
- the phase it was allocated in and whether it outlived that phase: made and freed in one phase is a temporary;
  made in a forward phase and kept is an activation or a tensor saved for backward; made in backward and kept is a
  gradient; made in an optimizer step and kept is optimizer state;
- for the recorder's mixed-precision runs, the model's parameter list: a bf16 tensor of a Linear weight's size made
  by `nn.Linear` in forward and released in backward is autocast's weight copy (the Linear's output, e.g. the
  logits, may have the same size, but the step still holds it after backward).
With none of these (e.g. a tensor alive before the trace began, with no stack), the role is `unknown`.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from profiler_kit.memory.analyze import BEFORE_TRACE, MIB, Reconstruction
from profiler_kit.memory.phases import PhaseSpan

PARAMETER = "parameter"
GRADIENT = "gradient"
OPTIMIZER_STATE = "optimizer state"
ACTIVATION = "activation"
AUTOCAST_COPY = "autocast weight copy"
TEMPORARY = "temporary"
UNKNOWN = "unknown"
ROLES = (PARAMETER, GRADIENT, OPTIMIZER_STATE, ACTIVATION, AUTOCAST_COPY, TEMPORARY, UNKNOWN)
# The recorder's names for the storages it lists.
RECORDED_ROLES = {"parameter": PARAMETER, "gradient": GRADIENT, "adamw_state": OPTIMIZER_STATE}
BF16_BYTES = 2
_OPTIM_FILE = re.compile(r"(^|[/\\])torch[/\\]optim[/\\]")
_MODULES_FILE = re.compile(r"(^|[/\\])torch[/\\]nn[/\\](modules[/\\]|parameter\.py)")
_LINEAR_FILE = re.compile(r"(^|[/\\])torch[/\\]nn[/\\]modules[/\\]linear\.py$")


def phase_kind(label: str | None) -> str | None:
    """forward, backward or optimizer for a phase named like one (`backward #2`, `Optimizer.step#…`)."""
    if not label:
        return None
    name = label.lower()
    for kind, words in (("optimizer", ("optimizer",)), ("backward", ("backward",)), ("forward", ("forward",))):
        if any(w in name for w in words):
            return kind
    return None


def _frame_evidence(frames: list[dict]) -> set[str]:
    found = set()
    for frame in frames:
        name, filename = str(frame.get("name", "")), str(frame.get("filename", ""))
        if "cached_cast" in name:
            found.add("autocast")
        elif "autograd::Engine::" in name:
            found.add("engine")
        elif _OPTIM_FILE.search(filename):
            found.add("optimizer")
        elif _MODULES_FILE.search(filename) and name in ("__init__", "reset_parameters", "__new__"):
            found.add("module_init")
    if frames:
        innermost = next((f for f in frames if str(f.get("filename", "")).endswith(".py")), None)
        if innermost is not None and _LINEAR_FILE.search(str(innermost["filename"])):
            found.add("linear")
    return found


def _span_index(spans: list[PhaseSpan], starts: np.ndarray) -> np.ndarray:
    """Index of the span each entry index falls in, -1 outside all spans."""
    out = np.full(len(starts), -1, dtype=np.int64)
    for k, span in enumerate(spans):
        out[(starts >= span.start) & (starts < span.end)] = k
    return out


def assign_roles(recon: Reconstruction, spans: list[PhaseSpan], meta: dict | None) -> pd.Series:
    """One role from `ROLES` per row of `recon.allocations`."""
    meta = meta or {}
    by_address = {
        addr: RECORDED_ROLES.get(role, role)
        for role, addresses in (meta.get("tensor_roles") or {}).items()
        for addr in addresses
    }
    config = meta.get("config") or {}
    bf16_weights = {n * BF16_BYTES for n in meta.get("linear_weight_numels") or []} \
        if config.get("mixed_precision") else set()
    a = recon.allocations
    span_idx = _span_index(spans, a["start"].to_numpy())
    end_idx = _span_index(spans, a["end"].to_numpy())
    roles = []
    columns = ["addr", "size_bytes", "start", "end", "frames", "free_frames", "alive_at_end"]
    for (addr, size, start, end, frames, free_frames, alive_at_end), k, k_end in zip(
            a[columns].itertuples(index=False), span_idx, end_idx, strict=True):
        if alive_at_end and addr in by_address:
            roles.append(by_address[addr])
            continue
        made, freed = _frame_evidence(frames), _frame_evidence(free_frames)
        span = spans[k] if k >= 0 else None
        freed_in_backward = "engine" in freed or (k_end >= 0 and phase_kind(spans[k_end].label) == "backward")
        roles.append(_role(made, "engine" in freed, freed_in_backward, span, start, end, size, bool(alive_at_end),
                           bf16_weights))
    return pd.Series(roles, index=a.index, dtype=object)


def _role(made: set[str], freed_by_engine: bool, freed_in_backward: bool, span: PhaseSpan | None, start: int,
          end: int, size: int, alive_at_end: bool, bf16_weights: set[int]) -> str:
    """The role one allocation's evidence supports (see the module docstring), `unknown` when none does."""
    kind = phase_kind(span.label) if span else None
    outlives = end >= span.end if span else alive_at_end
    if "autocast" in made or (kind == "forward" and "linear" in made and size in bf16_weights
                              and freed_in_backward):
        return AUTOCAST_COPY
    if start == BEFORE_TRACE:
        return _role_before_trace(made)
    if span is not None and not outlives:
        return TEMPORARY
    if "engine" in made:  # made by the autograd engine: freed there it was an intermediate, else a gradient
        return TEMPORARY if freed_by_engine else GRADIENT
    if kind == "backward":
        return GRADIENT
    if "optimizer" in made or kind == "optimizer":  # optimizer state lives on; what the step frees was scratch
        return OPTIMIZER_STATE if outlives else TEMPORARY
    if freed_by_engine or kind == "forward":  # kept until backward released it: saved for backward
        return ACTIVATION
    if "module_init" in made:
        return PARAMETER
    return UNKNOWN


def _role_before_trace(evidence: set[str]) -> str:
    """Tensors older than the trace: only their stack (kept when history was on as they were made) can tell."""
    if "module_init" in evidence:
        return PARAMETER
    if "optimizer" in evidence:
        return OPTIMIZER_STATE
    return UNKNOWN


def role_series(recon: Reconstruction, roles: pd.Series) -> dict[str, np.ndarray]:
    """Allocated bytes of each role after every trace entry (index 0 is the state before the first entry)."""
    n = recon.n_entries
    a = recon.allocations
    out = {}
    for role in ROLES:
        rows = a[roles == role]
        delta = np.zeros(n + 1, dtype=np.int64)
        np.add.at(delta, rows["start"].to_numpy() + 1, rows["size_bytes"].to_numpy())
        ends = rows["end"].to_numpy()
        inside = ends < n
        np.add.at(delta, ends[inside] + 1, -rows["size_bytes"].to_numpy()[inside])
        out[role] = np.cumsum(delta)
    return out


def roles_at(recon: Reconstruction, roles: pd.Series, index: int) -> pd.DataFrame:
    """Count and bytes of each role alive after entry `index`, with its share of all allocated bytes."""
    a = recon.allocations
    alive = (a["start"] <= index) & (a["end"] > index)
    total = int(a.loc[alive, "size_bytes"].sum())
    rows = []
    for role in ROLES:
        sel = alive & (roles == role)
        size = int(a.loc[sel, "size_bytes"].sum())
        rows.append({"role": role, "count": int(sel.sum()), "size_mib": size / MIB,
                     "share_pct": 100.0 * size / total if total else 0.0, "size_bytes": size})
    return pd.DataFrame(rows)


def timeline(recon: Reconstruction, roles: pd.Series, max_points: int) -> tuple[np.ndarray, dict[str, np.ndarray],
                                                                                np.ndarray]:
    """At most `max_points` moments of the trace (entry indices, -1 for the start): bytes per role and reserved
    bytes. Each bucket of entries is represented by its highest allocated moment, so the peak always shows."""
    by_role = role_series(recon, roles)
    allocated = np.concatenate(([recon.initial_allocated_bytes], recon.allocated_bytes))
    reserved = np.concatenate(([recon.initial_reserved_bytes], recon.reserved_bytes))
    n = len(allocated)
    if n > max_points:
        edges = np.linspace(0, n, max_points + 1).astype(np.int64)
        keep = np.array([lo + int(np.argmax(allocated[lo:hi])) for lo, hi in zip(edges[:-1], edges[1:],
                                                                                  strict=True) if hi > lo])
    else:
        keep = np.arange(n)
    return keep - 1, {role: series[keep] for role, series in by_role.items()}, reserved[keep]
