"""Which steps of a report are warm-up: only the leading ones slower than 1.5× the later half's median, on a
synthetic GPU report whose step walls are set here; a slow step later in the run is no warm-up."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiler_kit.kernels import summarize_trace
from profiler_kit.kernels.trace import KernelTrace, kernel_frame, range_frame

MS = 1_000_000


def report(walls_ms: list[float]) -> KernelTrace:
    """One process: back-to-back `step` ranges of the walls given, each ⊃ `fwd` [s, s + 1] launching a 0.5 ms
    matmul at s + 0.2, and `bwd` [s + 1, s + 2] launching another at s + 1.2."""
    names, starts, ends, kernels = [], [], [], []
    s = 0.0
    for wall in walls_ms:
        names += ["step", "fwd", "bwd"]
        starts += [s, s, s + 1]
        ends += [s + wall, s + 1, s + 2]
        kernels += [(s + 0.2, s + 0.3), (s + 1.2, s + 1.3)]
        s += wall
    frame = kernel_frame(["ampere_sgemm_128x64_nn"] * len(kernels), [MS // 2] * len(kernels),
                         [round(k[0] * MS) for k in kernels], [1] * len(kernels),
                         start_ns=[round(k[1] * MS) for k in kernels], stream=[7] * len(kernels))
    ranges = range_frame(names, [round(t * MS) for t in starts], [round(t * MS) for t in ends],
                         [1] * len(names), [1] * len(names))
    return KernelTrace("synthetic", Path("steps"), frame, ranges)


@pytest.mark.parametrize(("walls", "warm"), [
    ([25, 10, 10, 20, 10, 10], 1),  # step 3 is twice the median, but not leading
    ([25, 22, 10, 20, 10, 10], 2),
    ([10, 25, 10, 10, 10, 10], 0),  # a slow second step after a steady first
])
def test_only_leading_slow_steps_are_warm_up(walls, warm):
    steps = summarize_trace(report(walls)).steps
    assert steps["wall_ms"].tolist() == pytest.approx(walls)
    states = steps["state"].tolist() if "state" in steps.columns else ["steady"] * len(walls)
    assert [state == "warm-up" for state in states] == [i < warm for i in range(len(walls))]
