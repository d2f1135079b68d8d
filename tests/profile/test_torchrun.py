"""A job under torchrun (gloo, 2 ranks on the CPU): every worker is recorded, torchrun itself is not, and each
process is told apart by the RANK it had, as its recorder wrote it: the trace per rank under torch.profiler, and
the marks in the one report of the whole job under a real nsys (Debian's 2022.4, through the NVTX shim)."""

from __future__ import annotations

import sys
from pathlib import Path

from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.kernels import load

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
# A DDP program with profiler_kit.phase marks and no capture, whose ranks run different numbers of steps.
DDP = """
import os, torch, torch.distributed as dist, profiler_kit
from torch import nn
dist.init_process_group("gloo")
rank = dist.get_rank()
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    with profiler_kit.phase("fwd"):
        loss = model(torch.randn(8, 16)).square().mean()
    with profiler_kit.phase("bwd"):
        loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
"""


def _program(tmp_path: Path) -> Path:
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    return script


def test_each_rank_names_its_trace_and_says_its_rank(tmp_path):
    out = tmp_path / "ddp"
    result = CliRunner().invoke(main, ["nsys", "--backend", "torch", "-o", str(out), "--", *TORCHRUN,
                                       str(_program(tmp_path))])
    assert result.exit_code == 0, result.output
    for rank in (0, 1):
        trace = load(tmp_path / f"ddp.rank{rank}.json.gz")
        assert set(trace.process_ranks.values()) == {rank} and trace.process_ranks
        steps = trace.ranges[(trace.ranges["kind"] == "auto") & (trace.ranges["name"] == "step")]
        assert steps["number"].tolist() == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.glob("ddp.*")) == ["ddp.py", "ddp.rank0.json.gz", "ddp.rank1.json.gz"]


def test_nsys_around_torchrun_records_every_rank_in_one_report(tmp_path, nsys, nvtx_shim):
    lib, wrapper = nvtx_shim
    out = tmp_path / "job"
    result = CliRunner().invoke(main, [
        "nsys", "--nsys", str(nsys.path), "--nsys-args", "--trace=nvtx,osrt --osrt-threshold=100000000", "-o",
        str(out), "--", *TORCHRUN, str(wrapper), str(lib), str(_program(tmp_path))])
    # No CUDA here: the report holds no kernels (an error that says so), but every rank's ranges and marks.
    assert "no CUDA device here" in result.output and (tmp_path / "job.sqlite").is_file()
    trace = load(tmp_path / "job.sqlite")
    assert sorted(trace.process_ranks.values()) == [0, 1]  # by RANK, one process each
    ranges = trace.ranges
    for process in trace.process_ranks:
        mine = ranges[ranges["process"] == process]
        assert (mine.loc[mine["kind"] == "phase", "name"].value_counts() == 3).all()
        steps = mine[(mine["kind"] == "auto") & (mine["name"] == "step")]
        assert steps["number"].tolist() == [0, 1, 2]
    assert set(ranges["process"]) == set(trace.process_ranks)  # torchrun itself recorded nothing


# FSDP2 (`fully_shard` per block and on the model) with its own forward hooks and DTensor parameters, two
# micro-batches per optimizer step.
FSDP2 = """
import os, sys, torch, torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)) for _ in range(3)])
for block in model:
    fully_shard(block)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters())
for step in range(3):
    for micro in range(2):
        model(torch.randn(8, 32)).square().mean().backward()
    opt.step()
    opt.zero_grad()
os.write(1, f"program done {dist.get_rank()}\\n".encode())
dist.destroy_process_group()
"""


def test_fsdp2_keeps_its_hooks_and_gets_the_marks(tmp_path):
    script = tmp_path / "fsdp.py"
    script.write_text(FSDP2)
    result = CliRunner().invoke(main, ["nsys", "--backend", "torch", "--modules", "all", "-o", str(tmp_path / "fsdp"),
                                       "--", *TORCHRUN, str(script)])
    assert result.exit_code == 0, result.output
    assert "program done 0" in result.stderr and "program done 1" in result.stderr
    for rank in (0, 1):
        ranges = load(tmp_path / f"fsdp.rank{rank}.json.gz").ranges
        marks = ranges[ranges["kind"] == "auto"].groupby("name").size().to_dict()
        assert {name: n for name, n in marks.items() if "::" not in name} == {
            "backward": 6, "forward": 6, "optimizer_step": 3, "step": 3}
        # The module marks too, forward and backward, beside FSDP2's own hooks.
        assert all(marks[f"{kind}::{path}"] == 6 for kind in ("module", "module_backward")
                   for path in ("0", "1", "2", "0.0", "2.2")), marks
