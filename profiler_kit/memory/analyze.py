"""Answers from a memory snapshot: the peak, what is alive at it and which code allocated it, the per-phase
peaks the recorder measured, and expected vs measured sizes of the model's big tensors.

Allocated memory over time is rebuilt from the trace the way pytorch.org/memory_viz does it: an allocation
lives from its `alloc` entry to its `free_completed` entry. The trace may begin mid-run (a ring buffer of
`max_entries`, or history switched on late), so a free whose alloc is not in the trace, and an allocated block
in `segments` that no live trace allocation accounts for, were alive before the first entry. Sizes are the
bytes the trace records, i.e. what was requested (a tensor's nbytes), so they match tensor shapes exactly; the
allocator's own counter rounds each block up to 512 B and reads a little higher. Reserved memory is the
segments, rebuilt backwards from the final segments through the segment events.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profiler_kit.errors import ProfilerKitError
from profiler_kit.presets import count_parameters, from_name
from profiler_kit.workload import phases_for

MIB = 1024**2
BEFORE_TRACE = -1  # the entry index of allocations made before the first trace entry
BEFORE_TRACE_LABEL = "before trace"
AFTER_STEPS_LABEL = "after the steps"
# Blocks still holding a tensor, or freed but waiting for another stream: both count until `free_completed`.
ALIVE_BLOCK_STATES = ("active_allocated", "active_pending_free")
SEGMENT_SIGN = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
ROLE_NAMES = {"parameter": "parameter", "gradient": "gradient", "adamw_state": "AdamW state"}
DTYPE_BYTES = {"fp32": 4, "bf16": 2}
_TORCH_FILE = re.compile(r"(^|[/\\])torch[/\\]")


@dataclass
class Reconstruction:
    """Allocated and reserved bytes after every trace entry of one device, and every allocation seen."""

    device: int
    n_entries: int
    # One row per allocation: addr, size_bytes, start/end (trace entry indices; start BEFORE_TRACE when it was
    # alive before the trace, end n_entries when still alive at the end), alive_at_end, frames.
    allocations: pd.DataFrame
    allocated_bytes: np.ndarray
    reserved_bytes: np.ndarray
    initial_allocated_bytes: int
    initial_reserved_bytes: int
    time_us: np.ndarray | None
    oom_events: list[dict] = field(default_factory=list)

    def allocated_at(self, index: int) -> int:
        return self.initial_allocated_bytes if index == BEFORE_TRACE else int(self.allocated_bytes[index])

    @property
    def peak_index(self) -> int:
        """Entry index after which allocated memory is highest (BEFORE_TRACE: never above the start)."""
        series = np.concatenate(([self.initial_allocated_bytes], self.allocated_bytes))
        return int(np.argmax(series)) + BEFORE_TRACE

    @property
    def peak_allocated_bytes(self) -> int:
        return self.allocated_at(self.peak_index)

    @property
    def peak_reserved_bytes(self) -> int:
        return int(max(self.initial_reserved_bytes, self.reserved_bytes.max(initial=0)))

    def alive_at(self, index: int) -> pd.DataFrame:
        a = self.allocations
        return a[(a["start"] <= index) & (a["end"] > index)]


def pick_device(snapshot: dict, device: int | None = None) -> int:
    """The requested device, else the one with the longest trace, else the one with most segment bytes."""
    traces = snapshot["device_traces"]
    by_segments: dict[int, int] = {}
    for seg in snapshot["segments"]:
        by_segments[seg.get("device", 0)] = by_segments.get(seg.get("device", 0), 0) + seg["total_size"]
    known = set(range(len(traces))) | set(by_segments)
    if device is not None:
        if device not in known:
            raise ProfilerKitError(f"the snapshot has no device {device}; it has {sorted(known) or 'none'}")
        return device
    if any(traces):
        return max(range(len(traces)), key=lambda d: len(traces[d]))
    if by_segments:
        return max(by_segments, key=by_segments.get)
    raise ProfilerKitError("the snapshot holds no segments and no trace entries: nothing was on the GPU")


def reconstruct(snapshot: dict, device: int | None = None) -> Reconstruction:
    """Replay one device's trace into allocations and allocated/reserved bytes after each entry."""
    device = pick_device(snapshot, device)
    traces = snapshot["device_traces"]
    entries = traces[device] if device < len(traces) else []
    n = len(entries)
    rows: list[list] = []  # [addr, size_bytes, start, end, frames]
    live: dict[int, int] = {}  # address → row of the allocation living there
    alloc_delta = np.zeros(n, dtype=np.int64)
    reserved_delta = np.zeros(n, dtype=np.int64)
    oom_events = []
    for i, entry in enumerate(entries):
        action = entry["action"]
        if action == "alloc":
            stale = live.get(entry["addr"])
            if stale is not None:  # its free was not recorded (skipped actions): it ended here at the latest
                rows[stale][3] = i
                alloc_delta[i] -= rows[stale][1]
            live[entry["addr"]] = len(rows)
            rows.append([entry["addr"], entry["size"], i, n, entry.get("frames", [])])
            alloc_delta[i] += entry["size"]
        elif action == "free_completed":
            row = live.pop(entry["addr"], None)
            if row is None:
                rows.append([entry["addr"], entry["size"], BEFORE_TRACE, i, []])
                alloc_delta[i] = -entry["size"]
            else:
                rows[row][3] = i
                alloc_delta[i] = -rows[row][1]
        elif action in SEGMENT_SIGN:
            reserved_delta[i] = SEGMENT_SIGN[action] * entry["size"]
        elif action == "oom":
            oom_events.append({
                "event": i, "requested_bytes": entry.get("size"),
                "device_free_bytes": entry.get("device_free"), "time_us": entry.get("time_us"),
            })
    final_reserved = 0
    for seg in snapshot["segments"]:
        if seg.get("device", 0) != device:
            continue
        final_reserved += seg["total_size"]
        address = seg["address"]
        for block in seg["blocks"]:
            if block["state"] in ALIVE_BLOCK_STATES and address not in live:
                size = block.get("requested_size", block["size"])
                rows.append([address, size, BEFORE_TRACE, n, block.get("frames", [])])
            address += block["size"]
    allocations = pd.DataFrame(rows, columns=["addr", "size_bytes", "start", "end", "frames"])
    allocations["alive_at_end"] = allocations["end"] == n
    initial = int(allocations.loc[allocations["start"] == BEFORE_TRACE, "size_bytes"].sum())
    initial_reserved = final_reserved - int(reserved_delta.sum())
    times = [entry.get("time_us") for entry in entries]
    return Reconstruction(
        device=device,
        n_entries=n,
        allocations=allocations,
        allocated_bytes=initial + np.cumsum(alloc_delta),
        reserved_bytes=initial_reserved + np.cumsum(reserved_delta),
        initial_allocated_bytes=initial,
        initial_reserved_bytes=initial_reserved,
        time_us=np.array(times, dtype=np.int64) if n and None not in times else None,
        oom_events=oom_events,
    )


