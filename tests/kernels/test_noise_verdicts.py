"""Every column of the noise rule's verdict table and its edges, on runs written out here: run counts, medians,
ranges and changes in ms, a quantity one side lacks, each side's own range, a change of 1 ns, the gate exactly at
its percent, and the runs' JSON bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels.noise import (
    IMPROVED,
    REGRESSED,
    VERDICT_COLUMNS,
    WITHIN,
    run_frame,
    runs_from_json,
    verdicts,
)

MS = 1_000_000


def test_every_column_in_ms_against_the_runs():
    a = run_frame([{"gemm": 10 * MS, "add": 2 * MS}, {"gemm": 12 * MS, "add": 2 * MS}, {"gemm": 11 * MS}])
    b = run_frame([{"gemm": 20 * MS, "add": 2 * MS, "copy": 3 * MS}, {"gemm": 22 * MS, "add": 2 * MS}])
    table = verdicts(a, b, min_delta_ns=0)
    assert list(table.columns) == list(VERDICT_COLUMNS)
    rows = table.set_index("quantity")
    assert rows.index.tolist() == ["gemm", "add", "copy"]
    # A's third run has no `add`, B's second no `copy`: each counts 0 there.
    assert rows["a_runs"].tolist() == [3, 3, 3] and rows["b_runs"].tolist() == [2, 2, 2]
    assert rows["a_median_ms"].tolist() == [11.0, 2.0, 0.0] and rows["a_range_ms"].tolist() == [2.0, 2.0, 0.0]
    assert rows["b_median_ms"].tolist() == [21.0, 2.0, 1.5] and rows["b_range_ms"].tolist() == [2.0, 0.0, 3.0]
    assert rows["delta_ms"].tolist() == [10.0, 0.0, 1.5]
    assert rows.loc["gemm", "delta_pct"] == pytest.approx(100 * 10 / 11) and rows.loc["add", "delta_pct"] == 0.0
    assert math.isnan(rows.loc["copy", "delta_pct"])  # nothing to take a percent of
    assert rows["verdict"].tolist() == [REGRESSED, WITHIN, WITHIN]  # copy's change is inside B's own range
    assert table["failed"].dtype == np.bool_ and not table["failed"].any()


def test_either_sides_range_is_noise():
    steady, spread = run_frame([{"k": 100}] * 3), run_frame([{"k": 150}, {"k": 300}, {"k": 120}])
    assert verdicts(steady, spread, min_delta_ns=0)["verdict"].tolist() == [WITHIN]
    assert verdicts(spread, steady, min_delta_ns=0)["verdict"].tolist() == [WITHIN]


@pytest.mark.parametrize(("a", "b", "verdict"), [(100, 101, REGRESSED), (101, 100, IMPROVED), (100, 100, WITHIN)])
def test_a_change_of_one_ns_is_real_without_noise_or_floor(a, b, verdict):
    assert verdicts(run_frame([{"k": a}]), run_frame([{"k": b}]), min_delta_ns=0)["verdict"].tolist() == [verdict]


def test_a_median_of_one_ns_still_gives_a_percent():
    assert verdicts(run_frame([{"k": 1}]), run_frame([{"k": 2}]), min_delta_ns=0)["delta_pct"].tolist() == [100.0]


@pytest.mark.parametrize(("b_ns", "failed"), [(110, False), (111, True)])
def test_the_gate_fails_only_above_its_percent(b_ns, failed):
    table = verdicts(run_frame([{"k": 100}]), run_frame([{"k": b_ns}]), min_delta_ns=0, fail_above_pct=10.0)
    assert table["verdict"].tolist() == [REGRESSED] and table["failed"].tolist() == [failed]


def test_a_side_without_runs_is_refused():
    one = run_frame([{"k": 1}])
    for a, b in ((one, one.iloc[:0]), (one.iloc[:0], one)):
        with pytest.raises(ProfilerKitError, match="^each side of a comparison needs at least one run$"):
            verdicts(a, b, min_delta_ns=0)


def test_json_runs_take_zero_up_to_just_below_two_to_the_63():
    accepted = runs_from_json([{"k": 0}, {"k": 2**63 - 1}], "x.json")
    assert accepted["value_ns"].tolist() == [0, 2**63 - 1]
    with pytest.raises(ProfilerKitError, match=r"x.json: runs\[1\] is not an object"):
        runs_from_json([{"k": 0}, {"k": 2**63}], "x.json")
