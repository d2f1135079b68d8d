"""stderr carries the program's output and ours, not the libraries' noise that the recorder causes: kineto's
`USDT: ... profiler_start/stop` lines and torch.profiler's "clears events at the end of each cycle" warning (torch
2.10-2.11 give it at every start) are kept off it; the program's own warnings, that one included, are not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CYCLE_WARNING = ("Warning: Profiler clears events at the end of each cycle.Only events from the current cycle will "
                 "be reported.To keep events across cycles, set acc_events=True.")

# A program whose torch.profiler warns at every start as torch 2.11's does; the recorder starts its own profiler
# when the captured step begins, the program starts one of its own after it.
PROGRAM = f"""
import warnings
import torch
from torch.profiler import profiler
import profiler_kit

start = profiler._KinetoProfile.prepare_trace


def prepare_trace(self):
    warnings.warn({CYCLE_WARNING!r}, UserWarning, stacklevel=2)
    start(self)


profiler._KinetoProfile.prepare_trace = prepare_trace
warnings.warn("the program warns")
cap = profiler_kit.capture(warmup=0, steps=1)
with cap.step():
    torch.ones(4, 4) @ torch.ones(4, 4)
print("profiling itself", flush=True)
with torch.profiler.profile():
    torch.ones(4, 4) + 1
"""


def test_a_profiled_program_keeps_its_warnings_and_loses_the_recorders_noise(tmp_path):
    program = tmp_path / "prog.py"
    program.write_text(PROGRAM)
    proc = subprocess.run([sys.executable, "-m", "profiler_kit", "nsys", "--backend", "torch", "-o",
                           str(tmp_path / "p"), "--format", "json", "--", sys.executable, str(program)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "UserWarning: the program warns" in proc.stderr
    assert "USDT" not in proc.stderr, proc.stderr
    # One cycle warning: the program's own profiler's, after its line; none from the recorder's start.
    assert proc.stderr.count("Profiler clears events") == 1, proc.stderr
    assert proc.stderr.index("profiling itself") < proc.stderr.index("Profiler clears events")
