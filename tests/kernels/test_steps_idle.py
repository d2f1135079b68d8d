"""Steps and where the GPU idles in them: the warm-up step left out of the idle verdicts, one long gap named as
such rather than launch-bound, on kernel timelines built here with known gaps; the per-step table of the
committed 2-rank DDP recording, and the timeline of a CPU trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiler_kit.kernels import CATEGORIES, load, summarize, summarize_trace
from profiler_kit.kernels.attribution import RangeIndex
from profiler_kit.kernels.ranks import rank_traces, summarize_ranks
from profiler_kit.kernels.steps import find_steps
from profiler_kit.kernels.timeline import timeline
from profiler_kit.kernels.trace import KernelTrace, kernel_frame, range_frame

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
RANKS = [FIXTURES / "cpu_ddp2_gloo.rank0.json.gz", FIXTURES / "cpu_ddp2_gloo.rank1.json.gz"]
CPU_EXAMPLE = FIXTURES / "cpu_example_mlp_torch.json.gz"
MS, US = 1_000_000, 1_000
KERNELS = 10
KERNEL_NS = 100 * US


def synthetic(gaps_ns: list[list[int]], walls_ms: list[int]) -> KernelTrace:
    """Steps (`step` ⊃ `fwd`) of the given wall times; step i's fwd launches KERNELS kernels of 100 µs whose
    GPU starts are separated by `gaps_ns[i]` (one gap before each kernel but the first)."""
    names, starts, ends = [], [], []
    kernel_names, launches, gpu_starts = [], [], []
    cpu = gpu = 0
    for i, (gaps, wall) in enumerate(zip(gaps_ns, walls_ms, strict=True)):
        names += ["step", "fwd"]
        starts += [cpu, cpu + 1]
        ends += [cpu + wall * MS, cpu + 2 * MS]
        for k in range(KERNELS):
            gpu += gaps[k - 1] if k else 0
            kernel_names.append(f"k{i + 1}_{k}")
            launches.append(cpu + 2 + k)
            gpu_starts.append(gpu)
            gpu += KERNEL_NS
        cpu += wall * MS
        gpu += 10 * MS
    count = len(kernel_names)
    kernels = kernel_frame(kernel_names, [KERNEL_NS] * count, launches, [1] * count, start_ns=gpu_starts,
                           stream=[7] * count)
    ranges = range_frame(names, starts, ends, [1] * len(names), [1] * len(names))
    return KernelTrace("synthetic", Path("synthetic"), kernels, ranges)


SHORT = [5 * US] * (KERNELS - 1)  # busy: 100 µs kernels 5 µs apart
EVEN = [400 * US] * (KERNELS - 1)  # launch-bound: idle 4/5 of the span, no gap stands out


def test_warm_up_step_is_left_out_of_the_idle_verdict():
    # The first step is slow (40 ms against 10) and launch-bound; the steady steps are busy.
    summary = summarize_trace(synthetic([EVEN, SHORT, SHORT], [40, 10, 10]))
    assert summary.steps["state"].tolist() == ["warm-up", "steady", "steady"]
    assert summary.steps["idle_pct"].iloc[0] == pytest.approx(9 * 400 / (9 * 400 + 10 * 100) * 100)
    idle = summary.idle.set_index("phase").loc["fwd"]
    assert idle["ranges"] == 2 and idle["verdict"] == "gpu-bound"
    assert idle["gpu_span_ns"] == 2 * (KERNELS * KERNEL_NS + 9 * 5 * US)
    assert any("judged on the 2 steady steps of 3" in n for n in summary.notes)
    # Without a warm-up step every range counts.
    assert summarize_trace(synthetic([EVEN, SHORT, SHORT], [10, 10, 10])).idle["ranges"].iloc[0] == 3


def test_one_long_gap_is_named_not_called_launch_bound():
    long_gap = [*SHORT[:4], 50 * MS, *SHORT[5:]]  # before the fifth kernel of the third step's fwd
    summary = summarize_trace(synthetic([SHORT, SHORT, long_gap], [10, 10, 10]))
    idle = summary.idle.set_index("phase").loc["fwd"]
    assert idle["verdict"] == "one long gap"
    gap = idle["dominant_gap"]
    assert gap["gap_ns"] == 50 * MS and gap["range"] == 3 and gap["ranges"] == 3
    assert gap["next_kernel"] == "k3_5"
    assert gap["offset_ns"] == 5 * KERNEL_NS + 4 * 5 * US
    assert gap["share_of_idle_pct"] == pytest.approx(50 * MS * 100 / idle["idle_ns"])
    note = next(n for n in summary.notes if n.startswith("fwd: one idle gap of 50.0 ms"))
    assert "range 3 of 3" in note and "before k3_5" in note and "not launch overhead" in note
    # Launch-bound throughout, with one long gap too: still launch-bound, and the gap is still named.
    both = summarize_trace(synthetic([EVEN, EVEN, [*EVEN[:4], 500 * MS, *EVEN[5:]]], [10, 10, 10]))
    row = both.idle.set_index("phase").loc["fwd"]
    assert row["verdict"] == "launch-bound" and row["dominant_gap"]["gap_ns"] == 500 * MS
    # Evenly spread gaps are launch overhead.
    even = summarize_trace(synthetic([EVEN, EVEN, EVEN], [10, 10, 10])).idle.iloc[0]
    assert even["verdict"] == "launch-bound" and even["dominant_gap"] is None


def test_ddp_ranks_have_the_same_phases_steps_and_optimizer_work():
    ranked = summarize_ranks(rank_traces(RANKS))
    for summary in ranked.summaries:
        assert summary.phase_rule == "program" and summary.phase_names == ["fwd", "bwd", "opt"]
        # AdamW's CPU operators inside `Optimizer.step#AdamW.step`, whatever their names.
        opt = summary.phase_ns()["opt"]
        assert opt["categories"]["optimizer"] > 0.9 * opt["total_ns"]
        steps = summary.steps
        assert steps["step"].tolist() == [1, 2]
        assert steps["operator_ms"].sum() * MS == pytest.approx(
            sum(summary.phase_ns()[p]["total_ns"] for p in ("fwd", "bwd", "opt")), rel=0.02)


def test_timeline_of_a_cpu_trace_shows_operators_under_the_phases():
    trace = load(CPU_EXAMPLE)
    events = timeline([("cpu", trace)])["traceEvents"]
    ops = [e for e in events if e["ph"] == "X" and e["cat"] in CATEGORIES]
    assert len(ops) == len(trace.cpu_ops)
    threads = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    ranges = [e for e in events if e.get("cat") == "nvtx"]
    # Operators share their thread's track with its ranges, under the phases track.
    assert {e["tid"] for e in ops} <= set(threads) and {e["tid"] for e in ranges} <= {e["tid"] for e in ops}
    phases = [e for e in events if e.get("cat") == "phase"]
    assert [e["name"] for e in phases] == ["fwd", "bwd", "opt"] * 2
    summary = summarize(CPU_EXAMPLE)
    in_phase = [e for e in ops if e.get("args", {}).get("phase") == "opt"]
    assert len(in_phase) == summary.phases.set_index("phase").loc["opt", "instances"].sum()
    assert {e["cat"] for e in in_phase} == {"optimizer"}
    # Each operator lasts its whole call, not its self time.
    calls = trace.cpu_ops
    assert sorted(e["dur"] for e in ops) == pytest.approx(sorted((calls["end_ns"] - calls["start_ns"]) / US))


def test_steps_are_the_ranges_that_hold_the_phases():
    def steps_of(names: list[str], starts: list[int], ends: list[int]) -> list[str]:
        index = RangeIndex(range_frame(names, starts, ends, [1] * len(names), [1] * len(names)))
        return index.names().to_numpy()[find_steps(index, ["fwd", "bwd"])].tolist()

    # torch.profiler's numbered steps, directly around the phases.
    assert steps_of(["ProfilerStep#3", "fwd", "bwd", "ProfilerStep#4", "fwd", "bwd"], [0, 1, 5, 10, 11, 15],
                    [9, 4, 8, 19, 14, 18]) == ["ProfilerStep#3", "ProfilerStep#4"]
    # The program's own `step` inside them is the nearer one.
    assert steps_of(["ProfilerStep#3", "step", "fwd", "bwd", "ProfilerStep#4", "step", "fwd", "bwd"],
                    [0, 1, 2, 5, 10, 11, 12, 15], [9, 9, 4, 8, 19, 19, 14, 18]) == ["step", "step"]
    # One step does not repeat; phases at top level have no steps.
    assert steps_of(["step", "fwd", "bwd"], [0, 1, 5], [9, 4, 8]) == []
    assert steps_of(["fwd", "bwd", "fwd", "bwd"], [0, 5, 10, 15], [4, 8, 14, 18]) == []
