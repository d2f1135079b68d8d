"""Allocated and reserved memory over a snapshot's trace, the peak, what is alive at it, and the code that
allocated it.

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

MIB = 1024**2
BEFORE_TRACE = -1  # the entry index of allocations made before the first trace entry
# Blocks still holding a tensor, or freed but waiting for another stream: both count until `free_completed`.
ALIVE_BLOCK_STATES = ("active_allocated", "active_pending_free")
SEGMENT_SIGN = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
_TORCH_FILE = re.compile(r"(^|[/\\])torch[/\\]")


@dataclass
class Reconstruction:
    """Allocated and reserved bytes after every trace entry of one device, and every allocation seen."""

    device: int
    n_entries: int
    # One row per allocation: addr, size_bytes, start/end (trace entry indices; start BEFORE_TRACE when it was
    # alive before the trace, end n_entries when still alive at the end), alive_at_end, frames, user_metadata
    # (what `torch.cuda.memory._set_memory_metadata` held when it was made), free_frames (the stack that freed
    # it, recorded with context="all").
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


def _metadata(entry: dict) -> str:
    value = entry.get("user_metadata")
    return value if isinstance(value, str) else ""


def reconstruct(snapshot: dict, device: int | None = None) -> Reconstruction:
    """Replay one device's trace into allocations and allocated/reserved bytes after each entry."""
    device = pick_device(snapshot, device)
    traces = snapshot["device_traces"]
    entries = traces[device] if device < len(traces) else []
    n = len(entries)
    rows: list[list] = []  # [addr, size_bytes, start, end, frames, user_metadata, free_frames]
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
            rows.append([entry["addr"], entry["size"], i, n, entry.get("frames", []), _metadata(entry), []])
            alloc_delta[i] += entry["size"]
        elif action == "free_completed":
            row = live.pop(entry["addr"], None)
            if row is None:
                rows.append([entry["addr"], entry["size"], BEFORE_TRACE, i, [], "", entry.get("frames", [])])
                alloc_delta[i] = -entry["size"]
            else:
                rows[row][3] = i
                rows[row][6] = entry.get("frames", [])
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
                rows.append([address, size, BEFORE_TRACE, n, block.get("frames", []), "", []])
            address += block["size"]
    allocations = pd.DataFrame(rows, columns=["addr", "size_bytes", "start", "end", "frames", "user_metadata",
                                             "free_frames"])
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
