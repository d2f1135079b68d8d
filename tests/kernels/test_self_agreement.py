"""A report agrees with itself: compared with itself it shows no change, and what-if's measured columns are the
same whatever scenario is asked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profiler_kit.kernels import compare, summarize
from profiler_kit.kernels.compare import Comparison
from profiler_kit.kernels.noise import WITHIN, run_frame
from profiler_kit.kernels.runs import STEP, Side
from profiler_kit.kernels.whatif import Speedup, what_if

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "kernels"
# Every kind of kernel report committed: nsys exports, torch traces (GPU and CPU-only), `nsys stats` tables (the
# one in seconds rounds short kernels to 0 ns).
# (The flash and sdpa exports are the bf16 one's program with another attention: left out for time.)
REPORTS = sorted([*(p for p in FIXTURES.glob("*.sqlite") if not p.stem.endswith(("_flash", "_sdpa"))),
                  *FIXTURES.glob("*.json.gz"), *(ROOT / "profiles" / "examples").glob("*.sqlite"),
                  FIXTURES / "nsys2022_tiny_train_bf16_gpukernsum_sec.txt",
                  FIXTURES / "nsys2025_h100_tiny_train_bf16_cuda_gpu_kern_sum.csv"])


@pytest.mark.parametrize("path", REPORTS, ids=lambda p: p.name)
def test_a_report_compared_with_itself_shows_no_change(path):
    summary = summarize(path)
    comparison = compare(summary, summary, fail_above_pct=0.0)
    kernels = comparison.kernels()
    assert (kernels["status"] == "both").all(), kernels[kernels["status"] != "both"]
    assert (kernels["a_ns"] == kernels["b_ns"]).all()
    for table in (comparison.categories(), comparison.phases()):
        assert (table["a_ns"] == table["b_ns"]).all()
    gate = comparison.gate()
    assert (gate["verdict"] == WITHIN).all() and not gate["regressed"].any() and not comparison.failed
    tables = dict((str(title), table) for title, table in comparison.tables(display=True))
    assert not any("only one side" in title for title in tables)
    movers = next(table for title, table in tables.items() if title.startswith("Kernels that moved most"))
    assert "names" not in movers.columns and (movers["delta_ms"] == 0).all()


def _side(label: str, runs: list[dict[str, int]]) -> Side:
    names = pd.DataFrame({"kernel": ["gemm", "rare"], "category": ["gemm", "other"], "names": [["gemm"], ["rare"]]})
    return Side(label, label, run_frame(runs), STEP, names)


def test_a_kernel_in_few_steps_of_both_sides_is_in_both():
    """A kernel that ran in one step of three has a median of 0 on each side; it is still on both sides."""
    runs = [{"total": 110, "kernel gemm": 100, "kernel rare": 10}, {"total": 100, "kernel gemm": 100},
            {"total": 100, "kernel gemm": 100}]
    kernels = Comparison(_side("A", runs), _side("B", runs)).kernels().set_index("kernel")
    assert kernels.loc["rare", ["a_ns", "b_ns"]].tolist() == [0, 0]
    assert kernels["status"].tolist() == ["both", "both"]
    only_b = Comparison(_side("A", [{k: v for k, v in r.items() if k != "kernel rare"} for r in runs]),
                        _side("B", runs)).kernels().set_index("kernel")
    assert only_b.loc["rare", "status"] == "new" and only_b.loc["gemm", "status"] == "both"
    assert np.array_equal(only_b["a_ns"].to_numpy(), [100, 0])


# GPU reports with launch times (what-if replays them): nsys exports and a torch trace of a GPU run.
GPU_REPORTS = [ROOT / "profiles" / "examples" / "small_ctx128_train_bf16.sqlite", FIXTURES / "h100_example_mlp.sqlite",
               FIXTURES / "gpu2_ddp_nccl.sqlite", FIXTURES / "h100_tiny_train_bf16_trace.json.gz"]
MEASURED = ["phase", "ranges", "measured_ms", "verdict_measured"]


@pytest.mark.parametrize("path", GPU_REPORTS, ids=lambda p: p.name)
def test_what_if_measured_columns_do_not_depend_on_the_scenario(path):
    summary = summarize(path)
    scenarios = [what_if(summary, [Speedup("matmul", 2.0)]), what_if(summary, [], launch_gaps=False),
                 what_if(summary, [Speedup("matmul", 3.0)], launch_gaps=False)]
    first = scenarios[0]
    for other in scenarios[1:]:
        pd.testing.assert_frame_equal(other.phases[MEASURED], first.phases[MEASURED])
        pd.testing.assert_frame_equal(other.steps[["step", "measured_ms"]], first.steps[["step", "measured_ms"]])
        assert other.timing == first.timing
        assert other.caption().endswith(first.caption().split("; launch latency")[1])
    assert not scenarios[1].phases["predicted_ms"].equals(first.phases["predicted_ms"])
    # Nothing changed: the replay gives the measured timeline back.
    same = what_if(summary, [])
    assert np.allclose(same.phases["predicted_ms"], same.phases["measured_ms"])


def test_cpu_operator_time_above_the_step_wall_time_is_explained_by_threads():
    """Rank 1 of the gloo job runs its backward's operators beside the process group's thread: in step 1 their
    self times add up to more than the step's wall time, and a note says so with the step's thread count."""
    summary = summarize(FIXTURES / "cpu_ddp2_gloo.rank1.json.gz")
    steps = summary.steps.set_index("step")
    assert steps.loc[1, "operator_ms"] > steps.loc[1, "wall_ms"]
    assert steps.loc[0, "operator_ms"] <= steps.loc[0, "wall_ms"]
    ops = summary.attributed
    threads = ops.loc[ops["step"] == 1, "stream"].nunique()
    assert threads > 1
    note = next(n for n in summary.notes if "exceeds the step's wall time" in n)
    assert (f"step 1 ({steps.loc[1, 'operator_ms']:.2f} against {steps.loc[1, 'wall_ms']:.2f} ms, on {threads} "
            "threads)") in note and "step 0" not in note
    # Where no step's operator time passes its wall time, no note.
    other = summarize(FIXTURES / "cpu_ddp2_gloo.rank0.json.gz")
    assert (other.steps["operator_ms"] <= other.steps["wall_ms"]).all()
    assert not any("exceeds the step's wall time" in n for n in other.notes)
