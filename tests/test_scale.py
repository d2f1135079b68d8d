"""The scale benchmark's grown inputs: a real trace or snapshot repeated k times must summarize as exactly k
copies of the original (kernels, phases, allocations per role), and the tool prints one row per input. Also the
memory bounds every `make test` keeps: summaries of a 1M-kernel export and of an export with a 50 MB kernel
name, each run in its own process, within 1 GiB and 2 GiB of peak RSS."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from profiler_kit.errors import ProfilerKitError
from profiler_kit.kernels import summarize
from profiler_kit.kernels.speedtest import build_repeated_export
from profiler_kit.memory.report import analyze_file
from profiler_kit.scale import build_long_name_export, build_repeated_snapshot, build_repeated_trace, measure

REPO = Path(__file__).resolve().parents[1]
KERNELS = REPO / "tests" / "fixtures" / "kernels"
MEMORY = REPO / "tests" / "fixtures" / "memory"
COPIES = 3
EXPORT = KERNELS / "h100_tiny_train_bf16.sqlite"
# case → the input's builder and the peak RSS (MiB) its summary must stay within.
MEMORY_BOUNDS = {
    "1M kernels": (lambda path: build_repeated_export(EXPORT, path, 1_000_000), 1024),
    "a 50 MB kernel name": (lambda path: build_long_name_export(EXPORT, path, 50 * 2**20), 2048),
}


def _times(one: dict, k: int) -> dict:
    return {key: _times(value, k) if isinstance(value, dict) else k * value for key, value in one.items()}


@pytest.mark.parametrize("name", ["h100_tiny_train_bf16_trace.json.gz", "h100_ddp1_torch.rank0.json.gz",
                                  "cpu_example_mlp_torch.json.gz"])
def test_a_repeated_trace_sums_to_that_many_copies(tmp_path, name):
    source = KERNELS / name
    events = json.loads(gzip.decompress(source.read_bytes()))["traceEvents"]
    body = sum(e.get("ph") != "M" for e in events)
    big = tmp_path / "big.json"
    assert build_repeated_trace(source, big, len(events) + (COPIES - 1) * body) == COPIES
    assert len(json.loads(big.read_text())["traceEvents"]) == len(events) + (COPIES - 1) * body
    one, many = summarize(source), summarize(big)
    assert many.kernel_count == COPIES * one.kernel_count
    assert many.category_ns() == _times(one.category_ns(), COPIES)
    assert many.phase_ns() == _times(one.phase_ns(), COPIES)
    assert one.phase_ns()  # every one of these traces has phases, so the check above covers attribution


@pytest.mark.parametrize("name", ["h100_tiny_train_snapshot", "h100_plain_phases", "tiny_ctx128_train_bf16"])
def test_a_repeated_snapshot_is_that_many_steady_steps(tmp_path, name):
    source = MEMORY / f"{name}.pickle"
    trace = pickle.loads(source.read_bytes())["device_traces"][0]
    big = tmp_path / f"{name}.pickle"
    assert build_repeated_snapshot(source, big, COPIES * len(trace) - 10) == COPIES
    one, many = analyze_file(source), analyze_file(big)
    a1, a3 = one.recon.allocations, many.recon.allocations
    in1, in3 = a1["start"] >= 0, a3["start"] >= 0
    assert many.recon.n_entries == COPIES * len(trace) - (COPIES - 1) * sum(
        e["action"].startswith("segment") for e in trace)
    # Every free of a copy finds the alloc of the copy before it: nothing more is alive before the trace.
    assert (~in3).sum() == (~in1).sum()
    assert in3.sum() == COPIES * in1.sum()
    assert a3.loc[in3, "size_bytes"].sum() == COPIES * a1.loc[in1, "size_bytes"].sum()
    assert many.roles[in3].value_counts().to_dict() == _times(one.roles[in1].value_counts().to_dict(), COPIES)
    assert many.recon.peak_allocated_bytes == one.recon.peak_allocated_bytes
    assert many.recon.peak_reserved_bytes == one.recon.peak_reserved_bytes
    assert len(many.phases) == COPIES * len(one.phases)
    # Each copy starts after the one before it ends: the clock steps back only where the original's does.
    assert (np.diff(many.recon.time_us) < 0).sum() == COPIES * (np.diff(one.recon.time_us) < 0).sum()


def test_a_snapshot_that_is_not_a_steady_step_is_refused(tmp_path):
    snapshot = pickle.loads((MEMORY / "h100_tiny_train_snapshot.pickle").read_bytes())
    trace = snapshot["device_traces"][0]
    # Drop the last alloc: the step now holds less at its end than it freed from the step before.
    last = max(i for i, e in enumerate(trace) if e["action"] == "alloc")
    snapshot["device_traces"][0] = trace[:last] + trace[last + 1:]
    source = tmp_path / "cut.pickle"
    source.write_bytes(pickle.dumps(snapshot))
    with pytest.raises(ProfilerKitError, match="not one steady step"):
        build_repeated_snapshot(source, tmp_path / "big.pickle", 5000)


def test_measure_reads_the_child_alone():
    grow = measure([sys.executable, "-c", "b = bytearray(200 * 2**20); b[::4096] = b'x' * len(b[::4096])"])
    spin = measure([sys.executable, "-c", "import time\nwhile time.process_time() < 0.5: pass"])
    assert 0.5 <= spin.cpu_s <= spin.wall_s
    small = measure([sys.executable, "-c", "pass"])
    assert grow.returncode == small.returncode == 0
    assert small.peak_rss_mib < 100 < 200 < grow.peak_rss_mib < 300
    failed = measure([sys.executable, "-c", "import sys; sys.exit('Error: no')"])
    assert (failed.returncode, failed.error) == (1, "Error: no")


def test_the_tool_prints_one_row_per_input(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(REPO / "tools" / "scale_bench.py"), "--kernels", "1k", "--events",
                           "5k", "--entries", "2k", "--no-torch-tool", "--workdir", str(tmp_path), "--format",
                           "json"], capture_output=True, text=True, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    rows = next(value for value in doc.values() if isinstance(value, list))  # the one table, beside the envelope
    assert [r["command"] for r in rows] == ["kernels summarize", "kernels summarize", "memory summarize"]
    assert [r["status"] for r in rows] == ["ok"] * 3
    assert rows[0]["rows"] >= 1000 and rows[1]["rows"] >= 5000 and rows[2]["rows"] >= 2000
    for row in rows:
        assert row["ratio"] == pytest.approx(row["wall_s"] / row["floor_s"])
        assert row["cpu_ratio"] == pytest.approx(row["cpu_s"] / row["floor_cpu_s"])
        assert row["peak_rss_mib"] > row["floor_rss_mib"] > 0
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".pickle", ".sqlite"]


@pytest.mark.parametrize("case", list(MEMORY_BOUNDS))
def test_a_summary_stays_within_its_memory_bound(tmp_path, case):
    build, bound_mib = MEMORY_BOUNDS[case]
    export = tmp_path / "export.sqlite"
    build(export)
    # Its address space is capped at 4× the bound: a summary far past it fails soon instead of filling the machine.
    run = measure([sys.executable, "-m", "profiler_kit", "kernels", "summarize", str(export), "--format", "json"],
                  address_space_mib=4 * bound_mib)
    assert run.returncode == 0 and run.peak_rss_mib <= bound_mib, (
        f"{case}: exit {run.returncode} {run.error}, peak RSS {run.peak_rss_mib:,.0f} MiB (bound {bound_mib:,} MiB)")
