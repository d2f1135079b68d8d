"""Run under torchrun by test_parallel.py: one training step of the tiny workload with DDP and with FSDP2, each
rank on its own batch, and the parameters after it compared with one process stepping on all the ranks'
batches at once (what synchronized gradients must give). Rank 0 writes the largest differences as JSON."""

import json
import sys
from dataclasses import replace

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from profiler_kit import distributed
from profiler_kit.workload import Workload, WorkloadConfig

CFG = WorkloadConfig("tiny", 32, "train", batch_size=2, device="cpu", nvtx=False)


def full_parameters(workload: Workload) -> list[torch.Tensor]:
    return [p.full_tensor() if isinstance(p, DTensor) else p.detach() for p in workload.model.parameters()]


def max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


def stepped_on(inputs: torch.Tensor, targets: torch.Tensor) -> list[torch.Tensor]:
    """Parameters of the plain workload after one step on the given batch."""
    plain = Workload(CFG)
    plain.inputs, plain.targets = inputs, targets
    plain.step()
    return full_parameters(plain)


def main(out: str) -> None:
    result = {}
    for mode in ("ddp", "fsdp"):
        workload = Workload(replace(CFG, parallel=mode))
        before = [p.clone() for p in full_parameters(workload)]
        workload.step()
        after = full_parameters(workload)
        world = dist.get_world_size()
        inputs, targets = [torch.empty_like(workload.inputs) for _ in range(world)], [
            torch.empty_like(workload.targets) for _ in range(world)]
        dist.all_gather(inputs, workload.inputs)
        dist.all_gather(targets, workload.targets)
        # Each rank's mean loss averaged over ranks is the mean loss over the ranks' batches together.
        together = stepped_on(torch.cat(inputs), torch.cat(targets))
        alone = stepped_on(workload.inputs, workload.targets)
        mine = torch.cat([p.flatten() for p in after])
        theirs = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(theirs, mine)
        result[mode] = {
            "batches_differ": not torch.equal(inputs[0], inputs[1]),
            "moved": max_difference(after, before),
            "vs_together": max_difference(after, together),
            "vs_alone": max_difference(after, alone),
            "across_ranks": max((t - mine).abs().max().item() for t in theirs),
        }
    if dist.get_rank() == 0:
        with open(out, "w") as fh:
            json.dump(result, fh)
    distributed.leave()


if __name__ == "__main__":
    main(sys.argv[1])
