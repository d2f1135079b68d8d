"""Comparisons of several runs a side: the runs of a report (its steps), sides of several reports, a saved side,
and the verdict against the runs' noise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels import compare, summarize
from profiler_kit.kernels.runs import REPORT, STEP, report_runs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
MLP = FIXTURES / "h100_example_mlp.sqlite"  # two steps, each `step` ⊃ fwd, bwd, opt
BF16, FP32 = FIXTURES / "h100_tiny_train_bf16.sqlite", FIXTURES / "h100_tiny_train_fp32.sqlite"


def run(*args):
    return CliRunner().invoke(main, ["kernels", "compare", *map(str, args)])


def test_a_report_with_steps_gives_a_run_per_step():
    summary = summarize(MLP)
    runs, unit = report_runs(summary)
    assert unit == STEP and len(runs) == len(summary.steps) == 2
    for run, step in zip(runs, summary.steps.itertuples(index=False), strict=True):
        assert run["total"] == pytest.approx(step.kernel_ms * 1e6, abs=1)
        assert sum(run[f"phase {p}"] for p in ("fwd", "bwd", "opt")) == run["total"]
        assert sum(v for q, v in run.items() if q.startswith("category ")) == run["total"]
        assert sum(v for q, v in run.items() if q.startswith("kernel ")) == run["total"]


def test_a_report_without_steps_is_one_run_of_its_totals():
    summary = summarize(BF16)
    runs, unit = report_runs(summary)
    assert unit == REPORT and len(runs) == 1
    assert runs[0]["total"] == summary.total_ns
    assert {p: runs[0][f"phase {p}"] for p in summary.phase_names} == \
        {p: v["total_ns"] for p, v in summary.phase_ns().items()}


def test_the_same_report_against_itself_is_within_noise():
    doc = json.loads(run(MLP, MLP, "--fail-above", "0", "--gate", "total,phases,kernels", "--format", "json").stdout)
    assert doc["gate"]["verdict"] == "pass"
    assert {c["verdict"] for c in doc["gate"]["checks"]} == {"within noise"}
    assert len(doc["a"]["runs"]) == len(doc["b"]["runs"]) == 2
    # The ranges are the steps' spread: the two steps of this run differ.
    total = next(c for c in doc["gate"]["checks"] if c["check"] == "total")
    assert total["a_range_ns"] == total["b_range_ns"] > 0


def test_against_splits_the_sides_and_a_saved_side_stands_for_a(tmp_path):
    both = run(FP32, FP32, "--against", BF16, BF16, "--fail-above", "5", "--format", "json")
    doc = json.loads(both.stdout)
    assert len(doc["a"]["runs"]) == len(doc["b"]["runs"]) == 2 and doc["a"]["unit"] == REPORT
    saved = tmp_path / "fp32.json"
    saved.write_text(json.dumps({"b": json.loads(run(BF16, FP32, "--format", "json").stdout)["b"]}))
    again = json.loads(run("--baseline", saved, BF16, "--fail-above", "5", "--format", "json").stdout)
    direct = json.loads(run(FP32, BF16, "--fail-above", "5", "--format", "json").stdout)
    assert again["gate"]["checks"] == direct["gate"]["checks"]
    assert run("--baseline", tmp_path / "missing.json", BF16).exit_code == 1
    summary = tmp_path / "summary.json"
    summary.write_text(CliRunner().invoke(main, ["kernels", "summarize", str(FP32), "--format", "json"]).stdout)
    from_summary = json.loads(run("--baseline", summary, BF16, "--fail-above", "5", "--format", "json").stdout)
    assert from_summary["gate"]["checks"] == direct["gate"]["checks"]


def test_runs_of_steps_and_whole_reports_do_not_mix():
    with pytest.raises(ProfilerKitError, match="per-step table"):
        compare(summarize(MLP), summarize(BF16))
    assert run(MLP).exit_code == 2 and "two reports" in run(MLP).stderr
