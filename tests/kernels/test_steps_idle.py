"""Steps and where the GPU idles in them: the warm-up step left out of the idle verdicts, one long gap named as
such rather than launch-bound, on kernel timelines built here with known gaps; steps numbered as the program
counted them, `state` only where a warm-up was seen, only the outermost step ranges counted (in reports built
here, a real torch.profiler schedule and real recordings of a program); the per-step table of the committed
2-rank DDP recording, and the timeline of a CPU trace."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.kernels import CATEGORIES, load, summarize, summarize_trace
from profiler_kit.kernels.attribution import RangeIndex
from profiler_kit.kernels.labels import NUMBERED_HERE
from profiler_kit.kernels.ranks import rank_traces
from profiler_kit.kernels.timeline import timeline
from profiler_kit.kernels.trace import KernelTrace, kernel_frame, range_frame
from profiler_kit.phase_rule import find_steps

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
    assert any("judged on the steady steps, 2 of 3 (1 warm-up left out" in n for n in summary.notes)
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
    for _, trace in rank_traces(RANKS):
        summary = summarize_trace(trace)
        assert summary.phase_rule == "program" and summary.phase_names == ["fwd", "bwd", "opt"]
        # AdamW's CPU operators inside `Optimizer.step#AdamW.step`, whatever their names.
        opt = summary.phase_ns()["opt"]
        assert opt["categories"]["optimizer"] > 0.9 * opt["total_ns"]
        steps = summary.steps
        # Recorded with `capture(warmup=1, steps=2)` before traces said which steps they held.
        assert steps["step"].tolist() == [0, 1] and NUMBERED_HERE in summary.notes
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


def test_state_only_where_a_warm_up_was_seen():
    warm = summarize_trace(synthetic([SHORT, SHORT, SHORT], [40, 10, 10]))
    assert warm.steps["state"].tolist() == ["warm-up", "steady", "steady"]
    assert [t for t, _ in warm.tables()][3] == "Per step: warm-up against the steady state"
    even = summarize_trace(synthetic([SHORT, SHORT], [10, 11]))
    assert "state" not in even.steps.columns
    assert [t for t, _ in even.tables()][3].startswith("Per step: no warm-up or one-off seen")
    assert "state" not in even.to_json()["steps"][0]


def test_steps_are_numbered_as_the_program_counted_them():
    trace = synthetic([SHORT, SHORT, SHORT], [10, 10, 10])
    # The recorder's numbers (the program's steps 4-6), NA on every other range.
    numbers = pd.array([4, pd.NA, 5, pd.NA, 6, pd.NA], dtype="Int64")
    summary = summarize_trace(replace(trace, ranges=trace.ranges.assign(number=numbers)))
    assert summary.steps["step"].tolist() == [4, 5, 6] and NUMBERED_HERE not in summary.notes
    plain = summarize_trace(trace)
    assert plain.steps["step"].tolist() == [0, 1, 2] and NUMBERED_HERE in plain.notes


def test_the_programs_own_steps_take_the_numbers_of_the_recorders_step_marks_inside_them():
    # The program's `step` ranges hold its phases; the recorder's step mark inside each (on its own lane) says it
    # was the program's step 7 or 8 (a capture window after warm-up).
    trace = synthetic([SHORT, SHORT], [10, 10])
    r = trace.ranges

    def with_marks(numbers: list) -> KernelTrace:
        ranges = range_frame(r["name"].tolist() + ["step", "step"], r["start_ns"].tolist() + [1 * MS, 11 * MS],
                             r["end_ns"].tolist() + [9 * MS, 19 * MS], [1] * (len(r) + 2), [1] * (len(r) + 2),
                             kind=["program"] * len(r) + ["auto", "auto"], number=[None] * len(r) + numbers)
        return replace(trace, ranges=ranges)

    summary = summarize_trace(with_marks([7, 8]))
    assert summary.steps["step"].tolist() == [7, 8] and NUMBERED_HERE not in summary.notes
    # A step holding no numbered mark is numbered here, with the note.
    summary = summarize_trace(with_marks([7, None]))
    assert summary.steps["step"].tolist() == [0, 1] and NUMBERED_HERE in summary.notes


SCHEDULED = """
import sys, torch
from torch.profiler import profile, record_function, schedule, ProfilerActivity
model = torch.nn.Linear(64, 64)
x = torch.randn(8, 64)
with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2),
             on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1])) as prof:
    for i in range(4):
        with record_function("fwd"):
            y = model(x).sum()
        with record_function("bwd"):
            y.backward()
        prof.step()
