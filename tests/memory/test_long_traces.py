"""The shortcuts that keep long traces fast give what the plain computations give: phases of many allocations by
binary search, and each distinct stack's marks read once."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from profiler_kit.memory.analyze import reconstruct
from profiler_kit.memory.evidence import allocation_marks, frame_marks
from profiler_kit.memory.phases import PhaseSpan, span_index
from profiler_kit.memory.snapshot import load_snapshot

FIXTURES = Path(__file__).parents[1] / "fixtures" / "memory"


def _by_loop(spans: list[PhaseSpan], starts: np.ndarray) -> np.ndarray:
    out = np.full(len(starts), -1, dtype=np.int64)
    for k, span in enumerate(spans):
        out[(starts >= span.start) & (starts < span.end)] = k
    return out


def test_span_of_each_entry_matches_checking_every_span():
    rng = np.random.default_rng(0)
    edges = np.sort(rng.choice(np.arange(1, 5000), size=400, replace=False))
    # Disjoint spans with gaps and empty ones between them; then overlapping ones, where the last span wins.
    disjoint = [PhaseSpan(f"s{k}", int(a), int(b) if k % 5 else int(a)) for k, (a, b) in
                enumerate(zip(edges[::2], edges[1::2], strict=True))]
    overlapping = [PhaseSpan("a", 0, 300), PhaseSpan("b", 100, 200), PhaseSpan("c", 150, 400)]
    starts = rng.integers(-1, 5200, size=20_000)
    for spans in (disjoint, overlapping, []):
        assert (span_index(spans, starts) == _by_loop(spans, starts)).all()


def test_marks_of_shared_stacks_are_those_of_each_stack():
    snapshot = load_snapshot(FIXTURES / "h100_plain_phases.pickle")
    allocations = reconstruct(snapshot).allocations
    made, freed = allocation_marks(allocations)
    in_trace = allocations["start"] >= 0
    python_allocs = any(f["filename"].endswith(".py") for fr in allocations.loc[in_trace, "frames"] for f in fr)
    expected = [frame_marks(frames, python_allocs and bool(recorded))
                for frames, recorded in zip(allocations["frames"], in_trace, strict=True)]
    assert made == expected
    assert len(freed) == len(allocations)
    assert pd.Series(made).nunique() > 3  # the fixture's stacks differ, so a wrong cache key would show
