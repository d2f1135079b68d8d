"""Which steps of a report are warm-up, one-off or steady, on a synthetic GPU report whose step walls are set here:
warm-up the program's first step and the leading ones slower than 1.5× the later half's median, a later step 3×
the median a one-off with its cause; `compare` takes the steady ones."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from profiler_kit.kernels import compare, summarize_trace
from profiler_kit.kernels.runs import STEP, side_of
from profiler_kit.kernels.trace import KernelTrace, kernel_frame, range_frame

MS = 1_000_000


def report(walls_ms: list[float], numbers: list[int] | None = None,
           ranges: list[tuple[str, float, float]] = (), kernels: list[tuple[str, float, float]] = ()) -> KernelTrace:
    """One process: back-to-back `step` ranges of the walls given, each ⊃ `fwd` [s, s + 1] launching a 0.5 ms
    matmul at s + 0.2, and `bwd` [s + 1, s + 2] launching another at s + 1.2; `numbers`: the recorder's step
    numbers of the steps; `ranges` and `kernels` (name, start ms, end ms; a kernel launched as it starts): more."""
    names, starts, ends, launched = [], [], [], []
    s = 0.0
    for wall in walls_ms:
        names += ["step", "fwd", "bwd"]
        starts += [s, s, s + 1]
        ends += [s + wall, s + 1, s + 2]
        launched += [("ampere_sgemm_128x64_nn", s + 0.2, s + 0.7), ("ampere_sgemm_128x64_nn", s + 1.2, s + 1.7)]
        s += wall
    launched += list(kernels)
    frame = kernel_frame([k[0] for k in launched], [round((k[2] - k[1]) * MS) for k in launched],
                         [round(k[1] * MS) for k in launched], [1] * len(launched),
                         start_ns=[round(k[1] * MS) for k in launched], stream=[7] * len(launched))
    count = len(names)
    number = None
    if numbers is not None:
        number = pd.array([numbers[i // 3] if i % 3 == 0 else pd.NA for i in range(count)]
                          + [pd.NA] * len(ranges), dtype="Int64")
    names += [r[0] for r in ranges]
    starts += [r[1] for r in ranges]
    ends += [r[2] for r in ranges]
    frame_ranges = range_frame(names, [round(t * MS) for t in starts], [round(t * MS) for t in ends],
                               [1] * len(names), [1] * len(names))
    if number is not None:
        frame_ranges = frame_ranges.assign(number=number)
    return KernelTrace("synthetic", Path("steps"), frame, frame_ranges)


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


def states(trace: KernelTrace) -> list[str]:
    steps = summarize_trace(trace).steps
    return steps["state"].tolist() if "state" in steps.columns else ["steady"] * len(steps)


def test_the_programs_first_step_is_warm_up_whatever_its_time():
    # Step 0 of the program took 1.4× the others: under the threshold, yet warm-up (it holds the start-up); a
    # report whose first step is the program's step 3 judges it by the threshold alone.
    walls = [14, 10, 10, 10, 10]
    assert states(report(walls, numbers=[0, 1, 2, 3, 4]))[:2] == ["warm-up", "steady"]
    assert states(report(walls, numbers=[3, 4, 5, 6, 7]))[:2] == ["steady", "steady"]
    assert states(report(walls))[:2] == ["steady", "steady"]


def test_a_late_slow_step_is_one_off_with_the_gap_that_made_it():
    summary = summarize_trace(report([10, 10, 10, 40, 10, 10]))
    assert summary.steps["state"].tolist() == ["steady"] * 3 + ["one-off"] + ["steady"] * 2
    # Its kernels end 1.7 ms in: nothing ran for the 38.3 ms after, more than half its 30 ms over the median.
    assert summary.steps["cause"].tolist() == [""] * 3 + ["no kernel ran for 38.3 ms"] + [""] * 2
    assert summary.tables()[3][0] == "Per step: one-offs against the steady state"
    # 2.9× the median is no one-off.
    assert "state" not in summarize_trace(report([10, 10, 10, 29, 10, 10])).steps.columns


def test_a_one_off_step_names_torch_compile_when_its_events_cover_it():
    compiling = [("_compile.compile_inner (dynamo_timed)", 32.0, 62.0)]  # inside step 3 [30, 70)
    summary = summarize_trace(report([10, 10, 10, 40, 10, 10], ranges=compiling))
    assert summary.steps["cause"].iloc[3] == "compiling 30 ms"
    assert "_compile.compile_inner (dynamo_timed)" not in summary.phase_names  # a library's range, no phase


def test_a_one_off_step_names_autotuning_when_new_kernels_fill_it():
    # 60 launches of 3 kernels no steady step runs, 0.5 ms each, back to back inside step 3 [30, 70).
    candidates = [(f"triton_mm_{i % 3}", 32.0 + i * 0.6, 32.5 + i * 0.6) for i in range(60)]
    summary = summarize_trace(report([10, 10, 10, 40, 10, 10], kernels=candidates))
    assert summary.steps["cause"].iloc[3] == "autotuning: 60 launches of 3 kernels no steady step runs"


def test_warm_up_and_one_off_steps_are_left_out_of_a_side():
    # Step 0 warms up (40 ms against 10) and step 4 is a one-off (40 ms again): the side keeps steps 1-3, 5.
    walls = [40, 10, 10, 10, 40, 10]
    summary = summarize_trace(report(walls))
    assert summary.steps["state"].tolist() == ["warm-up", "steady", "steady", "steady", "one-off", "steady"]
    side = side_of([summary], "A")
    assert side.unit == STEP and side.run_count == 4
    steady = summary.steps["kernel_ms"].iloc[[1, 2, 3, 5]] * 1e6
    assert side.runs[side.runs["quantity"] == "total"]["value_ns"].tolist() == pytest.approx(steady.tolist(), abs=1)
    note = "A: the comparison is judged on the steady steps, 4 of 6 (1 warm-up, 1 one-off left out"
    assert any(n.startswith(note) for n in compare(summary, summary).notes)
