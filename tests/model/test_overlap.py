"""The optimizer beside the backward (`--optimizer-overlap`): per-block groups, updates launched from inside the
backward as each block's gradients become final, numerics equal to the sequential step (CPU here: the update runs
inside the hook; the master-weight kernel under TRITON_INTERPRET=1), and the gradient-clipping fallback."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from profiler_kit import master_weights
from profiler_kit.errors import ProfilerKitError
from profiler_kit.overlap import BlockOptimizers, block_groups
from profiler_kit.workload import Workload, WorkloadConfig

OPTIMIZERS = ["adamw-fused", "adamw-foreach", "adamw-master"]


def _trained(steps: int = 2, **options) -> tuple[list[torch.Tensor], Workload]:
    """The parameters (and the optimizers' master weights, if any) after `steps` steps of the tiny model."""
    cfg = WorkloadConfig("tiny", 32, batch_size=2, device="cpu", **options)
    workload = Workload(cfg)
    for _ in range(steps):
        workload.step()
    optimizers = workload.blocks.optimizers if workload.blocks else [workload.optimizer]
    states = {id(p): state for opt in optimizers for p, state in opt.state.items()}
    params = list(workload.model.parameters())
    masters = [states[id(p)]["master"] for p in params if "master" in states[id(p)]]
    return [p.detach().clone() for p in params] + masters, workload


def _mixed(optimizer: str) -> dict:
    return {"optimizer": optimizer, "mixed_precision": optimizer == "adamw-master"}


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_beside_the_backward_equals_the_sequential_step(optimizer):
    """Every weight (and master weight) after two steps is bitwise the sequential step's."""
    if optimizer == "adamw-master" and not master_weights.INTERPRET:
        pytest.skip("the master-weight kernel runs on a CPU under TRITON_INTERPRET=1 (the torch path otherwise)")
    sequential, _ = _trained(**_mixed(optimizer))
    beside, workload = _trained(optimizer_overlap=True, **_mixed(optimizer))
    assert workload.beside_backward and not workload.notes
    assert len(beside) == len(sequential)
    for a, b in zip(sequential, beside, strict=True):
        assert torch.equal(a, b)


def test_each_block_is_updated_inside_the_backward_once_its_gradients_are_final():
    """When a block's update runs, every gradient of that block exists and the first block's do not yet (the
    backward reaches it last); the embedding, whose gradient comes last, is updated from the backward too."""
    workload = Workload(WorkloadConfig("tiny", 32, batch_size=2, device="cpu", optimizer_overlap=True))
    model, seen = workload.model, []
    first_block = list(model.layers[0].parameters())
    for group, optimizer in zip(workload.blocks.groups, workload.blocks.optimizers, strict=True):
        def pre_hook(opt, args, kwargs, group=group):
            seen.append((group, all(p.grad is not None for p in group), all(p.grad is None for p in first_block)))
        optimizer.register_step_pre_hook(pre_hook)
    workload.step(on_phase_end=seen.append)
    assert seen[0] == "forward" and seen[-2:] == ["backward", "optimizer_step"], "an update ran after the backward"
    updates = seen[1:-2]
    assert len(updates) == len(workload.blocks.groups)
    assert all(complete for _, complete, _ in updates)
    last_block = next(i for i, (group, *_) in enumerate(updates) if group[0] is model.layers[-1].norm1.weight)
    assert updates[last_block][2], "the last block was updated after the first block's gradients existed"


def test_gradient_clipping_updates_after_the_backward_and_says_so():
    clipped_seq, _ = _trained(clip_grad_norm=0.5)
    clipped_beside, workload = _trained(optimizer_overlap=True, clip_grad_norm=0.5)
    assert not workload.beside_backward
    assert workload.notes == ["gradient clipping needs every gradient: the optimizer ran after the backward"]
    for a, b in zip(clipped_seq, clipped_beside, strict=True):
        assert torch.equal(a, b)
    unclipped, _ = _trained()
    assert any(not torch.equal(a, b) for a, b in zip(unclipped, clipped_seq, strict=True)), "0.5 clipped nothing"


class _Blocks(nn.Module):
    """Two blocks and an extra parameter; the second block's `unused` gets no gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
        self.layers[1].unused = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x * self.scale)
        return x.square().sum()


def test_groups_and_a_group_missing_a_gradient_is_updated_by_finish():
    model = _Blocks()
    groups = block_groups(model)
    assert groups == [[model.scale], list(model.layers[0].parameters()), list(model.layers[1].parameters())]
    blocks = BlockOptimizers(groups, lambda params: torch.optim.SGD(params, lr=0.1))
    before = [p.detach().clone() for p in model.parameters()]
    blocks.arm()
    model(torch.ones(2, 4)).backward()
    # The second block waits for `unused`, which never comes: finish updates it with the gradients it has.
    assert torch.equal(model.layers[1].weight, before[3])
    blocks.finish()
    assert not torch.equal(model.layers[1].weight, before[3])
    assert torch.equal(model.layers[1].unused, before[-1])
    with pytest.raises(ProfilerKitError, match="layers"):
        block_groups(nn.Linear(2, 2))


@pytest.mark.parametrize("options, message", [
    ({"mode": "forward-backward"}, "needs a train step"),
    ({"parallel": "ddp"}, "one device"),
    ({"clip_grad_norm": 0.0}, "must be positive"),
])
def test_options_the_overlap_refuses(options, message):
    cfg = WorkloadConfig("tiny", 32, device="cpu", optimizer_overlap=options.get("clip_grad_norm") is None,
                         **options)
    with pytest.raises(ProfilerKitError, match=message):
        cfg.validate()


@pytest.mark.slow
def test_compiled_block_by_block_compiles_one_code_and_still_updates_inside_the_backward():
    """With --compile the overlap compiles each block on its own: one compiled code for every block, and the
    backward still ends block by block (the last block is updated before the first block's gradients exist)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    workload = Workload(WorkloadConfig("tiny", 32, batch_size=2, device="cpu", compile=True,
                                       optimizer_overlap=True))
    last, first = list(workload.model.layers[-1].parameters()), list(workload.model.layers[0].parameters())
    seen = []
    index = next(i for i, group in enumerate(workload.blocks.groups) if group[0] is last[0])
    workload.blocks.optimizers[index].register_step_pre_hook(
        lambda *args: seen.append(all(p.grad is None for p in first)))
    eager, _ = _trained(steps=2)
    for _ in range(2):
        workload.step()
    assert seen == [True, True]
    assert counters["stats"]["unique_graphs"] == 1
    for a, b in zip(eager, workload.model.parameters(), strict=False):
        torch.testing.assert_close(a, b.detach(), rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()
