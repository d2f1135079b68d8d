"""The recording path on small programs written here, under torch.profiler on the CPU: the program's own
NVTX ranges (torch.cuda.nvtx and the `nvtx` package) in the trace, its capture window, phases listed in the
trace, outputs reserved against a concurrent run, exit statuses of signals, and the process group."""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.errors import ProfilerKitError
from profiler_kit.files import reserve_output
from profiler_kit.recording.recorders import opens_own_window

REPO = Path(__file__).resolve().parents[2]


def nsys_cli(*args: object):
    return CliRunner().invoke(main, ["nsys", *map(str, args)])


def trace_of(path: Path) -> dict:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def annotations(path: Path) -> Counter:
    return Counter(e["name"] for e in trace_of(path)["traceEvents"] if e.get("cat") == "user_annotation")


def program(tmp_path: Path, name: str, code: str) -> Path:
    script = tmp_path / f"{name}.py"
    script.write_text(code)
    return script


def cli_process(*args: object) -> subprocess.Popen:
    """`python -m profiler_kit nsys ARGS` as a process of its own."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "profiler_kit", "nsys", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def gone(pid: int, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


NVTX_RANGES = """
import nvtx, torch

@nvtx.annotate()
def helper(x):
    return x * 2

x = torch.ones(8, 8)
for _ in range(3):
    torch.cuda.nvtx.range_push("step")
    with nvtx.annotate("fwd", color="green"):
        y = x @ x
    nvtx.push_range("bwd")
    y.sum()
    nvtx.pop_range()
    with torch.cuda.nvtx.range("opt"):
        x.add_(helper(x))
    torch.cuda.nvtx.range_pop()
"""


def test_the_programs_nvtx_ranges_are_in_the_torch_trace(tmp_path):
    script = program(tmp_path, "ranges", NVTX_RANGES)
    result = nsys_cli("--backend", "torch", "--modules", "depth:3", "-o", tmp_path / "ranges", "--format", "json",
                      "--", sys.executable, script)
    assert result.exit_code == 0, result.stderr
    names = annotations(tmp_path / "ranges.json.gz")
    for name in ("step", "fwd", "bwd", "opt", "helper"):
        assert names[name] == 3, (name, names)
    assert result.stderr.count("recorded the whole run, 3 steps") == 2  # when recorded, and in the summary's notes
    # A program without modules: the module marks were on (depth 3) and saw none.
    assert trace_of(tmp_path / "ranges.json.gz")["profiler_kit"] == {
        "phases": [], "notes": [], "host": socket.gethostname(),
        "modules": {"depth": 3, "types": {}, "compiled": []}}


CAPTURE = """
import torch, profiler_kit
cap = profiler_kit.capture(warmup=2, steps=3)
x = torch.ones(16, 16)
with cap:
    for i in range(7):
        with cap.step():
            with profiler_kit.phase("fwd"):
                x = (x @ x).clamp(max=1.0)
            with profiler_kit.phase("opt"):
                x.add_(1)
"""


def test_only_the_steps_capture_marks_are_recorded(tmp_path):
    code, steps, phases = CAPTURE, 3, ["fwd", "opt"]
    said = "recorded the steps profiler_kit.capture marks, 3 steps"
    script = program(tmp_path, "window", code)
    out = tmp_path / "window"
    result = nsys_cli("--backend", "torch", "--modules", "depth:3", "-o", out, "--format", "json", "--",
                      sys.executable, script)
    assert result.exit_code == 0, result.stderr
    trace = tmp_path / "window.json.gz"
    names = annotations(trace)
    assert [names[f"profiler_kit::step#{n}"] for n in (2, 3, 4)] == [1, 1, 1] and names["fwd"] == steps
    meta = trace_of(trace)["profiler_kit"]
    # The FLOPs of the program's first step, a warm-up step the window left out: one 16×16 matrix product.
    assert meta.pop("modules")["flops"] == {"step": 0, "total": {"forward": 2 * 16**3}, "modules": {}}
    assert meta == {"phases": phases, "notes": [], "host": socket.gethostname()}
    assert result.stderr.count(said) == 2  # when recorded, and in the summary's notes


def test_a_second_run_with_the_same_output_fails_at_once(tmp_path):
    flag, started = tmp_path / "go", tmp_path / "started"
    script = program(tmp_path, "waits", f"""
