"""stderr carries the program's output and ours, not the libraries' noise that the recorder causes: kineto's
`USDT: ... profiler_start/stop` lines and torch.profiler's "clears events at the end of each cycle" warning (torch
2.10-2.11 give it at every start) are kept off it, the program's own warnings are not."""

from __future__ import annotations

import io
import subprocess
import sys
import warnings
from pathlib import Path

import torch

from profiler_kit.recording import ranges
from profiler_kit.recording.child import TorchRecorder, Window
from profiler_kit.recording.runner import _Output

REPO = Path(__file__).resolve().parents[2]
KINETO_LINES = [
    "USDT:2026-11-27 11:17:17 21900:21900 SyncActivityProfilerHandler.cpp:52] profiler_start\n",
    "USDT:2026-11-27 11:17:17 21900:21900 SyncActivityProfilerHandler.cpp:59] profiler_stop\n",
]


def test_the_relay_drops_kinetos_start_and_stop_lines_only(capsys):
    program = ["step 1\n", "USDT: a line of the program's that only looks alike\n", "done\n"]
    output = _Output()
    output.pump(io.BytesIO("".join([KINETO_LINES[0], *program, KINETO_LINES[1]]).encode()))
    assert capsys.readouterr().err == "".join(program)
    assert "profiler_start" not in output.tail and "done" in "".join(output.tail)


def test_a_profiled_program_keeps_its_warnings_and_loses_the_libraries_lines(tmp_path):
    program = tmp_path / "prog.py"
    program.write_text("import warnings\nimport torch\nwarnings.warn('the program warns')\n"
                       "torch.ones(4, 4) @ torch.ones(4, 4)\n")
    proc = subprocess.run([sys.executable, "-m", "profiler_kit", "nsys", "--backend", "torch", "-o",
                           str(tmp_path / "p"), "--format", "json", "--", sys.executable, str(program)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "UserWarning: the program warns" in proc.stderr
    assert "USDT" not in proc.stderr and "clears events" not in proc.stderr


def test_the_recorders_start_hides_torchs_cycle_warning_only(tmp_path, monkeypatch):
    """torch 2.11's start, as it warns (in `prepare_trace`): the recorder's start shows nothing; the same warning
    given by the program outside the recorder's start still shows."""
    from torch.profiler import profiler

    def warning_prepare(self):
        warnings.warn("Warning: Profiler clears events at the end of each cycle.Only events from the current cycle "
                      "will be reported.To keep events across cycles, set acc_events=True.", UserWarning, stacklevel=2)

    monkeypatch.setattr(profiler._KinetoProfile, "prepare_trace", warning_prepare)
    monkeypatch.setattr(profiler._KinetoProfile, "start_trace", lambda self: None)
    monkeypatch.setattr(ranges, "_observers", [])  # the window's step counter stays this test's
    recorder = TorchRecorder(tmp_path / "t", Window())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recorder.start()
        torch.profiler.profile().start()  # the program's own
    assert len(caught) == 1 and str(caught[0].message).startswith("Warning: Profiler clears events")
