"""The kernel summary of any program's report: phases found without `--phase`, CPU operator time when a trace
has no kernels, the idle analysis per phase, the Perfetto timeline, the regression gate of `compare` and the
JSON envelope; all on real recordings (tests/fixtures/kernels/README.md says how each was made)."""

from __future__ import annotations

import gzip
import json
import sqlite3
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.kernels import CATEGORIES, load, summarize
from profiler_kit.kernels.attribution import RangeIndex
from profiler_kit.kernels.categories import category_of
from profiler_kit.kernels.phase_metrics import FlopRate
from profiler_kit.kernels.summary import CPU_OPS, GPU_KERNELS
from profiler_kit.kernels.trace import range_frame
from profiler_kit.phase_rule import choose_phases

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
BF16 = FIXTURES / "h100_tiny_train_bf16.sqlite"
FP32 = FIXTURES / "h100_tiny_train_fp32.sqlite"
BF16_TRACE = FIXTURES / "h100_tiny_train_bf16_trace.json.gz"
CPU_BUILTIN = FIXTURES / "cpu_tiny_train_torch.json.gz"
CPU_EXAMPLE = FIXTURES / "cpu_example_mlp_torch.json.gz"


def run(*args: object):
    return CliRunner().invoke(main, ["kernels", *map(str, args)])


def events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)["traceEvents"]


# Phases found in a report


def test_a_loop_of_its_own_gets_its_phases_without_the_option():
    summary = summarize(CPU_EXAMPLE)
    assert summary.phase_names == ["fwd", "bwd", "opt"]
    phases = summary.phase_ns()
    assert all(phases[p]["total_ns"] > 0 for p in ("fwd", "bwd", "opt"))


def test_the_built_in_model_keeps_its_phase_names():
    assert summarize(BF16).phase_names == ["forward", "backward", "optimizer_step"]
    assert summarize(CPU_BUILTIN).phase_names == ["forward", "backward", "optimizer_step"]


def test_chosen_phases_rule_on_ranges():
    # Main thread 1: warmup, then two steps holding fwd/bwd; thread 2 (autograd) has short ranges of its own.
    ranges = range_frame(
        ["warmup", "step", "fwd", "bwd", "step", "fwd", "bwd", "blocks.0.backward"],
        [0, 100, 110, 150, 300, 310, 350, 160],
        [90, 200, 140, 190, 400, 340, 390, 170],
        [7] * 8,
        [1, 1, 1, 1, 1, 1, 1, 2],
    )
    assert choose_phases(RangeIndex(ranges)).names == ["fwd", "bwd"]
    flat = range_frame(["warmup", "a", "b", "a"], [0, 10, 20, 30], [5, 15, 25, 35], [1] * 4, [1] * 4)
    assert choose_phases(RangeIndex(flat)).names == ["a", "b"]


# CPU operator time when there are no kernels


def test_cpu_trace_is_summarized_by_operator_self_time():
    summary = summarize(CPU_BUILTIN)
    assert summary.basis == CPU_OPS
    assert any("CPU operator self time" in note for note in summary.notes)
    cats = summary.category_ns()
    assert sum(cats.values()) == summary.total_ns
    for category in ("matmul", "elementwise", "reduction", "softmax", "copy"):
        assert cats[category] > 0, category
    assert summarize(CPU_EXAMPLE).category_ns()["normalization"] > 0  # its blocks use nn.LayerNorm
    by_name = summary.kernels.set_index("name")["category"]
    assert by_name["aten::mm"] == "matmul" and by_name["aten::bmm"] == "matmul"
    # Self times of nested operators add up to the time spent under the outermost operators of each thread.
    ops = sorted(((e["pid"], e["tid"], e["ts"], e["ts"] + e["dur"]) for e in events(CPU_BUILTIN)
                  if e.get("cat") == "cpu_op" and e["dur"] > 0), key=lambda o: (o[0], o[1], o[2], -o[3]))
    outer_us, reach = 0.0, {}
    for pid, tid, start, end in ops:
        if start >= reach.get((pid, tid), -1.0):
            outer_us += end - start
            reach[(pid, tid)] = end
    assert summary.total_ns == pytest.approx(outer_us * 1000, rel=1e-3)