@dataclass(frozen=True)
class PhaseSpan:
    """Trace entries [start, end) recorded during one phase of one step."""

    label: str
    start: int
    end: int
    completed: bool = True


def phase_spans(recon: Reconstruction, sidecar: dict | None) -> list[PhaseSpan]:
    """Place the recorder's phase ends (wall-clock µs, the clock of the trace's `time_us`) on the trace."""
    phases = (sidecar or {}).get("phases") or []
    if not phases or recon.time_us is None:
        return []
    # Trace times come from a calibrated cycle counter and may step back by a few µs; search a monotone copy.
    times = np.maximum.accumulate(recon.time_us)
    several_steps = len({p["step"] for p in phases}) > 1
    spans, start = [], 0
    for p in phases:
        end = max(start, int(np.searchsorted(times, p["end_time_us"], side="right")))
        label = f"{p['phase']} (step {p['step'] + 1})" if several_steps else p["phase"]
        spans.append(PhaseSpan(label, start, end, p.get("completed", True)))
        start = end
    return spans


def phase_at(spans: list[PhaseSpan], index: int) -> str | None:
    """The phase an entry index falls in; None when phases are unknown."""
    if index == BEFORE_TRACE:
        return BEFORE_TRACE_LABEL
    for span in spans:
        if span.start <= index < span.end:
            return span.label
    return AFTER_STEPS_LABEL if spans else None


