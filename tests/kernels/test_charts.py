"""The numbers the kernel pictures draw, against the reports' own figures: each phase's bar stacks its
categories and sums to the phase's total, the step chart is the per-step table, the rank chart is each rank's
own summary, the comparison chart is each side's totals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from profiler_kit.kernels import compare, summarize
from profiler_kit.kernels.charts import (
    CATEGORY_COLORS,
    WHOLE_REPORT,
    BarChart,
    compare_charts,
    rank_charts,
    report_charts,
    summary_charts,
)
from profiler_kit.kernels.ranks import rank_traces, summarize_ranks
from profiler_kit.kernels.summary import NS_PER_MS, OUTSIDE_PHASES

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "kernels"
EXAMPLE = REPO / "profiles" / "examples" / "small_ctx128_train_bf16.sqlite"
MLP = FIXTURES / "h100_example_mlp.sqlite"  # a program's fwd/bwd/opt over two steps, on an H100
CPU_STEPS = FIXTURES / "cpu_ddp2_gloo.rank0.json.gz"  # CPU operators, two steps
RANKS = [FIXTURES / "cpu_ddp2_gloo.rank0.json.gz", FIXTURES / "cpu_ddp2_gloo.rank1.json.gz"]
FP32, BF16 = FIXTURES / "h100_tiny_train_fp32.sqlite", FIXTURES / "h100_tiny_train_bf16.sqlite"


def segments(chart: BarChart, group: str, bar: str = "") -> dict[str, float]:
    g, b = chart.groups.index(group), chart.bars.index(bar)
    return {s: float(v) for s, v in zip(chart.segments, chart.values[g, b], strict=True) if v}


@pytest.mark.parametrize("path", [EXAMPLE, MLP, CPU_STEPS], ids=lambda p: p.name)
def test_each_phase_bar_stacks_its_categories_and_sums_to_the_phase_total(path):
    summary = summarize(path)
    chart = summary_charts(summary)[0]
    table = summary.phase_table()
    assert chart.groups == table["phase"].tolist() and chart.bars == [""]
    assert chart.y_label.endswith("(ms)") and chart.unit == "ms"
    np.testing.assert_allclose(chart.totals()[:, 0], table["total_ms"].to_numpy(), rtol=1e-12)
    for phase, figures in summary.phase_ns().items():
        expected = {c: ns / NS_PER_MS for c, ns in figures["categories"].items() if ns}
        assert segments(chart, phase) == pytest.approx(expected, rel=1e-12)
    # Every category with time in a phase is a segment, coloured as the category.
    assert chart.colors == [CATEGORY_COLORS[c] for c in chart.segments]
    assert chart.legend() == list(zip(chart.segments, chart.colors, strict=True))


def test_kernels_outside_the_phases_are_a_bar_of_their_own():
    summary = summarize(MLP, phases=["fwd"])
    chart = summary_charts(summary)[0]
    assert chart.groups == ["fwd", OUTSIDE_PHASES]
    assert chart.totals().sum() == pytest.approx(summary.total_ns / NS_PER_MS, rel=1e-12)


def test_a_report_without_phases_is_one_bar_of_its_categories():
    summary = summarize(FIXTURES / "nsys2022_tiny_train_bf16_gpukernsum.csv")
    assert not summary.phase_names
    (chart,) = summary_charts(summary)
    assert chart.groups == [WHOLE_REPORT]
    table = summary.category_table()
    assert segments(chart, WHOLE_REPORT) == pytest.approx(dict(zip(table["category"], table["total_ms"],
                                                                   strict=True)), rel=1e-12)


def test_step_chart_is_the_per_step_table():
    summary = summarize(MLP)
    _, steps = summary_charts(summary)
    table = summary.steps
    assert steps.groups == [str(s) for s in table["step"]] and steps.bars == ["wall time", "kernel time"]
    np.testing.assert_array_equal(steps.values[:, 0, 0], table["wall_ms"].to_numpy())
    np.testing.assert_array_equal(steps.values[:, 1, 0], table["kernel_ms"].to_numpy())
    np.testing.assert_array_equal(steps.line, table["idle_pct"].to_numpy())
    assert 0 < np.nanmin(steps.line) and np.nanmax(steps.line) <= 100
    assert "%" in steps.line_label


def test_step_chart_of_a_cpu_trace_shows_operator_time_and_no_idle():
    summary = summarize(CPU_STEPS)
    _, steps = summary_charts(summary)
    assert steps.bars == ["wall time", "operator time"] and steps.line is None
    np.testing.assert_array_equal(steps.values[:, 1, 0], summary.steps["operator_ms"].to_numpy())


def test_rank_charts_cover_the_steps_the_per_rank_table_covers():
    ranked = summarize_ranks(rank_traces(RANKS))
    by_phase, walls = rank_charts(ranked)
    assert ranked.steady_steps == [1]  # step 0 warms up on these ranks: the charts leave it out, as the table does
    assert by_phase.groups == ["rank 0", "rank 1"] and by_phase.bars[:3] == ["fwd", "bwd", "opt"]
    assert by_phase.title.endswith("over 1 steady step 1") and walls.title.endswith("over 1 steady step 1")
    table = ranked.rank_table()
    for position, (member, path) in enumerate(zip(ranked.members, RANKS, strict=True)):
        # Each phase's bar: the rank's own per-step table over the steady steps.
        steps = summarize(path).steps.set_index("step").loc[ranked.steady_steps]
        for phase in ranked.phase_names:
            bar = by_phase.values[position, by_phase.bars.index(phase)].sum()
            assert bar == pytest.approx(steps[f"{phase}_ms"].sum(), rel=1e-12)
        # The bars of a rank hold all its time in those steps (phases, and outside them when any), and each
        # category's time there.
        assert by_phase.totals()[position].sum() == pytest.approx(table["total_ms"][position], rel=1e-12)
        for category, ns in member.totals["categories"].items():
            got = segments_sum(by_phase, position, category)
            assert got == pytest.approx(ns / NS_PER_MS, rel=1e-12, abs=1e-12)
    for phase in ranked.phase_names:
        b = walls.bars.index(phase)
        np.testing.assert_array_equal(walls.values[:, b, 0], table[f"{phase}_wall_ms"].to_numpy())
    assert walls.y_label == "wall time (ms)"


def segments_sum(chart: BarChart, group: int, segment: str) -> float:
    """A segment's time summed over the group's bars (0 where the chart has no such segment)."""
    return float(chart.values[group, :, chart.segments.index(segment)].sum()) if segment in chart.segments else 0.0


def test_compare_chart_puts_each_side_total_side_by_side():
    a, b = summarize(FP32), summarize(BF16)
    by_category, by_phase = compare_charts(compare(a, b))
    assert by_category.bars == ["A", "B"] and "total" not in by_category.groups
    for side, summary in enumerate((a, b)):
        expected = {c: ns / NS_PER_MS for c, ns in summary.category_ns().items() if ns}
        got = {c: v for c, v in zip(by_category.groups, by_category.values[:, side, 0], strict=True) if v}
        assert got == pytest.approx(expected, rel=1e-12)
        phases = {p: f["total_ns"] / NS_PER_MS for p, f in summary.phase_ns().items()}
        assert dict(zip(by_phase.groups, by_phase.values[:, side, 0], strict=True)) == pytest.approx(phases)
    title, charts = report_charts(compare(a, b))
    assert title == f"A = {FP32.name}; B = {BF16.name}" and len(charts) == 2


def test_a_report_without_kernels_says_so_over_its_empty_bars():
    summary = summarize(FIXTURES / "cpu_tiny_train_nsys2022.sqlite")  # nsys 2022.4 on a CPU: ranges, no kernels
    assert summary.kernel_count == 0
    (chart,) = summary_charts(summary)
    assert chart.groups == summary.phase_names and chart.segments == [] and chart.totals().sum() == 0
    assert chart.title.endswith("(no kernels in this report)")
