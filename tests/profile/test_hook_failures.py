"""The recorder never breaks the program: each hook it installs is made to fail from inside the program (the
automatic marks' forward, backward and optimizer-step hooks, the module marks' forward hooks and the hooks on
autograd nodes that give their backward, the FLOP count inside the program's operators, the mirrors of the
program's ranges, the step clock, the trace's metadata, the recording's stop, the pause before the process group
closes), alone and under torchrun (gloo, 2 ranks), several at once in each run. The program's own output and
exit status stay what they are without profiler-kit, and the recording's notes say what was lost."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from profiler_kit.cli import main
from profiler_kit.kernels import load

REPO = Path(__file__).resolve().parents[2]

PROGRAM = """
import os, sys, nvtx, torch
from torch import nn
torch.manual_seed(0)
distributed = "RANK" in os.environ
if distributed:
    import torch.distributed as dist
    dist.init_process_group("gloo")
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
if distributed:
    model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    with torch.profiler.record_function("fwd"):
        loss = model(torch.randn(8, 16)).square().mean()
    nvtx.push_range("bwd")
    loss.backward()
    nvtx.pop_range()
    opt.step()
    opt.zero_grad()
os.write(1, f"program done {os.environ.get('RANK', '-')} {loss.item():.6f}\\n".encode())  # one write: ranks never mix
if distributed:
    dist.destroy_process_group()
sys.exit(3)
"""


# Each sabotage wraps what it replaces in a closure of its own, so that several can be chained in one program.
def _fail_mark(name: str) -> str:
    return f"""
import profiler_kit.recording.marks as marks
def fail_mark(real):
    def mark_start(name, number=None):
        if name == {name!r}:
            raise RuntimeError("sabotaged")
        return real(name, number)
    return mark_start
marks.mark_start = fail_mark(marks.mark_start)
"""


def _fail_module_range(category: str) -> str:
    return f"""
import profiler_kit.recording.modules as modules
def fail_module_range(real):
    def module_start(path, category, name):
        if category == {category!r}:
            raise RuntimeError("sabotaged")
        return real(path, category, name)
    return module_start
modules.module_start = fail_module_range(modules.module_start)
"""


# hook → (code that makes it fail, the instrument the note names)
HOOKS = {
    "module hook": (_fail_module_range("module"), "the module marks"),
    "module backward hook": (_fail_module_range("module_backward"), "the module marks"),
    "FLOP count": ("import torch\nimport torch.utils.flop_counter as fc\n"
                   "def fail(*a, **k): raise RuntimeError('sabotaged')\n"
                   "fc.flop_registry[torch.ops.aten.addmm] = fail\n", "the FLOPs per module"),
    "forward hook": (_fail_mark("forward"), "the automatic marks"),
    "backward hook": (_fail_mark("backward"), "the automatic marks"),
    "optimizer step hook": (_fail_mark("optimizer_step"), "the automatic marks"),
    "mirrors": ("import profiler_kit.nvtx_ranges as r\ndef fail(): raise RuntimeError('sabotaged')\n"
                "r.new_token = fail\n", "the program's own ranges"),
    "step clock": ("import profiler_kit.recording.window as w\ndef fail(*a): raise RuntimeError('sabotaged')\n"
                   "w.StepClock.__call__ = fail\n", "the step clock"),
    "trace metadata": ("import torch\ndef fail(*a): raise RuntimeError('sabotaged')\n"
                       "torch.profiler.profile.add_metadata_json = fail\n", "the trace's metadata"),
    "trace export": ("import torch\ndef fail(*a): raise RuntimeError('sabotaged')\n"
                     "torch.profiler.profile.export_chrome_trace = fail\n", "the recording window"),
    "teardown pause": ("import profiler_kit.recording.teardown as t\ndef fail(): raise RuntimeError('sabotaged')\n"
                       "t._pause = fail\n", "the pause that keeps a gloo job from hanging at exit"),
}
# The pause runs where the program closes its process group: only under torchrun.
ONLY_TORCHRUN = {"teardown pause"}
# Each run makes several hooks fail at once, each of an instrument of its own, so that each note names the hook
# that failed; every hook fails in one run alone and in one torchrun job, beside other hooks in each.
ALONE_RUNS = [
    ("forward hook", "module backward hook", "mirrors", "trace export"),
    ("backward hook", "module hook", "step clock", "trace metadata"),
    ("optimizer step hook", "FLOP count"),
]
TORCHRUN_JOBS = [
    ("forward hook", "module hook", "FLOP count", "mirrors", "step clock", "trace metadata", "teardown pause"),
    ("backward hook", "module backward hook", "trace export"),
    ("optimizer step hook",),
]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def _program(tmp_path: Path, sabotage: str) -> Path:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(sabotage) + PROGRAM)
    return script


def _program_lines(text: str) -> list[str]:
    """The program's own lines (torch.profiler's own messages may run into them on a shared stream)."""
    return sorted(re.findall(r"program done \S+ \S+", text))


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The program's output lines and exit status without profiler-kit, alone and under torchrun."""
    script = _program(tmp_path_factory.mktemp("plain"), "")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs = {}
    for launcher in ("alone", "torchrun"):
        cmd = [sys.executable, str(script)] if launcher == "alone" else [*TORCHRUN, str(script)]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        runs[launcher] = (_program_lines(done.stdout + done.stderr), done.returncode)
    return runs