def first_user_frame(frames: list[dict]) -> dict | None:
    """The innermost Python frame outside the torch package (frames run from innermost outwards; C++ frames,
    which `stacks="all"` adds, are skipped)."""
    for frame in frames:
        filename = str(frame.get("filename", ""))
        if filename.endswith(".py") and not _TORCH_FILE.search(filename):
            return frame
    return None


def short_path(filename: str) -> str:
    """Path below site-packages, else the last two components: `profiler_kit/model.py`."""
    parts = re.split(r"[/\\]", filename)
    if "site-packages" in parts:
        return "/".join(parts[len(parts) - parts[::-1].index("site-packages"):])
    return "/".join(parts[-2:])


def assign_roles(recon: Reconstruction, sidecar: dict | None) -> pd.Series:
    """What each allocation holds when the recorder named it (parameter, gradient, AdamW state), by the
    address of the tensor's storage at the end of the recording; only allocations alive at the end match."""
    by_address = {
        addr: ROLE_NAMES.get(role, role)
        for role, addresses in ((sidecar or {}).get("tensor_roles") or {}).items()
        for addr in addresses
    }
    a = recon.allocations
    pairs = zip(a["addr"], a["alive_at_end"], strict=True)
    return pd.Series(
        [by_address.get(addr) if alive else None for addr, alive in pairs],
        index=a.index,
        dtype=object,
    )


def top_allocations(recon: Reconstruction, roles: pd.Series, spans: list[PhaseSpan], n: int) -> pd.DataFrame:
    """The n largest allocations alive at the peak, with the phase that allocated them and the first frame
    outside torch."""
    alive = recon.alive_at(recon.peak_index).sort_values("size_bytes", ascending=False, kind="stable").head(n)
    rows = []
    for rank, (idx, row) in enumerate(alive.iterrows(), start=1):
        frame = first_user_frame(row["frames"])
        rows.append({
            "rank": rank,
            "size_mib": row["size_bytes"] / MIB,
            "size_bytes": int(row["size_bytes"]),
            "role": roles[idx],
            "allocated_in": phase_at(spans, int(row["start"])),
            "where": f"{short_path(frame['filename'])}:{frame['line']}" if frame else None,
            "function": frame["name"] if frame else None,
        })
    columns = ["rank", "size_mib", "size_bytes", "role", "allocated_in", "where", "function"]
    return pd.DataFrame(rows, columns=columns)


def frame_with_optional_ints(rows: list[dict], columns: list[str], optional_ints: tuple[str, ...]
                              ) -> pd.DataFrame:
    """A DataFrame whose listed columns keep Python ints and None (pandas would turn them into floats)."""
    df = pd.DataFrame(rows, columns=columns)
    for col in optional_ints:
        df[col] = pd.Series([row[col] for row in rows], index=df.index, dtype=object)
    return df


def parameter_tensor_count(num_layers: int) -> int:
    """Parameter tensors of `TransformerLM`: per layer two RMSNorm gains, fused QKV, output projection and the
    three SwiGLU matrices; plus embedding, final RMSNorm and LM head."""
    return 7 * num_layers + 3


@dataclass(frozen=True)
class ExpectedTensor:
    """A big tensor of the config: matched to measured allocations by role when it has one, else by size."""

    tensor: str
    dtype: str
    formula: str
    sizes: tuple[int, ...] = ()
    role: str | None = None
    expected_count: int | None = None
    expected_total_bytes: int | None = None


