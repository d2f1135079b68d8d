"""Every number the kernel tables derive, against its definition, on small synthetic traces whose values are
worked out by hand here: shares, per-category shares of a phase, averages, per-step and per-phase idle time,
verdicts, TFLOP/s and MFU, A-against-B deltas, speedups and changes, what-if savings, and the ranks' spread and
communication overlap.

The trace (one process, the built-in phases, two identical steps 200 µs apart; times in ns from the step's
start, kernels on stream 7):

    step [0, 100_000]: forward [0, 40_000], backward [40_000, 80_000], optimizer_step [80_000, 100_000]
    sgemm        launched 1_000, runs 10_000-30_000   (forward)
    elementwise  launched 2_000, runs 30_000-35_000   (forward)
    sgemm        launched 41_000, runs 50_000-60_000  (backward)
    elementwise  launched 42_000, runs 70_000-75_000  (backward)
    adam         launched 81_000, runs 85_000-87_000  (optimizer_step)
    adam         launched 82_000, runs 95_000-97_000  (optimizer_step)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from profiler_kit.kernels import compare, summarize_trace
from profiler_kit.kernels.phase_metrics import FlopRate
from profiler_kit.kernels.ranks import summarize_ranks
from profiler_kit.kernels.trace import KernelTrace, kernel_frame, range_frame
from profiler_kit.kernels.whatif import Speedup, what_if

GEMM = "ampere_sgemm_128x64_nn"
ADD = "vectorized_elementwise_kernel<add>"
ADAM = "multi_tensor_apply_kernel<AdamFunctor>"
NCCL = "ncclDevKernel_AllReduce_Sum_f32"
STEP_NS = 200_000
PHASES = [("step", 0, 100_000), ("forward", 0, 40_000), ("backward", 40_000, 80_000),
          ("optimizer_step", 80_000, 100_000)]
KERNELS = [(GEMM, 1_000, 10_000, 20_000), (ADD, 2_000, 30_000, 5_000), (GEMM, 41_000, 50_000, 10_000),
           (ADD, 42_000, 70_000, 5_000), (ADAM, 81_000, 85_000, 2_000), (ADAM, 82_000, 95_000, 2_000)]
MS = 1e-6  # ns → ms


def make_trace(kernels: list[tuple], ranges: list[tuple] = PHASES, steps: int = 2, name: str = "t",
               stream: int = 7) -> KernelTrace:
    """`kernels` (name, launch, start, duration[, stream]) and `ranges` (name, start, end) of one step, repeated
    `steps` times STEP_NS apart, as a reader would give them."""
    rows = [(k[0], k[1] + s * STEP_NS, k[2] + s * STEP_NS, k[3], k[4] if len(k) > 4 else stream)
            for s in range(steps) for k in kernels]
    names, launch, start, duration, streams = (np.array(column) for column in zip(*rows, strict=True))
    frame = kernel_frame(names, duration.astype(np.int64), launch, np.ones(len(rows), dtype=np.int64),
                         start_ns=start, stream=streams)
    spans = [(r[0], r[1] + s * STEP_NS, r[2] + s * STEP_NS) for s in range(steps) for r in ranges]
    ranges_frame = range_frame([r[0] for r in spans], [r[1] for r in spans], [r[2] for r in spans],
                               [1] * len(spans), [1] * len(spans))
    return KernelTrace("test", Path(f"{name}.sqlite"), frame, ranges_frame)


@pytest.fixture
def summary():
    return summarize_trace(make_trace(KERNELS))


def by(table, column):
    return table.set_index(column)


def test_categories_share_the_total(summary):
    table = by(summary.category_table(), "category")
    total = 2 * (20_000 + 5_000 + 10_000 + 5_000 + 2_000 + 2_000)
    assert summary.total_ns == total == 88_000
    assert table.loc["matmul", "kernels"] == 4 and table.loc["matmul", "total_ms"] == pytest.approx(60_000 * MS)
    assert table.loc["matmul", "share_pct"] == pytest.approx(100 * 60_000 / 88_000)
    assert table.loc["elementwise", "share_pct"] == pytest.approx(100 * 20_000 / 88_000)
    assert table.loc["optimizer", "share_pct"] == pytest.approx(100 * 8_000 / 88_000)


def test_top_kernels_average_and_share(summary):
    table = by(summary.top_table(), "name")
    assert list(table.index) == [GEMM, ADD, ADAM]
    assert table.loc[GEMM, "instances"] == 4 and table.loc[GEMM, "total_ms"] == pytest.approx(0.06)
    assert table.loc[GEMM, "avg_us"] == pytest.approx(60_000 / 4 / 1_000)
    assert table.loc[ADAM, "avg_us"] == pytest.approx(2.0)
    assert table.loc[ADD, "share_pct"] == pytest.approx(100 * 20_000 / 88_000)


def test_a_kernel_shown_among_the_top_n_shares_all_the_time():
    top = summarize_trace(make_trace(KERNELS), top=1).top_table()
    assert list(top["name"]) == [GEMM] and top.loc[0, "share_pct"] == pytest.approx(100 * 60_000 / 88_000)


def test_phases_share_the_total_and_split_by_category(summary):
    table = by(summary.phase_table(), "phase")
    assert list(table.index) == ["forward", "backward", "optimizer_step"]
    assert table.loc["forward", "total_ms"] == pytest.approx(50_000 * MS)
    assert table.loc["forward", "share_pct"] == pytest.approx(100 * 50_000 / 88_000)
    assert table.loc["forward", "matmul_pct"] == pytest.approx(80.0)  # of the phase's own time
    assert table.loc["forward", "elementwise_pct"] == pytest.approx(20.0)
    assert table.loc["backward", "matmul_pct"] == pytest.approx(100 * 20_000 / 30_000)
    assert table.loc["optimizer_step", "optimizer_pct"] == pytest.approx(100.0)
    assert table.loc["optimizer_step", "kernels"] == 4


def test_steps_wall_kernel_idle_and_phase_times(summary):
    steps = summary.steps
    assert len(steps) == 2
    for row in steps.to_dict("records"):
        assert row["wall_ms"] == pytest.approx(100_000 * MS)
        assert row["kernel_ms"] == pytest.approx(44_000 * MS)
        # The step's kernels span 10_000-97_000 and are busy 44_000 of it.
        assert row["idle_pct"] == pytest.approx(100 * (87_000 - 44_000) / 87_000)
        assert row["forward_ms"] == pytest.approx(25_000 * MS)
        assert row["backward_ms"] == pytest.approx(15_000 * MS)
        assert row["optimizer_step_ms"] == pytest.approx(4_000 * MS)


def test_where_the_gpu_idles_per_phase(summary):
    idle = by(summary.idle_table(), "phase")
    forward, backward, optimizer = (idle.loc[p] for p in ("forward", "backward", "optimizer_step"))
    assert forward["ranges"] == 2 and forward["wall_ms"] == pytest.approx(80_000 * MS)
    assert forward["gpu_span_ms"] == pytest.approx(50_000 * MS) and forward["busy_ms"] == pytest.approx(0.05)
    assert forward["idle_ms"] == 0 and forward["idle_pct"] == 0 and forward["verdict"] == "gpu-bound"
    assert backward["gpu_span_ms"] == pytest.approx(50_000 * MS) and backward["busy_ms"] == pytest.approx(0.03)
    assert backward["idle_ms"] == pytest.approx(20_000 * MS) and backward["idle_pct"] == pytest.approx(40.0)
    assert backward["verdict"] == "gpu-bound"  # idle 40%, not above half the span
    assert backward["largest_gaps_us"] == "10.0, 10.0"
    assert optimizer["wall_ms"] == pytest.approx(40_000 * MS)
    assert optimizer["idle_pct"] == pytest.approx(100 * 16_000 / 24_000)
    assert optimizer["verdict"] == "launch-bound"


def test_kernels_that_overlap_on_two_streams_are_busy_once():
    """A kernel on stream 9 at 55_000-65_000 overlaps the backward's matmul (50_000-60_000): the backward's GPU
    is busy 50_000-65_000 and 70_000-75_000 of its 25 µs span."""
    overlapped = summarize_trace(make_trace([*KERNELS, (ADD, 43_000, 55_000, 10_000, 9)]))
    backward = by(overlapped.idle_table(), "phase").loc["backward"]
    assert backward["busy_ms"] == pytest.approx(2 * 20_000 * MS)
    assert backward["idle_pct"] == pytest.approx(100 * 5_000 / 25_000)
    steps = overlapped.steps
    assert steps["kernel_ms"].tolist() == pytest.approx([54_000 * MS] * 2)  # kernel time counts both
    assert steps["idle_pct"].tolist() == pytest.approx([100 * (87_000 - 49_000) / 87_000] * 2)


def test_flop_rate_and_mfu_over_the_gpu_span(summary):
    rated = summary.with_flops(FlopRate(per_phase={"forward": 1e9}, per_step=3e9, peak_tflops=100.0))
    assert "tflops" not in summary.idle_table().columns and "tflops" not in summary.idle.columns  # a new summary
    idle = by(rated.idle_table(), "phase")
    # 1 GFLOP per forward range, two ranges, over 50 µs of GPU span: 40 TFLOP/s, 40% of 100.
    assert idle.loc["forward", "tflops"] == pytest.approx(2e9 / 50_000e-9 / 1e12)
    assert idle.loc["forward", "mfu_pct"] == pytest.approx(40.0)
    assert np.isnan(idle.loc["backward", "tflops"])
    # 3 GFLOP per step, two steps, over the phases' 124 µs of GPU span.
    assert rated.step_mfu["tflops"] == pytest.approx(6e9 / 124_000e-9 / 1e12)
    assert rated.step_mfu["mfu_pct"] == pytest.approx(100 * 6e9 / 124_000e-9 / 1e12 / 100.0)
    assert summary.step_mfu is None


FASTER_GEMM = [(GEMM, 1_000, 10_000, 10_000), *KERNELS[1:]]  # the forward matmul takes 10 µs instead of 20


def test_compare_deltas_speedups_and_change(summary):
    b = summarize_trace(make_trace(FASTER_GEMM, name="b"))
    comparison = compare([summary], [b])
    categories = by(comparison.category_table(), "category")
    # Each side's value is the median over its runs, here its steps: matmul 30 µs a step in A, 20 µs in B.
    assert categories.loc["matmul", "a_ms"] == pytest.approx(30_000 * MS)
    assert categories.loc["matmul", "b_ms"] == pytest.approx(20_000 * MS)
    assert categories.loc["matmul", "delta_ms"] == pytest.approx(-10_000 * MS)
    assert categories.loc["matmul", "speedup"] == pytest.approx(1.5)
    assert categories.loc["elementwise", "speedup"] == pytest.approx(1.0)
    assert categories.loc["total", "delta_ms"] == pytest.approx(-10_000 * MS)
    assert by(comparison.phase_table(), "phase").loc["forward", "speedup"] == pytest.approx(25_000 / 15_000)
    kernels = comparison.kernel_table()
    assert kernels.iloc[0]["delta_ms"] == pytest.approx(-10_000 * MS) and kernels.iloc[0]["speedup"] == 1.5
    regressed = compare([b], [summary], fail_above_pct=5.0)
    gate = by(regressed.gate(), "check")
    assert gate.loc["total", "delta_ns"] == 10_000
    assert gate.loc["total", "change_pct"] == pytest.approx(100 * 10_000 / 34_000)  # of A, not B/A
    assert gate.loc["total", "regressed"] and regressed.failed


def test_a_side_of_several_runs_is_their_median_and_their_range_its_noise():
    """Three runs of A whose forward matmul takes 20, 20 and 50 µs (matmul 30, 30 and 60 µs a run), one of B."""
    runs = [summarize_trace(make_trace([(GEMM, 1_000, 10_000, gemm), *KERNELS[1:]], steps=1, name=f"a{i}"))
            for i, gemm in enumerate((20_000, 20_000, 50_000))]
    b = summarize_trace(make_trace(FASTER_GEMM, steps=1, name="b"))
    comparison = compare(runs, [b], fail_above_pct=5.0, gates=("categories",))
    assert comparison.a.run_count == 3
    assert by(comparison.category_table(), "category").loc["matmul", "a_ms"] == pytest.approx(30_000 * MS)
    gate = by(comparison.gate(), "check")
    assert gate.loc["category matmul", "a_range_ns"] == 30_000 and gate.loc["category matmul", "delta_ns"] == -10_000
    assert gate.loc["category matmul", "verdict"] == "within noise"  # 10 µs faster, inside A's 30 µs range


WHATIF_PHASES = [("step", 0, 100_000), ("forward", 0, 50_000), ("backward", 50_000, 100_000)]
# Every kernel starts 1 µs after its launch on an idle stream.
WHATIF_KERNELS = [(GEMM, 1_000, 2_000, 20_000), (ADD, 30_000, 31_000, 4_000), (GEMM, 51_000, 52_000, 10_000)]


def test_what_if_saved_time_and_share_of_the_measured_time():
    summary = summarize_trace(make_trace(WHATIF_KERNELS, WHATIF_PHASES, steps=2))
    same = what_if(summary, [])
    assert (same.phases["saved_ms"] == 0).all() and (same.steps["saved_pct"] == 0).all()
    result = what_if(summary, [Speedup("matmul", 2.0)])
    assert result.timing.launch_latency_ns == 1_000
    phases = by(result.phases, "phase")
    # forward: its matmul ends sooner, but the elementwise kernel still waits for its launch: no saving.
    assert phases.loc["forward", "measured_ms"] == pytest.approx(2 * 35_000 * MS)
    assert phases.loc["forward", "saved_ms"] == pytest.approx(0.0)
    # backward: from its start to its last kernel's end, 12 µs measured, 7 µs predicted.
    assert phases.loc["backward", "measured_ms"] == pytest.approx(2 * 12_000 * MS)
    assert phases.loc["backward", "predicted_ms"] == pytest.approx(2 * 7_000 * MS)
    assert phases.loc["backward", "saved_ms"] == pytest.approx(2 * 5_000 * MS)
    assert phases.loc["backward", "saved_pct"] == pytest.approx(100 * 5_000 / 12_000)  # of the measured time
    steps = result.steps
    assert steps["measured_ms"].tolist() == pytest.approx([62_000 * MS] * 2)
    assert steps["predicted_ms"].tolist() == pytest.approx([57_000 * MS] * 2)
    assert steps["saved_pct"].tolist() == pytest.approx([100 * 5_000 / 62_000] * 2)
    whole = phases.loc["(all kernels)"]
    # From the first kernel's start (2 µs) to the last one's end (262 µs measured, 257 µs predicted).
    assert whole["measured_ms"] == pytest.approx(260_000 * MS)
    assert whole["saved_pct"] == pytest.approx(100 * 5_000 / 260_000)


def test_ranks_spread_slowest_rank_and_communication_overlap():
    """Rank 1's forward lasts 60 µs instead of 40; an all-reduce of 10 µs on stream 8 in the backward overlaps
    the backward's matmul (50_000-60_000) for 5 µs."""
    collective = [*KERNELS, (NCCL, 43_000, 55_000, 10_000, 8)]
    slow = [("step", 0, 100_000), ("forward", 0, 60_000), ("backward", 60_000, 80_000),
            ("optimizer_step", 80_000, 100_000)]
    ranked = summarize_ranks([(0, make_trace(collective, name="r0")), (1, make_trace(collective, slow, name="r1"))])
    stragglers = by(ranked.stragglers(), "phase")
    walls = np.array([2 * 40_000, 2 * 60_000])
    assert stragglers.loc["forward", "mean_wall_ms"] == pytest.approx(walls.mean() * MS)
    assert stragglers.loc["forward", "spread_pct"] == pytest.approx(100 * (walls.max() - walls.min()) / walls.mean())
    assert stragglers.loc["forward", "slowest_rank"] == 1
    comm = by(ranked.members[0].communication, "phase")
    assert comm.loc["backward", "comm_ns"] == 2 * 10_000
    assert comm.loc["backward", "overlapped_ns"] == 2 * 5_000
    assert comm.loc["backward", "exposed_ns"] == 2 * 5_000
    assert comm.loc["backward", "overlap_pct"] == pytest.approx(50.0)
    ranks = by(ranked.rank_table(), "rank")
    assert ranks.loc[0, "comm_ms"] == pytest.approx(20_000 * MS)
    assert ranks.loc[0, "exposed_comm_ms"] == pytest.approx(10_000 * MS)
    assert ranks.loc[1, "forward_wall_ms"] == pytest.approx(120_000 * MS)
    merged = by(ranked.merged_communication(), "phase")
    assert merged.loc["backward", "overlap_pct"] == pytest.approx(50.0)