import pathlib, time, torch
pathlib.Path({str(started)!r}).touch()
while not pathlib.Path({str(flag)!r}).exists():
    time.sleep(0.05)
torch.ones(4, 4) @ torch.ones(4, 4)
""")
    out = tmp_path / "same"
    first = cli_process("--backend", "torch", "-o", out, "--", sys.executable, script)
    try:
        wait_for(started)
        began = time.monotonic()
        second = nsys_cli("--backend", "torch", "-o", out, "--", sys.executable, script)
        assert time.monotonic() - began < 10
        lines = second.stderr.strip().splitlines()
        assert second.exit_code == 1 and len(lines) == 1, second.stderr
        assert lines[0] == (f"Error: {out}.json.gz: another run (process {first.pid}) is recording it; wait for it "
                            "or pass another --output")
    finally:
        flag.touch()
        _, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr
    assert annotations(out.with_name("same.json.gz")) is not None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["go", "same.json.gz", "started", "waits.py"]


def test_death_by_a_signal_gives_128_plus_its_number(tmp_path):
    script = program(tmp_path, "killed", "import os, signal, torch\ntorch.ones(2) + 1\n"
                                         "os.kill(os.getpid(), signal.SIGKILL)\n")
    result = nsys_cli("--backend", "torch", "-o", tmp_path / "killed", "--", sys.executable, script)
    assert result.exit_code == 128 + signal.SIGKILL
    assert f"the program exited with status {128 + signal.SIGKILL}; nothing was recorded" in result.stderr


def test_what_the_program_leaves_running_is_stopped(tmp_path):
    pid_file = tmp_path / "pid"
    script = program(tmp_path, "leaves", f"""
import pathlib, subprocess, torch
sleeper = subprocess.Popen(["sleep", "300"])
pathlib.Path({str(pid_file)!r}).write_text(str(sleeper.pid))
torch.ones(4, 4) @ torch.ones(4, 4)
""")
    began = time.monotonic()
    result = nsys_cli("--backend", "torch", "-o", tmp_path / "leaves", "--", sys.executable, script)
    assert result.exit_code == 0, result.stderr
    assert time.monotonic() - began < 60
    assert gone(int(pid_file.read_text()))


def test_a_signal_to_profiler_kit_reaches_the_whole_program(tmp_path):
    started, pid_file = tmp_path / "started", tmp_path / "pid"
    script = program(tmp_path, "sleeps", f"""
