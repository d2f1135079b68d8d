"""The module marks (`recording.modules`) and their FLOPs (`recording.module_flops`) in this process, seen through
torch.profiler: paths and types behind wrappers, forward, backward and recomputation ranges, backward ranges
against the program's own full backward hooks, the autograd graph left as it is, FLOPs per Linear exact and as
FlopCounterMode counts them, compiled modules as one entry without recompiles."""

from __future__ import annotations

import contextlib
import gzip
import json
import statistics
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch._dynamo.utils
from click.testing import CliRunner
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from profiler_kit import nvtx_ranges
from profiler_kit.cli import main
from profiler_kit.recording.marks import Marks
from profiler_kit.recording.module_flops import StepFlops
from profiler_kit.recording.modules import ModuleMarks, Tree
from profiler_kit.recording.notes import Notes

REPO = Path(__file__).resolve().parents[2]
B, T, D, H = 4, 8, 32, 96  # batch, tokens, width, hidden width


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(D, H), nn.Linear(H, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    """Blocks in a ModuleList, the odd ones checkpointed when asked (block 1 reentrant, block 3 not)."""

    def __init__(self, blocks: int = 4, checkpointed: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.head = nn.Linear(D, 4)
        self.checkpointed = checkpointed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            if self.checkpointed and i % 2:
                x = checkpoint(block, x, use_reentrant=i == 1)
            else:
                x = block(x)
        return self.head(x)


class DistributedDataParallel(nn.Module):
    """Stands in for DDP, which holds the model as `module` (a process group is not needed to test paths)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args):
        return self.module(*args)


@contextlib.contextmanager
def module_marks(depth: int | None = None, flops: bool = False) -> Iterator[ModuleMarks]:
    """The automatic and module marks installed in this process (and the FLOP count of the first step)."""
    notes = Notes()
    modules = ModuleMarks(notes, depth)
    marks = Marks(notes, modules)
    observers = [StepFlops(modules, notes)] if flops else []
    for observer in observers:
        nvtx_ranges.observe(observer)
    marks.install()
    try:
        yield modules
    finally:
        marks.finish()
        marks.remove()
        for observer in observers:
            nvtx_ranges._observers.remove(observer)
    assert notes.lines == []


def train(model: nn.Module, steps: int, grad_input: bool = True) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        model(torch.randn(B, T, D, requires_grad=grad_input)).square().mean().backward()
        opt.step()
        opt.zero_grad()


def ranges(prof: torch.profiler.profile, prefix: str = "profiler_kit::") -> list:
    return sorted((e for e in prof.events() if e.name.startswith(prefix)), key=lambda e: e.time_range.start)


def named(events: list, name: str) -> list:
    return [e for e in events if e.name == name]


def inside(inner, outer) -> bool:
    return outer.time_range.start <= inner.time_range.start and inner.time_range.end <= outer.time_range.end


def test_paths_skip_wrappers_and_name_shared_modules_by_their_caller():
    shared = nn.Linear(D, D)
    net = Net(blocks=2)
    net.blocks[0].norm = net.blocks[1].norm = shared
    net.blocks[1] = torch.compile(net.blocks[1])
    tree = Tree(DistributedDataParallel(net), depth=2)
    ranged = {place.path: place.type for places in tree.places.values() for place in places if place.ranged}
    # DDP's `module` and torch.compile's `_orig_mod` are no level of their own; depth 2 stops above the Linears.
    assert ranged == {"blocks": "ModuleList", "blocks.0": "Block", "blocks.1": "Block", "head": "Linear"}
    assert tree.types[""] == "Net" and tree.compiled == ["blocks.1"]
    assert [place.path for place in tree.places[id(shared)]] == ["blocks.0.norm", "blocks.1.norm"]
    # Inside a compiled module nothing gets ranges, whatever the depth.
    assert [place.ranged for place in Tree(net, depth=None).places[id(shared)]] == [True, False]
    eager = Net(blocks=2)
    eager.blocks[0].norm = eager.blocks[1].norm = shared
    with module_marks(depth=None) as modules, torch.profiler.profile() as prof:
        modules.outermost(eager)
        for block in eager.blocks:
            modules.enter(block, recompute=False)
            modules.enter(shared, recompute=False)
            modules.leave(shared, None)
            modules.leave(block, None)
    assert [e.name for e in ranges(prof)] == ["profiler_kit::module::blocks.0", "profiler_kit::module::blocks.0.norm",
                                             "profiler_kit::module::blocks.1", "profiler_kit::module::blocks.1.norm"]


def test_forward_backward_and_recomputation_ranges():
    model = Net(checkpointed=True)
    with module_marks() as modules, torch.profiler.profile() as prof:
        train(model, steps=2)
    events = ranges(prof)
    count = Counter(e.name for e in events)
    for block in range(4):
        for path in (f"blocks.{block}", f"blocks.{block}.up", f"blocks.{block}.down"):
            assert count[f"profiler_kit::module::{path}"] == 2
            assert count[f"profiler_kit::module_backward::{path}"] == 2, path
    assert count["profiler_kit::module::head"] == count["profiler_kit::module_backward::head"] == 2
    # The checkpointed blocks run their forward again inside the backward, and only those.
    assert {name.split("::")[-1] for name in count if "module_recompute" in name} == {
        "blocks.1", "blocks.1.up", "blocks.1.down", "blocks.3", "blocks.3.up", "blocks.3.down"}
    assert modules.metadata["types"]["blocks.3.up"] == "Linear" and modules.metadata["types"][""] == "Net"
    backward = named(events, "profiler_kit::backward")
    step_bwd = [e for e in events if e.name.startswith("profiler_kit::module_") and inside(e, backward[0])]
    assert {e.name for e in step_bwd} >= {"profiler_kit::module_backward::blocks.0",
                                          "profiler_kit::module_recompute::blocks.3"}
    # Backward runs the blocks in reverse; a block's layers run inside its backward range.
    firsts = [named(step_bwd, f"profiler_kit::module_backward::blocks.{i}")[0] for i in range(4)]
    assert [e.time_range.start for e in firsts] == sorted(e.time_range.start for e in reversed(firsts))[::-1]
    assert all(inside(named(step_bwd, f"profiler_kit::module_backward::blocks.{i}.{layer}")[0], firsts[i])
               for i in range(4) for layer in ("up", "down"))
    # The non-reentrant checkpoint recomputes block 3 inside its backward range.
    assert inside(named(step_bwd, "profiler_kit::module_recompute::blocks.3")[0], firsts[3])
    # The backward ranges run where the autograd engine runs the nodes.
    engine = {e.thread for e in prof.events() if e.name.startswith("autograd::engine::evaluate_function")}
    assert {e.thread for e in step_bwd} <= engine


def test_backward_ranges_match_the_programs_full_backward_hooks():
    """The truth: ranges the program opens from full backward pre-hooks and closes from full backward hooks (which
    put nodes around each block) against the recorder's ranges from the nodes' own hooks, in one recording."""
    model = Net(blocks=3)
    open_truth: dict[nn.Module, object] = {}

    def before(module, _grads):
        open_truth[module] = torch.ops.profiler._record_function_enter_new(f"truth::{module.name}", None)

    def after(module, _grad_inputs, _grad_outputs):
        torch.ops.profiler._record_function_exit._RecordFunction(open_truth.pop(module))

    for i, block in enumerate(model.blocks):
        block.name = f"blocks.{i}"
        block.register_full_backward_pre_hook(before)
        block.register_full_backward_hook(after)
    x = torch.randn(64, 64, D, requires_grad=True)  # a block's backward takes far longer than a hook
    with module_marks(), torch.profiler.profile() as prof:
        for _ in range(5):
            model(x).square().mean().backward()
    events = ranges(prof, "")
    for i in range(3):
        truth = named(events, f"truth::blocks.{i}")
        ours = named(events, f"profiler_kit::module_backward::blocks.{i}")
        assert len(truth) == len(ours) == 5
        # Medians over the steps: a process switch on a busy machine may fall between two hooks of one step.
        span = statistics.median(t.time_range.end - t.time_range.start for t in truth)
        for edge in ("start", "end"):
            apart = statistics.median(abs(getattr(o.time_range, edge) - getattr(t.time_range, edge))
                                      for t, o in zip(truth, ours, strict=True))
            assert apart <= 0.05 * span, (i, edge, apart, span)


def graph(loss: torch.Tensor) -> list[str]:
    """The autograd graph behind `loss`: each node's type and its inputs' types, in a fixed order."""
    out, todo, seen = [], [loss.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        out.append(f"{node.name()} <- {','.join(n.name() if n else '-' for n, _ in node.next_functions)}")
        todo.extend(n for n, _ in node.next_functions)
    return sorted(out)


def test_the_autograd_graph_and_gradients_stay_as_they_are():
    torch.manual_seed(0)
    model, x = Net(checkpointed=True), torch.randn(B, T, D, requires_grad=True)
    plain_loss = model(x).square().mean()
    plain = graph(plain_loss)
    plain_loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with module_marks(depth=None):
        loss = model(x).square().mean()
        assert graph(loss) == plain
        loss.backward()
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters(), strict=True))


def test_linear_flops_are_exact_and_as_flop_counter_mode_counts_them():
    model = Net(blocks=2, checkpointed=True)
    with module_marks(flops=True) as modules:
        train(model, steps=2)
    flops = modules.metadata["flops"]
    per = flops["modules"]
    up, down = 2 * B * T * D * H, 2 * B * T * H * D
    assert flops["step"] == 0
    assert per["blocks.0.up"] == {"forward": up, "backward": 2 * up}
    assert per["blocks.0.down"] == {"forward": down, "backward": 2 * down}
    assert per["blocks.0"] == {"forward": up + down, "backward": 2 * (up + down)}
    # Block 1 is checkpointed (reentrant): its forward runs again in the backward.
    assert per["blocks.1"]["recompute"] == up + down
    head = 2 * B * T * D * 4
    assert per["head"] == {"forward": head, "backward": 2 * head}
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(B, T, D, requires_grad=True)).square().mean().backward()
    assert sum(flops["total"].values()) == counter.get_total_flops()
    # An input that needs no gradient: the first Linear's backward computes the weight's gradient only.
    model = Net(blocks=1)
    with module_marks(flops=True) as modules:
        train(model, steps=1, grad_input=False)
    assert modules.metadata["flops"]["modules"]["blocks.0.up"] == {"forward": up, "backward": up}


@pytest.fixture
def dynamo_counters():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield lambda: {key: dict(torch._dynamo.utils.counters[key])
                   for key in ("stats", "recompiles", "graph_break", "unimplemented")}
    torch._dynamo.reset()


def compiled_blocks() -> Net:
    torch.manual_seed(0)
    model = Net(blocks=2)
    model.blocks[0].compile()
    model.blocks[1] = torch.compile(model.blocks[1])
    return model


def test_a_compiled_module_is_one_entry_and_compiles_as_it_would(dynamo_counters):
    train(compiled_blocks(), steps=3)
    plain = dynamo_counters()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with module_marks(depth=None, flops=True) as modules, torch.profiler.profile() as prof:
        train(compiled_blocks(), steps=3)
    assert dynamo_counters() == plain and plain["graph_break"] == {} and plain["recompiles"] == {}
    count = Counter(e.name for e in ranges(prof))
    assert count["profiler_kit::forward"] == 3
    # One range per call of each compiled block, its backward one more; nothing of what is inside them.
    assert {name: n for name, n in count.items() if "module" in name} == {
        f"profiler_kit::{kind}::{path}": 3 for kind in ("module", "module_backward")
        for path in ("blocks.0", "blocks.1", "head")}
    assert modules.metadata["compiled"] == ["blocks.0", "blocks.1"]
    assert modules.metadata["flops"]["modules"]["blocks.1"]["forward"] == 2 * B * T * D * H * 2


def test_a_backward_traced_on_fake_tensors_is_no_backward():
    """A compiler traces a compiled module's backward with `torch.autograd.grad` on fake tensors (AOTAutograd does
    so through the attribute the recorder wraps, in torch 2.11): no backward mark for it, one for the program's
    own backward right after."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with module_marks(), torch.profiler.profile() as prof:
        with FakeTensorMode():
            traced = torch.randn(4, requires_grad=True)
            torch.autograd.grad(traced.square().sum(), traced)
        real = torch.randn(4, requires_grad=True)
        torch.autograd.grad(real.square().sum(), real)
    assert Counter(e.name for e in ranges(prof))["profiler_kit::backward"] == 1


def test_a_model_compiled_in_place_gets_one_forward_per_call(dynamo_counters):
    with module_marks() as modules, torch.profiler.profile() as prof:
        model = Net(blocks=1)
        model.compile()  # as the program does, once the recorder is in place
        train(model, steps=3)
    count = Counter(e.name for e in ranges(prof))
    assert count["profiler_kit::forward"] == 3 and count["profiler_kit::backward"] == 3
    assert not any("module" in name for name in count) and modules.metadata["compiled"] == [""]
    assert dynamo_counters()["graph_break"] == {}


# Through the command line: the recording's ranges and metadata

PROGRAM = """
import sys, torch
from torch import nn
from torch.utils.checkpoint import checkpoint
torch.manual_seed(0)

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(32, 96), nn.Linear(96, 32)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        x = checkpoint(self.blocks[0], x, use_reentrant=False)
        return self.head(self.blocks[1](x))

model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
def step():
    model(torch.randn(4, 8, 32)).square().mean().backward()
    opt.step()
    opt.zero_grad()
"""


def trace_of(path) -> tuple[Counter, dict]:
    with gzip.open(path, "rt") as fh:
        trace = json.load(fh)
    names = Counter(e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("profiler_kit::module"))
    return names, trace["profiler_kit"]


@pytest.mark.parametrize("setting", ["depth:3", "depth:1", None])
def test_torch_backend_records_module_ranges_and_metadata(tmp_path, setting):
    """Module ranges and their metadata at depth 3 and 1; none without --modules (off by default)."""
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM + "for _ in range(3):\n    step()\n")
    out = tmp_path / "prog"
    options = ["--modules", setting] if setting else []
    result = CliRunner().invoke(main, ["nsys", "--backend", "torch", "-o", str(out), "--format", "json", *options,
                                       "--", sys.executable, str(script)])
    assert result.exit_code == 0, result.output
    names, meta = trace_of(tmp_path / "prog.json.gz")
    if setting is None:
        assert names == Counter() and "modules" not in meta
        return
    if setting == "depth:1":  # the ModuleList is never called: the head alone
        assert set(names) == {"profiler_kit::module::head", "profiler_kit::module_backward::head"}
        assert meta["modules"]["depth"] == 1
        return
    paths = ("blocks.0", "blocks.0.up", "blocks.0.down", "blocks.1", "blocks.1.up", "blocks.1.down", "head")
    assert {name: n for name, n in names.items() if "recompute" not in name} == {
        f"profiler_kit::{kind}::{path}": 3 for kind in ("module", "module_backward") for path in paths}
    assert {name.rsplit("::", 1)[1] for name in names if "recompute" in name} <= {"blocks.0", "blocks.0.up",
                                                                                  "blocks.0.down"}
    modules = meta["modules"]
    assert modules["depth"] == 3 and modules["compiled"] == []
    assert {path: modules["types"][path] for path in ("", "blocks.0", "blocks.1.up")} == {
        "": "Net", "blocks.0": "Block", "blocks.1.up": "Linear"}
    flops = modules["flops"]
    assert flops["step"] == 0 and flops["modules"]["blocks.1.up"] == {"forward": 2 * 4 * 8 * 32 * 96,
                                                                      "backward": 2 * 2 * 4 * 8 * 32 * 96}
    assert flops["modules"]["blocks.0"]["recompute"] == 2 * 4 * 8 * 32 * 96  # up only: the recompute stops early


