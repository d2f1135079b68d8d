"""Where each timed forward+backward of `host_bound_trace.py` goes, from its Nsight Systems SQLite export.

do_bench records a start and an end CUDA event around every timed call, after the L2 flush. For each
implementation's NVTX range the script pairs those records (skipping do_bench's first pair, its estimate) and
splits every call, in µs:
- span: from where the GPU reaches the start event (the flush's end, or the record if the host is later) to
  where it reaches the end event: what do_bench measures;
- kernels: the GPU's busy time within the span, and idle: the rest;
- host: forward (start record to the main thread's last launch), hand-off (to the first API call of the
  thread that runs the backward), backward (that thread's first to last API call), tail (from there to the end
  record, on the main thread);
- the runtime and driver API calls per call, by name.
Each cell is the median over the calls with its 20th and 80th percentiles.

Usage: python3 scripts/step24/trace_gaps.py trace.sqlite [--impl flash-triton,sdpa-flash]
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
from collections import Counter


def _union_us(intervals: list[tuple[int, int]], lo: int, hi: int) -> float:
    """Length of the union of [start, end) intervals clipped to [lo, hi), in µs (inputs in ns)."""
    total, reach = 0, lo
    for start, end in sorted(intervals):
        start, end = max(start, reach), min(end, hi)
        if end > start:
            total += end - start
            reach = end
    return total / 1e3


def calls(db: sqlite3.Connection, impl: str) -> tuple[list[dict], Counter]:
    """The split of every timed call inside `impl`'s NVTX range, and its API calls counted by name."""
    names = dict(db.execute("SELECT id, value FROM StringIds"))
    lo, hi, main = db.execute(
        "SELECT start, end, globalTid FROM NVTX_EVENTS WHERE end IS NOT NULL AND "
        "(text = ? OR textId IN (SELECT id FROM StringIds WHERE value = ?)) ORDER BY start LIMIT 1",
        (impl, impl)).fetchone()
    api = [(s, e, tid, corr, names[n]) for s, e, tid, corr, n in db.execute(
        "SELECT start, end, globalTid, correlationId, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME "
        "WHERE start >= ? AND end <= ? ORDER BY start", (lo, hi))]
    kernels = list(db.execute(
        "SELECT start, end, correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start >= ? ORDER BY correlationId",
        (lo,)))
    records = [a for a in api if a[2] == main and a[4].startswith("cudaEventRecord")][2:]
    out, counts = [], Counter()
    for (s0, e0, _, c0, _), (s1, e1, _, c1, _) in zip(records[0::2], records[1::2], strict=False):
        flush = max((k for k in kernels if k[2] < c0), key=lambda k: k[2], default=None)
        mine = [(k[0], k[1]) for k in kernels if c0 < k[2] < c1]
        if flush is None or not mine:
            continue
        gpu_start = max(flush[1], e0)
        gpu_end = max(max(end for _, end in mine), e1)
        inside = [a for a in api if s0 <= a[0] and a[1] <= e1]
        counts.update(a[4] for a in inside[1:-1])
        main_launches = [a for a in inside[1:-1] if a[2] == main]
        other = [a for a in inside if a[2] != main]
        fwd_end = max((a[1] for a in main_launches if not other or a[1] <= other[0][0]), default=e0)
        span = (gpu_end - gpu_start) / 1e3
        busy = _union_us(mine, gpu_start, gpu_end)
        out.append({
            "span": span, "kernels": busy, "idle": span - busy,
            "forward": (fwd_end - e0) / 1e3,
            "hand-off": ((other[0][0] - fwd_end) / 1e3) if other else 0.0,
            "backward": ((other[-1][1] - other[0][0]) / 1e3) if other else 0.0,
            "tail": ((s1 - other[-1][1]) / 1e3) if other else (s1 - fwd_end) / 1e3,
        })
    return out, counts


def _cell(values: list[float]) -> str:
    """Median [p20, p80] (nearest rank) of `values`."""
    v = sorted(values)
    return f"{statistics.median(v):.0f} [{v[len(v) // 5]:.0f}, {v[4 * len(v) // 5]:.0f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sqlite")
    parser.add_argument("--impl", default="flash-triton,sdpa-flash")
    args = parser.parse_args()
    db = sqlite3.connect(args.sqlite)
    keys = ("span", "kernels", "idle", "forward", "hand-off", "backward", "tail")
    print("| impl | calls | " + " | ".join(f"{k} µs" for k in keys) + " |")
    print("|---|---:|" + "---:|" * len(keys))
    per_impl = {}
    for impl in args.impl.split(","):
        rows, counts = calls(db, impl)
        per_impl[impl] = (len(rows), counts)
        cells = " | ".join(_cell([r[k] for r in rows]) for k in keys) if rows else "–"
        print(f"| {impl} | {len(rows)} | {cells} |")
    for impl, (n, counts) in per_impl.items():
        print(f"\n{impl}, API calls per timed call: "
              + ", ".join(f"{name} {c / max(n, 1):.1f}" for name, c in counts.most_common(12)))


if __name__ == "__main__":
    main()
