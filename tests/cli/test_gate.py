"""`kernels compare --fail-above`: which checks it makes (--gate), the absolute floor (--min-delta-ms), what a
failure says, and the comparisons it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.kernels import summarize
from profiler_kit.kernels.summary import NS_PER_MS

KERNELS = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
BF16, FP32 = KERNELS / "h100_tiny_train_bf16.sqlite", KERNELS / "h100_tiny_train_fp32.sqlite"
CPU_TRACE = KERNELS / "cpu_tiny_train_torch.json.gz"


def compare(*args):
    return CliRunner().invoke(main, ["kernels", "compare", *map(str, args)])


def gate_of(*args) -> dict:
    return json.loads(compare(*args, "--format", "json").stdout)["gate"]


def test_default_gate_checks_the_total_and_each_phase_above_a_floor():
    gate = gate_of(BF16, FP32, "--fail-above", "5")
    checks = {c["check"]: c for c in gate["checks"]}
    phases = set(summarize(BF16).phase_ns()) & set(summarize(FP32).phase_ns())
    assert set(checks) == {"total", *(f"phase {p}" for p in phases)}
    assert gate["min_delta_ns"] == int(summarize(BF16).total_ns * 0.01)
    for check in checks.values():
        expected = check["change_pct"] > 5 and check["delta_ns"] > gate["min_delta_ns"]
        assert check["regressed"] == expected
    assert checks["total"]["regressed"] is False  # the total moved 1.9%: only a phase can fail this run
    assert gate["verdict"] == ("fail" if any(c["regressed"] for c in checks.values()) else "pass")


def test_a_change_below_the_floor_never_fails():
    regressed = [c for c in gate_of(BF16, FP32, "--fail-above", "5")["checks"] if c["regressed"]]
    assert regressed
    floor_ms = max(c["delta_ns"] for c in regressed) / NS_PER_MS + 0.001
    result = compare(BF16, FP32, "--fail-above", "5", "--min-delta-ms", f"{floor_ms:.6f}", "--format", "json")
    assert result.exit_code == 0 and json.loads(result.stdout)["gate"]["verdict"] == "pass"


def test_gate_chooses_categories_and_kernels():
    checks = [c["check"] for c in gate_of(BF16, FP32, "--fail-above", "5", "--gate", "categories,kernels")["checks"]]
    assert checks and all(c.startswith(("category ", "kernel ")) for c in checks)
    assert any(c.startswith("kernel ") for c in checks) and "category matmul" in checks
    bad = compare(BF16, FP32, "--fail-above", "5", "--gate", "phase")
    assert bad.exit_code == 2


def test_the_failure_lists_each_failed_check_with_a_b_and_the_kernels_that_moved():
    result = compare(BF16, FP32, "--fail-above", "5", "--min-delta-ms", "0")
    assert result.exit_code == 1
    failed = [c for c in gate_of(BF16, FP32, "--fail-above", "5", "--min-delta-ms", "0")["checks"] if c["regressed"]]
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"regression: {len(failed)} check(s)")
    for check in failed:
        line = next(line for line in lines if line.strip().startswith(check["check"] + ":"))
        assert f"A {check['a_ns'] / NS_PER_MS:.3f} ms, B {check['b_ns'] / NS_PER_MS:.3f} ms" in line
        assert "moved most:" in line


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_threshold_that_is_not_a_number_is_refused(value):
    assert compare(BF16, FP32, "--fail-above", value).exit_code == 2


def test_a_gpu_report_and_a_cpu_trace_are_not_compared():
    result = compare(BF16, CPU_TRACE, "--fail-above", "5")
    assert result.exit_code == 2 and "same kind" in result.stderr