"""


def test_torch_profiler_steps_keep_their_numbers(tmp_path):
    """A program that records itself with torch.profiler's schedule: its steps 2 and 3, as ProfilerStep#2/#3."""
    out = tmp_path / "scheduled.json"
    done = subprocess.run([sys.executable, "-c", SCHEDULED, str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = summarize(out)
    assert summary.steps["step"].tolist() == [2, 3] and NUMBERED_HERE not in summary.notes


def test_nested_ranges_of_the_step_name_are_part_of_their_step():
    # A step holding two micro-steps of the same name, twice: two steps, not six.
    names = ["step", "step", "fwd", "bwd", "step", "fwd", "bwd"] * 2
    starts = [0, 1, 2, 5, 10, 11, 15, 100, 101, 102, 105, 110, 111, 115]
    ends = [50, 9, 4, 8, 19, 14, 18, 150, 109, 104, 108, 119, 114, 118]
    index = RangeIndex(range_frame(names, starts, ends, [1] * len(names), [1] * len(names)))
    steps = find_steps(index, ["fwd", "bwd"])
    assert index.ranges["start_ns"].to_numpy()[steps].tolist() == [0, 100]


# A program that records its own window (torch.cuda.profiler.start/stop) over its steps 2 and 3, each step
# holding repeated per-layer ranges: the recorder counts the steps of the window.
WINDOW_PROGRAM = """
import torch
import profiler_kit
model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(3)])
x = torch.randn(4, 16)
for i in range(5):
    if i == 2:
        torch.cuda.profiler.start()
    with profiler_kit.phase("step"):
        with profiler_kit.phase("fwd"):
            y = x
            for layer in model:
                with profiler_kit.phase("layer"):
                    y = layer(y)
        with profiler_kit.phase("bwd"):
            y.sum().backward()
    if i == 3:
        torch.cuda.profiler.stop()
"""


def test_the_recorders_step_count_is_the_step_tables(tmp_path):
    """The window's step count counts only the top-level ranges of the main thread: the per-layer ranges nested
    in each step are not steps. It agrees with the per-step table of the same recording."""
    program = tmp_path / "window.py"
    program.write_text(WINDOW_PROGRAM)
    result = CliRunner().invoke(main, ["nsys", "--backend", "torch", "-o", str(tmp_path / "w"), "--format", "json",
                                       "--", sys.executable, str(program)])
    assert result.exit_code == 0, result.stderr[-3000:]
    steps = json.loads(result.stdout)["steps"]
    assert len(steps) == 2
    assert "torch.cuda.profiler.start()/stop() window, 2 steps" in result.stderr


CAPTURED = """
import torch
import profiler_kit
model = torch.nn.Linear(16, 16)
x = torch.randn(4, 16)
with profiler_kit.capture(warmup=2, steps=2) as cap:
    for _ in range(5):
        with cap.step():
            with profiler_kit.phase("fwd"):
                y = model(x).sum()
            with profiler_kit.phase("bwd"):
                y.backward()
"""


def test_a_capture_of_steps_2_and_3_is_numbered_2_and_3(tmp_path):
    """The recorder numbers the step ranges of `profiler_kit.capture` as the program counts its steps."""
    program = tmp_path / "captured.py"
    program.write_text(CAPTURED)
    result = CliRunner().invoke(main, ["nsys", "--backend", "torch", "-o", str(tmp_path / "c"), "--format", "json",
                                       "--", sys.executable, str(program)])
    assert result.exit_code == 0, result.stderr[-3000:]
    if "number" not in load(tmp_path / "c.json.gz").ranges.columns:
        pytest.skip("this torch trace reader gives the step ranges no numbers")
    assert [row["step"] for row in json.loads(result.stdout)["steps"]] == [2, 3]
