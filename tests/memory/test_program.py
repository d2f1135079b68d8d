"""`profiler-kit memory -- COMMAND`: refused in one line without CUDA; on a CPU, with torch's memory history
calls replaced inside the program by fakes that return a real H100 snapshot, the recording path runs end to end
(window, storages at its start and after each optimizer step, per-rank snapshots, the dump after an OOM, the
report); on a GPU, a plain program's own window is recorded, its peaks equal a replay and its roles are
the program's."""

import json
import os
import pickle
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from memory_replay import replay_levels, replay_range_peak

from profiler_kit.cli import main
from profiler_kit.memory import analyze_file, load_snapshot
from profiler_kit.memory.phases import annotation_ranges
from profiler_kit.memory.snapshot import EMBEDDED_KEY
from profiler_kit.names import LIBRARY_RANGES
from profiler_kit.recording import runner

ROOT = Path(__file__).parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "memory" / "h100_plain_phases.pickle"

# Torch's memory history calls, replaced inside the program: what was asked is printed, the snapshot is the
# fixture's.
FAKES = f"""
import json, pickle, sys, torch
torch.cuda.synchronize = lambda *a: None
torch.cuda.get_device_name = lambda *a: "fake"
torch.cuda.memory._record_memory_history = lambda enabled="all", **kw: print(
    "history", json.dumps([enabled, kw.get("max_entries")]), file=sys.stderr)
with open({str(FIXTURE)!r}, "rb") as f:
    SNAPSHOT = pickle.load(f)
torch.cuda.memory._snapshot = lambda: dict(SNAPSHOT)
model = torch.nn.Linear(8, 8)
opt = torch.optim.AdamW(model.parameters())

def step():
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def _program(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "prog.py"
    path.write_text(FAKES + textwrap.dedent(body))
    return path


def _run(monkeypatch, args: list[str]):
    monkeypatch.setattr(runner, "cuda_device_present", lambda: True)  # the parent's check; the child fakes the rest
    return CliRunner().invoke(main, ["memory", *args])


def _meta(path: Path) -> dict:
    return load_snapshot(path)[EMBEDDED_KEY]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is what a machine without CUDA answers")
def test_without_cuda_one_line_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"
    prog = tmp_path / "prog.py"
    prog.write_text(f"open({str(marker)!r}, 'w').close()\n")
    out = subprocess.run([sys.executable, "-m", "profiler_kit", "memory", "-o", str(tmp_path / "m"), "--",
                          sys.executable, str(prog)], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip() == "Error: CUDA memory history needs a CUDA device" and out.stdout == ""
    assert not marker.exists() and list(tmp_path.iterdir()) == [prog]


def test_program_window_storages_and_report(tmp_path, monkeypatch):
    prog = _program(tmp_path, """
        step()                          # warm-up: AdamW's state exists before the window
        torch.cuda.profiler.start()
        step(); step()
        torch.cuda.profiler.stop()
        step()                          # after the window: no capture
    """)
    out = tmp_path / "run"
    result = _run(monkeypatch, ["-o", str(out), "--max-entries", "1234", "--format", "json", "--",
                                sys.executable, str(prog)])
    assert result.exit_code == 0, result.stderr
    assert 'history ["all", 1234]' in result.stderr and 'history [null, null]' in result.stderr
    meta = _meta(out.with_suffix(".pickle"))
    captures = meta["storages"]
    assert [c["label"] for c in captures] == ["window start", "optimizer step 1", "optimizer step 2"]
    assert all(isinstance(c["time_us"], int) for c in captures)
    assert captures[0]["time_us"] <= captures[1]["time_us"] <= captures[2]["time_us"]
    # Linear(8, 8): a 256-byte weight and a 32-byte bias; AdamW: exp_avg, exp_avg_sq and a step counter each.
    for capture in captures:
        assert sorted(n for _, n in capture["parameter"]) == [32, 256]
        assert sorted(n for _, n in capture["optimizer_state"]) == [4, 4, 32, 32, 256, 256]
    assert captures[0]["gradient"] == []  # zero_grad set them to None before the window
    assert sorted(n for _, n in captures[1]["gradient"]) == [32, 256]
    assert meta["window"] == "torch.cuda.profiler" and meta["max_entries"] == 1234
    report = json.loads(result.stdout)
    assert "recorded the program's torch.cuda.profiler.start()/stop() window, 2 steps" in report["notes"]
    assert report["peak"]["allocated_bytes"] > 0


def test_ranks_and_oom_dump(tmp_path, monkeypatch):
    prog = _program(tmp_path, """
        import os
        step()
        torch.cuda.profiler.start()
        step()
        if os.environ["RANK"] == "1":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 ...")
        torch.cuda.profiler.stop()
    """)
    out = tmp_path / "ddp"
    result = _run(monkeypatch, ["-o", str(out), "--format", "json", "--", sys.executable, "-m",
                                "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(prog)])
    assert result.exit_code == 1, result.stderr
    assert "OutOfMemoryError" in result.stderr  # the program's own traceback, passed through
    rank0, rank1 = (tmp_path / f"ddp.rank{r}.pickle" for r in (0, 1))
    assert not (tmp_path / "ddp.pickle").exists()
    assert _meta(rank0)["program_oom"] is None
    assert _meta(rank1)["program_oom"] == "Tried to allocate 2.00 GiB"
    assert [c["label"] for c in _meta(rank1)["storages"]] == ["window start", "optimizer step 1"]
    *reports, merged = [json.loads(doc) for doc in result.stdout.replace("}\n{", "}\n\x00{").split("\x00")]
    assert len(reports) == 2 and [r["rank"] for r in merged["ranks"]] == [0, 1]
    assert any("the program ran out of memory (Tried to allocate 2.00 GiB)" in n for n in reports[1]["notes"])


def test_options_of_the_builtin_workload_are_refused_with_a_command(tmp_path):
    result = CliRunner().invoke(main, ["memory", "--ctx", "64", "--", sys.executable, "x.py"])
    assert result.exit_code == 2 and "--ctx: options of the built-in workload" in result.stderr
    result = CliRunner().invoke(main, ["memory", "-o", str(tmp_path / "x"), "--model", "tiny"])
    assert result.exit_code == 2 and "-o: options of -- COMMAND" in result.stderr


# A program of its own for the GPU test: big enough that the cuBLAS workspaces (about 64 MiB, alive before the
# window and in no list) stay under 2% of the peak.
PLAIN_ARGS = ["--window", "--ranges", "--width", "1024", "--depth", "6", "--batch", "16", "--seq", "1024"]


def _roles(report: dict) -> dict[str, dict]:
    return {row["role"]: row for row in report["roles_at_peak"]}


@pytest.mark.gpu
def test_plain_program_window_on_gpu(tmp_path):
    """A program of its own (Transformer, fused AdamW, its torch.cuda.profiler window after warm-up): the peak and
    the peak of each of its ranges equal a replay of the trace; at the peak ≤ 2% is unknown, parameters and
    optimizer state are the program's to 1%, gradients at most its own; without the list, ≤ 10% unknown and
    parameters and optimizer state within 5%."""
    out = tmp_path / "plain"
    run = subprocess.run([sys.executable, "-m", "profiler_kit", "memory", "-o", str(out), "--format", "json", "--",
                          sys.executable, str(ROOT / "examples" / "memory_plain.py"), *PLAIN_ARGS],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    held = json.loads(next(line for line in run.stderr.splitlines() if line.startswith('{"snapshot"')))
    report = json.loads(run.stdout)
    assert report["metadata_source"] == "snapshot"
    assert "recorded the program's torch.cuda.profiler.start()/stop() window, 2 steps" in report["notes"]
    snapshot = load_snapshot(out.with_suffix(".pickle"))
    levels, times = replay_levels(snapshot)
    assert report["peak"]["allocated_bytes"] == levels.max()
    assert re.fullmatch(r"step \d+, (forward|backward|optimizer)", report["peak"]["phase"])
    # The program's own ranges are the phases: not PyTorch's (Optimizer.zero_grad#…) nor the recorder's marks, whose
    # step range opens inside the program's forward and closes inside its optimizer range.
    own = [r for r in annotation_ranges(snapshot, report["device"]) if not LIBRARY_RANGES.match(r[0])]
    named = [p for p in report["phases"] if p["source"] in ("annotation", "program")]
    assert [p["name"].split(", ")[1] for p in named] == [r[0] for r in own]
    for phase, (_, start_us, end_us, _) in zip(named, own, strict=True):
        assert phase["peak_allocated_bytes"] == replay_range_peak(levels, times, start_us, end_us), phase["name"]
    roles = _roles(report)
    assert roles["unknown"]["share_pct"] <= 2.0
    assert roles["parameter"]["size_bytes"] == pytest.approx(held["parameter_bytes"], rel=0.01)
    assert roles["optimizer state"]["size_bytes"] == pytest.approx(held["optimizer_state_bytes"], rel=0.01)
    assert roles["gradient"]["size_bytes"] <= 1.01 * held["gradient_bytes"]

    del snapshot[EMBEDDED_KEY]["storages"]
    bare = tmp_path / "bare.pickle"
    bare.write_bytes(pickle.dumps(snapshot, protocol=4))
    roles = _roles(analyze_file(bare).to_json())
    assert roles["unknown"]["share_pct"] <= 10.0
    assert roles["parameter"]["size_bytes"] == pytest.approx(held["parameter_bytes"], rel=0.05)
    assert roles["optimizer state"]["size_bytes"] == pytest.approx(held["optimizer_state_bytes"], rel=0.05)


def test_a_real_window_recording_finds_what_the_program_holds_with_and_without_its_list(tmp_path):
    """An H100 recording of `memory -- python3 examples/memory_plain.py --window` (fixtures README): with the
    recorder's list and with the list removed, parameters and optimizer state are the program's to the byte, and
    the two 32 MiB blocks older than the history that share a gradient's size (cuBLAS workspaces) stay unknown."""
    snapshot_path = FIXTURE.with_name("h100_program_window.pickle")
    held = json.loads(FIXTURE.with_name("h100_program_window_held.json").read_text())
    snapshot = load_snapshot(snapshot_path)
    del snapshot[EMBEDDED_KEY]["storages"]
    bare = tmp_path / "bare.pickle"
    bare.write_bytes(pickle.dumps(snapshot, protocol=4))
    for path in (snapshot_path, bare):
        report = analyze_file(path).to_json()
        roles = _roles(report)
        # The peak comes inside the backward before any gradient is made: the report says why none is there.
        assert roles["gradient"]["size_bytes"] == 0
        assert any(n.startswith("no gradient is alive at the peak") and "zero_grad" in n and "backward" in n
                   for n in report["notes"])
        assert roles["parameter"]["size_bytes"] == held["parameter_bytes"]
        assert roles["optimizer state"]["size_bytes"] == held["optimizer_state_bytes"]
        assert roles["unknown"]["share_pct"] <= 2.0