def expected_tensors(config: dict) -> list[ExpectedTensor]:
    """Model state (parameters, gradients, AdamW moments) and the largest activations of a workload config."""
    mc = from_name(config["model"], config["ctx"])
    phases = phases_for(config["mode"])
    b, t, d, h, f, v = config["batch_size"], config["ctx"], mc.d_model, mc.num_heads, mc.d_ff, mc.vocab_size
    n_params, n_tensors = count_parameters(mc), parameter_tensor_count(mc.num_layers)
    fp32 = DTYPE_BYTES["fp32"]
    state = [("parameters", "parameter", 1)]
    if "backward" in phases:
        state.append(("gradients", "gradient", 1))
    if "optimizer_step" in phases:
        state.append(("AdamW state (exp_avg, exp_avg_sq)", "AdamW state", 2))
    out = [
        ExpectedTensor(name, "fp32", f"{k}×{n_params:,} params × {fp32} B", role=role,
                       expected_count=k * n_tensors, expected_total_bytes=k * n_params * fp32)
        for name, role, k in state
    ]
    dtypes = ["fp32", "bf16"] if config["mixed_precision"] else ["fp32"]
    activations = [
        ("B·T·d activations (residual stream)", f"{b}·{t}·{d}", b * t * d),
        ("attention scores B·h·T²", f"{b}·{h}·{t}²", b * h * t * t),
        ("FFN hidden B·T·d_ff", f"{b}·{t}·{f}", b * t * f),
        ("logits B·T·V", f"{b}·{t}·{v}", b * t * v),
    ]
    for name, formula, elements in activations:
        for dtype in dtypes:
            size = elements * DTYPE_BYTES[dtype]
            out.append(ExpectedTensor(name, dtype, f"{formula} × {DTYPE_BYTES[dtype]} B", sizes=(size,)))
    if config["mixed_precision"]:
        # Autocast keeps a bf16 copy of every Linear weight for the forward pass (its weight cast cache).
        per_layer = [3 * d * d, d * d, d * f, d * f, f * d]
        weights = per_layer * mc.num_layers + [d * v]
        bf16 = DTYPE_BYTES["bf16"]
        out.append(ExpectedTensor(
            "bf16 copies of Linear weights (autocast)", "bf16", f"5·{mc.num_layers}+1 weights × {bf16} B",
            sizes=tuple(w * bf16 for w in weights), expected_count=len(weights),
            expected_total_bytes=sum(weights) * bf16,
        ))
    return out


def expected_vs_measured(recon: Reconstruction, roles: pd.Series, config: dict) -> pd.DataFrame:
    """Each expected tensor with its matching allocations: alive at the peak, and allocated in the trace."""
    a = recon.allocations
    at_peak = (a["start"] <= recon.peak_index) & (a["end"] > recon.peak_index)
    in_trace = a["start"] != BEFORE_TRACE
    rows = []
    for exp in expected_tensors(config):
        if exp.role is not None:
            match = roles == exp.role
        else:
            match = roles.isna() & a["size_bytes"].isin(set(exp.sizes))
        rows.append({
            "tensor": exp.tensor,
            "dtype": exp.dtype,
            "formula": exp.formula,
            "bytes_each": exp.sizes[0] if len(set(exp.sizes)) == 1 else None,
            "expected_count": exp.expected_count,
            "expected_total_mib": None if exp.expected_total_bytes is None
            else exp.expected_total_bytes / MIB,
            "count_at_peak": int((match & at_peak).sum()),
            "total_at_peak_mib": a.loc[match & at_peak, "size_bytes"].sum() / MIB,
            "allocs_in_trace": int((match & in_trace).sum()),
        })
    return frame_with_optional_ints(rows, list(rows[0]), ("bytes_each", "expected_count"))
