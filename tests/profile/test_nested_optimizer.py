"""An optimizer whose `step` runs another optimizer's `step` (as ZeroRedundancyOptimizer runs its local one) is
one `optimizer_step` mark per step, from the outer step's start to its end, under `profiler-kit nsys --backend
torch` on the CPU."""

from __future__ import annotations

import sys
import textwrap

from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.kernels import load

STEPS = 3
PROGRAM = f"""
import torch

class Sharded(torch.optim.Optimizer):
    def __init__(self, params):
        params = list(params)
        self.local = torch.optim.SGD(params, lr=0.1)
        super().__init__(params, {{}})

    def step(self, closure=None):
        with torch.profiler.record_function("before_local"):
            torch.ones(64, 64) @ torch.ones(64, 64)
        self.local.step()
        with torch.profiler.record_function("after_local"):
            torch.ones(64, 64) @ torch.ones(64, 64)

model = torch.nn.Linear(16, 16)
optimizer = Sharded(model.parameters())
for _ in range({STEPS}):
    model(torch.randn(4, 16)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def test_an_optimizer_stepping_another_is_one_mark_over_the_outer_step(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    out = tmp_path / "prog"
    result = CliRunner().invoke(main, ["nsys", "--backend", "torch", "-o", str(out), "--format", "json", "--",
                                       sys.executable, str(script)])
    assert result.exit_code == 0, result.stderr
    ranges = load(out.with_name("prog.json.gz")).ranges
    auto = ranges[ranges["kind"] == "auto"]
    marks = auto[auto["name"] == "optimizer_step"].sort_values("start_ns")
    assert len(marks) == STEPS and (auto["name"] == "step").sum() == STEPS
    for name in ("before_local", "after_local"):
        inside = ranges[ranges["name"] == name].sort_values("start_ns")
        assert len(inside) == STEPS
        assert (marks["start_ns"].to_numpy() <= inside["start_ns"].to_numpy()).all()
        assert (inside["end_ns"].to_numpy() <= marks["end_ns"].to_numpy()).all()
