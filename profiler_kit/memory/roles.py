"""What each allocation of a snapshot holds, decided from evidence about it, with that evidence in words.

Evidence, strongest first:
- the recorder's list of storages (`storages.py`: parameters, gradients, optimizer state, with the moment each
  list was taken; of a sharded parameter, its local shard): an allocation alive then at a listed address, of the
  listed size, has the listed role (a listed gradient that DDP's reducer made is a gradient bucket);
- the allocation's stacks (`evidence.py`): PyTorch's autocast cast cache, FSDP's all-gather (an unsharded
  parameter), DDP's reducer (a gradient bucket), the autograd engine's thread, the optimizer's code, a module's
  `__init__`, `zero_grad` freeing it (a `.grad`);
- the phase it was allocated in and whether it outlived that phase: made and freed in one phase is a temporary;
  made in a forward phase and kept is an activation or a tensor saved for backward; made in backward and kept is a
  gradient; made in an optimizer step and kept is optimizer state;
- for the recorder's mixed-precision runs, the model's parameter list: a bf16 tensor of a Linear weight's size made
  by `nn.Linear` in forward and released in backward is autocast's weight copy (the Linear's output, e.g. the
  logits, may have the same size, but the step still holds it after backward);
- without the recorder's list, blocks alive since before the trace and never freed are the program's persistent
  state. Matched to the gradients of the trace by size, they divide into parameters and optimizer state: per
  gradient of a size, one block of that size is its parameter and the next k its optimizer state, k read from the
  counts (Adam keeps 2 tensors per parameter, SGD with momentum 1). Which of the same-size blocks is the parameter is
  not recorded, so only the bytes per role are certain.
What none of these explains is `unknown`, with the reason.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from profiler_kit.memory.analyze import BEFORE_TRACE, MIB, Reconstruction
from profiler_kit.memory.evidence import (
    AUTOCAST,
    DDP_BUCKET,
    ENGINE,
    LINEAR,
    MODULE_INIT,
    OPTIMIZER,
    UNSHARDED,
    ZERO_GRAD,
    Marks,
    allocation_marks,
    phase_kind,
)
from profiler_kit.memory.phases import PhaseSpan, span_index
from profiler_kit.memory.storages import Capture, read_captures

PARAMETER = "parameter"
UNSHARDED_PARAMETER = "unsharded parameter"
GRADIENT = "gradient"
GRADIENT_BUCKET = "gradient bucket"
OPTIMIZER_STATE = "optimizer state"
ACTIVATION = "activation"
AUTOCAST_COPY = "autocast weight copy"
TEMPORARY = "temporary"
UNKNOWN = "unknown"
ROLES = (PARAMETER, UNSHARDED_PARAMETER, GRADIENT, GRADIENT_BUCKET, OPTIMIZER_STATE, ACTIVATION, AUTOCAST_COPY,
         TEMPORARY, UNKNOWN)
LISTED_ROLES = {"parameter": PARAMETER, "unsharded_parameter": UNSHARDED_PARAMETER, "gradient": GRADIENT,
                "gradient_bucket": GRADIENT_BUCKET, "optimizer_state": OPTIMIZER_STATE}
BF16_BYTES = 2
BLOCK_ROUND = 512  # the caching allocator's block granularity
MAX_STATE_PER_PARAMETER = 2  # Adam's exp_avg and exp_avg_sq
STEP_COUNTER_BYTES = (4, 8)  # fused or capturable Adam keeps each parameter's step as a float32 (or float64) tensor
BEFORE_TRACE_KEPT = "alive before the trace and never freed"
_STATE_NAMES = {1: "1 optimizer-state tensor (e.g. SGD's momentum)", 2: "2 optimizer-state tensors (Adam's "
                "exp_avg, exp_avg_sq)"}


def sizes_are_rounded(snapshot: dict) -> bool:
    """True when the snapshot's blocks lack `requested_size`, so their sizes are the allocator's rounded ones."""
    return any("requested_size" not in block for seg in snapshot.get("segments", []) for block in seg["blocks"]
               if block.get("state") != "inactive")


def infer_roles(recon: Reconstruction, spans: list[PhaseSpan], meta: dict | None, rounded_sizes: bool = False,
                marks: Marks | None = None) -> pd.DataFrame:
    """Per row of `recon.allocations`: `role` (one of `ROLES`) and `evidence` (why, in words); `marks` are
    `evidence.allocation_marks(recon.allocations)` when the caller has them."""
    meta = meta or {}
    config = meta.get("config") or {}
    bf16_weights = {n * BF16_BYTES for n in meta.get("linear_weight_numels") or []} \
        if config.get("mixed_precision") else set()
    a = recon.allocations
    made, freed = marks or allocation_marks(a)
    span_idx = span_index(spans, a["start"].to_numpy())
    end_idx = span_index(spans, a["end"].to_numpy())
    roles, evidence = [], []
    columns = ["size_bytes", "start", "end", "alive_at_end"]
    for (size, start, end, alive_at_end), m, f, k, k_end in zip(
            a[columns].itertuples(index=False), made, freed, span_idx, end_idx, strict=True):
        span = spans[k] if k >= 0 else None
        freed_in_backward = ENGINE in f or (k_end >= 0 and phase_kind(spans[k_end].phase) == "backward")
        role, why = _role(m, f, freed_in_backward, span, start, end, size, bool(alive_at_end), bf16_weights)
        roles.append(role)
        evidence.append(why)
    out = pd.DataFrame({"role": roles, "evidence": evidence}, index=a.index, dtype=object)
    captures = read_captures(meta)
    if captures:
        _apply_list(recon, captures, out, rounded_sizes)
    else:
        _persistent_state(a, out, rounded_sizes)
    return out


def assign_roles(recon: Reconstruction, spans: list[PhaseSpan], meta: dict | None, rounded_sizes: bool = False
                 ) -> pd.Series:
    """One role from `ROLES` per row of `recon.allocations`."""
    return infer_roles(recon, spans, meta, rounded_sizes)["role"]


def _role(made: frozenset[str], freed: frozenset[str], freed_in_backward: bool, span: PhaseSpan | None, start: int,
          end: int, size: int, alive_at_end: bool, bf16_weights: set[int]) -> tuple[str, str]:
    """The role one allocation's evidence supports (see the module docstring), and that evidence."""
    kind = phase_kind(span.phase) if span else None
    outlives = end >= span.end if span else alive_at_end
    if AUTOCAST in made:
        return AUTOCAST_COPY, "made by autocast's cast cache"
    if UNSHARDED in made:
        return UNSHARDED_PARAMETER, "made by FSDP's all-gather of the sharded parameters"
    if DDP_BUCKET in made and (span is None or outlives):  # what the reducer frees at once is its scratch
        return GRADIENT_BUCKET, "made by DDP's reducer (torch/nn/parallel/distributed.py) and kept: its buckets"
    if kind == "forward" and LINEAR in made and size in bf16_weights and freed_in_backward:
        return AUTOCAST_COPY, "a Linear weight's size in bf16, made by nn.Linear in forward, freed in backward"
    if ZERO_GRAD in freed:
        return GRADIENT, "freed by zero_grad"
    if start == BEFORE_TRACE:
        if MODULE_INIT in made:
            return PARAMETER, "made before the trace by a module's constructor or its move to the device"
        if OPTIMIZER in made:
            return OPTIMIZER_STATE, "made before the trace by torch/optim"
        if alive_at_end:
            return UNKNOWN, BEFORE_TRACE_KEPT
        return UNKNOWN, "made before the trace (no stack), freed in it, not by zero_grad"
    if MODULE_INIT in made and outlives:
        return PARAMETER, "made by a module's constructor or its move to the device"
    if span is not None and not outlives:
        return TEMPORARY, f"made and freed in {span.phase}"
    if ENGINE in made:  # made by the autograd engine: freed there it was an intermediate, else a gradient
        if ENGINE in freed:
            return TEMPORARY, "made and freed by the autograd engine"
        return GRADIENT, "made by the autograd engine, kept after it"
    if kind == "backward":
        return GRADIENT, f"made in {span.phase}, kept after it"
    if OPTIMIZER in made or kind == "optimizer":  # optimizer state lives on; what the step frees was scratch
        where = "by torch/optim" if OPTIMIZER in made else f"in {span.phase}"
        return (OPTIMIZER_STATE, f"made {where}, kept after it") if outlives else \
            (TEMPORARY, f"made {where}, freed in the step")
    if ENGINE in freed:
        return ACTIVATION, "freed by the autograd engine: saved for backward"
    if kind == "forward":
        return ACTIVATION, f"made in {span.phase}, kept after it"
    where = f"made in {span.phase}" if span else "made outside any phase"
    return UNKNOWN, f"{where}; no stack or phase says what it holds"


