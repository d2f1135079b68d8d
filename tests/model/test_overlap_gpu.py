"""On a GPU: the optimizer beside the backward (updates on a stream of their own) against the sequential step, and
the whole step captured as one CUDA graph (compiled block by block, `adamw-master`) against the same graph with
the update after the backward and against the uncaptured step."""

from __future__ import annotations

import pytest
import torch

from profiler_kit import benchmark as bench
from profiler_kit.workload import Workload, WorkloadConfig, release

pytestmark = pytest.mark.gpu
SMALL = {"model": "tiny", "ctx": 64, "batch_size": 2, "attention": "sdpa", "device": "cuda"}
# A clipping bound no gradient norm reaches: the clip multiplies every gradient by exactly 1.
NO_CLIP = 1e30


def _trained(steps: int, masters_only: bool = False, **options) -> list[torch.Tensor]:
    """Parameters and master weights (in the model's parameter order) after `steps` steps. The compiled code
    stays in dynamo's cache for the next workload of the same shapes."""
    workload = Workload(WorkloadConfig(**{**SMALL, **options}))
    for _ in range(steps):
        workload.step()
    torch.cuda.synchronize()
    optimizers = workload.blocks.optimizers if workload.blocks else [workload.optimizer]
    states = {id(p): state for opt in optimizers for p, state in opt.state.items()}
    params = list(workload.model.parameters())
    masters = [states[id(p)]["master"].clone() for p in params if "master" in states.get(id(p), {})]
    return masters if masters_only else [p.detach().clone() for p in params] + masters


def _largest_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("optimizer", ["adamw-fused", "adamw-master"])
def test_updates_beside_the_backward_equal_the_sequential_step(optimizer):
    """Three steps with each block's update on the optimizer's stream end where the sequential step ends, as
    close as two sequential runs are to each other (the GPU's own run-to-run differences)."""
    options = {"optimizer": optimizer, "mixed_precision": optimizer == "adamw-master"}
    first, second = _trained(3, **options), _trained(3, **options)
    beside = _trained(3, optimizer_overlap=True, **options)
    floor = _largest_difference(first, second)
    assert _largest_difference(first, beside) <= floor + 1e-7


@pytest.mark.gpu_slow  # torch.compile
def test_the_whole_step_as_one_graph_equals_the_sequential_and_the_uncaptured_steps():
    """Compiled block by block with `adamw-master`: the step captured as one graph (updates beside the backward)
    ends where the same graph with the update after the backward ends, and where the uncaptured overlapped step
    ends, so replays advance the step count; its replays record the phase events the benchmark times."""
    options = {"optimizer": "adamw-master", "mixed_precision": True, "compile": True, "optimizer_overlap": True,
               "attention": "naive"}
    steps = 7  # three warm-up steps, the capture, three replays: a step count frozen at the capture would show
    graph, again = (_trained(steps, masters_only=True, cuda_graphs=True, **options) for _ in range(2))
    graph_sequential = _trained(steps, masters_only=True, cuda_graphs=True, clip_grad_norm=NO_CLIP, **options)
    uncaptured = _trained(steps, masters_only=True, **options)
    moved = _largest_difference(graph, _trained(0, masters_only=True, **options))
    bound = 2 * _largest_difference(graph, again) + 1e-3 * moved
    assert moved > 0
    assert _largest_difference(graph, graph_sequential) <= bound
    assert _largest_difference(graph, uncaptured) <= bound

    workload = Workload(WorkloadConfig(**{**SMALL, **options, "cuda_graphs": True}))
    try:
        timing = bench.time_steps(workload, bench.TimingOptions(warmup=4, max_warmup=0, steps=3))
        assert workload.graph.graph is not None and workload.phase_events() is not None
        for i in range(3):
            phases = [timing.samples[p][i] for p in workload.phases]
            assert all(t >= 0 for t in phases) and phases[0] > 0 and phases[1] > 0
            assert sum(phases) <= timing.samples["total"][i]
    finally:
        release(workload)  # also drops the compiled code
