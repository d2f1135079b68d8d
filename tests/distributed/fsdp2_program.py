"""An FSDP2 training program as users write one, for the tests and the GPU checks: `fully_shard` on each block,
then the root, with bf16 parameters for compute and fp32 gradient reduction (`MixedPrecisionPolicy`), its phases
marked with `torch.cuda.nvtx` ranges; NCCL on GPUs (one per rank), gloo on CPUs, started by torchrun:

    torchrun --nproc-per-node 2 tests/distributed/fsdp2_program.py --steps 6

A CPU build of torch has no NVTX: on a CPU the program runs under a profiler-kit recorder, which takes its ranges.
Rank 0 prints the last loss.
"""

from __future__ import annotations

import argparse
import gc
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.cuda import nvtx
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class Model(nn.Module):
    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(0)
    model = Model(args.width, args.depth).to(device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(dist.get_rank())
    batch = torch.randn(args.batch, args.width, generator=generator).to(device)
    for _ in range(args.steps):
        with nvtx.range("step"):
            with nvtx.range("forward"):
                loss = model(batch).float().pow(2).mean()
            with nvtx.range("backward"):
                loss.backward()
            with nvtx.range("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    if dist.get_rank() == 0:
        print(f"loss {loss.item():.4f} after {args.steps} steps on {dist.get_world_size()} ranks")
    # The sharded model holds the process group: freed before the group is destroyed, as ddp_program.py does.
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
