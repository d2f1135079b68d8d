"""The what-if replay: hand-computed timelines on small synthetic traces, and the replay of every committed real
report with nothing changed giving its measured times back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels import load, summarize_trace
from profiler_kit.kernels.trace import KernelTrace, kernel_frame, range_frame
from profiler_kit.kernels.whatif import GRAPH_QUEUE_GAP_NS, Speedup, replay, what_if

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
REPO = Path(__file__).resolve().parents[2]
US = 1_000


def synthetic(names, launches_us, starts_us, durations_us, streams, step_us) -> KernelTrace:
    """One process, one step range on the main thread from 0 to `step_us`."""
    n = len(names)
    kernels = kernel_frame(np.asarray(names, dtype=object), np.asarray(durations_us) * US,
                           np.asarray(launches_us) * US, np.zeros(n, dtype=np.int64),
                           start_ns=np.asarray(starts_us) * US, stream=np.asarray(streams))
    ranges = range_frame(["step"], [0], [step_us * US], [0], [1])
    return KernelTrace("synthetic", Path("synthetic"), kernels, ranges)


def phase_row(result, phase="step"):
    return result.phases.set_index("phase").loc[phase]


def test_gpu_bound_stream_shrinks_with_its_kernels():
    # Launched 1 µs apart, 5 µs latency, 10 µs kernels queued 1 µs apart: starts 5, 16, 27, 38; last end 48.
    trace = synthetic(["sgemm_a"] * 4, [0, 1, 2, 3], [5, 16, 27, 38], [10] * 4, [7] * 4, 50)
    summary = summarize_trace(trace, phases=["step"])
    same = what_if(summary, [])
    assert (same.timing.launch_latency_ns, same.timing.queue_gap_ns) == (5 * US, 1 * US)
    assert phase_row(same)["measured_ms"] == pytest.approx(0.048)
    assert phase_row(same)["predicted_ms"] == pytest.approx(0.048)
    assert phase_row(same)["verdict_measured"] == "gpu-bound"
    # Twice as fast: starts 5, 11, 17, 23; last end 28 µs.
    faster = what_if(summary, [Speedup.parse("matmul=2")])
    assert phase_row(faster)["predicted_ms"] == pytest.approx(0.028)
    assert phase_row(faster)["saved_ms"] == pytest.approx(0.020)


def test_launch_bound_stream_gains_only_its_last_kernel():
    # Launched every 20 µs, 4 µs kernels: starts 5, 25, 45, 65; last end 69 µs; the GPU idles 75% of its span.
    trace = synthetic(["elementwise_kernel"] * 4, [0, 20, 40, 60], [5, 25, 45, 65], [4] * 4, [7] * 4, 70)
    summary = summarize_trace(trace, phases=["step"])
    faster = what_if(summary, [Speedup.parse("elementwise=2")])
    row = phase_row(faster)
    assert row["verdict_measured"] == row["verdict_predicted"] == "launch-bound"
    # The step ends at max(last launch, last kernel end) after its start: 69 µs measured, 67 predicted.
    assert (row["measured_ms"], row["predicted_ms"]) == (pytest.approx(0.069), pytest.approx(0.067))
    assert not faster.timing.gap_measured and any("queued" in note for note in faster.notes)
    # Without launch gaps every kernel is ready at 5 µs and they follow each other as a graph replays them,
    # GRAPH_QUEUE_GAP_NS apart: the last ends at 5 + 4 × 4 µs + 3 gaps.
    graphed = what_if(summary, [], launch_gaps=False)
    assert phase_row(graphed)["predicted_ms"] == pytest.approx((21 * US + 3 * GRAPH_QUEUE_GAP_NS) / 1e6)
    assert phase_row(graphed)["verdict_predicted"] == "gpu-bound"


def test_a_kernel_waiting_on_another_stream_follows_it():
    # Stream 1: A0 at 5-7 µs, A1 at 15-35 µs. Stream 2: B launched at 11 µs waits for A1 and starts 1 µs after
    # its end, 36-46 µs.
    trace = synthetic(["copy_a0", "copy_a1", "copy_b"], [0, 10, 11], [5, 15, 36], [2, 20, 10], [1, 1, 2], 50)
    summary = summarize_trace(trace, phases=["step"])
    kernels = summary.attributed
    starts, timing = replay(kernels, kernels["total_ns"].to_numpy().astype(float))
    assert timing.waits == 1
    assert starts.tolist() == [5 * US, 15 * US, 36 * US]
    # A1 twice as fast (15-25 µs): B starts at 26 µs and the step ends at 36 µs.
    faster = what_if(summary, [Speedup.parse("copy_a1=2")])
    assert phase_row(faster)["measured_ms"] == pytest.approx(0.046)
    assert phase_row(faster)["predicted_ms"] == pytest.approx(0.036)


REAL = sorted([*FIXTURES.glob("h100_*.sqlite"), *FIXTURES.glob("h100_*.json.gz"),
               REPO / "profiles/examples/small_ctx128_train_bf16.sqlite"])


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_replay_with_nothing_changed_gives_the_measured_times(path):
    summary = summarize_trace(load(path))
    result = what_if(summary, [])
    kernels = summary.attributed
    starts, _ = replay(kernels, kernels["total_ns"].to_numpy().astype(float))
    np.testing.assert_allclose(starts, kernels["start_ns"].to_numpy(), rtol=0, atol=1)
    for table in (result.phases, result.steps):
        np.testing.assert_allclose(table["predicted_ms"], table["measured_ms"], rtol=0.01)
    # The measured phase time is at least the GPU span the idle table reports for that phase.
    if summary.idle is not None:
        spans = summary.idle.set_index("phase")["gpu_span_ns"] / 1e6
        measured = result.phases.set_index("phase")["measured_ms"]
        for phase, span in spans.items():
            assert measured[phase] >= span * (1 - 1e-9)


def test_steps_count_no_moment_twice_when_the_gpu_runs_behind():
    # Two steps (0-10 µs and 12-20 µs) each launch two 10 µs kernels at once; the GPU runs them back to back from
    # 5 µs: 5-15, 16-26 (the first step), 27-37, 38-48 (the second). The first takes 26 µs, the second 26-48: 22 µs.
    trace = synthetic(["sgemm"] * 4, [0, 1, 12, 13], [5, 16, 27, 38], [10] * 4, [7] * 4, 50)
    trace.ranges = range_frame(["step", "step", "fwd", "fwd"], [0, 12 * US, 0, 12 * US],
                               [10 * US, 20 * US, 9 * US, 19 * US], [0] * 4, [1] * 4)
    result = what_if(summarize_trace(trace), [])
    assert result.steps["measured_ms"].tolist() == pytest.approx([0.026, 0.022])
    assert phase_row(result, "fwd")["measured_ms"] == pytest.approx(0.048)


def test_steps_carry_the_numbers_the_summary_gives_them():
    # The recorder's step marks say these were the program's steps 5 and 6 (a capture window after warm-up).
    trace = synthetic(["sgemm"] * 4, [0, 1, 12, 13], [5, 16, 27, 38], [10] * 4, [7] * 4, 50)
    trace.ranges = range_frame(["step", "step", "fwd", "fwd"], [0, 12 * US, 0, 12 * US],
                               [10 * US, 20 * US, 9 * US, 19 * US], [0] * 4, [1] * 4,
                               kind=["auto", "auto", "program", "program"], number=[5, 6, None, None])
    summary = summarize_trace(trace)
    result = what_if(summary, [])
    assert summary.steps["step"].tolist() == [5, 6]
    assert result.steps["step"].tolist() == [5, 6]


def test_a_range_speedup_takes_the_kernels_launched_inside_it():
    trace = synthetic(["sgemm_a"] * 4, [0, 1, 2, 3], [5, 16, 27, 38], [10] * 4, [7] * 4, 50)
    # The first two kernels are launched inside `attn` (0-1.5 µs), inside the step.
    trace.ranges = range_frame(["step", "attn"], [0, 0], [50 * US, 1500], [0, 0], [1, 1])
    summary = summarize_trace(trace, phases=["step"])
    # Kernels 0 and 1 take 5 µs: starts 5, 11, 17, 28; last end 38 µs.
    assert phase_row(what_if(summary, [Speedup.parse("range:attn=2")]))["predicted_ms"] == pytest.approx(0.038)
    with pytest.raises(ProfilerKitError, match="no kernel"):
        what_if(summary, [Speedup.parse("range:nothing=2")])


def test_speedup_parsing_and_unknown_targets():
    assert Speedup.parse("attention=1.5") == Speedup("attention", 1.5)
    assert Speedup.parse("a=b=2") == Speedup("a=b", 2.0)
    for bad in ("attention", "attention=0", "attention=nan", "=2", "attention=-1", "range:=2"):
        with pytest.raises(ProfilerKitError):
            Speedup.parse(bad)
    summary = summarize_trace(load(FIXTURES / "h100_example_mlp.sqlite"))
    with pytest.raises(ProfilerKitError, match="no kernel"):
        what_if(summary, [Speedup.parse("no_such_kernel=2")])


def test_cli_json_has_measured_and_predicted_per_phase_and_step():
    proc = subprocess.run([sys.executable, "-m", "profiler_kit", "kernels", "whatif",
                           str(FIXTURES / "h100_example_mlp.sqlite"), "--no-launch-gaps", "--format", "json"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert [row["phase"] for row in doc["phases"]] == ["fwd", "bwd", "opt", "(all kernels)"]
    assert len(doc["steps"]) == 2
    for row in doc["phases"] + doc["steps"]:
        assert row["predicted_ms"] < row["measured_ms"]
    bad = subprocess.run([sys.executable, "-m", "profiler_kit", "kernels", "whatif",
                          str(FIXTURES / "h100_example_mlp.sqlite"), "--speedup", "matmul"],
                         capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and "--speedup" in bad.stderr


def test_a_cpu_recording_is_refused_in_one_line_that_says_gpu_reports_only():
    """CPU operators run in turn on their calling thread, nested: there is no stream, launch or queue to replay, so
    what-if takes GPU reports only, says so in its --help, and points at the summary's category shares."""
    from click.testing import CliRunner

    from profiler_kit.cli import main

    cpu = FIXTURES / "cpu_example_mlp_torch.json.gz"
    result = CliRunner().invoke(main, ["kernels", "whatif", str(cpu), "--speedup", "matmul=2"])
    assert result.exit_code == 1 and result.stdout == ""
    error = result.stderr.strip()
    assert len(error.splitlines()) == 1 and error.startswith(f"Error: {cpu}: a CPU trace (no GPU kernels)")
    assert "takes GPU reports only" in error and "kernels summarize" in error
    helptext = " ".join(CliRunner().invoke(main, ["kernels", "whatif", "--help"], env={"COLUMNS": "80"}).stdout.split())
    assert "(GPU reports only)" in helptext and "GPU reports only: an nsys .nsys-rep" in helptext
