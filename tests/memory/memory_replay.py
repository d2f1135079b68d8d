"""A replay of a snapshot's trace that shares nothing with the analysis: allocated bytes after each entry, and
the peak over a time range; the truth that phase peaks are checked against."""

import numpy as np


def replay_levels(snapshot: dict) -> tuple[np.ndarray, np.ndarray]:
    """Allocated bytes after each trace entry, rebuilt backwards from the final allocated blocks (a different
    route from the analysis, which walks forwards), with each entry's time (made monotone: the trace's clock may
    step back by a few µs)."""
    trace = snapshot["device_traces"][0]
    final = sum(b["requested_size"] for s in snapshot["segments"] for b in s["blocks"]
                if b["state"] in ("active_allocated", "active_pending_free"))
    delta = np.array([e["size"] if e["action"] == "alloc" else -e["size"] if e["action"] == "free_completed"
                      else 0 for e in trace], dtype=np.int64)
    after = final - delta.sum() + np.cumsum(delta)
    return after, np.maximum.accumulate(np.array([e["time_us"] for e in trace]))


def replay_range_peak(levels: np.ndarray, times: np.ndarray, start_us: int, end_us: int) -> int:
    before = levels[times < start_us]
    inside = levels[(times >= start_us) & (times <= end_us)]
    return int(max(before[-1] if len(before) else levels[0], inside.max(initial=0)))
