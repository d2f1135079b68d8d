"""Every derived column of `memory compare` and of the roles at the peak against its definition: B − A in MiB and
in % of A (a +2% change reads 2, not 102), NaN where a side lacks the quantity or A is zero; a role's share of the
bytes allocated at the peak."""

import math
from pathlib import Path

import pytest
from snapshot_program import OPTIM, Program

from profiler_kit.memory import analyze, analyze_file, compare
from profiler_kit.memory.analyze import MIB

FIXTURES = Path(__file__).parents[1] / "fixtures" / "memory"
LOOP = {"filename": "/home/me/train.py", "line": 40, "name": "train"}


def _program(scratch: int, extra: int | None = None, phase: str = "load"):
    program = Program("python")
    program.recording = True
    with program.range(phase):
        kept = program.alloc(500, [LOOP])
        program.free(program.alloc(scratch, [LOOP]), [LOOP])
    if extra is not None:  # kept to the end: the optimizer's state
        program.alloc(extra, OPTIM)
    program.free(kept, [LOOP])
    return analyze(program.snapshot())


def test_deltas_are_b_minus_a_in_mib_and_in_percent_of_a():
    a, b = _program(1_000), _program(1_020, extra=40)
    result = compare(a, b)
    peaks = result.peaks.set_index("metric")
    assert peaks.loc["peak allocated", "a_mib"] == 1_500 / MIB and peaks.loc["peak allocated", "b_mib"] == 1_520 / MIB
    assert peaks.loc["peak allocated", "delta_mib"] == 20 / MIB
    assert peaks.loc["peak allocated", "delta_pct"] == pytest.approx(100 * 20 / 1_500)
    phases = result.phases.set_index("phase")
    assert phases.loc["load", "delta_pct"] == pytest.approx(100 * 20 / 1_500)  # 1.33, not 101.33
    roles = result.roles.set_index("role")
    assert roles.loc["temporary", "delta_pct"] == pytest.approx(2.0)  # 1,000 → 1,020 bytes: +2%
    # The role only B has at its peak: no percentage of nothing.
    other = compare(_program(1_000), _program(100, extra=5_000)).roles.set_index("role")
    assert other.loc["optimizer state", "a_mib"] == 0 and math.isnan(other.loc["optimizer state", "delta_pct"])
    assert other.loc["optimizer state", "delta_mib"] == 5_000 / MIB


def test_a_phase_only_one_side_has_is_nan_on_the_other():
    result = compare(_program(1_000, phase="load"), _program(1_000, phase="train"))
    phases = result.phases.set_index("phase")
    assert list(phases.index) == ["load", "train"]
    assert math.isnan(phases.loc["load", "b_mib"]) and math.isnan(phases.loc["train", "a_mib"])
    assert phases[["delta_mib", "delta_pct"]].isna().all().all()


def test_every_row_of_a_real_comparison_against_the_definition():
    a = analyze_file(FIXTURES / "tiny_ctx128_train.pickle")
    b = analyze_file(FIXTURES / "tiny_ctx128_train_bf16.pickle")
    result = compare(a, b)
    for table in (result.peaks, result.phases, result.roles):
        for row in table.itertuples():
            assert row.delta_mib == pytest.approx(row.b_mib - row.a_mib)
            if row.a_mib:
                assert row.delta_pct == pytest.approx(100 * (row.b_mib - row.a_mib) / row.a_mib)
    for report in (a, b):
        roles = report.roles_at_peak
        alive = report.recon.alive_at(report.recon.peak_index)["size_bytes"].sum()
        for row in roles.itertuples():
            assert row.share_pct == pytest.approx(100 * row.size_bytes / alive)
            assert row.size_mib == row.size_bytes / MIB
        assert roles["share_pct"].sum() == pytest.approx(100)
