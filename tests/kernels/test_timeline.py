"""Timeline windows: `--steps A:B` holds exactly the kernels the per-step table counts in those steps, `--window`
the kernels launched in a span from the report's first event; malformed windows are usage errors; `-j` reads
several reports in worker processes with the same result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels import load, summarize
from profiler_kit.kernels.sources import load_many
from profiler_kit.kernels.timeline import NS_PER_MS, Window, timeline, windowed
from profiler_kit.kernels.trace import NO_LAUNCH

KERNELS = Path(__file__).resolve().parents[1] / "fixtures" / "kernels"
# Two reports of two steps each (nsys export, torch.profiler trace of two ranks), one of one step.
STEPPED = KERNELS / "h100_example_mlp.sqlite"
RANKS = [KERNELS / "cpu_ddp2_gloo.rank0.json.gz", KERNELS / "cpu_ddp2_gloo.rank1.json.gz"]


def kernel_events(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["cat"] not in ("phase", "nvtx")]


@pytest.mark.parametrize("step", [0, 1])
def test_a_steps_window_holds_the_kernels_of_those_steps(step):
    steps = summarize(STEPPED).steps
    assert list(steps["step"]) == [0, 1]
    doc = timeline([("r", load(STEPPED))], window=Window.parse(steps=f"{step}:{step}"))
    total_us = sum(e["dur"] for e in kernel_events(doc))
    assert total_us / 1_000 == pytest.approx(steps.loc[steps["step"] == step, "kernel_ms"].item(), rel=1e-9)
    both = timeline([("r", load(STEPPED))], window=Window.parse(steps="0:"))
    assert sum(e["dur"] for e in kernel_events(both)) / 1_000 == pytest.approx(steps["kernel_ms"].sum(), rel=1e-9)


def test_a_window_in_milliseconds_holds_the_kernels_launched_in_it():
    trace = load(STEPPED)
    kernels = trace.kernels
    origin = min(int(kernels["start_ns"].min()), int(kernels.loc[kernels["launch_ns"] != NO_LAUNCH, "launch_ns"].min()),
                 int(trace.ranges["start_ns"].min()))
    launch = kernels["launch_ns"].where(kernels["launch_ns"] != NO_LAUNCH, kernels["start_ns"])
    span = (launch.max() - origin) / NS_PER_MS
    first, last = span / 4, span / 2
    shown = windowed(trace, Window.parse(span_ms=f"{first}:{last}"))
    inside = (launch >= origin + round(first * NS_PER_MS)) & (launch <= origin + round(last * NS_PER_MS))
    assert 0 < len(shown.kernels) == int(inside.sum()) < len(kernels)
    assert len(windowed(trace, Window.parse(span_ms="0:")).kernels) == len(kernels)


def test_the_cli_writes_a_window_and_refuses_a_malformed_one(tmp_path):
    out = tmp_path / "t.json"
    done = CliRunner().invoke(main, ["kernels", "timeline", str(STEPPED), "-o", str(out), "--steps", "1"])
    assert done.exit_code == 0, done.output
    whole = CliRunner().invoke(main, ["kernels", "timeline", str(STEPPED), "-o", str(tmp_path / "w.json")])
    assert whole.exit_code == 0
    assert 0 < len(kernel_events(json.loads(out.read_text()))) < len(kernel_events(json.loads(
        (tmp_path / "w.json").read_text())))
    for bad in (["--steps", "2:1"], ["--steps", "x"], ["--window", "-1:3"], ["--steps", "1", "--window", "0:1"]):
        refused = CliRunner().invoke(main, ["kernels", "timeline", str(STEPPED), "-o", str(tmp_path / "b.json"),
                                            *bad])
        assert refused.exit_code == 2 and refused.stderr.startswith("Error: --"), (bad, refused.output)
    missing = CliRunner().invoke(main, ["kernels", "timeline", str(STEPPED), "-o", str(tmp_path / "m.json"),
                                        "--steps", "5:6"])
    assert missing.exit_code == 1 and "has steps 0 to 1" in missing.stderr


def test_steps_of_a_report_without_steps_point_to_a_window():
    with pytest.raises(ProfilerKitError, match="no steps.*--window"):
        windowed(load(KERNELS / "h100_tiny_train_bf16.sqlite"), Window.parse(steps="0:1"))


def test_reports_read_in_worker_processes_summarize_as_read_here():
    assert [t.kernels.equals(u.kernels) and t.ranges.equals(u.ranges) for t, u in
            zip(load_many(RANKS, jobs=2), load_many(RANKS), strict=True)] == [True, True]
    runs = [CliRunner().invoke(main, ["kernels", "summarize", *map(str, RANKS), "-j", jobs, "--format", "json"])
            for jobs in ("1", "2")]
    assert runs[0].exit_code == runs[1].exit_code == 0
    assert json.loads(runs[0].stdout) == json.loads(runs[1].stdout)
    # As a user runs it: the workers start afresh and must not run the command themselves.
    done = subprocess.run([sys.executable, "-m", "profiler_kit", "kernels", "summarize", *map(str, RANKS), "-j", "2",
                           "--format", "json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ranks"] == json.loads(runs[0].stdout)["ranks"]


def test_a_failure_in_a_worker_is_one_line_naming_the_report(tmp_path):
    bad = tmp_path / "rank1.json"
    bad.write_text('{"traceEvents": [}')
    with pytest.raises(ProfilerKitError, match=f"^{bad}: not valid JSON"):
        load_many([RANKS[0], bad], jobs=2)
