"""Per-phase metrics (`kernels.phase_metrics`): each a DataFrame indexed by phase, joined into one phase table whose
column groups the per-phase tables show and from all of which `--columns` picks; a new metric is one function."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.kernels import phase_metrics, summarize
from profiler_kit.kernels.labels import OUTSIDE_PHASES
from profiler_kit.kernels.phase_metrics import FlopRate, phase_table

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
BF16 = FIXTURES / "h100_tiny_train_bf16.sqlite"
TWO_GPUS = FIXTURES / "gpu2_ddp_nccl.sqlite"
STATS = FIXTURES / "nsys2025_h100_tiny_train_bf16_cuda_gpu_kern_sum.csv"


def run(*args: object):
    return CliRunner().invoke(main, [*map(str, args)], env={"COLUMNS": "200"})


def test_each_metric_is_a_frame_indexed_by_phase():
    summary = summarize(BF16).with_flops(FlopRate(per_phase={"forward": 3e9}, peak_tflops=989.0))
    for metric in phase_metrics.METRICS:
        frame = metric(summary)
        assert frame.index.name == "phase" and set(frame.index) <= {*summary.phase_names, OUTSIDE_PHASES}, metric
    assert list(phase_metrics.idle(summary).index) == summary.phase_names
    rate = phase_metrics.flops(summary)
    assert rate.loc["forward", "tflops"] > 0 and np.isnan(rate.loc["backward", "tflops"])
    categories = phase_metrics.categories(summary)
    assert categories["total_ms"].sum() == pytest.approx(summary.total_ns / 1e6)
    # A report without phases has none of them.
    bare = summarize(STATS)
    assert all(metric(bare) is None for metric in phase_metrics.METRICS)
    assert list(phase_table(bare).columns) == ["phase"] and not len(phase_table(bare))


def test_the_phase_table_joins_every_metric():
    summary = summarize(TWO_GPUS)
    table = phase_table(summary).set_index("phase")
    assert list(table.index) == summary.phase_table()["phase"].tolist()
    for metric in phase_metrics.METRICS:
        frame = metric(summary)
        if frame is None:
            continue
        pd.testing.assert_frame_equal(table.loc[frame.index, frame.columns], frame, check_dtype=False)
    # The phases' communication: NCCL's all-reduces run in the backward, beside its compute.
    comm = table["comm_ms"]
    assert comm["backward"] > 0 and comm["backward"] == pytest.approx(comm.sum())
    assert 0 <= table.loc["backward", "overlap_pct"] <= 100
    assert table.loc["backward", "exposed_ms"] == pytest.approx(comm["backward"] - table.loc["backward",
                                                                                            "overlapped_ms"])


def test_columns_pick_from_every_metric():
    both = run("kernels", "summarize", BF16, "--flops-per-step", "2e12", "--peak-tflops", "989", "--columns",
               "phase,matmul_pct,idle_pct,mfu_pct,comm_ms")
    assert both.exit_code == 0, both.output
    header = next(line for line in both.stdout.splitlines() if "matmul_pct" in line)
    assert [c for c in ("phase", "matmul_pct", "idle_pct", "mfu_pct", "comm_ms") if c in header] == [
        "phase", "matmul_pct", "idle_pct", "mfu_pct", "comm_ms"]
    # Columns one table has of its own stay there: the others keep their default.
    idle_only = run("kernels", "summarize", BF16, "--columns", "phase,idle_pct,verdict")
    lines = idle_only.stdout.splitlines()
    assert sum("idle_pct" in line for line in lines) == 1 and any("elementwise_pct" in line for line in lines)
    unknown = run("kernels", "summarize", BF16, "--columns", "phase,nonsense_ms")
    assert unknown.exit_code == 2 and "comm_ms" in unknown.stderr


def test_a_new_metric_is_one_function(monkeypatch):
    def mean_kernel(report) -> pd.DataFrame:
        per_phase = report.phases.groupby("phase")[["instances", "total_ns"]].sum()
        return pd.DataFrame({"mean_kernel_us": per_phase["total_ns"] / per_phase["instances"] / 1e3})

    monkeypatch.setattr(phase_metrics, "METRICS", (*phase_metrics.METRICS, mean_kernel))
    summary = summarize(BF16)
    table = phase_table(summary).set_index("phase")
    forward = summary.phases[summary.phases["phase"] == "forward"]
    assert table.loc["forward", "mean_kernel_us"] == pytest.approx(forward["total_ns"].sum() / forward[
        "instances"].sum() / 1e3)
    shown = run("kernels", "summarize", BF16, "--columns", "phase,mean_kernel_us")
    assert shown.exit_code == 0 and "mean_kernel_us" in shown.stdout