def test_cpu_operator_rules():
    assert category_of("aten::bmm", "cpu_op") == "matmul"
    assert category_of("aten::native_layer_norm", "cpu_op") == "normalization"
    assert category_of("aten::_softmax", "cpu_op") == "softmax"
    assert category_of("c10d::allreduce_", "cpu_op") == "communication"
    assert category_of("gloo:all_reduce", "cpu_op") == "communication"
    assert category_of("aten::_foreach_add_", "cpu_op") == "optimizer"
    assert category_of("aten::copy_", "cpu_op") == "copy"
    assert category_of("aten::gelu_backward", "cpu_op") == "elementwise"
    assert category_of("autograd::engine::evaluate_function: MmBackward0", "cpu_op") == "other"


def test_gpu_traces_keep_kernel_time():
    assert summarize(BF16_TRACE).basis == GPU_KERNELS


# Idle analysis


def _union_by_hand(intervals: list[tuple[int, int]]) -> tuple[int, int]:
    """(span, busy) of intervals, by a plain loop."""
    intervals.sort()
    busy, cur_start, cur_end = 0, *intervals[0]
    for start, end in intervals[1:]:
        if start > cur_end:
            busy += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    busy += cur_end - cur_start
    return max(e for _, e in intervals) - intervals[0][0], busy


def test_idle_matches_a_direct_query_of_the_export():
    idle = summarize(BF16).idle.set_index("phase")
    con = sqlite3.connect(BF16)
    launches = dict(con.execute(
        "SELECT r.correlationId, r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
        "WHERE s.value LIKE '%Launch%'"))
    kernels = con.execute("SELECT correlationId, start, end FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
    for phase in ("forward", "backward", "optimizer_step"):
        (lo, hi), = con.execute("SELECT n.start, n.end FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId "
                                "WHERE s.value = ?", (phase,)).fetchall()
        mine = [(start, end) for corr, start, end in kernels if lo <= launches.get(corr, -1) <= hi]
        span, busy = _union_by_hand(mine)
        assert idle.loc[phase, "gpu_span_ns"] == span and idle.loc[phase, "busy_ns"] == busy
        assert idle.loc[phase, "wall_ns"] == hi - lo
        assert idle.loc[phase, "idle_pct"] == pytest.approx((span - busy) * 100 / span)
    # The tiny model at ctx 128 waits on kernel launches in every phase.
    assert set(idle["verdict"]) == {"launch-bound"}


def test_idle_in_json_and_table():
    result = run("summarize", BF16, "--format", "json")
    assert result.exit_code == 0, result.output
    idle = json.loads(result.stdout)["idle"]
    assert list(idle) == ["forward", "backward", "optimizer_step"]
    assert idle["backward"]["largest_gaps_ns"] == sorted(idle["backward"]["largest_gaps_ns"], reverse=True)
    assert "Where the GPU idles" in run("summarize", BF16).stdout


# Timeline


def test_timeline_puts_backward_kernels_under_their_phase(tmp_path):
    out = tmp_path / "trace.json"
    result = run("timeline", BF16, "--output", out)
    assert result.exit_code == 0, result.output
    trace = json.loads(out.read_text())
    kernels = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] in CATEGORIES]
    assert len(kernels) == summarize(BF16).kernel_count
    assert all({"ts", "dur", "pid", "tid"} <= set(e) for e in kernels)
    phase_rows = summarize(BF16).phases
    by_phase = Counter(e.get("args", {}).get("phase") for e in kernels)
    for phase in ("forward", "backward", "optimizer_step"):
        assert by_phase[phase] == phase_rows.loc[phase_rows["phase"] == phase, "instances"].sum()
    phases = [e for e in trace["traceEvents"] if e.get("cat") == "phase"]
    assert [e["name"] for e in phases] == ["forward", "backward", "optimizer_step"]
    backward = next(e for e in phases if e["name"] == "backward")
    inside = [e for e in kernels if e.get("args", {}).get("phase") == "backward"]
    assert min(e["ts"] for e in inside) == backward["ts"]
    assert max(e["ts"] + e["dur"] for e in inside) == pytest.approx(backward["ts"] + backward["dur"])
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "phases" in names and any(n.startswith("stream ") for n in names)
    # A trace is never replaced.
    again = run("timeline", BF16, "--output", out)
    assert again.exit_code != 0 and "already exists" in again.stderr


