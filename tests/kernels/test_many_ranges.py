"""A report with 200,000 short top-level NVTX ranges, each of its own name (an export of about 10 MB), is
summarized with array work, not Python per range: the phase totals and idle figures of every range asked for
as a phase, against a plain loop over the kernels."""

from __future__ import annotations

import bisect
import shutil
import sqlite3
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from profiler_kit.kernels import load, summarize

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
SOURCE = FIXTURES / "h100_example_mlp.sqlite"
RANGES = 200_000


@pytest.fixture(scope="module")
def many_ranges(tmp_path_factory) -> Path:
    """The committed export with its NVTX ranges replaced by RANGES short ones on the main thread, over the
    time its kernels were launched, named `r0`, `r1`, …"""
    path = tmp_path_factory.mktemp("many") / "many_ranges.sqlite"
    shutil.copyfile(SOURCE, path)
    con = sqlite3.connect(path)
    (tid,) = con.execute("SELECT globalTid FROM NVTX_EVENTS GROUP BY globalTid ORDER BY count(*) DESC").fetchone()
    lo, hi = con.execute("SELECT min(start), max(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()
    (event,) = con.execute("SELECT id FROM ENUM_NSYS_EVENT_TYPE WHERE name = 'NvtxPushPopRange'").fetchone()
    con.execute("DELETE FROM NVTX_EVENTS")
    starts = np.linspace(lo, hi, RANGES).astype(np.int64)
    length = int((hi - lo) // RANGES * 3 // 4)
    con.executemany("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, ?, ?, ?)",
                    ((int(s), int(s) + length, event, f"r{i}", tid) for i, s in enumerate(starts)))
    con.commit()
    con.close()
    return path


def test_many_ranges_match_a_plain_loop(many_ranges):
    found = summarize(many_ranges)
    assert found.phase_names == [] and "200,000 names, too many to be phases" in found.notes[0]
    names = [f"r{i}" for i in range(RANGES)]
    summary = summarize(many_ranges, phases=names)
    trace = load(many_ranges)
    ranges = trace.ranges.sort_values("start_ns").reset_index(drop=True)
    starts, ends = ranges["start_ns"].tolist(), ranges["end_ns"].tolist()
    assert ranges["name"].tolist() == names
    per_range: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for launch, duration, start in zip(trace.kernels["launch_ns"], trace.kernels["total_ns"],
                                       trace.kernels["start_ns"], strict=True):
        i = bisect.bisect_right(starts, launch) - 1
        if i >= 0 and launch <= ends[i]:
            per_range[i].append((start, start + duration))
    assert len(per_range) > 20
    phases = summary.phase_ns()
    assert {p: v["total_ns"] for p, v in phases.items() if v["total_ns"]} == {
        names[i]: sum(e - s for s, e in intervals) for i, intervals in per_range.items()}
    idle = summary.idle
    assert idle["ranges"].eq(1).all()
    assert idle["wall_ns"].tolist() == [e - s for s, e in zip(starts, ends, strict=True)]
    expected_span, expected_busy = np.zeros(RANGES, dtype=np.int64), np.zeros(RANGES, dtype=np.int64)
    for i, intervals in per_range.items():
        intervals.sort()
        expected_span[i] = max(e for _, e in intervals) - intervals[0][0]
        reach = intervals[0][0]
        for a, b in intervals:
            expected_busy[i] += max(b - max(a, reach), 0)
            reach = max(reach, b)
    assert (idle["gpu_span_ns"].to_numpy() == expected_span).all()
    assert (idle["busy_ns"].to_numpy() == expected_busy).all()