def _record_with_failing_hooks(tmp_path: Path, plain: dict, hooks: tuple[str, ...], launcher: str) -> None:
    """Record the program with `hooks` made to fail: its output and exit status are those without profiler-kit,
    no traceback runs through the recorder, each rank notes each failed hook's instrument and nothing else, and
    each rank's trace is written unless its export is what failed."""
    script = _program(tmp_path, "".join(HOOKS[hook][0] for hook in hooks))
    cmd = [sys.executable, str(script)] if launcher == "alone" else [*TORCHRUN, str(script)]
    result = CliRunner().invoke(main, ["nsys", "--backend", "torch", "--modules", "all", "-o", str(tmp_path / "run"),
                                       "--", *cmd])
    lines, status = plain[launcher]
    assert len(lines) == (1 if launcher == "alone" else 2)
    assert _program_lines(result.stderr) == lines and result.exit_code == status, result.output
    assert not re.search(r'File ".*profiler_kit/', result.output)  # no traceback through the recorder
    said = " ".join(result.output.split())  # the notes, however the table wrapped them
    ranks = ["rank 0: ", "rank 1: "] if launcher == "torchrun" else [""]
    failed = {HOOKS[hook][1] for hook in hooks}
    for instrument in {instrument for _, instrument in HOOKS.values()}:
        note = (re.escape(instrument) + r"[^:]*: not recorded from here on, the recorder's hook failed "
                r"\(RuntimeError: sabotaged\)")
        if instrument in failed:
            assert all(re.search(re.escape(rank) + note, said) for rank in ranks), (instrument, said)
        else:
            assert not re.search(note, said), (instrument, said)
    traces = sorted(tmp_path.glob("run*.json.gz"))
    if "trace export" in hooks:
        assert traces == []  # nothing could be written: the notes say why
    else:
        assert len(traces) == len(ranks)
        assert all(len(load(trace).cpu_ops) > 0 for trace in traces)


@pytest.mark.parametrize("hooks", ALONE_RUNS, ids=["+".join(run) for run in ALONE_RUNS])
def test_failing_hooks_leave_the_program_as_it_is(tmp_path, plain, hooks):
    _record_with_failing_hooks(tmp_path, plain, hooks, "alone")


@pytest.mark.parametrize("hooks", TORCHRUN_JOBS, ids=["+".join(job) for job in TORCHRUN_JOBS])
def test_failing_hooks_leave_a_torchrun_job_as_it_is(tmp_path, plain, hooks):
    _record_with_failing_hooks(tmp_path, plain, hooks, "torchrun")


def test_every_hook_fails_in_one_run_and_one_job_beside_hooks_of_other_instruments():
    assert sorted(hook for job in TORCHRUN_JOBS for hook in job) == sorted(HOOKS)
    assert sorted(hook for run in ALONE_RUNS for hook in run) == sorted(set(HOOKS) - ONLY_TORCHRUN)
    for job in (*ALONE_RUNS, *TORCHRUN_JOBS):
        assert len({HOOKS[hook][1] for hook in job}) == len(job), job


# The memory recorder's storage captures, on a CPU: torch's memory history calls are replaced inside the program
# by fakes, and the optimizer holds state whose storage cannot be read (as FSDP2's DTensor shards may answer);
# SABOTAGE, when given, makes the capture itself fail.
MEMORY_PROGRAM = """
import pickle, sys, torch
from torch import nn
torch.cuda.synchronize = lambda *a: None
torch.cuda.get_device_name = lambda *a: "fake"
torch.cuda.memory._record_memory_history = lambda *a, **kw: None
with open(sys.argv[1], "rb") as f:
    SNAPSHOT = pickle.load(f)  # a real H100 snapshot stands for the GPU's
torch.cuda.memory._snapshot = lambda: dict(SNAPSHOT)
SABOTAGE

class Shard:
    def untyped_storage(self):
        raise RuntimeError("Attempted to access the data pointer on an invalid python storage.")

model = nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
def step():
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
step()
opt.state[model.weight]["shard"] = Shard()
torch.cuda.profiler.start()
step(); step()
torch.cuda.profiler.stop()
print("program done")
sys.exit(3)
"""
CAPTURE_FAILS = """
import profiler_kit.recording.history as history
def fail(*args, **kwargs):
    raise RuntimeError("sabotaged")
history.capture_storages = fail
"""


@pytest.mark.parametrize("capture_fails", [False, True], ids=["unreadable storage", "capture fails"])
def test_storages_that_cannot_be_read_leave_the_program_as_it_is(tmp_path, monkeypatch, capture_fails):
    from profiler_kit.memory import load_snapshot
    from profiler_kit.recording import runner

    script = tmp_path / "prog.py"
    script.write_text(MEMORY_PROGRAM.replace("SABOTAGE", CAPTURE_FAILS if capture_fails else ""))
    monkeypatch.setattr(runner, "cuda_device_present", lambda: True)  # the parent's check; the child fakes CUDA
    snapshot = REPO / "tests" / "fixtures" / "memory" / "h100_plain_phases.pickle"
    result = CliRunner().invoke(main, ["memory", "-o", str(tmp_path / "run"), "--", sys.executable, str(script),
                                       str(snapshot)])
    assert result.exit_code == 3 and "program done" in result.stderr, result.output
    assert not re.search(r'File ".*profiler_kit/', result.output)
    meta = load_snapshot(tmp_path / "run.pickle")["profiler_kit"]
    if capture_fails:  # the recorder's guard: the captures stop, the notes say so
        said = " ".join(result.output.split())
        for what in ("the storages at the window's start", "the storages after optimizer steps"):
            assert (f"{what}: not recorded from here on, the recorder's hook failed (RuntimeError: sabotaged)"
                    in said)
        assert meta["storages"] == [] and len(meta["notes"]) == 2
    else:  # the capture leaves out what it cannot read, and says so in the capture
        assert [c["label"] for c in meta["storages"]] == ["window start", "optimizer step 1", "optimizer step 2"]
        assert all("invalid python storage" in c["note"] for c in meta["storages"]) and meta["notes"] == []