def test_timeline_of_several_reports_has_one_process_each(tmp_path):
    out = tmp_path / "two.json.gz"
    assert run("timeline", BF16, BF16_TRACE, "-o", out).exit_code == 0
    with gzip.open(out, "rt") as fh:
        trace = json.load(fh)
    processes = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert sorted(processes.values()) == ["rank 0", "rank 1"]  # several reports are the ranks of one job
    kernels = Counter(e["pid"] for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] in CATEGORIES)
    assert sorted(kernels.values()) == sorted([summarize(BF16).kernel_count, summarize(BF16_TRACE).kernel_count])


# Regression gate


@pytest.mark.parametrize(("threshold", "code", "verdict"), [("1", 1, "fail"), ("1000", 0, "pass")])
def test_compare_fail_above(threshold, code, verdict):
    result = run("compare", BF16, FP32, "--fail-above", threshold, "--format", "json")
    assert result.exit_code == code, result.output
    gate = json.loads(result.stdout)["gate"]
    assert gate["verdict"] == verdict and gate["fail_above_pct"] == float(threshold)
    checks = {c["check"]: c for c in gate["checks"]}
    fp32, bf16 = summarize(FP32).total_ns, summarize(BF16).total_ns
    assert checks["total"]["change_pct"] == pytest.approx((fp32 - bf16) * 100 / bf16)
    assert {"phase forward", "phase backward"} <= set(checks)
    assert any(c["regressed"] for c in gate["checks"]) == (code == 1)


def test_compare_of_a_report_with_itself_passes_at_zero():
    result = run("compare", BF16, BF16, "--fail-above", "0")
    assert result.exit_code == 0, result.output
    assert "Regression gate" in result.stdout and "pass" in result.stdout


def test_compare_without_threshold_has_no_gate():
    obj = json.loads(run("compare", BF16, FP32, "--format", "json").stdout)
    assert obj["gate"] is None


# JSON envelope


def test_every_json_object_has_schema_and_environment():
    for args in (("summarize", CPU_EXAMPLE), ("compare", BF16, FP32)):
        obj = json.loads(run(*args, "--format", "json").stdout)
        assert obj["schema_version"] == 1
        assert obj["environment"]["profiler_kit"]
        assert obj["environment"]["python"].count(".") == 2
        assert set(obj["environment"]) == {"profiler_kit", "python", "torch", "cuda", "gpu", "nsys"}


def test_chosen_phases_are_not_duplicated_by_several_steps():
    trace = load(CPU_EXAMPLE)
    index = RangeIndex(trace.ranges)
    assert int(np.sum(index.names() == "step")) == 2  # --steps 2 of the recording
    assert choose_phases(index).names == ["fwd", "bwd", "opt"]


# FLOP rates


def test_flop_rate_per_phase_and_per_step():
    summary = summarize(BF16)
    spans = summary.idle.set_index("phase")["gpu_span_ns"]
    summary = summary.with_flops(FlopRate({"forward": 3e9, "backward": 6e9}, per_step=9e9, peak_tflops=989.0))
    idle = summary.idle_table().set_index("phase")
    assert idle.loc["forward", "tflops"] == pytest.approx(3e9 / spans["forward"] / 1e3)
    assert idle.loc["backward", "mfu_pct"] == pytest.approx(6e9 / spans["backward"] / 1e3 * 100 / 989.0)
    assert np.isnan(idle.loc["optimizer_step", "tflops"])
    assert summary.step_mfu["tflops"] == pytest.approx(9e9 / spans.sum() / 1e3)
    result = run("summarize", BF16, "--flops-per-step", "9e9", "--peak-tflops", "989", "--format", "json")
    assert json.loads(result.stdout)["mfu"]["mfu_pct"] == pytest.approx(summary.step_mfu["mfu_pct"])


def test_built_in_workload_flops_per_phase():
    from profiler_kit.recording.builtin import workload_flops
    from profiler_kit.workload import WorkloadConfig

    per_phase, peak = workload_flops(WorkloadConfig("tiny", 32, batch_size=2, device="cpu"))
    # tiny at B = 2, T = 32: 2·B·T·(L·(4d² + 3·d·d_ff) + d·V) + 4·B·L·T²·d with d 64, d_ff 256, L 2, V 10000
    # (tests/model/test_flops.py checks it against torch's FLOP counter).
    fwd = 2 * 2 * 32 * (2 * (4 * 64**2 + 3 * 64 * 256) + 64 * 10_000) + 4 * 2 * 2 * 32**2 * 64
    assert per_phase == {"forward": fwd, "backward": 2 * fwd} and peak is None