import os, pathlib, subprocess, time, torch
sleeper = subprocess.Popen(["sleep", "300"])
pathlib.Path({str(pid_file)!r}).write_text(str(sleeper.pid))
torch.ones(4, 4) @ torch.ones(4, 4)
pathlib.Path({str(started)!r}).touch()
time.sleep(300)
""")
    run = cli_process("--backend", "torch", "-o", tmp_path / "sleeps", "--", sys.executable, script)
    wait_for(started)
    run.send_signal(signal.SIGTERM)
    _, stderr = run.communicate(timeout=60)
    assert run.returncode == 128 + signal.SIGTERM, stderr
    assert gone(int(pid_file.read_text()))


def test_a_recording_with_no_operators_says_why(tmp_path):
    script = program(tmp_path, "idle", "import torch\n")
    result = nsys_cli("--backend", "torch", "-o", tmp_path / "idle", "--", sys.executable, script)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 1 and result.stdout == ""
    assert lines[-1] == (f"Error: {tmp_path / 'idle.json.gz'}: nothing recorded: no PyTorch operator ran in the "
                         "whole run (the program did no torch work there)")


def test_the_window_example_under_torch_profiler_on_a_cpu(tmp_path):
    """examples/train_window.py: torch.cuda.nvtx ranges and a torch.cuda.profiler window, unchanged."""
    example = REPO / "examples" / "train_window.py"
    result = nsys_cli("--backend", "torch", "-o", tmp_path / "window", "--format", "json", "--", sys.executable,
                      example, "--width", "16", "--depth", "1", "--vocab", "32", "--batch", "2", "--seq", "8",
                      "--warmup", "2", "--steps", "2", "--after", "1")
    assert result.exit_code == 0, result.stderr
    names = annotations(tmp_path / "window.json.gz")
    assert {name: names[name] for name in ("step", "fwd", "bwd", "opt")} == {"step": 2, "fwd": 2, "bwd": 2, "opt": 2}
    assert "recorded the program's torch.cuda.profiler.start()/stop() window, 2 steps" in result.stderr
    doc = json.loads(result.stdout)
    assert doc["time_basis"] == "cpu_ops" and set(doc["phases"]) >= {"fwd", "bwd", "opt"}


def test_reserve_output_holds_a_recording_for_one_run(tmp_path):
    out = tmp_path / "deep" / "run.json.gz"
    lock = out.with_name(".run.json.gz.lock")
    with reserve_output(out, force=False):
        assert lock.read_text() == str(os.getpid())
        with pytest.raises(ProfilerKitError, match=f"another run \\(process {os.getpid()}\\) is recording it"):
            reserve_output(out, force=True)
    assert not lock.exists()
    out.write_bytes(b"earlier")
    with pytest.raises(ProfilerKitError, match="already exists; pass another --output, or --force"):
        reserve_output(out, force=False)
    assert not lock.exists() and out.read_bytes() == b"earlier"
    dead = subprocess.Popen(["true"])
    dead.wait()
    lock.write_text(str(dead.pid))  # left by a run that was killed: taken over
    reserve_output(out, force=True).release()
    assert not lock.exists() and out.read_bytes() == b"earlier"


def test_only_the_files_a_run_would_write_are_refused(tmp_path):
    """A one-process run writes OUT.json.gz: the ranks' files of an earlier torchrun job with the same -o stay and
    do not stop it; a launcher writes OUT.rank<R>.json.gz: those that exist are refused, each named, in one line."""
    out = tmp_path / "ddp"
    ranks = [tmp_path / f"ddp.rank{r}.json.gz" for r in (0, 1)]
    for path in ranks:
        path.write_bytes(b"earlier")
    script = program(tmp_path, "one", "import torch\nprint(float((torch.ones(4, 4) @ torch.ones(4, 4)).sum()))\n")
    result = nsys_cli("--backend", "torch", "-o", out, "--format", "json", "--", sys.executable, script)
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "ddp.json.gz").is_file() and all(p.read_bytes() == b"earlier" for p in ranks)
    job = nsys_cli("--backend", "torch", "-o", out, "--", sys.executable, "-m", "torch.distributed.run",
                   "--nproc-per-node", "2", script)
    assert job.exit_code == 2
    assert job.stderr.strip().splitlines()[-1] == (
        f"Error: {ranks[0]}, {ranks[1]} already exist; pass another --output, or --force to replace them once "
        "the new recording is complete")


def test_a_main_script_that_opens_its_own_cuda_profiler_window_is_recognised(tmp_path):
    """Under nsys on a GPU the cudaProfilerApi range then waits for the program's own start()."""
    assert opens_own_window(REPO / "examples" / "train_window.py")
    assert not opens_own_window(REPO / "examples" / "train_mlp.py")  # profiler_kit.capture: declared, not read
    other = program(tmp_path, "torch_profiler", "import torch\nwith torch.profiler.profile() as p:\n    pass\n")
    assert not opens_own_window(other) and not opens_own_window(None)
    assert not opens_own_window(tmp_path / "absent.py")
    block = program(tmp_path, "block", "import torch\nwith torch.cuda.profiler.profile():\n    pass\n")
    assert opens_own_window(block)


def test_a_recording_path_with_markup_and_escape_codes_is_printed_literally(tmp_path):
    script = program(tmp_path, "tiny", "import torch\nx = torch.ones(64, 64)\nfor _ in range(3):\n    x = x @ x / 64\n")
    out = tmp_path / "[/x][bold]\x1b]0;title\x07run"
    result = nsys_cli("--backend", "torch", "-o", out, "--", sys.executable, script)
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stderr and "\\x1b" in result.stderr
    assert "[/x][bold]" in result.stderr  # no markup was interpreted
    assert Path(f"{out}.json.gz").exists()