# The memory recorder on a CPU: torch's memory history calls are fakes, the snapshot a real H100 one; the
# program records its own torch.profiler around a step to see the recorder's record_function ranges, which
# the memory history keeps as annotations on a GPU.
MEMORY_FAKES = """
import pickle
torch.cuda.synchronize = lambda *a: None
torch.cuda.get_device_name = lambda *a: "fake"
torch.cuda.memory._record_memory_history = lambda *a, **kw: None
with open(sys.argv[1], "rb") as f:
    SNAPSHOT = pickle.load(f)
torch.cuda.memory._snapshot = lambda: dict(SNAPSHOT)
step()
torch.cuda.profiler.start()
with torch.profiler.profile() as prof:
    step()
torch.cuda.profiler.stop()
print("ranges", sorted({e.name for e in prof.events() if e.name.startswith("profiler_kit::module")}))
"""


def test_memory_recorder_annotates_modules_and_keeps_their_metadata(tmp_path, monkeypatch):
    from profiler_kit.memory import load_snapshot
    from profiler_kit.recording import runner

    script = tmp_path / "prog.py"
    script.write_text(PROGRAM + MEMORY_FAKES)
    monkeypatch.setattr(runner, "cuda_device_present", lambda: True)  # the parent's check; the child fakes CUDA
    snapshot = REPO / "tests" / "fixtures" / "memory" / "h100_plain_phases.pickle"
    result = CliRunner().invoke(main, ["memory", "-o", str(tmp_path / "run"), "--modules", "depth:2", "--",
                                       sys.executable, str(script), str(snapshot)])
    assert result.exit_code == 0, result.output
    seen = result.stderr[result.stderr.index("ranges "):].splitlines()[0]
    for name in ("module::blocks.0", "module::head", "module_backward::blocks.1", "module_recompute::blocks.0"):
        assert f"'profiler_kit::{name}'" in seen, seen
    assert "blocks.0.up" not in seen  # depth 2
    modules = load_snapshot(tmp_path / "run.pickle")["profiler_kit"]["modules"]
    assert modules["depth"] == 2 and modules["types"]["blocks.1"] == "Block"
    assert modules["flops"]["modules"]["head"] == {"forward": 2 * 4 * 8 * 32 * 4, "backward": 2 * 2 * 4 * 8 * 32 * 4}


def test_the_modules_option_is_checked_before_anything_runs(tmp_path):
    bad = CliRunner().invoke(main, ["nsys", "--backend", "torch", "--modules", "depth:0", "--", "python", "x.py"])
    assert bad.exit_code == 2 and "'depth:0': expected depth:N (N at least 1), all or none" in bad.stderr
    builtin = CliRunner().invoke(main, ["memory", "--modules", "all"])
    assert builtin.exit_code == 2 and "--modules: options of -- COMMAND" in builtin.stderr