def _size_key(size, rounded: bool):
    """A size (int or Series) comparable between the trace (requested bytes) and blocks (rounded when
    `rounded`)."""
    return -(-size // BLOCK_ROUND) * BLOCK_ROUND if rounded else size


def _set(out: pd.DataFrame, rows, role: str, why: str) -> None:
    out.loc[rows, "role"] = role
    out.loc[rows, "evidence"] = why


def _apply_list(recon: Reconstruction, captures: list[Capture], out: pd.DataFrame, rounded: bool) -> None:
    """Give each allocation alive at a capture's moment at a listed address, of the listed size, that role (the
    captures in time order: the first one that lists an allocation names it)."""
    a = recon.allocations
    keys = _size_key(a["size_bytes"], rounded)
    times = None if recon.time_us is None else np.maximum.accumulate(recon.time_us)
    rows_at = a.groupby("addr").groups
    listed: set = set()  # the first capture that names an allocation gives its evidence
    for capture in captures:
        if capture.time_us is None:
            moment = recon.n_entries
        elif times is None:
            continue
        else:  # entries up to the capture's time happened before it
            moment = int(np.searchsorted(times, capture.time_us, side="right"))
        for addr, (kind, size) in capture.storages.items():
            for idx in rows_at.get(addr, ()):
                alive = a.at[idx, "start"] < moment <= a.at[idx, "end"]
                if alive and idx not in listed and (size is None or keys[idx] == _size_key(size, rounded)):
                    listed.add(idx)
                    label = f" taken at {capture.label}" if capture.label else ""
                    why = f"in the recorder's list of {kind.replace('_', ' ')} storages{label}"
                    if LISTED_ROLES[kind] == GRADIENT and out.at[idx, "role"] == GRADIENT_BUCKET:
                        # DDP with gradient_as_bucket_view: the gradients are views into its buckets.
                        _set(out, idx, GRADIENT_BUCKET, f"{why}, made by DDP's reducer: a bucket the gradients "
                             "are views of")
                    else:
                        _set(out, idx, LISTED_ROLES[kind], why)
    kept = (out["role"] == UNKNOWN) & (out["evidence"] == BEFORE_TRACE_KEPT)
    out.loc[kept, "evidence"] = f"{BEFORE_TRACE_KEPT}; not in the recorder's list"


def _max_alive(starts: np.ndarray, ends: np.ndarray) -> int:
    """Most allocations alive at one moment (a free at an entry happens before an allocation at a later one)."""
    events = sorted([(int(s), 1) for s in starts] + [(int(e), -1) for e in ends])
    return int(np.cumsum([d for _, d in events]).max(initial=0))


def _persistent_state(a: pd.DataFrame, out: pd.DataFrame, rounded: bool) -> None:
    """Blocks alive before the trace and never freed, divided by size into parameters and optimizer state against
    the gradients the trace shows (see the module docstring); the rest keeps `unknown` with its reason."""
    keys = _size_key(a["size_bytes"], rounded)
    kept = (out["role"] == UNKNOWN) & (out["evidence"] == BEFORE_TRACE_KEPT)
    grads = out["role"] == GRADIENT
    if not grads.any():
        out.loc[kept, "evidence"] = f"{BEFORE_TRACE_KEPT}; the trace has no gradient to match its size against"
        return
    per_size = {key: _max_alive(a.loc[rows, "start"].to_numpy(), a.loc[rows, "end"].to_numpy())
                for key, rows in a[grads].groupby(keys[grads]).groups.items()}
    blocks = {key: sorted(rows, key=lambda idx: a.at[idx, "addr"])
              for key, rows in a[kept].groupby(keys[kept]).groups.items()}
    # Parameters and state that other evidence (their stacks) already named count towards each size's share.
    known_params = Counter(keys[out["role"] == PARAMETER])
    known_state = Counter(keys[out["role"] == OPTIMIZER_STATE])
    votes: Counter[int] = Counter()
    for key, n in per_size.items():
        total = len(blocks.get(key, ())) + known_params[key] + known_state[key]
        if total >= n:
            votes[min(total // n - 1, MAX_STATE_PER_PARAMETER)] += n
    state_per_param = votes.most_common(1)[0][0] if votes else 0
    group = 1 + state_per_param
    matched = sum(known_params.values())
    for key, rows in blocks.items():
        n = per_size.get(key, 0)
        if n == 0:
            out.loc[rows, "evidence"] = f"{BEFORE_TRACE_KEPT}; no gradient of the trace has its size"
            continue
        share = (f"{BEFORE_TRACE_KEPT}; sized like a gradient: per gradient, its parameter and "
                 f"{_STATE_NAMES.get(state_per_param, 'no optimizer state')}")
        n_params = max(n - known_params[key], 0)
        n_state = max(n * state_per_param - known_state[key], 0)
        params, state = rows[:n_params], rows[n_params:n_params + n_state]
        _set(out, params, PARAMETER, share)
        _set(out, state, OPTIMIZER_STATE, share)
        out.loc[rows[n_params + n_state:], "evidence"] = (
            f"{BEFORE_TRACE_KEPT}; more blocks of its size than parameters and their optimizer state ({group} per "
            "gradient)")
        matched += len(params)
    counters = [idx for key in STEP_COUNTER_BYTES for idx in blocks.get(key, ()) if not rounded]
    if state_per_param and counters and len(counters) == matched and not any(per_size.get(k) for k in
                                                                             STEP_COUNTER_BYTES):
        _set(out, counters, OPTIMIZER_STATE, f"{BEFORE_TRACE_KEPT}, one scalar tensor per matched parameter: "
             "Adam's step counters (fused or capturable)")


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


def evidence_summary(sizes: pd.Series, evidence: pd.Series, most: int = 3) -> str:
    """The evidence of some allocations, the most bytes first: `freed by zero_grad (17, 5.4 MiB); …`."""
    by_reason = sizes.groupby(evidence).agg(["count", "sum"]).sort_values("sum", ascending=False, kind="stable")
    parts = [f"{reason} ({n:,}, {total / MIB:,.1f} MiB)" for reason, n, total in
             by_reason.head(most).itertuples()]
    if len(by_reason) > most:
        parts.append(f"{len(by_reason) - most} more")
    return "; ".join(parts)


def roles_at(recon: Reconstruction, roles: pd.Series, index: int, evidence: pd.Series | None = None
             ) -> pd.DataFrame:
    """Count and bytes of each role alive after entry `index`, with its share of all allocated bytes and, given
    each allocation's `evidence`, what it rests on."""
    a = recon.allocations
    alive = (a["start"] <= index) & (a["end"] > index)
    total = int(a.loc[alive, "size_bytes"].sum())
    rows = []
    for role in ROLES:
        sel = alive & (roles == role)
        size = int(a.loc[sel, "size_bytes"].sum())
        row = {"role": role, "count": int(sel.sum()), "size_mib": size / MIB,
               "share_pct": 100.0 * size / total if total else 0.0, "size_bytes": size}
        if evidence is not None:
            row["evidence"] = evidence_summary(a.loc[sel, "size_bytes"], evidence[sel]) if sel.any() else None
        rows.append(row)
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
